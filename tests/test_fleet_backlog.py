"""A collector that starts over a backlog publishes one file after another: rank 0's whole
history, then rank 1's. A fleet detector reading the partition half-way through judged
rank 1's end-of-save lines late by rank 0's time and paged complete saves as
``stalled_save`` (withdrawn once rank 1's lines came). A job's watermark now waits for
its sources still being read (``DetectorConfig.source_idle``). Real broker, real
collector, the detector in-process, stepped between the two files so the order is not left
to timing."""

from __future__ import annotations

import dataclasses
import datetime as dt
import time

import pytest
from kafka_support import fresh_config, topic_messages

from ckptwatch.detectors import Detector, DetectorConfig
from ckptwatch.ingest.layout import compile_template
from ckptwatch.kafka.codec import decode_incident
from ckptwatch.rules import RuleSet
from ckptwatch.services.collect import Collector
from ckptwatch.services.detect import DetectorMember

SAVES = 25  # 100 s apart: the history spans 2,500 s, more than a save may take (1,800 s)
START = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=1)).replace(microsecond=0)


def lines(rank: int, saves: range) -> str:
    out = []
    for i in saves:
        step, t = 10 * (i + 1), START + dt.timedelta(seconds=100.0 * (i + 1) + 0.01 * rank)
        path = f"/ckpt/job-b/step_{step}"
        for kind, at in (("save_start", t), ("save_end", t + dt.timedelta(seconds=2))):
            extra = " files=2 bytes=4096" if kind == "save_end" else ""
            out.append(f"{at:%Y-%m-%dT%H:%M:%S.%f}Z ckptwatch event={kind} step={step} rank={rank} world_size=2"
                       f"{extra} path={path}\n")
    return "".join(out)


def caught_up(member: DetectorMember, events: int) -> None:
    """Step ``member`` until it consumed ``events`` events in all and no partition has a
    backlog, then once more (each step asks for incidents)."""
    deadline = time.monotonic() + 60
    while not (member.joined and member.stats.events >= events and not any(map(member.behind, member.detectors))):
        member.step()
        assert time.monotonic() < deadline, "the detector did not catch up"
    member.step()


@pytest.mark.kafka
@pytest.mark.parametrize("rank1_first", [0, 3], ids=["rank1-unheard", "rank1-behind"])
def test_a_backlog_published_file_by_file_pages_no_complete_save(kafka_bootstrap, tmp_path, rank1_first):
    """``rank1_first``: saves of rank 1 published with rank 0's history. 3: rank 1 is heard
    from, far behind rank 0 (this failed before the fix: 3 false stalls paged, then
    withdrawn). 0: rank 1 is not heard from until its own file comes (rank 0's saves are
    complete by the ranks known to save, then rank 1's come whole: passed before too)."""
    logs = tmp_path / "logs" / "job-b"
    logs.mkdir(parents=True)
    cfg = fresh_config(kafka_bootstrap, tmp_path, partitions=1)
    cfg = dataclasses.replace(cfg, collect=dataclasses.replace(cfg.collect, paths=[str(tmp_path / "logs")]))
    (logs / "rank0.log").write_text(lines(0, range(SAVES)))
    (logs / "rank1.log").write_text(lines(1, range(rank1_first)))
    collector = Collector(cfg, rules=RuleSet.load(), template=compile_template("{job}/rank{rank}.log"))
    member = DetectorMember(cfg, poll_timeout=0.2)
    try:
        collector.step(final=True)  # the first file's backlog: what a detector may read before the second's
        caught_up(member, collector.published)
        with (logs / "rank1.log").open("a") as f:
            f.write(lines(1, range(rank1_first, SAVES)))
        collector.step(final=True)
        caught_up(member, collector.published)
        assert collector.published == 4 * SAVES
        open_saves = sum(det.open_saves() for det in member.detectors.values())
    finally:
        member.close()
        collector.close()
    published = [decode_incident(m.value) for m in topic_messages(kafka_bootstrap, cfg.kafka.incidents_topic)]
    assert [(i.kind, i.step, i.status) for i in published] == []
    assert open_saves == 0


def test_a_silent_source_holds_the_watermark_for_source_idle_seconds_only():
    """The detector alone, wall times explicit: rank 1's file stops (its rank hangs in the
    save of step 40) while rank 0's goes on, all read at once. For ``source_idle`` seconds after rank 1's last
    line arrived the job's watermark waits for it; then the stall is concluded all the same.
    Without ``source_idle`` (the embedded run) it is concluded at once."""
    from test_cause import T0, ev

    def events() -> list[dict]:
        out = []
        for i in range(SAVES):
            step, t = 10 * (i + 1), 100.0 * (i + 1)
            for r in (0, 1):
                if r == 0 or step <= 40:
                    out.append(ev("save_start", t, rank=r, step=step) | {"source_id": f"rank{r}"})
                if r == 0 or step < 40:
                    out.append(ev("save_end", t + 2, rank=r, step=step) | {"source_id": f"rank{r}"})
        return out

    def stalls(source_idle: float | None, wall: list[float]) -> list[list[int]]:
        d = Detector(DetectorConfig(source_idle=source_idle))
        d.process(events(), now=T0)
        return [sorted(i.step for i in d.advance(now=T0 + dt.timedelta(seconds=sec)) if i.kind == "stalled_save")
                for sec in wall]

    # saves 1,800 s before rank 0's newest line (rank 1 started none after 40), and step 70
    # once the job's silence moved its watermark on
    assert stalls(None, [0.0, 29.0, 31.0]) == [[40, 50, 60], [70], []]
    assert stalls(30.0, [0.0, 29.0, 31.0]) == [[], [], [40, 50, 60, 70]]
