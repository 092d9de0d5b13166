"""Events that retention deletes before they are read are not lost without a word (issue 35,
item 13). A consumer whose next offset was deleted gets ``OffsetOutOfRange`` and resets to
the earliest offset left (``auto_offset_reset``), past offsets it never received: the sink
and the detector group used to skip them silently (38 % of the events in one run). Now each
says which offsets it never received in one line and counts them
(``ckptwatch_records_skipped_total{reason="offsets_lost"}``). The deletion is Kafka's own
(``DeleteRecords``, what retention does: the partition's log start moves up)."""

from __future__ import annotations

import json

import pytest
from kafka import KafkaAdminClient, TopicPartition
from kafka_support import fresh_config, step_until

from ckptwatch.kafka.admin import ensure_topics
from ckptwatch.kafka.producer import Message, Publisher
from ckptwatch.services.detect import DetectorMember
from ckptwatch.services.sink import SinkMember
from ckptwatch.sinks.duckdb_store import Store
from ckptwatch.sinks.metrics import Metrics

pytestmark = pytest.mark.kafka

T0 = 1_764_489_600_000_000_000  # 2025-11-30T08:00:00Z in ns


def publish(cfg, offsets: range) -> None:
    """One message per event: a metric line of job-a at source offset ``o``."""
    pub = Publisher(cfg.kafka, client_id="test-retention")
    try:
        pub.publish([Message(cfg.kafka.events_topic, b"job-a", json.dumps(
            {"ts": T0 + o * 10**9, "kind": "metric", "job": "job-a", "source_id": "s", "offset": o, "rule_id": "r",
             "line": f"step {o} loss 1.0", "attrs": '{"loss": 1.0}', "step": o}).encode()) for o in offsets])
    finally:
        pub.close()


def run(make, done, timeout: float = 60.0):
    """A member made by ``make()``, stepped until ``done(member)``, then closed."""
    member = make()
    try:
        return step_until(member, done, timeout)
    finally:
        member.close()


def never_received(topic: str, first: int, last: int, role: str, group: str) -> str:
    """What a ``role`` ('sink' or 'detector') of consumer ``group`` says of offsets lost on partition 0."""
    lost = "stored" if role == "sink" else "judged"
    return (f"{topic} partition 0: offsets {first} to {last} ({last - first + 1} message(s)) were never received: "
            f"the topic's retention deleted them before {role} group {group} read them; their events are not {lost}")


def test_offsets_deleted_before_the_sink_and_the_detectors_read_them_are_reported_and_counted(kafka_bootstrap, tmp_path):
    cfg = fresh_config(kafka_bootstrap, tmp_path, partitions=1)
    ensure_topics(cfg.kafka)
    tp = TopicPartition(cfg.kafka.events_topic, 0)
    store = Store(cfg.sink.db)
    try:
        def stored(_member=None) -> int:
            return store.con.execute("SELECT count(*) FROM events").fetchone()[0]

        publish(cfg, range(0, 3))  # read by both, then both stop
        run(lambda: SinkMember(cfg, store, poll_timeout=0.2), lambda m: stored() == 3)
        run(lambda: DetectorMember(cfg, poll_timeout=0.2), lambda m: m.committed.get(tp) == 3)
        publish(cfg, range(3, 7))  # offsets 3..6 arrive while they are away
        admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, client_id="test-retention")
        try:
            admin.delete_records({tp: 5})  # retention took 3 and 4 before anyone read them
        finally:
            admin.close()

        metrics, said, notes = Metrics(), [], []
        sink = run(lambda: SinkMember(cfg, store, poll_timeout=0.2, on_message=said.append, metrics=metrics),
                   lambda m: stored() == 5)
        member = run(lambda: DetectorMember(cfg, poll_timeout=0.2, on_message=notes.append, metrics=metrics),
                     lambda m: m.stats.events == 2)
        kept = store.con.execute('SELECT "offset" FROM events ORDER BY 1').fetchall()
    finally:
        store.close()
    assert kept == [(0,), (1,), (2,), (5,), (6,)]
    topic = cfg.kafka.events_topic
    assert [n for n in said if "never received" in n] == [never_received(topic, 3, 4, "sink", cfg.sink.group)]
    assert [n for n in notes if "never received" in n] == [
        never_received(topic, 3, 4, "detector", cfg.detect.group)]
    assert sink.stats.offsets_lost == member.stats.offsets_lost == 2
    # one Metrics for both, as in run --kafka: the same two offsets count once in the process
    assert 'ckptwatch_records_skipped_total{reason="offsets_lost"} 2.0' in metrics.exposition()


def test_a_partition_retention_emptied_is_reported_before_anything_new_is_published(kafka_bootstrap, tmp_path):
    """Found by the second attack round: a partition whose every unread record retention
    deleted (log start = log end) showed no jump, since no record came after the gap; a
    restarted sink said ``0 new events`` and nothing else until the next message."""
    cfg = fresh_config(kafka_bootstrap, tmp_path, partitions=1)
    ensure_topics(cfg.kafka)
    tp = TopicPartition(cfg.kafka.events_topic, 0)
    store = Store(cfg.sink.db)
    try:
        publish(cfg, range(0, 2))
        run(lambda: SinkMember(cfg, store, poll_timeout=0.2),
            lambda m: store.con.execute("SELECT count(*) FROM events").fetchone()[0] == 2)
        run(lambda: DetectorMember(cfg, poll_timeout=0.2), lambda m: m.committed.get(tp) == 2)
        publish(cfg, range(2, 5))  # offsets 2..4, then retention takes all of them
        admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, client_id="test-retention")
        try:
            admin.delete_records({tp: 5})
        finally:
            admin.close()
        said, notes = [], []
        sink = run(lambda: SinkMember(cfg, store, poll_timeout=0.2, on_message=said.append),
                   lambda m: m.stats.offsets_lost > 0, timeout=30)
        member = run(lambda: DetectorMember(cfg, poll_timeout=0.2, on_message=notes.append),
                     lambda m: m.stats.offsets_lost > 0, timeout=30)
    finally:
        store.close()
    topic = cfg.kafka.events_topic
    assert [n for n in said if "never received" in n] == [never_received(topic, 2, 4, "sink", cfg.sink.group)]
    assert [n for n in notes if "never received" in n] == [
        never_received(topic, 2, 4, "detector", cfg.detect.group)]
    assert sink.stats.offsets_lost == member.stats.offsets_lost == 3


def test_a_gap_is_said_once_though_the_expectation_goes_back_after_a_broker_restart():
    """After a broker restart the sink expects each partition from what it stored again;
    the third attack round saw the same lost offsets said after every outage."""
    from kafka.consumer.fetcher import ConsumerRecord

    from ckptwatch.kafka.consumer import OffsetGaps

    def rec(offset: int) -> ConsumerRecord:
        return ConsumerRecord("ev", 0, None, offset, 0, 0, None, b"v", None, None, 1, 0, 0)

    tp = TopicPartition("ev", 0)
    gaps = OffsetGaps()
    gaps.expect(tp, 8)
    assert gaps.check([rec(10), rec(11)]) == [(tp, 8, 10)]
    gaps.expect(tp, 8)  # the broker came back: fetch again from what is stored
    assert gaps.check([rec(10), rec(11), rec(12)]) == []
    gaps.expect(tp, 8)
    assert gaps.behind({tp: 14}) == [(tp, 10, 14)]  # only what is new of a wider gap
