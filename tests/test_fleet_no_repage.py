"""Issue 17, no page storms: a fleet sink whose database is deleted under it, and that starts
again on a new file, does not page again what it paged.

The incidents topic keeps 7 days of incidents, and a new database reads it from the
beginning. The sink's notification log is mirrored to the compacted notifications topic
and restored from it into a new database before anything is consumed: the incidents paged
before are not paged again, a new incident is paged once, and a resolve of an incident
paged by the lost database still goes out. Real Kafka broker; real HTTP receiver.
"""

from __future__ import annotations

import dataclasses
import os
import time

import pytest
from alert_support import sent, version
from kafka_support import fresh_config

from ckptwatch.config import AlertSettings
from ckptwatch.kafka.admin import ensure_topics
from ckptwatch.kafka.codec import encode_incident
from ckptwatch.kafka.producer import Message, Publisher
from ckptwatch.pipeline import diagnose
from ckptwatch.services.sink import SinkMember
from ckptwatch.sinks.alerts.setup import alerter_from_config
from ckptwatch.sinks.duckdb_store import Store

pytestmark = pytest.mark.kafka


def _publish(cfg, *incs) -> None:
    ensure_topics(cfg.kafka)  # what the detector stage does before it publishes
    pub = Publisher(cfg.kafka, client_id="test-incidents")
    try:
        pub.publish([Message(cfg.kafka.incidents_topic, i.id.encode(), encode_incident(i)) for i in incs])
    finally:
        pub.close()


def _sink(cfg, hook: str):
    store = Store(cfg.sink.db)
    settings = AlertSettings(channels={"hook": {"type": "webhook", "url": hook}})
    alerter = alerter_from_config(settings, store, db_path=cfg.sink.db)
    said: list[str] = []
    return store, SinkMember(cfg, store, alerter=alerter, poll_timeout=0.2, on_message=said.append), said


def _pump(sink, until, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sink.step()
        if until():
            return
    pytest.fail("timed out")


def _stored(store) -> int:
    return store.con.execute("SELECT count(*) FROM incidents").fetchone()[0]


def test_a_new_database_under_a_running_fleet_pages_nothing_twice(kafka_bootstrap, tmp_path, httpserver):
    from conftest import CORPUS

    httpserver.expect_request("/hook").respond_with_data("ok")
    hook = httpserver.url_for("/hook")
    cfg = fresh_config(kafka_bootstrap, tmp_path, partitions=2)
    cfg = dataclasses.replace(cfg, sink=dataclasses.replace(cfg.sink, db=str(tmp_path / "sink.duckdb")))
    incidents, _ = diagnose([str(CORPUS / "02-sigkill-mid-save" / "logs")])
    assert len(incidents) == 3
    _publish(cfg, *incidents)

    store, sink, _ = _sink(cfg, hook)
    try:
        _pump(sink, lambda: len(sent(httpserver, "/hook")) == 3)
        for _ in range(5):
            sink.step()  # the mirror is published after the step that delivered
    finally:
        sink.close()
        store.close()
    first = sent(httpserver, "/hook")
    assert sorted((p["action"], p["incident"]["kind"]) for p in first) == [
        ("trigger", "interrupted_save"), ("trigger", "load_failure"), ("trigger", "poisoned_resume")]

    for suffix in ("", ".wal", ".snapshot.duckdb"):  # the database is lost
        if os.path.exists(cfg.sink.db + suffix):
            os.remove(cfg.sink.db + suffix)

    store, sink, said = _sink(cfg, hook)
    try:
        # three incidents told to two channels: the webhook and the console (always on)
        assert any("6 notification(s) already sent restored" in m for m in said), said
        _pump(sink, lambda: _stored(store) == 3)  # the whole incidents topic read again
        for _ in range(10):
            sink.step()
        assert len(sent(httpserver, "/hook")) == 3  # nothing paged again

        (late,) = diagnose([str(CORPUS / "03-collective-timeout" / "logs" / "attempt-1-train")])[0]
        paged = next(i for i in incidents if i.kind == "interrupted_save")
        _publish(cfg, late, version(paged, status="resolved"))
        _pump(sink, lambda: len(sent(httpserver, "/hook")) == 5)
        for _ in range(10):
            sink.step()
        new = sent(httpserver, "/hook")[3:]
        assert sorted((p["action"], p["incident"]["id"]) for p in new) == sorted(
            [("trigger", late.id), ("resolve", paged.id)])
        rows = store.con.execute("SELECT count(*) FROM alerts WHERE last_error = "
                                 "'restored from the notifications topic'").fetchone()
        assert rows == (6,)
    finally:
        sink.close()
        store.close()
