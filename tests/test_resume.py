"""Resume-side incidents on small hand-built event streams: poisoned resumes across jobs,
load failures linked to the save that broke the checkpoint, world-size mismatches, and
post-resume loss regressions (with ordinary noise left alone)."""

from __future__ import annotations

import math
import random

import pytest
from test_cause import ev, saves, world

from ckptwatch.detectors import Detector
from ckptwatch.detectors.checkpoints import checkpoint_key
from ckptwatch.detectors.regression import RegressionSettings, judge


def run(events):
    d = Detector()
    d.process(events)
    d.advance(final=True)
    return {i.kind: i for i in d.incidents() if i.status != "superseded"}


def trained(job, steps, sec0, loss, rank=0):
    return [ev("metric", sec0 + i, rank=rank, step=s, job=job, loss=loss(s)) for i, s in enumerate(steps)]


def crashed_save_40():
    """job-a saves 20, dies while saving 40 (rank 2 SIGKILL)."""
    events = world(job="job-a") + [dict(e, job="job-a") for e in saves(20, 1) + saves(20, 2, end=True) + saves(40, 10)]
    events += trained("job-a", range(1, 41), -40, lambda s: 2.0 / s)
    return events + [ev("process_exit", 11, pid=102, exitcode=-9, reporter="agent", job="job-a")]


def load(job, step, sec, path="/c/step_40"):
    return [ev("load_start", sec, rank=r, step=step, job=job) | {"path": path} for r in range(4)]


@pytest.mark.parametrize("path, step, key", [
    ("/ckpt/iter_0000040", 40, ("/ckpt", 40)), ("/ckpt", 40, ("/ckpt", 40)), ("/out/checkpoint-60", None, ("/out", 60)),
    ("/out/checkpoint-60/", 60, ("/out", 60)), ("/runs/a/step_40", 40, ("/runs/a", 40)), (None, 7, (None, 7)),
])
def test_checkpoint_keys_agree_whatever_the_trainer_prints(path, step, key):
    assert checkpoint_key(path, step) == key


def test_resume_from_the_interrupted_save_is_poisoned_and_names_the_way_out():
    got = run(crashed_save_40() + world(job="job-b") + load("job-b", 40, 100))
    bad, p = got["interrupted_save"], got["poisoned_resume"]
    assert (p.job, p.step, p.checkpoint_path, p.severity) == ("job-b", 40, "/c/step_40", "critical")
    assert p.checkpoint_state["marked_bad_by"] == bad.id and p.checkpoint_state["bad_job"] == "job-a"
    assert p.last_good_checkpoint == {"step": 20, "path": "/c/step_20"}
    assert "step 20 (/c/step_20)" in p.remediation and bad.id in p.remediation


def test_resume_from_the_last_good_checkpoint_is_no_incident():
    got = run(crashed_save_40() + world(job="job-b") + load("job-b", 20, 100, "/c/step_20")
              + trained("job-b", range(21, 41), 101, lambda s: 2.0 / s))
    assert set(got) == {"interrupted_save"}


def test_load_error_is_linked_to_the_save_that_broke_the_checkpoint():
    errors = [ev("load_error", 101, rank=r, job="job-b", **{"class": "missing_metadata"}) for r in range(4)]
    got = run(crashed_save_40() + world(job="job-b") + load("job-b", 40, 100) + errors)
    lf = got["load_failure"]
    assert (lf.step, lf.checkpoint_state["save_incident"], lf.checkpoint_state["ranks"]) == (
        40, got["interrupted_save"].id, [0, 1, 2, 3])
    assert "was interrupted by signal on rank 2" in lf.remediation


def test_deepspeed_dp_world_size_message_is_a_world_size_mismatch():
    err = ev("load_error", 5, rank=0, job="job-c", saved_world_size=8, current_world_size=4,
             **{"class": "world_size_mismatch"})
    got = run(world(4, job="job-c") + load("job-c", 100, 4, "/ds/global_step100") + [err])
    ws = got["world_size_mismatch"]
    assert (ws.checkpoint_state["saved_world_size"], ws.checkpoint_state["current_world_size"]) == (8, 4)
    assert "universal checkpoint" in ws.remediation and "load_failure" not in got


def test_a_load_error_at_another_world_size_than_the_save_is_a_world_size_mismatch():
    save = [dict(e, job="job-a") for e in saves(40, 1) + saves(40, 2, end=True)]
    err = [ev("load_error", 11, rank=r, job="job-b", **{"class": "size_mismatch"}) for r in range(2)]
    got = run(world(4, job="job-a") + save + world(2, job="job-b") + load("job-b", 40, 10)[:2] + err)
    assert got["world_size_mismatch"].checkpoint_state["saved_world_size"] == 4
    assert got["world_size_mismatch"].checkpoint_state["current_world_size"] == 2


def resumed(after_loss, *, n_after=5):
    events = world(job="job-a") + [dict(e, job="job-a") for e in saves(40, 41) + saves(40, 42, end=True)]
    events += trained("job-a", range(1, 41), 0, lambda s: 1.0 + 1.0 / s + 0.01 * math.sin(s))
    events += world(job="job-b") + load("job-b", 40, 100, "/c/step_40")
    return events + trained("job-b", range(41, 41 + n_after), 101, after_loss)


def test_loss_much_worse_after_resume_is_a_regression_warning():
    r = run(resumed(lambda s: 2.3 + 0.01 * (s % 3)))["post_resume_regression"]
    assert (r.severity, r.step, r.checkpoint_state["reason"]) == ("warning", 40, "worse")
    assert r.checkpoint_state["after_median"] == pytest.approx(2.31) and 1.0 < r.checkpoint_state["before_median"] < 1.1
    assert "ckptwatch verify" in r.remediation


def test_nan_or_constant_loss_after_resume_is_a_regression():
    assert run(resumed(lambda s: float("nan")))["post_resume_regression"].checkpoint_state["reason"] == "not_finite"
    assert run(resumed(lambda s: 1.05))["post_resume_regression"].checkpoint_state["reason"] == "constant"


def test_too_few_steps_after_resume_say_nothing_yet():
    assert "post_resume_regression" not in run(resumed(lambda s: 9.0, n_after=4))


def test_ordinary_noise_never_alerts():
    rng = random.Random(7)
    for trial in range(300):
        base = rng.uniform(0.05, 5.0)
        noise = base * rng.uniform(0.005, 0.08)
        before = [base + rng.gauss(0, noise) for _ in range(5)]
        after = [(41 + i, base * 0.99 + rng.gauss(0, noise)) for i in range(5)]
        assert judge(before, after, RegressionSettings()) is None, (trial, before, after)


def _unfinished_save_then_resume():
    """job-a: 20 saved; 40 started by 4 ranks at 10 s, ended by ranks 0, 1, 3 at 12 s.
    job-b loads 40 at 14 s. Rank 2's end of save is held back (a late host)."""
    events = world(job="job-a") + [dict(e, job="job-a") for e in
                                   saves(20, 1) + saves(20, 2, end=True) + saves(40, 10) + saves(40, 12, [0, 1, 3], end=True)]
    return events + world(job="job-b") + load("job-b", 40, 14)


def _at(d, sec):
    import datetime as dt

    from test_cause import T0

    return d.advance(now=T0 + dt.timedelta(seconds=sec))


def _stream(d, events, sec):
    import datetime as dt

    from test_cause import T0

    d.process(events, now=T0 + dt.timedelta(seconds=sec))


def test_resume_from_a_save_never_seen_to_finish_is_poisoned_once_the_watermark_passes_it():
    d = Detector()
    _stream(d, _unfinished_save_then_resume(), 14)
    assert [i.kind for i in _at(d, 14)] == []  # watermark 9 s: rank 2's end may still come
    (p,) = [i for i in _at(d, 20) if i.kind == "poisoned_resume"]  # watermark 15 s, past the resume
    assert (p.job, p.step, p.status, p.checkpoint_path) == ("job-b", 40, "open", "/c/step_40")
    assert p.checkpoint_state == {"reason": "never_finished", "saved_by": "job-a", "missing_ranks": [2],
                                  "loaded_path": "/c/step_40"}
    assert p.last_good_checkpoint == {"step": 20, "path": "/c/step_20"}
    assert "never seen to finish on every rank (no end of save from rank(s) 2)" in p.remediation

    # the late host's line shows the save did finish: the page is taken back, withdrawn
    _stream(d, [dict(e, job="job-a") for e in saves(40, 12.5, [2], end=True)], 21)
    (again,) = [i for i in _at(d, 21) if i.kind == "poisoned_resume"]
    assert (again.id, again.status) == (p.id, "superseded")
    assert again.withdrawn == ("the save of step 40 by job job-a finished on every rank after all (its last "
                               "end-of-save lines arrived late): the checkpoint loaded is whole")
    assert again.remediation == f"Withdrawn: {again.withdrawn}. No action needed."
    assert _at(d, 60) == []  # and stays so


def test_a_never_finished_resume_names_the_save_incident_once_it_settles():
    d = Detector()
    crash = [ev("process_exit", 13, pid=102, exitcode=-9, reporter="agent", job="job-a")]
    _stream(d, _unfinished_save_then_resume() + crash, 14)
    (p,) = [i for i in _at(d, 20) if i.kind == "poisoned_resume"]
    assert p.checkpoint_state["reason"] == "never_finished"
    later = _at(d, 60)  # 30 s of settle past the failure: the interrupted save is concluded
    bad = next(i for i in later if i.kind == "interrupted_save")
    (p2,) = [i for i in later if i.kind == "poisoned_resume"]
    assert (p2.id, p2.status, p2.checkpoint_state["marked_bad_by"]) == (p.id, "open", bad.id)
