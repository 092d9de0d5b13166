"""``ckptwatch run --kafka`` runs the detector and the sink in one process with one
:class:`~ckptwatch.sinks.metrics.Metrics`: both read the events topic, so both skip its
poison message and both find the offsets retention deleted before they read them. The
process counts each such message, and each lost offset, once
(``ckptwatch_records_skipped_total{reason="bad_message"|"offsets_lost"}``), while each stage
still says what it skipped. Real broker, real retention (``DeleteRecords``)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from kafka import KafkaAdminClient, TopicPartition
from kafka_support import fresh_config

from ckptwatch.kafka.admin import ensure_topics
from ckptwatch.kafka.producer import Message, Publisher
from ckptwatch.pipeline import PipelineOptions
from ckptwatch.services import launch
from ckptwatch.sinks.duckdb_store import Store
from ckptwatch.sinks.metrics import Metrics

pytestmark = pytest.mark.kafka

T0 = 1_764_489_600_000_000_000  # 2025-11-30T08:00:00Z in ns


def metric_event(o: int) -> bytes:
    """A metric line of job-a at source offset ``o``, as one message."""
    return json.dumps({"ts": T0 + o * 10**9, "kind": "metric", "job": "job-a", "source_id": "s", "offset": o,
                       "rule_id": "r", "line": f"step {o} loss 1.0", "attrs": '{"loss": 1.0}', "step": o}).encode()


def skipped(metrics: Metrics, reason: str) -> float | None:
    return metrics.registry.get_sample_value("ckptwatch_records_skipped_total", {"reason": reason})


def test_run_kafka_counts_a_poison_message_and_lost_offsets_once(kafka_bootstrap, tmp_path):
    cfg = fresh_config(kafka_bootstrap, tmp_path, partitions=1)
    (tmp_path / "logs").mkdir()  # the collector has nothing to publish: the test does
    cfg = dataclasses.replace(cfg, collect=dataclasses.replace(cfg.collect, paths=[str(tmp_path / "logs")]))
    k = cfg.kafka
    ensure_topics(k)
    tp = TopicPartition(k.events_topic, 0)
    pub = Publisher(k, client_id="test-skip-counts")
    store = Store(cfg.sink.db)
    try:
        pub.publish([Message(k.events_topic, b"job-a", metric_event(o)) for o in range(3)])
        first = Metrics()  # a first run reads offsets 0..2: both groups go on at 3
        launch.run_all(cfg, PipelineOptions(), store, once=True, until_idle=0.5, say=lambda m: None, metrics=first)
        assert skipped(first, "bad_message") is None and skipped(first, "offsets_lost") is None  # none yet
        # while it is away: offsets 3 and 4, a tombstone at 5, then 6; retention takes 3 and 4
        pub.publish([Message(k.events_topic, b"job-a", metric_event(o)) for o in (3, 4)] +
                    [Message(k.events_topic, b"job-a", None), Message(k.events_topic, b"job-a", metric_event(6))])
        admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, client_id="test-skip-counts")
        try:
            admin.delete_records({tp: 5})
        finally:
            admin.close()
        metrics, said = Metrics(), []
        collector, member, sink = launch.run_all(cfg, PipelineOptions(), store, once=True, until_idle=0.5,
                                                 say=said.append, metrics=metrics)
        kept = store.con.execute('SELECT "offset" FROM events ORDER BY 1').fetchall()
    finally:
        pub.close()
        store.close()
    assert kept == [(0,), (1,), (2,), (6,)]
    # each stage met both and says so ...
    assert member.stats.bad_messages == sink.stats.bad_messages == 1
    assert member.stats.offsets_lost == sink.stats.offsets_lost == 2
    assert len([m for m in said if f"{k.events_topic} partition 0 offset 5: skipped: " in m]) == 2
    assert len([m for m in said if "offsets 3 to 4 (2 message(s)) were never received" in m]) == 2
    # ... and the process counts the message once, and each lost offset once
    assert skipped(metrics, "bad_message") == 1.0
    assert skipped(metrics, "offsets_lost") == 2.0
    assert 'ckptwatch_records_skipped_total{reason="bad_message"} 1.0' in metrics.exposition()
