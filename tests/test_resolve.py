"""Incidents resolve once the job has a good checkpoint again (a later save completed on
every rank), streaming and in batch; progress logged by a restarted process does not
count as the end of the save its predecessor died in."""

from __future__ import annotations

import datetime as dt

from test_cause import T0, ev, run, saves, world

from ckptwatch.detectors import Detector, DetectorConfig
from ckptwatch.detectors.save_incidents import SaveWindows


def killed_during_save_40():
    events = world() + saves(20, 1) + saves(20, 2, end=True) + saves(40, 10)
    events += [ev("process_exit", 11, pid=102, exitcode=-9, reporter="agent")]
    events += [ev("process_exit", 11.2, pid=p, exitcode=-15, reporter="torchrun_summary") for p in (100, 101, 103)]
    return events


def test_interrupted_save_resolves_when_a_restarted_job_completes_a_later_save():
    # the restarted ranks log steps 21.. and save 60: that is not rank 2 finishing save 40
    restart = [ev("metric", 100 + s, rank=r, step=s, loss=1.0) for s in range(21, 61) for r in range(4)]
    (inc,) = run(killed_during_save_40() + restart + saves(60, 200) + saves(60, 202, end=True))
    assert (inc.kind, inc.step, inc.status) == ("interrupted_save", 40, "resolved")
    assert inc.root_cause.rank == 2 and inc.last_good_checkpoint == {"step": 20, "path": "/c/step_20"}


def test_a_later_save_missing_a_rank_resolves_nothing():
    incs = run(killed_during_save_40() + saves(60, 200) + saves(60, 202, ranks=(0, 1, 3), end=True))
    assert [(i.kind, i.step, i.status) for i in incs] == [("interrupted_save", 40, "open")]


def test_streaming_open_then_resolved_same_id():
    d = Detector(DetectorConfig(allowed_lateness=0.0))
    d.process(killed_during_save_40())
    (opened,) = d.advance(final=True)
    d.process(saves(60, 200) + saves(60, 202, end=True))
    (resolved,) = d.advance(final=True)
    assert opened.id == resolved.id and resolved.status == "resolved"
    assert resolved.detected_ts == opened.detected_ts


def test_a_stalled_save_that_finishes_after_all_is_resolved():
    windows = SaveWindows(stall_after=60.0)
    d = Detector(DetectorConfig(allowed_lateness=0.0, windows=windows))
    d.process(world() + saves(40, 10), now=T0 + dt.timedelta(seconds=10))
    now = T0 + dt.timedelta(seconds=200)  # 190 s without a line: the watermark moves with wall time
    (stalled,) = d.advance(now=now)
    assert (stalled.kind, stalled.status) == ("stalled_save", "open")
    d.process(saves(40, 300, end=True), now=now)
    (done,) = d.advance(now=now + dt.timedelta(seconds=1))
    assert (done.id, done.kind, done.status) == (stalled.id, "stalled_save", "resolved")
