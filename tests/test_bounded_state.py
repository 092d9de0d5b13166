"""Bounded detector state: a concluded, idle job is released (its events and incidents leave
memory, a tombstone and its checkpoints' facts stay), re-delivered old events of a released
job are dropped, the registry and host events are pruned, and the state a restart needs
round-trips through JSON."""

from __future__ import annotations

import datetime as dt
import json

from test_cause import T0, ev, saves, world
from test_resume import crashed_save_40, load

from ckptwatch.detectors import Detector
from ckptwatch.detectors.checkpoints import MAX_PER_ROOT, CheckpointRegistry, SaveFact

HOUR = dt.timedelta(hours=1)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def good_saves(job="job-a"):
    return world(job=job) + [dict(e, job=job) for e in saves(20, 1) + saves(20, 2, end=True)]


def test_a_concluded_idle_job_is_released_and_its_old_events_are_dropped_when_re_delivered():
    d = Detector()
    events = good_saves()
    d.process(events, now=at(3))
    assert d.advance(now=at(10)) == [] and "job-a" in d.jobs
    d.advance(now=at(10) + HOUR / 2)
    assert "job-a" in d.jobs, "not idle for release_after yet"
    d.advance(now=at(10) + HOUR)
    assert "job-a" not in d.jobs and d.stats.released == 1
    assert d.released["job-a"] == (at(2), at(10) + HOUR)
    assert d.take_released() == [("job-a", at(2))] and d.take_released() == []
    assert d.registry.saves[("/c", 20)].complete
    d.process(events, now=at(10) + 2 * HOUR)  # a collector restart publishes them again
    assert d.stats.after_release == len(events) and "job-a" not in d.jobs
    assert d.advance(now=at(10) + 3 * HOUR) == []
    later = [dict(e, job="job-a") for e in saves(40, 4000)]  # the job relaunched: newer events start it afresh
    d.process(later, now=at(4000))
    assert set(d.jobs) == {"job-a"} and d.jobs["job-a"].max_ts == at(4000)


def test_a_job_with_an_open_save_is_not_released():
    d = Detector()
    d.process(world() + saves(20, 1), now=at(2))  # started, never ended: stalls, stays under evaluation
    d.advance(now=at(10) + 3 * HOUR)
    assert "job-a" in d.jobs and d.stats.released == 0


def test_a_released_jobs_bad_checkpoint_still_poisons_a_later_resume():
    d = Detector()
    d.process(crashed_save_40(), now=at(12))
    (bad,) = [i for i in d.advance(now=at(100)) if i.kind == "interrupted_save"]
    d.advance(now=at(100) + HOUR)
    assert "job-a" not in d.jobs and d.incidents() == []
    assert d.registry.bad[("/c", 40)].id == bad.id and d.registry.bad[("/c", 40)].evidence == []
    d.process(world(job="job-b") + load("job-b", 40, 5000), now=at(5000))
    (p,) = [i for i in d.advance(now=at(5010)) if i.kind == "poisoned_resume"]
    assert p.checkpoint_state["marked_bad_by"] == bad.id
    assert p.last_good_checkpoint == {"step": 20, "path": "/c/step_20"}


def test_registry_and_tombstones_restore_a_new_detector_that_judges_the_same():
    d = Detector()
    d.process(crashed_save_40(), now=at(12))
    d.advance(now=at(100))
    d.advance(now=at(100) + HOUR)
    snapshot = json.loads(json.dumps(d.registry.to_dict()))
    tombs = [(job, ts, wall) for job, (ts, wall) in d.released.items()]
    resume = world(job="job-b") + load("job-b", 40, 5000)
    d.process(resume, now=at(5000))
    (want,) = [i for i in d.advance(now=at(5010)) if i.kind == "poisoned_resume"]

    fresh = Detector()
    fresh.restore(tombs, snapshot)
    fresh.process(crashed_save_40(), now=at(5000))  # a full replay would bring these: dropped
    assert fresh.stats.after_release == len(crashed_save_40()) and "job-a" not in fresh.jobs
    fresh.process(resume, now=at(5000))
    (got,) = [i for i in fresh.advance(now=at(5010)) if i.kind == "poisoned_resume"]
    assert (got.id, got.checkpoint_state, got.last_good_checkpoint, got.remediation) == (
        want.id, want.checkpoint_state, want.last_good_checkpoint, want.remediation)


def test_registry_prune_keeps_the_newest_steps_per_root_and_drops_what_is_older_than_the_horizon():
    reg = CheckpointRegistry()
    for step in range(MAX_PER_ROOT + 44):
        reg.record_save(SaveFact("job-a", step, f"/c/step_{step}", True, at(step), 4,
                                 ((at(step), step, float("nan")),)))
    reg.record_save(SaveFact("job-z", 7, "/old/step_7", True, at(-86400 * 40), 4))
    gone = reg.prune(at(-86400 * 30))
    assert gone == 45
    assert sorted(reg.saves) == [("/c", s) for s in range(44, MAX_PER_ROOT + 44)]
    again = CheckpointRegistry.from_dict(json.loads(json.dumps(reg.to_dict())))
    assert again.saves.keys() == reg.saves.keys()
    assert str(again.saves[("/c", 99)].losses[0][2]) == "nan" and again.saves[("/c", 99)].first_ts == at(99)


def test_host_events_older_than_the_live_jobs_by_release_after_are_pruned():
    d = Detector()
    oom = ev("oom_kill", -2 * 3600, host="h1", pid=999, job=None, scope="host")
    d.process([oom] + good_saves(), now=at(3))
    d.advance(now=at(10))
    assert list(d.host_events) == [oom["dedup_key"]], "arrived a moment ago: a job's lines may still come"
    fresh = ev("oom_kill", 1, host="h1", pid=998, job=None, scope="host")
    d.process([fresh] + [dict(e, job="job-b") for e in saves(30, 3700)], now=at(3700))
    d.advance(now=at(3701))
    assert list(d.host_events) == [fresh["dedup_key"]]


def test_embedded_restart_replays_only_live_jobs_and_still_judges_a_resume_from_a_released_one(tmp_path):
    """The real logs of tests/scenarios/hf-poisoned-resume, in two halves: the crashed
    training job, stored and released (an hour idle); then, after a restart, the job that
    resumes from its broken checkpoint-400. The restart replays nothing of the released
    job, yet the resume is poisoned, citing the save incident stored before."""
    import shutil
    from pathlib import Path

    import duckdb

    from ckptwatch.embedded import EmbeddedRunner

    src = Path(__file__).parent / "scenarios" / "hf-poisoned-resume" / "logs"
    logs, db = tmp_path / "logs", str(tmp_path / "h.duckdb")
    shutil.copytree(src / "hf-0501-train", logs / "hf-0501-train")
    shutil.copytree(src / "kernel", logs / "kernel")
    now = dt.datetime.now(dt.timezone.utc)
    r = EmbeddedRunner(str(logs), db, retention=dt.timedelta(days=365 * 20))
    r.cycle(final=True, now=now)
    r.cycle(final=True, now=now + 2 * HOUR)
    assert r.detector.stats.released >= 1 and "hf-0501-train" not in r.detector.jobs
    stored = r.store.con.execute("SELECT count(*) FROM events").fetchone()[0]
    r.close()

    shutil.copytree(src / "hf-0502-resume", logs / "hf-0502-resume")
    r = EmbeddedRunner(str(logs), db)
    assert r.detector.stats.events < stored / 4  # host lines only: the released job is not replayed
    assert "hf-0501-train" in r.detector.released
    r.cycle(final=True, now=now + 3 * HOUR)
    # retention takes the released job's and the host lines, never a live job's
    gone = r.store.delete_events_before(now + 10 * 365 * 24 * HOUR)
    left = r.store.con.execute("SELECT DISTINCT job FROM events").fetchall()
    assert gone >= stored * 0.9 and left == [("hf-0502-resume",)]
    r.close()
    con = duckdb.connect(db, read_only=True)
    rows = con.execute("SELECT kind, job, step, checkpoint_state->>'marked_bad_by' FROM incidents "
                       "WHERE status = 'open' ORDER BY kind").fetchall()
    bad_id = con.execute("SELECT id FROM incidents WHERE kind = 'interrupted_save'").fetchone()[0]
    con.close()
    assert ("poisoned_resume", "hf-0502-resume", 400, bad_id) in rows
    assert ("interrupted_save", "hf-0501-train", 400, None) in rows


def test_fleet_retention_counts_a_job_quiet_since_the_horizon_as_ended(tmp_path):
    """The fleet sink's retention (``[sink] retention_days``): its detectors release jobs in
    their own state, so a job with no event since the horizon counts as ended; a job still
    logging keeps its old events, and host lines go."""
    import polars as pl

    from ckptwatch.schema import EVENT_SCHEMA
    from ckptwatch.sinks.duckdb_store import Store

    now = dt.datetime(2026, 12, 2, tzinfo=dt.timezone.utc)
    rows = [("old-job", now - 40 * 24 * HOUR), ("old-job", now - 35 * 24 * HOUR),
            ("live-job", now - 40 * 24 * HOUR), ("live-job", now - HOUR), (None, now - 40 * 24 * HOUR)]
    events = pl.DataFrame({"source_id": ["s"] * len(rows), "offset": list(range(len(rows))),
                           "job": [j for j, _ in rows], "ts": [t for _, t in rows], "kind": ["save_start"] * len(rows),
                           "line": [f"line {i}" for i in range(len(rows))]})
    events = events.with_columns([pl.lit(None, dtype=t).alias(c) for c, t in EVENT_SCHEMA.items()
                                  if c not in events.columns]).select(list(EVENT_SCHEMA)).cast(EVENT_SCHEMA)
    store = Store(str(tmp_path / "f.duckdb"))
    try:
        store.commit_batch(events, [])
        horizon = now - 30 * 24 * HOUR
        assert store.delete_events_before(horizon) == 1  # embedded rule: the host line only
        assert store.delete_events_before(horizon, quiet_jobs=True) == 2  # and the quiet job's two
        left = store.con.execute("SELECT job, ts FROM events ORDER BY ts").fetchall()
    finally:
        store.close()
    assert [(j, t.astimezone(dt.timezone.utc)) for j, t in left] == [("live-job", now - 40 * 24 * HOUR),
                                                                       ("live-job", now - HOUR)]


def test_registry_keeps_the_earlier_attempts_of_a_step_through_a_snapshot_and_a_prune():
    reg = CheckpointRegistry()
    torn = SaveFact("job-a", 40, "/c/step_40", False, at(0), 4, missing=(2,))
    again = SaveFact("job-b", 40, "/c/step_40", True, at(100), 4)
    reg.record_save(torn)
    reg.record_save(again)  # a later run writes the step again
    assert reg.fact_at(("/c", 40), at(50)) == torn and reg.fact_at(("/c", 40), at(150)) == again
    assert reg.fact_at(("/c", 40), at(-10)) == again  # a load before any save seen: the latest
    restored = CheckpointRegistry.from_dict(json.loads(json.dumps(reg.to_dict())))
    assert restored.fact_at(("/c", 40), at(50)) == torn and restored.saves[("/c", 40)] == again
    for n in range(1, 7):  # at most MAX_ATTEMPTS earlier ones, the newest
        reg.record_save(SaveFact("job-b", 40, "/c/step_40", True, at(100 + n), 4))
    assert [f.first_ts for f in reg.earlier[("/c", 40)]] == [at(100 + n) for n in range(2, 6)]
    assert reg.prune(at(104)) == 2 and [f.first_ts for f in reg.earlier[("/c", 40)]] == [at(104), at(105)]
