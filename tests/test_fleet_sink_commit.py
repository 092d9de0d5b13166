"""After a sink crash (kill -9 between its DuckDB transaction and the group commit), the
restarted sink commits the positions it resumed from at once: the group's committed
offsets, which consumer-lag monitoring reads, are right before any new record arrives.
They used to stay None (or stale) until new records came."""

from __future__ import annotations

import time

import pytest
from kafka import KafkaAdminClient
from kafka_support import ckptwatch, cli_env, finish, fresh_config, killed_at, save_lines

from ckptwatch.services.sink import SinkMember
from ckptwatch.sinks.duckdb_store import Store

pytestmark = pytest.mark.kafka


def group_offsets(bootstrap: str, group: str) -> dict[tuple[str, int], int]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="test-offsets")
    try:
        return {(tp.topic, tp.partition): om.offset
                for tp, om in admin.list_group_offsets({group: None}).get(group, {}).items() if om.offset >= 0}
    finally:
        admin.close()


def test_a_restarted_sink_commits_where_it_resumed_without_new_records(kafka_bootstrap, tmp_path):
    logs = tmp_path / "logs" / "job-a"
    logs.mkdir(parents=True)
    (logs / "rank0.log").write_text(save_lines(0, 40))
    cfg = fresh_config(kafka_bootstrap, tmp_path, partitions=2)
    env = cli_env(cfg, CKPTWATCH_COLLECT_PATH_TEMPLATE="{job}/rank{rank}.log")
    finish(ckptwatch(["collect", str(tmp_path / "logs"), "--once"], env, cwd=tmp_path))
    killed_at("sink.after_write", ["sink"], env, timeout=60)  # stored, not committed
    store = Store(cfg.sink.db)
    stored = {k: v for k, v in store.kafka_offsets().items() if k[0] == cfg.kafka.events_topic}
    assert sum(stored.values()) == 1  # one message: the 40 events of one job, one NDJSON batch
    assert store.con.execute("SELECT count(*) FROM events").fetchone() == (40,)
    before = group_offsets(kafka_bootstrap, cfg.sink.group)
    assert all(before.get(k) != v for k, v in stored.items() if v)  # the write's offsets: not committed
    sink = SinkMember(cfg, store, poll_timeout=0.2)
    try:
        deadline = time.monotonic() + 60
        while not sink.joined:
            sink.step()
            assert time.monotonic() < deadline, "the sink never joined"
        for _ in range(3):
            assert sink.step() == 0  # nothing new arrives
        committed = group_offsets(kafka_bootstrap, cfg.sink.group)
    finally:
        sink.close()
        store.close()
    # every partition of both topics: where the database says, the others at their beginning
    events, incidents = cfg.kafka.events_topic, cfg.kafka.incidents_topic
    assert committed == {(events, 0): 0, (events, 1): 0, (incidents, 0): 0, (incidents, 1): 0} | stored
