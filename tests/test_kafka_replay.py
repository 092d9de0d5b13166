"""A restarted detector replays its partition from where its live jobs begin, not from the
start of retention: a released job's events are not read again, and nothing is published
twice. Real broker."""

from __future__ import annotations

import datetime as dt

import polars as pl
import pytest
from kafka_support import fresh_config, topic_messages
from test_cause import saves, world

from ckptwatch.detectors import DetectorConfig
from ckptwatch.kafka.admin import ensure_topics
from ckptwatch.kafka.codec import encode_events
from ckptwatch.kafka.producer import Message, Publisher
from ckptwatch.schema import EVENT_SCHEMA
from ckptwatch.services.detect import DetectorMember

pytestmark = pytest.mark.kafka
HOUR = dt.timedelta(hours=1)


def job_events(job: str, sec0: float, *, finished: bool) -> list[dict]:
    evs = world(job=job) + [dict(e, job=job) for e in saves(20, sec0 + 1) + saves(20, sec0 + 2, end=True)]
    if not finished:
        evs += [dict(e, job=job) for e in saves(40, sec0 + 3)]  # a save still open: the job stays live
    return [dict(e, ts=e["ts"] + dt.timedelta(seconds=sec0) if e["kind"] == "world_size" else e["ts"]) for e in evs]


def drain(member: DetectorMember, now: dt.datetime, events: int) -> None:
    deadline = dt.datetime.now() + dt.timedelta(seconds=90)
    while not (member.joined and member.stats.events >= events and not any(map(member.behind, member.detectors))):
        member.step(now=now)
        assert dt.datetime.now() < deadline, "the detector did not catch up"
    member.step(now=now)


def test_a_restarted_detector_replays_only_the_live_jobs(kafka_bootstrap, tmp_path):
    cfg = fresh_config(kafka_bootstrap, tmp_path, partitions=1)
    ensure_topics(cfg.kafka)
    pub = Publisher(cfg.kafka, client_id="test-collector")
    done, live = job_events("job-done", 0, finished=True), job_events("job-live", 100, finished=False)

    def publish(events):
        values = encode_events(pl.DataFrame(events, schema=EVENT_SCHEMA))
        pub.publish([Message(cfg.kafka.events_topic, e["job"].encode(), v) for e, v in zip(events, values, strict=True)])

    publish(done)
    publish(live)
    config = DetectorConfig(release_after=60.0)
    wall = dt.datetime.now(dt.timezone.utc)
    m = DetectorMember(cfg, detector_config=config, poll_timeout=0.2)
    drain(m, wall, len(done) + len(live))
    assert set(next(iter(m.detectors.values())).jobs) == {"job-done", "job-live"}
    more = [dict(e, job="job-live") for e in saves(40, 200, ranks=[0])]  # job-live goes on; job-done idles
    publish(more)
    drain(m, wall + 2 * HOUR, len(done) + len(live) + len(more))
    det = next(iter(m.detectors.values()))
    assert "job-done" not in det.jobs and "job-done" in det.released
    published = len(topic_messages(kafka_bootstrap, cfg.kafka.incidents_topic))
    m.close()

    again = DetectorMember(cfg, detector_config=config, poll_timeout=0.2)
    drain(again, wall + 2 * HOUR, len(live) + len(more))
    det = next(iter(again.detectors.values()))
    assert again.stats.events == len(live) + len(more), "job-done's events were replayed"
    assert set(det.jobs) == {"job-live"}
    assert len(topic_messages(kafka_bootstrap, cfg.kafka.incidents_topic)) == published  # nothing published twice
    again.close()
    pub.close()
