"""A long job's finished saves are retired (ckptwatch.detectors.retire): its save lines stay
bounded however long it runs, the incidents come out as they do with every line kept, the
retired checkpoints stay known to the registry, and a late copy of a retired line does not
start its save again."""

from __future__ import annotations

import datetime as dt
import itertools
import json

import pytest

from ckptwatch.detectors import Detector, retire
from ckptwatch.detectors.saves import saves_of

T0 = dt.datetime(2026, 11, 30, 10, 0, tzinfo=dt.timezone.utc)
_offsets = itertools.count()


def ev(kind, sec, *, rank=None, pid=None, step=None, job="job-a", **attrs):
    """An event row as the rules give it (test_cause.ev's shape; its offsets run out here)."""
    off = next(_offsets)
    return {"ts": T0 + dt.timedelta(seconds=sec), "ts_source": "line", "job": job, "host": None, "rank": rank,
            "local_rank": rank, "pid": pid, "kind": kind, "step": step, "path": f"/c/step_{step}" if step else None,
            "rule_id": f"test.{kind}", "attrs": json.dumps(attrs), "source_id": "src", "source_kind": "log",
            "offset": off, "line": f"{kind} {attrs}", "dedup_key": f"k{off}"}


def world(n=4):
    return [ev("world_size", 0, rank=r, pid=100 + r, world_size=n) for r in range(n)]


def saves(step, sec, ranks=range(4), end=False):
    return [ev("save_end" if end else "save_start", sec, rank=r, step=step) for r in ranks]


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def long_job(n_saves: int, *, partial_at: int | None = None, twice: bool = False,
             metrics: bool = True) -> list[list[dict]]:
    """Batches of a 4-rank job saving every 10 s (step 10 * i at second 10 * i, ends a second
    later); at ``partial_at`` rank 3 reports an error writing its shard and the job goes on.
    ``twice``: rank 0 prints two start lines and two end lines per save (as DeepSpeed's main
    process does), the second end a second after the first."""
    out = [world()]
    for i in range(1, n_saves + 1):
        step, sec = 10 * i, 10 * i
        done = (0, 1, 2) if step == partial_at else range(4)
        failed = [ev("save_error", sec + 1, rank=3, step=step, errno_name="EIO")] if step == partial_at else []
        more = saves(step, sec, ranks=(0,)) + saves(step, sec + 2, ranks=(0,), end=True) if twice else []
        out.append(saves(step, sec) + saves(step, sec + 1, ranks=done, end=True) + failed + more
                   + [ev("metric", sec + 3, rank=r, step=step + 1) for r in range(4) if metrics])
    return out


def killed_mid_save(step: int) -> list[dict]:
    """Every rank starts the save of ``step``; rank 2 is SIGKILLed in it, the others time out."""
    sec = step
    return (saves(step, sec) + [ev("collective_timeout", sec + 30, rank=r, backend="nccl", seq=9) for r in (0, 1, 3)]
            + [ev("process_exit", sec + 31, pid=102, exitcode=-9, reporter="agent")])


def replay(batches: list[list[dict]], *, retiring: bool, monkeypatch, read: bool = False) -> Detector:
    """Feed ``batches`` as a live run does (an advance after each), or with ``read`` as
    ``diagnose`` reads files (retire_saves at each batch's newest time, one final advance)."""
    monkeypatch.setattr(retire, "RETIRE_MIN", 64 if retiring else 10**9)
    d = Detector()
    for b in batches:
        d.process(b, now=max(e["ts"] for e in b))
        if read:
            d.retire_saves(max(e["ts"] for e in b))
        else:
            d.advance(now=max(e["ts"] for e in b))
    d.advance(final=True, now=max(e["ts"] for e in batches[-1]))
    return d


def summary(d: Detector) -> list[tuple]:
    return [(i.kind, i.step, i.status, i.root_cause.rank if i.root_cause else None, i.collateral,
             i.last_good_checkpoint, i.checkpoint_state) for i in d.incidents()]


def test_a_long_job_keeps_few_save_lines_and_finds_the_same_interrupted_save(monkeypatch):
    batches = long_job(300) + [killed_mid_save(3010)]
    kept = replay(batches, retiring=False, monkeypatch=monkeypatch)
    d = replay(batches, retiring=True, monkeypatch=monkeypatch)
    state = d.jobs["job-a"]
    saves_left = sum(e.kind in ("save_start", "save_end") for e in state.events.values())
    assert saves_left <= 2 * 64 + 8 * 2, saves_left  # 2,404 without retiring
    assert sum(e.kind in ("save_start", "save_end") for e in kept.jobs["job-a"].events.values()) == 2404
    assert d.stats.retired >= 2404 - saves_left - 8
    assert summary(d) == summary(kept)
    (inc,) = d.incidents()
    assert (inc.kind, inc.step, inc.root_cause.rank) == ("interrupted_save", 3010, 2)
    assert inc.last_good_checkpoint == {"step": 3000, "path": "/c/step_3000"}
    assert d.registry.saves[("/c", 2990)].complete  # retired, still known


def test_every_line_of_a_retired_save_goes_when_ranks_print_several(monkeypatch):
    batches = long_job(300, twice=True, metrics=False) + [killed_mid_save(3010)]
    kept = replay(batches, retiring=False, monkeypatch=monkeypatch)
    d = replay(batches, retiring=True, monkeypatch=monkeypatch)
    assert summary(d) == summary(kept)
    assert [(i.kind, i.step) for i in d.incidents()] == [("interrupted_save", 3010)]
    state = d.jobs["job-a"]
    assert 100 in state.retired and not any(e.step == 100 for e in state.events.values())


def test_a_job_with_a_save_line_naming_no_step_retires_nothing(monkeypatch):
    batches = long_job(100)
    batches[1].append(ev("save_start", 10.5, rank=0))  # "Saving checkpoint..." (torchtitan prints no step)
    d = replay(batches, retiring=True, monkeypatch=monkeypatch)
    assert d.stats.retired == 0 and not d.jobs["job-a"].retired


def test_an_incomplete_save_keeps_its_neighbours_and_its_incident(monkeypatch):
    batches = long_job(300, partial_at=1500)
    kept = replay(batches, retiring=False, monkeypatch=monkeypatch)
    d = replay(batches, retiring=True, monkeypatch=monkeypatch)
    assert summary(d) == summary(kept)
    (inc,) = d.incidents()
    assert (inc.kind, inc.step, inc.status) == ("partial_checkpoint", 1500, "resolved")
    assert inc.last_good_checkpoint == {"step": 1490, "path": "/c/step_1490"}
    state = d.jobs["job-a"]
    steps = {e.step for e in state.events.values() if e.kind == "save_start"}
    assert {1490, 1500, 1510} <= steps and 100 not in steps and 100 in state.retired


def test_a_late_copy_of_a_retired_line_is_dropped_and_a_new_attempt_is_kept(monkeypatch):
    d = replay(long_job(300), retiring=True, monkeypatch=monkeypatch)
    state = d.jobs["job-a"]
    assert 100 in state.retired
    copy = dict(saves(100, 100)[1], source_id="console", offset=7, dedup_key="console-copy")
    d.process([copy], now=at(4000))
    assert not any(e.dedup_key == "console-copy" for e in state.events.values())
    assert d.stats.duplicates >= 1
    assert d.advance(now=at(4000)) == []
    # after a restart the job saves step 100 again: a new attempt, not a copy
    again = [ev("resume", 4001, rank=0, step=90)] + saves(100, 4010)
    d.process(again, now=at(4010))
    assert sum(e.kind == "save_start" and e.step == 100 for e in state.events.values()) == 4
    assert {s.step for s in saves_of(state, state.events_sorted()).values() if not s.complete} == {100}


@pytest.mark.parametrize("named", [0, 1])
def test_nothing_is_retired_while_the_unlabelled_lines_may_still_be_folded_into_the_job(monkeypatch, named):
    batches = long_job(100)
    if not named:  # every line names no job: "unknown" is retired like any job
        batches = [[dict(e, job=None) for e in b] for b in batches]
    else:  # the launcher's lines name no job: they may yet be folded into job-a
        batches[0] = batches[0] + [ev("job_signal", 0.5, job=None, sig="SIGTERM")]
    d = replay(batches, retiring=True, monkeypatch=monkeypatch)
    assert (d.stats.retired > 0) == (not named)


@pytest.mark.parametrize("read", [False, True])
def test_a_save_given_up_and_saved_again_after_a_restart_keeps_its_last_good_checkpoint(monkeypatch, read):
    # rank 2 dies in the save of step 1010; the job resumes from step 1000, saves 1010 again
    # whole and trains on: the failed attempt still names 1000 as the last good checkpoint
    restarted = [[ev("resume", 1100, rank=r, step=1000) for r in range(4)]]
    for i in range(102, 300):
        step, sec = 10 * i - 10, 10 * i + 200
        restarted.append(saves(step, sec) + saves(step, sec + 1, end=True)
                         + [ev("metric", sec + 3, rank=r, step=step + 1) for r in range(4)])
    batches = long_job(100) + [killed_mid_save(1010)] + restarted
    kept = replay(batches, retiring=False, monkeypatch=monkeypatch, read=read)
    d = replay(batches, retiring=True, monkeypatch=monkeypatch, read=read)
    assert d.stats.retired > 0
    assert summary(d) == summary(kept)
    (inc,) = [i for i in d.incidents() if i.kind == "interrupted_save"]
    assert (inc.step, inc.root_cause.rank) == (1010, 2)
    assert inc.last_good_checkpoint == {"step": 1000, "path": "/c/step_1000"}
