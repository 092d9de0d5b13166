"""Progress lines (``metric`` events) go to the detector per batch (Detector.process_frame),
not one Ev each: the same incidents as event by event, and the per-rank store answers
"the last step before" and "the first line after" as the list of Ev it replaced did."""

from __future__ import annotations

import datetime as dt
import math

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


def long_job() -> pl.DataFrame:
    """Two ranks, 2,800 steps a second apart, a save every 200 steps. Rank 1 logs no end for
    the save of step 400 (its next progress line ends it) and the job fails at 500 s; it goes
    on, and fails again in the save of step 2,800, which rank 1 does not finish."""
    from test_cause import ev as event
    from test_cause import world

    rows = world(2)
    for step in range(1, 2801):
        rows += [event("metric", step, rank=r, step=step, loss=2.0 - step / 3000) for r in (0, 1)]
        if step % 200 == 0:
            rows += [event("save_start", step + 0.5, rank=r, step=step) for r in (0, 1)]
            rows += [event("save_end", step + 0.6, rank=r, step=step) for r in ((0,) if step in (400, 2800) else (0, 1))]
        if step in (500, 2800):
            rows.append(event("job_failed", step + 0.7, exitcode=1))
    return pl.DataFrame(rows, schema_overrides={"ts": pl.Datetime("us", "UTC")})


def test_a_long_job_keeps_bounded_progress_and_the_same_incidents():
    from ckptwatch.detectors.runner import DetectorConfig

    events = long_job()
    batches = [events.slice(i, 1000) for i in range(0, events.height, 1000)]

    def feed(config):
        d = Detector(config)
        for b in batches:
            d.process_frame(b, now=NOW)
            d.jobs["job-a"].progress_by_rank  # filed batch by batch, as a live run's advance does
        return d

    unbounded = feed(DetectorConfig(progress_cap=10**9, payload_keep=10**9))
    bounded = feed(DetectorConfig(progress_cap=100, payload_keep=8))
    state = bounded.jobs["job-a"]
    lines = {r: len(b) for r, b in state.progress_by_rank.items()}
    assert set(lines) == {0, 1} and all(50 <= n <= 100 for n in lines.values()), lines  # cut to 50 past 100
    assert len(unbounded.jobs["job-a"].progress_by_rank[1]) == 2800
    assert state._payloads.stored() < 60_000  # the rows let go are released at the next compaction
    got = {}
    for name, d in (("unbounded", unbounded), ("bounded", bounded)):
        d.advance(final=True)
        got[name] = sorted((i.kind, i.step, i.root_cause and i.root_cause.rank, sorted(i.checkpoint_state.get(
            "started_not_finished", []))) for i in d.incidents() if i.status != "superseded")
    assert got["bounded"] == got["unbounded"] == [("interrupted_save", 2800, None, [1])], got
    # the save of step 400 ended at rank 1's next progress line, before the failure: that line
    # was found before it was let go
    (end,) = [v for (step, rank, _), v in state.implicit_memo.items() if (step, rank) == (400, 1)]
    assert (end.step, end.ts) == (401, T0 + dt.timedelta(seconds=401))
    # the saves each rank ended with its own line need no memo: it holds that one save alone,
    # so it grows with the saves ended implicitly, not with every save of a long job
    assert sorted((step, rank) for step, rank, _ in state.implicit_memo) == [(400, 1)]


def test_loss_curve_gives_back_its_points_in_arrival_order():
    from ckptwatch.detectors.jobstate import LossCurve

    points = [(T0 + dt.timedelta(seconds=s, microseconds=7), s, 2.0 - s / 10) for s in (3, 1, 2)]
    curve = LossCurve(points)
    curve.append((T0, 9, math.nan))
    assert len(curve) == 4 and list(curve)[:3] == points and curve[0] == points[0]
    assert curve[3][:2] == (T0, 9) and math.isnan(curve[3][2])
    curve.clear()
    assert list(curve) == [] and len(curve) == 0
