"""Crashes against the real broker: kill -9 of the collector (at random moments and inside
the publish/checkpoint window), of the detector between publishing incidents and
committing offsets, and of the sink between its DuckDB write and its commit."""

from __future__ import annotations

import signal
import threading
import time

import pytest
from conftest import SCENARIOS

from ckptwatch.kafka.codec import FLOORS_HEADER, decode_floors
from kafka_support import (assert_no_version_twice, ckptwatch, cli_env, expected_lines, finish, fresh_config, killed_at, published_per_id,
                           run_embedded, save_lines, snapshot, stored_lines, topic_events, topic_messages)

pytestmark = pytest.mark.kafka


def test_collector_kill9_mid_stream_loses_and_repeats_nothing(kafka_bootstrap, tmp_path):
    logs = tmp_path / "logs" / "job-crash"
    logs.mkdir(parents=True)
    log = logs / "rank0.log"
    log.write_text("")
    cfg = fresh_config(kafka_bootstrap, tmp_path, partitions=2)
    env = cli_env(cfg, CKPTWATCH_COLLECT_PATH_TEMPLATE="{job}/rank{rank}.log")
    total, chunk = 6000, 300
    written = threading.Event()

    def writer():
        with open(log, "a") as f:
            for first in range(0, total - chunk, chunk):
                f.write(save_lines(first, chunk))
                f.flush()
                time.sleep(0.05)
        written.set()

    t = threading.Thread(target=writer)
    t.start()
    kills = 0
    # kill -9 at staggered moments while lines are still arriving (the last one long enough
    # after its start, ~1.2 s of imports on a loaded machine, for a checkpoint to be saved:
    # the floors below need one) ...
    for delay in (0.8, 1.3, 4.0):
        p = ckptwatch(["collect", str(tmp_path / "logs")], env)
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        p.communicate()
        kills += 1
    t.join()
    assert written.is_set()
    # ... and exactly inside the window where events are acknowledged but the checkpoint is
    # not saved (the last chunk is written now: the killed collectors may have read the rest)
    with open(log, "a") as f:
        f.write(save_lines(total - chunk, chunk))
    killed_at("collect.after_publish", ["collect", str(tmp_path / "logs")], env, timeout=60)
    finish(ckptwatch(["collect", str(tmp_path / "logs"), "--once"], env))
    finish(ckptwatch(["sink", "--until-idle", "4"], env))

    assert stored_lines(cfg.sink.db) == expected_lines(total)  # every line once: none lost, none twice
    keys = snapshot(cfg.sink.db)["event_keys"]
    assert len(keys) == len(set(keys)) == total
    # the topic itself may hold re-sent events (at-least-once): the ones published between
    # the last checkpoint and each kill; they all carry a (source_id, offset) seen before
    on_topic = topic_events(kafka_bootstrap, cfg.kafka.events_topic)
    assert {(e["source_id"], e["offset"]) for e in on_topic} == set(keys)
    assert len(on_topic) > total  # the failpoint kill re-sent at least its last batch
    # every message says the offset its collector had saved (the floor the sink drops repeats
    # by, holding only what is past it): a re-sent message the same floor as the first time
    floors = [decode_floors(dict(m.headers)[FLOORS_HEADER]) for m in topic_messages(kafka_bootstrap,
                                                                                  cfg.kafka.events_topic)]
    assert floors and all(len(f) == 1 for f in floors)
    assert {off for f in floors for off in f.values()} >= {0}
    assert max(off for f in floors for off in f.values()) > 0


def test_detector_kill9_between_publish_and_commit(copy_scenario, kafka_bootstrap, tmp_path):
    for s in SCENARIOS:
        copy_scenario(s)
    embedded = run_embedded(tmp_path, tmp_path.parent / f"{tmp_path.name}-embedded.duckdb",
                            named=False)  # `ckptwatch detect` services: job-less lines are unknown
    cfg = fresh_config(kafka_bootstrap, tmp_path.parent, partitions=3)
    env = cli_env(cfg)
    finish(ckptwatch(["collect", str(tmp_path), "--once"], env))

    killed_at("detect.after_publish", ["detect"], env)
    published_before = topic_messages(kafka_bootstrap, cfg.kafka.incidents_topic)
    assert published_before  # it died after publishing, before committing

    finish(ckptwatch(["detect", "--until-idle", "5"], env), timeout=180)
    finish(ckptwatch(["sink", "--until-idle", "5"], env))

    fleet = snapshot(cfg.sink.db)
    assert fleet["incidents"] == embedded["incidents"]
    assert fleet["evidence"] == embedded["evidence"]
    # the restarted member replayed the partitions and republished nothing it had published
    per_id = published_per_id(kafka_bootstrap, cfg.kafka.incidents_topic)
    assert set(per_id) >= {r[0] for r in embedded["incidents"]}
    assert_no_version_twice(kafka_bootstrap, cfg.kafka.incidents_topic)


def test_sink_kill9_after_write_before_commit(copy_scenario, kafka_bootstrap, tmp_path):
    logs = copy_scenario("02-sigkill-mid-save")
    embedded = run_embedded(logs, tmp_path / "embedded.duckdb")
    cfg = fresh_config(kafka_bootstrap, tmp_path, partitions=1)
    env = cli_env(cfg)
    finish(ckptwatch(["collect", str(logs), "--once"], env))
    finish(ckptwatch(["detect", "--until-idle", "3"], env))
    killed_at("sink.after_write", ["sink"], env, timeout=60)
    finish(ckptwatch(["sink", "--until-idle", "4"], env))
    fleet = snapshot(cfg.sink.db)
    assert fleet == embedded


def test_a_new_database_file_gets_everything(copy_scenario, kafka_bootstrap, tmp_path):
    """The sink resumes from the offsets stored in its database, not the group's: a second
    database file under the same group is filled from the start of the topics."""
    logs = copy_scenario("02-sigkill-mid-save")
    embedded = run_embedded(logs, tmp_path / "embedded.duckdb")
    cfg = fresh_config(kafka_bootstrap, tmp_path, partitions=2)
    env = cli_env(cfg)
    finish(ckptwatch(["collect", str(logs), "--once"], env))
    finish(ckptwatch(["detect", "--until-idle", "3"], env))
    finish(ckptwatch(["sink", "--until-idle", "4"], env))
    second = tmp_path / "moved.duckdb"
    finish(ckptwatch(["sink", "--until-idle", "4", "--db", str(second)], env))
    assert snapshot(cfg.sink.db) == embedded
    assert snapshot(second) == embedded
