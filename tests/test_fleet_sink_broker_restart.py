"""The sink waits out a broker restart as the detector does (issue 35, items 10 and 14). A
broker killed (``kill -9``) before the sink got its partitions made its poll raise
``KafkaConnectionError: 111 ECONNREFUSED`` and ``ckptwatch sink`` exit 2; pages waited until
someone restarted it. Now it says ``waiting for Kafka at ...``, then goes on: every event
stored once. And ``scripts/kafka-local start`` right after the ``kill -9`` starts a new
broker: it used to take the dead one (a zombie, still in the pid file) for a running one
and hand back its address. Runs its own broker (scripts/kafka-local), since it kills it."""

from __future__ import annotations

import dataclasses
import os
import signal
import time

import pytest
from kafka_support import fresh_config, save_lines

from ckptwatch.ingest.layout import compile_template
from ckptwatch.rules import RuleSet
from ckptwatch.services.collect import Collector
from ckptwatch.services.sink import SinkMember
from ckptwatch.sinks.duckdb_store import Store

pytestmark = pytest.mark.kafka


def test_sink_waits_out_a_broker_killed_and_restarted_before_it_joined(own_broker, tmp_path):
    local, state, addr = own_broker
    logs = tmp_path / "logs" / "job-a"
    logs.mkdir(parents=True)
    (logs / "rank0.log").write_text(save_lines(0, 20))
    cfg = fresh_config(addr, tmp_path, partitions=2)
    cfg = dataclasses.replace(cfg, collect=dataclasses.replace(cfg.collect, paths=[str(tmp_path / "logs")]))
    collector = Collector(cfg, rules=RuleSet.load(), template=compile_template("{job}/rank{rank}.log"))
    collector.step(final=True)
    collector.close()
    notes: list[str] = []
    store = Store(cfg.sink.db)
    sink = SinkMember(cfg, store, on_message=notes.append, poll_timeout=0.2)
    try:
        dead = int((state / "pid").read_text())
        os.kill(dead, signal.SIGKILL)  # not reaped: a zombie of this process, as a broker started by a shell
        until = time.monotonic() + 1.0
        while time.monotonic() < until:
            assert sink.step() >= 1  # raised before the fix; waiting is not idleness
        assert local.start(state, None, 180.0) == addr  # the same address, a new broker
        alive = int((state / "pid").read_text())
        assert alive != dead and local._metadata_ok(int(addr.rsplit(":", 1)[1]))
        deadline = time.monotonic() + 60
        while store.con.execute("SELECT count(*) FROM events").fetchone()[0] < 20:
            sink.step()
            assert time.monotonic() < deadline, f"the sink did not get its partitions back: {sink.stats}"
        stored = store.con.execute('SELECT count(*), count(DISTINCT "offset") FROM events').fetchone()
        assert [n for n in notes if n.startswith(f"waiting for Kafka at {addr} (")] and sink.stats.broker_waits >= 1
        assert any(n.startswith(f"Kafka at {addr} answers again after ") for n in notes)
        # caught up and idle, the broker goes away again: said too (the second attack round found an
        # idle sink silent through an 80 s outage; its polls just came back empty)
        before = len(notes)
        os.kill(int((state / "pid").read_text()), signal.SIGKILL)
        until = time.monotonic() + 8.0
        while time.monotonic() < until and not any(n.startswith("waiting for Kafka") for n in notes[before:]):
            sink.step()
        until = time.monotonic() + 1.5  # still away: an empty poll is no answer (the third attack round
        while time.monotonic() < until:  # saw 'answers again after 1 s' every 5 s of an outage)
            sink.step()
    finally:
        sink.close()
        store.close()
    assert stored == (20, 20)
    assert [n for n in notes[before:] if n.startswith(f"waiting for Kafka at {addr} (")]
    assert not [n for n in notes[before:] if "answers again" in n]
