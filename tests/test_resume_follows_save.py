"""Issue 14: a resume-side incident follows the fate of the save incident it cites, in every
mode and every delivery order.

The story: job-a saves step 40 on four ranks; rank 2's end-of-save line is held back (its
collector was killed with kill -9 during publication and re-publishes after a restart).
Meanwhile job-a goes quiet, so the save looks stalled, and job-b resumes from step 40. When
rank 2's line finally arrives the checkpoint is whole: the ``stalled_save`` and the
``poisoned_resume`` that cited it are withdrawn (status ``superseded``, with the reason in
``checkpoint_state["withdrawn"]``), their pages are resolved, and what is left is exactly
what the in-order run finds: nothing. Had the line arrived before the resume, no
``poisoned_resume`` is ever created.

Streaming is driven with explicit wall times (``now``), as the embedded runner and the
fleet detector do; the fleet test goes through the real broker."""

from __future__ import annotations

import datetime as dt
import random

import pytest
from test_cause import T0, ev, saves, world

from ckptwatch.detectors import Detector, DetectorConfig, Incident
from ckptwatch.detectors.save_incidents import SaveWindows

STALL = SaveWindows(stall_after=60.0)  # a save with no end is stalled 60 s after its start
LATENESS = 5.0


def at(sec: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=sec)


class Story:
    """The events, built once per test so that re-delivering one is a duplicate (same
    ``(source_id, offset)``). Times in seconds after T0."""

    def __init__(self, *, end_at: float = 12.5, load_at: float = 100.0, crash: bool = False) -> None:
        a = world(job="job-a") + saves(20, 1) + saves(20, 2, end=True) + saves(40, 10)
        self.saver = a + saves(40, 12, [0, 1, 3], end=True)  # job-a, but for rank 2's end of save 40
        if crash:  # rank 2 is SIGKILLed in the save: it never ends it
            self.saver += [ev("process_exit", 12.2, pid=102, exitcode=-9, reporter="agent")]
        self.late_end = [] if crash else saves(40, end_at, [2], end=True)
        self.resume = world(job="job-b") + [ev("load_start", load_at, rank=r, step=40, job="job-b") | {"path": "/c/step_40"}
                                            for r in range(4)]

    def everything(self) -> list[dict]:
        return self.saver + self.late_end + self.resume


def deliver(script: list[tuple[float, list[dict] | None]], **config) -> tuple[Detector, list[Incident]]:
    """Feed ``(wall second, events)`` steps to a detector (``config``: more
    :class:`DetectorConfig`), advancing after each one; returns it and every incident
    version it emitted, in order."""
    d = Detector(DetectorConfig(allowed_lateness=LATENESS, windows=STALL, **config))
    emitted: list[Incident] = []
    for sec, events in script:
        if events:
            d.process(events, now=at(sec))
        emitted += [Incident.from_dict(i.to_dict()) for i in d.advance(now=at(sec))]  # a snapshot of each version
    return d, emitted


def final(d: Detector) -> set[tuple]:
    """What a run leaves standing (superseded and withdrawn incidents are no longer any)."""
    return {(i.id, i.kind, i.job, i.step, i.status) for i in d.incidents() if i.status != "superseded"}


def in_order(story: Story, *, until: int = 300) -> set[tuple]:
    """The reference: every event delivered half a second after it was written, in
    event-time order, the detector advancing every 10 s of wall time besides."""
    lines = [((e["ts"] - T0).total_seconds() + 0.5, [e]) for e in sorted(story.everything(), key=lambda e: e["ts"])]
    ticks = [(float(sec), None) for sec in range(0, until + 1, 10)]
    d, _ = deliver(sorted(lines + ticks, key=lambda step: (step[0], step[1] is None)))
    return final(d)


def kinds(emitted: list[Incident]) -> list[tuple[str, str]]:
    return [(i.kind, i.status) for i in emitted]


def test_in_order_a_resume_from_a_whole_checkpoint_is_no_incident():
    d, emitted = deliver([(13, Story().everything()), (80, None), (300, None)])
    assert emitted == [] and final(d) == set()


def test_a_resume_citing_a_stall_that_finishes_after_all_is_withdrawn_with_it():
    """The issue: the stall is seen, the resume cites it, then the late end arrives."""
    story = Story()
    d, emitted = deliver([(13, story.saver), (80, None)])
    (stalled,) = emitted
    assert (stalled.kind, stalled.status) == ("stalled_save", "open")
    _, more = d.process(story.resume, now=at(100)), d.advance(now=at(100))
    (poisoned,) = more
    assert (poisoned.kind, poisoned.status, poisoned.severity) == ("poisoned_resume", "open", "critical")
    assert poisoned.checkpoint_state["marked_bad_by"] == stalled.id

    d.process(story.late_end, now=at(120))  # the collector is back: rank 2's line of 12.5 s
    withdrawn = {i.kind: i for i in d.advance(now=at(120))}
    assert set(withdrawn) == {"stalled_save", "poisoned_resume"}
    s, p = withdrawn["stalled_save"], withdrawn["poisoned_resume"]
    assert (s.id, s.status, p.id, p.status) == (stalled.id, "superseded", poisoned.id, "superseded")
    assert "finished on every rank" in s.checkpoint_state["withdrawn"]
    assert "within the 60 s" in s.checkpoint_state["withdrawn"]
    assert stalled.id in p.checkpoint_state["withdrawn"] and "whole" in p.checkpoint_state["withdrawn"]
    assert p.remediation.startswith("Withdrawn:") and s.remediation.startswith("Withdrawn:")
    assert d.advance(now=at(300)) == []  # nothing re-opens as time goes on
    assert final(d) == in_order(story) == set()


def test_the_end_arriving_before_the_resume_never_creates_a_poisoned_resume():
    story = Story()
    d, emitted = deliver([(13, story.saver), (80, None), (90, story.late_end), (100, story.resume), (300, None)])
    assert kinds(emitted) == [("stalled_save", "open"), ("stalled_save", "superseded")]
    assert final(d) == in_order(story) == set()


@pytest.mark.parametrize("end_arrives, seen", [
    (16, []),  # within the allowed lateness of the resume (14 s): judged once the watermark passes it
    (30, [("poisoned_resume", "open"), ("poisoned_resume", "superseded")]),  # beyond it
])
def test_a_resume_of_a_save_not_seen_to_finish_follows_the_late_end(end_arrives, seen):
    """No stall yet: job-b resumes at 14 s, right after the save; rank 2's end comes late."""
    story = Story(load_at=14)
    d, emitted = deliver([(14, story.saver + story.resume), (end_arrives - 1, None),
                          (end_arrives, story.late_end), (300, None)])
    assert kinds(emitted) == seen
    if seen:
        assert emitted[0].checkpoint_state["reason"] == "never_finished"
        assert "finished on every rank" in emitted[-1].checkpoint_state["withdrawn"]
    assert final(d) == in_order(story) == set()


def test_redelivered_events_change_nothing():
    """A restarted collector re-publishes what it had published: before the late line, with
    it, and after it."""
    story = Story()
    d, emitted = deliver([(13, story.saver), (80, None), (100, story.resume), (110, story.saver + story.resume),
                          (120, story.everything()), (130, story.everything() + story.late_end), (300, None)])
    assert kinds(emitted) == [("stalled_save", "open"), ("poisoned_resume", "open"), ("stalled_save", "superseded"),
                              ("poisoned_resume", "superseded")]
    assert d.stats.duplicates == 3 * len(story.saver) + 3 * len(story.resume) + 2 * len(story.late_end)
    assert final(d) == in_order(story) == set()


def test_a_resume_of_a_job_released_meanwhile_is_withdrawn_all_the_same():
    """Rank 2's line comes long after job-b went quiet and left memory (bounded state): the
    open poisoned resume was kept for this, and is withdrawn."""
    story = Story()
    d, emitted = deliver([(13, story.saver), (80, None), (100, story.resume), (150, None), (200, None)],
                         release_after=30.0)
    assert "job-b" in d.released and "job-b" not in d.jobs and "job-a" in d.jobs  # the stall keeps job-a
    assert kinds(emitted) == [("stalled_save", "open"), ("poisoned_resume", "open")]
    d.process(story.late_end, now=at(210))
    assert sorted(kinds(d.advance(now=at(210)))) == [("poisoned_resume", "superseded"), ("stalled_save", "superseded")]
    assert [i for i in d.incidents() if i.status != "superseded"] == []


@pytest.mark.parametrize("seed", range(12))
def test_any_order_in_small_batches_ends_as_the_in_order_run(seed):
    """Line by line or a few lines at a time, shuffled, some lines twice, the clock moving
    on between batches: what stands at the end is what the in-order run finds, and no
    page stays open."""
    rng = random.Random(seed)
    story = Story()
    lines = story.everything()
    lines = lines + rng.sample(lines, 6)  # re-deliveries
    rng.shuffle(lines)
    script, sec, i = [], 13.0, 0
    while i < len(lines):
        n = rng.choice((1, 1, 2, 3))
        script.append((sec, lines[i:i + n]))
        i, sec = i + n, sec + rng.choice((0.5, 5.0, 40.0))
    d, emitted = deliver(script + [(sec + 300, None)])
    assert final(d) == in_order(story) == set()
    assert all(i.status != "open" for i in d.incidents())


def test_a_checkpoint_that_really_is_partial_stays_poisoned_in_every_order():
    story = Story(crash=True)
    reference = in_order(story)
    assert {k for _, k, *_ in reference} == {"interrupted_save", "poisoned_resume"}
    assert all(status == "open" for *_, status in reference)
    for script in ([(13, story.saver), (80, None), (100, story.resume), (300, None)],
                   [(13, story.resume), (14, story.saver), (100, None), (300, story.everything()), (600, None)]):
        d, _ = deliver(script)
        assert final(d) == reference


def test_a_save_that_really_stalled_and_then_finished_resolves_and_the_resume_is_withdrawn():
    """Rank 2 ends the save 90 s after it began (past the 60 s stall window): the stall was
    real, so it is resolved, not withdrawn; the checkpoint is whole all the same."""
    story = Story(end_at=100, load_at=95)
    d, emitted = deliver([(13, story.saver), (80, None), (95, story.resume), (101, story.late_end), (300, None)])
    assert kinds(emitted) == [("stalled_save", "open"), ("poisoned_resume", "open"), ("stalled_save", "resolved"),
                              ("poisoned_resume", "superseded")]
    assert "withdrawn" not in emitted[2].checkpoint_state
    assert "finished on every rank" in emitted[-1].checkpoint_state["withdrawn"]
    (stall,) = final(d)
    assert stall[1:] == ("stalled_save", "job-a", 40, "resolved")
    assert final(d) == in_order(story)


# -- the embedded pipeline (ckptwatch run) and diagnose, over real log lines -----------------

def log_line(sec: float, event: str, rank: int, step: int = 40) -> str:
    ts = at(sec).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return f"{ts} ckptwatch event={event} step={step} rank={rank} world_size=4 path=/ckpt/a/step_{step}\n"


def log_lines(*, end_at: float = 12.5) -> dict[str, list[tuple[float, str]]]:
    """``(event second, line)`` per file: job-a saves 20 and 40 (rank 2 ends 40 at
    ``end_at``), job-b resumes from 40 at 100 s."""
    files: dict[str, list[tuple[float, str]]] = {}
    for r in range(4):
        files[f"job-a/rank{r}.log"] = [(1, log_line(1, "save_start", r, 20)), (2, log_line(2, "save_end", r, 20)),
                                       (10, log_line(10, "save_start", r)),
                                       (end_at if r == 2 else 12, log_line(end_at if r == 2 else 12, "save_end", r))]
        files[f"job-b/rank{r}.log"] = [(100, log_line(100, "resume", r))]
    return files


LATE = ("job-a/rank2.log", 3)  # rank 2's end of save 40


def embedded(tmp_path, name: str):
    """An embedded runner over ``tmp_path/name`` (logs) and ``name.duckdb``, alerting on the
    console channel into a buffer."""
    import io

    from rich.console import Console

    from ckptwatch.config import AlertSettings
    from ckptwatch.embedded import EmbeddedRunner
    from ckptwatch.ingest.layout import compile_template
    from ckptwatch.pipeline import PipelineOptions
    from ckptwatch.sinks.alerts.setup import alerter_from_config

    logs, db = tmp_path / name, str(tmp_path / f"{name}.duckdb")
    logs.mkdir()
    out = io.StringIO()
    options = PipelineOptions(template=compile_template("{job}/rank{rank}.log"),
                              detector=DetectorConfig(allowed_lateness=LATENESS, windows=STALL))
    runner = EmbeddedRunner(str(logs), db, options, alerter=lambda store, metrics: alerter_from_config(
        AlertSettings(), store, db_path=db, console=Console(file=out, width=200)))
    return runner, logs, out


def stream(tmp_path, name: str, order: list[tuple[float, tuple[str, int] | None]]):
    """Append each ``(wall second, (file, line index))`` to its file and run a cycle, with a
    cycle every 10 s of wall time besides, up to 300 s; then deliver the alerts. Returns the
    runner's database rows ``{kind: (status, withdrawn reason)}``, the alerts sent
    ``[(kind, action)]`` and the console output."""
    files = log_lines()
    runner, logs, out = embedded(tmp_path, name)
    ticks = [(float(sec), None) for sec in range(10, 301, 10)]
    try:
        for sec, what in sorted(order + ticks, key=lambda step: (step[0], step[1] is None)):
            if what is not None:
                path = logs / what[0]
                path.parent.mkdir(exist_ok=True)
                with path.open("a") as f:
                    f.write(files[what[0]][what[1]][1])
            runner.cycle(now=at(sec))
        runner.alerter.drain(10)
        con = runner.store.con
        rows = {k: (s, w) for k, s, w in con.execute(
            "SELECT kind, status, checkpoint_state->>'withdrawn' FROM incidents").fetchall()}
        alerts = con.execute("SELECT i.kind, a.action FROM alerts a JOIN incidents i ON i.id = a.incident_id "
                             "WHERE a.status = 'sent' ORDER BY a.id").fetchall()
    finally:
        runner.close()
    return rows, alerts, out.getvalue()


def every_line(but: tuple[str, int] | None = None) -> list[tuple[str, int]]:
    """Every line of :func:`log_lines` but ``but``, in event-time order."""
    files = log_lines()
    return [(f, i) for sec, f, i in sorted((sec, f, i) for f, lines in files.items() for i, (sec, _) in enumerate(lines))
            if (f, i) != but]


def test_embedded_in_order_finds_nothing(tmp_path):
    files = log_lines()
    order = [(files[f][i][0] + 0.5, (f, i)) for f, i in every_line()]
    assert stream(tmp_path, "in-order", order)[:2] == ({}, [])


def test_embedded_line_by_line_the_late_end_withdraws_the_stall_and_the_resume_and_resolves_their_pages(tmp_path):
    a = [(13 + 0.1 * n, x) for n, x in enumerate(every_line(but=LATE)) if x[0].startswith("job-a")]
    b = [(100 + 0.1 * n, x) for n, x in enumerate(every_line()) if x[0].startswith("job-b")]
    rows, alerts, console = stream(tmp_path, "late", a + b + [(120, LATE)])
    assert set(rows) == {"stalled_save", "poisoned_resume"}
    assert all(status == "superseded" and "finished on every rank after all" in why for status, why in rows.values())
    assert alerts == [("stalled_save", "trigger"), ("poisoned_resume", "trigger"), ("stalled_save", "resolve"),
                      ("poisoned_resume", "resolve")]
    assert "superseded poisoned_resume: job job-b step 40" in console
    # what stands is what the in-order run stored: nothing
    assert {k: v for k, v in rows.items() if v[0] != "superseded"} == {}


def test_embedded_the_end_before_the_resume_creates_no_poisoned_resume(tmp_path):
    a = [(13 + 0.1 * n, x) for n, x in enumerate(every_line(but=LATE)) if x[0].startswith("job-a")]
    b = [(100 + 0.1 * n, x) for n, x in enumerate(every_line()) if x[0].startswith("job-b")]
    rows, alerts, _ = stream(tmp_path, "end-first", a + [(90, LATE)] + b)
    assert set(rows) == {"stalled_save"} and rows["stalled_save"][0] == "superseded"
    assert alerts == [("stalled_save", "trigger"), ("stalled_save", "resolve")]


def test_embedded_restarted_before_the_late_end_still_withdraws_what_it_had_stored(tmp_path):
    """``ckptwatch run`` is restarted between the poisoned resume and rank 2's late line:
    rebuilt from the stored events it would not find the stall again (the wall time that
    concluded it is gone), but the open incidents it stored are its own to withdraw."""
    from ckptwatch.embedded import EmbeddedRunner

    files = log_lines()
    runner, logs, _ = embedded(tmp_path, "restart")

    def write(what: tuple[str, int]) -> None:
        (logs / what[0]).parent.mkdir(exist_ok=True)
        with (logs / what[0]).open("a") as f:
            f.write(files[what[0]][what[1]][1])

    seen = []
    for job, start, ticks in (("job-a", 13, range(20, 91, 10)), ("job-b", 100, (110, 120))):
        for n, what in enumerate(w for w in every_line(but=LATE) if w[0].startswith(job)):
            write(what)
            seen += runner.cycle(now=at(start + 0.1 * n))
        seen += [i for sec in ticks for i in runner.cycle(now=at(sec))]
    # (the resume is stored from its first rank's line on, and again as the others come)
    assert list(dict.fromkeys((i.kind, i.status) for i in seen)) == [("stalled_save", "open"),
                                                                     ("poisoned_resume", "open")]
    runner.close()
    runner = EmbeddedRunner(str(logs), str(tmp_path / "restart.duckdb"), runner.options)
    try:
        write(LATE)
        seen = [(i.kind, i.status) for sec in range(130, 301, 10) for i in runner.cycle(now=at(sec))]
        rows = runner.store.con.execute("SELECT kind, status FROM incidents ORDER BY kind").fetchall()
    finally:
        runner.close()
    assert sorted(seen) == rows == [("poisoned_resume", "superseded"), ("stalled_save", "superseded")]


def test_diagnose_reads_the_files_whole_and_finds_nothing(tmp_path):
    from ckptwatch.ingest.layout import compile_template
    from ckptwatch.pipeline import PipelineOptions, diagnose

    for f, lines in log_lines().items():
        (tmp_path / f).parent.mkdir(exist_ok=True)
        # rank 2's end of save written last, after the resume lines: a file's order is not time's
        (tmp_path / f).write_text("".join(line for _, line in lines))
    (tmp_path / "job-a" / "rank2.log").write_text("".join(line for _, line in log_lines()["job-a/rank2.log"][:3]))
    with (tmp_path / "job-a" / "rank2.log").open("a") as f:
        f.write(log_lines()["job-a/rank2.log"][3][1] * 2)  # and written twice
    options = PipelineOptions(template=compile_template("{job}/rank{rank}.log"),
                              detector=DetectorConfig(allowed_lateness=LATENESS, windows=STALL))
    incidents, stats = diagnose([str(tmp_path)], options)
    assert stats.errors == [] and incidents == []
    # without that line the resume is poisoned: the files are read as they should be
    (tmp_path / "job-a" / "rank2.log").write_text("".join(line for _, line in log_lines()["job-a/rank2.log"][:3]))
    (poisoned,) = diagnose([str(tmp_path)], options)[0]
    assert (poisoned.kind, poisoned.status, poisoned.checkpoint_state["reason"]) == (
        "poisoned_resume", "open", "never_finished")


# -- fleet: the real broker ---------------------------------------------------------------

class Fleet:
    """A detector member and a sink (alerting on the console channel) on fresh topics of the
    real broker, and a publisher standing in for the collector. Times are wall seconds."""

    def __init__(self, bootstrap: str, tmp_path) -> None:
        import io

        from kafka_support import fresh_config
        from rich.console import Console

        from ckptwatch.config import AlertSettings
        from ckptwatch.kafka.producer import Publisher
        from ckptwatch.services.sink import SinkMember
        from ckptwatch.sinks.alerts.setup import alerter_from_config
        from ckptwatch.sinks.duckdb_store import Store

        self.bootstrap = bootstrap
        self.cfg = cfg = fresh_config(bootstrap, tmp_path, partitions=3)
        self.publisher = Publisher(cfg.kafka, client_id="test-collector")
        self.member = self.new_member()
        self.store = Store(cfg.sink.db)
        self.alerter = alerter_from_config(AlertSettings(), self.store, db_path=cfg.sink.db,
                                           console=Console(file=io.StringIO(), width=200))
        self.sink = SinkMember(cfg, self.store, alerter=self.alerter, poll_timeout=0.2)
        self.consumed, self.read = 0, set()

    def new_member(self):
        """A detector member: a new one is a detector restarted (it replays its partitions)."""
        from ckptwatch.services.detect import DetectorMember

        self.consumed = 0
        return DetectorMember(self.cfg, detector_config=DetectorConfig(allowed_lateness=LATENESS, windows=STALL),
                              poll_timeout=0.2)

    def restart_detector(self) -> None:
        self.member.close()
        self.member = self.new_member()

    def publish(self, events: list[dict]) -> None:
        import polars as pl

        from ckptwatch.kafka.codec import encode_events
        from ckptwatch.kafka.producer import Message
        from ckptwatch.schema import EVENT_SCHEMA

        values = encode_events(pl.DataFrame(events, schema=EVENT_SCHEMA))
        self.publisher.publish([Message(self.cfg.kafka.events_topic, e["job"].encode(), v)
                                for e, v in zip(events, values, strict=True)])

    def step(self, sec: float, events: int) -> list[tuple[str, str]]:
        """The detector steps at wall second ``sec`` until ``events`` more events were
        consumed and no partition has a backlog, then the sink until it has read
        everything; returns ``(kind, status)`` of the incident versions published meanwhile."""
        from kafka_support import topic_messages

        from ckptwatch.kafka.codec import decode_incident

        deadline = dt.datetime.now() + dt.timedelta(seconds=90)
        m = self.member
        while not (m.joined and m.stats.events >= self.consumed + events and not any(map(m.behind, m.detectors))):
            m.step(now=at(sec))
            assert dt.datetime.now() < deadline, "the detector did not catch up"
        m.step(now=at(sec))
        self.consumed += events
        idle = 0
        while idle < 2:
            idle = idle + 1 if self.sink.step() == 0 else 0
            assert dt.datetime.now() < deadline, "the sink did not catch up"
        new = [m for m in topic_messages(self.bootstrap, self.cfg.kafka.incidents_topic)
               if (m.partition, m.offset) not in self.read]
        self.read.update((m.partition, m.offset) for m in new)
        return sorted((i.kind, i.status) for i in (decode_incident(m.value) for m in new))

    def partitions(self) -> dict[str, int]:
        return {job: tp.partition for tp, det in self.member.detectors.items() for job in det.jobs}

    def stored(self) -> tuple[list, list, int]:
        """Delivers the alerts, then: the sink's incidents ``(kind, status, withdrawn)``, the
        alerts sent ``(kind, action)`` and the number of events stored."""
        self.alerter.drain(10)
        con = self.store.con
        rows = con.execute("SELECT kind, status, checkpoint_state->>'withdrawn' FROM incidents ORDER BY kind").fetchall()
        sent = con.execute("SELECT i.kind, a.action FROM alerts a JOIN incidents i ON i.id = a.incident_id "
                           "WHERE a.status = 'sent' ORDER BY i.kind, a.id").fetchall()
        return rows, sent, con.execute("SELECT count(*) FROM events").fetchone()[0]

    def close(self) -> None:
        from kafka_support import assert_no_version_twice

        self.member.close()
        self.sink.close()
        self.store.close()
        self.publisher.close()
        assert_no_version_twice(self.bootstrap, self.cfg.kafka.incidents_topic)


WITHDRAWN_BOTH = [("poisoned_resume", "superseded"), ("stalled_save", "superseded")]
PAGED_AND_RESOLVED = [("poisoned_resume", "trigger"), ("poisoned_resume", "resolve"), ("stalled_save", "trigger"),
                      ("stalled_save", "resolve")]


@pytest.mark.kafka
def test_fleet_a_late_end_withdraws_the_stall_and_the_resume_through_kafka(kafka_bootstrap, tmp_path):
    """Events published to the events topic in the bad order (rank 2's end after the stall
    and the resume), and everything published again by a restarted collector; job-a and
    job-b land in different partitions (the resume's detector learns of the save from the
    other partition's detector). The incidents topic ends with both withdrawn, the sink's
    database holds nothing open, and the pages the sink sent are resolved. A detector
    restarted afterwards replays it all and re-opens nothing."""
    story, fleet = Story(), Fleet(kafka_bootstrap, tmp_path)
    try:
        fleet.publish(story.saver)
        assert fleet.step(13, len(story.saver)) == []
        assert fleet.step(80, 0) == [("stalled_save", "open")]
        fleet.publish(story.resume)
        assert fleet.step(100, len(story.resume)) == [("poisoned_resume", "open")]
        # the collector restarts after a kill -9: what it had published comes again, then the late line
        fleet.publish(story.saver + story.resume)
        assert fleet.step(110, len(story.saver) + len(story.resume)) == []
        fleet.publish(story.late_end + story.everything())
        assert fleet.step(120, len(story.late_end) + len(story.everything())) == WITHDRAWN_BOTH
        assert fleet.step(300, 0) == []
        partitions = fleet.partitions()
        # the detector is restarted too (kill -9, a rebalance): it replays the partitions and
        # learns both topics from their start again; nothing it reads back re-opens anything
        fleet.restart_detector()
        assert fleet.step(310, len(story.everything())) == []
        for sec in (320, 330, 600):
            assert fleet.step(sec, 0) == []
        rows, sent, stored_events = fleet.stored()
    finally:
        fleet.close()
    assert partitions["job-a"] != partitions["job-b"]
    assert [(k, s) for k, s, _ in rows] == WITHDRAWN_BOTH
    assert all("finished on every rank after all" in why for _, _, why in rows)
    assert sent == PAGED_AND_RESOLVED
    assert stored_events == len(story.everything())  # each event once, re-deliveries and all
    assert {(k, s) for k, s, _ in rows if s != "superseded"} == set() == in_order(story)


@pytest.mark.kafka
def test_fleet_a_detector_restarted_before_the_late_end_still_withdraws_what_it_had_published(kafka_bootstrap,
                                                                                              tmp_path):
    """The detector restarts between the poisoned resume and rank 2's late line: rebuilt
    from the events, it would not find the stall again (the wall time that concluded it
    is gone), but what was published is its own to withdraw."""
    story, fleet = Story(), Fleet(kafka_bootstrap, tmp_path)
    try:
        fleet.publish(story.saver)
        fleet.step(13, len(story.saver))
        assert fleet.step(80, 0) == [("stalled_save", "open")]
        fleet.publish(story.resume)
        assert fleet.step(100, len(story.resume)) == [("poisoned_resume", "open")]
        fleet.restart_detector()
        assert fleet.step(105, len(story.saver) + len(story.resume)) == []
        fleet.publish(story.late_end)
        assert fleet.step(120, len(story.late_end)) == WITHDRAWN_BOTH
        assert fleet.step(300, 0) == []
        rows, sent, _ = fleet.stored()
    finally:
        fleet.close()
    assert [(k, s) for k, s, _ in rows] == WITHDRAWN_BOTH
    assert sent == PAGED_AND_RESOLVED
