"""A detector member waits out a broker restart, as the collector and the sink do: before it
got its partitions (it used to raise ``KafkaTimeoutError: Unable to bootstrap`` reading the
incidents topic back, and ``ckptwatch detect`` exited 2) and while it consumes. It says
``waiting for Kafka at ...``, then goes on where it was: every incident published once.
Runs its own broker (scripts/kafka-local), since it stops it."""

from __future__ import annotations

import collections
import dataclasses
import time

import pytest
from kafka_support import assert_no_version_twice, failing_save, fresh_config, topic_messages

from ckptwatch.ingest.layout import compile_template
from ckptwatch.kafka.codec import decode_incident
from ckptwatch.rules import RuleSet
from ckptwatch.services.collect import Collector
from ckptwatch.services.detect import DetectorMember

pytestmark = pytest.mark.kafka


def test_detector_waits_out_a_broker_restart_before_and_after_it_got_its_partitions(own_broker, tmp_path):
    local, state, addr = own_broker
    cfg = fresh_config(addr, tmp_path, partitions=1)
    cfg = dataclasses.replace(cfg, collect=dataclasses.replace(cfg.collect, paths=[str(tmp_path / "logs")]))

    def write(job: str) -> None:
        (tmp_path / "logs" / job).mkdir(parents=True)
        for name, text in failing_save(job).items():
            (tmp_path / "logs" / job / name).write_text(text)

    def restart(member: DetectorMember, down: float = 4.0) -> None:
        local.stop(state, 2.0)  # SIGTERM, SIGKILL after 2 s: a clean shutdown takes 10 s and more
        until = time.monotonic() + down
        while time.monotonic() < until:
            member.step()  # raised before the fix
        local.start(state, None, 180.0)

    def consume(member: DetectorMember, events: int) -> None:
        deadline = time.monotonic() + 90
        while not (member.joined and member.stats.events >= events):
            member.step()
            assert time.monotonic() < deadline, "the detector did not get its partition after the restart"

    notes: list[str] = []
    write("job-a")
    collector = Collector(cfg, rules=RuleSet.load(), template=compile_template("{job}/rank{rank}.log"))
    collector.step(final=True)
    collector.close()
    member = DetectorMember(cfg, on_message=notes.append, poll_timeout=0.2)
    try:
        restart(member)  # before it joined: waiting for its partitions
        assert not member.stats.events
        consume(member, 8)
        restart(member)  # while it consumes
        write("job-b")
        collector = Collector(cfg, rules=RuleSet.load(), template=compile_template("{job}/rank{rank}.log"))
        collector.step(final=True)
        collector.close()
        consume(member, 16)
        member.finish()
    finally:
        member.close()
    waits = [n for n in notes if n.startswith(f"waiting for Kafka at {addr}")]
    assert waits and member.stats.broker_waits >= 1
    assert any("answers again" in n for n in notes)
    published = [decode_incident(m.value) for m in topic_messages(addr, cfg.kafka.incidents_topic)]
    assert collections.Counter((i.job, i.kind, i.step) for i in published) == {
        ("job-a", "storage_failure_during_save", 30): 1, ("job-b", "storage_failure_during_save", 30): 1}
    assert_no_version_twice(addr, cfg.kafka.incidents_topic)
