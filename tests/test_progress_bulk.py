"""Progress lines (``metric`` events) go to the detector per batch (Detector.process_frame),
not one Ev each: the same incidents as event by event, and the per-rank store answers
"the last step before" and "the first line after" as the list of Ev it replaced did."""

from __future__ import annotations

import datetime as dt

import polars as pl

from ckptwatch.detectors.events import Ev
from ckptwatch.detectors.jobstate import RankProgress
from ckptwatch.detectors.runner import Detector
from ckptwatch.ingest.watcher import SourceWatcher
from ckptwatch.pipeline import extract_events
from ckptwatch.rules import RuleSet
from conftest import CORPUS, SCENARIOS

T0 = dt.datetime(2026, 11, 30, 10, 0, tzinfo=dt.timezone.utc)
NOW = dt.datetime.now(dt.timezone.utc)  # the arrival time of every batch: the corpus is dated as it was run


def scenario_events(scenario: str) -> pl.DataFrame:
    w = SourceWatcher([str(CORPUS / scenario / "logs")])
    rules, batches = RuleSet.load(), []
    while True:
        batches.append(extract_events(rules, w.poll(final=True), w.stats))
        if not w.backlog:
            break
    w.close()
    return pl.concat(batches)


def concluded(feed) -> list[dict]:
    d = Detector()
    feed(d)
    d.adopt_unlabelled()
    d.advance(final=True)
    out = []
    for inc in d.incidents():
        x = inc.to_dict()
        x.pop("detected_ts", None)
        out.append(x)
    return sorted(out, key=lambda x: x["id"])


def test_every_scenario_gives_the_same_incidents_in_bulk_as_event_by_event():
    metric_rows, incidents = 0, 0
    for s in SCENARIOS:
        events = scenario_events(s)
        metric_rows += events.filter(pl.col("kind") == "metric").height
        one_by_one = concluded(lambda d: d.process(events.iter_rows(named=True), now=NOW))
        # in three batches, as polls deliver them
        thirds = [events.slice(i * events.height // 3, events.height // 3 + 1) for i in range(3)]
        in_bulk = concluded(lambda d: [d.process_frame(b, now=NOW) for b in thirds])
        assert in_bulk == one_by_one, s
        incidents += len(one_by_one)
    assert incidents >= 10 and metric_rows > 100  # the comparison compares something, and the bulk path was taken


def ev(ts_s: float, step: int | None, sid: str = "a", offset: int = 0) -> Ev:
    return Ev(ts=T0 + dt.timedelta(seconds=ts_s), kind="metric", job="j", host=None, rank=0, local_rank=None,
              pid=None, step=step, path=None, rule_id="r", source_id=sid, offset=offset,
              line=f"step {step}", dedup_key=f"{sid}:{offset}", attrs={"loss": 1.5})


def test_out_of_order_blocks_are_merged_and_queries_return_the_lines():
    p = RankProgress()
    for i, (t, step) in enumerate([(1, 1), (2, 2), (5, 5), (6, 6)]):
        p.add(ev(t, step, offset=i * 10))
    p.add(ev(3, 3, sid="b", offset=7))  # a console read a poll behind the rank's file
    p.add(ev(4, None, sid="b", offset=9))  # a line without a step
    assert [(e.step, e.source_id) for e in p.events] == [(1, "a"), (2, "a"), (3, "b"), (None, "b"), (5, "a"),
                                                         (6, "a")]
    key, step = p.last_step_before((T0 + dt.timedelta(seconds=4.5), "", 0))
    assert step == 3 and key == (T0 + dt.timedelta(seconds=3), "b", 7)
    after = p.first_after(ev(3, 3, sid="b", offset=7), T0, 3, {})
    assert after.step is None and after.offset == 9 and after.line == "step None" and after.attrs == {"loss": 1.5}
    assert p.first_after(None, T0 + dt.timedelta(seconds=4), 5, {}).step == 6
    assert p.first_after(None, T0 + dt.timedelta(seconds=7), 0, {}) is None
