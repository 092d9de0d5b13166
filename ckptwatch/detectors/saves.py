"""The save lifecycle of one job, per step and rank, derived from its events.

A rank's part of the save of step N is

* **started** by a ``save_start`` event for step N,
* **finished** by a ``save_end`` event for step N, or implicitly when the rank logs a
  later step (a metric for a step > N or a later ``save_start``) before any failure of the
  job after the save started: a synchronous save must have returned before training went
  on, but progress logged after a failure comes from a restarted process, which says
  nothing of the save that was under way; or, for every expected rank, when the trainer
  says training finished (``job_end``: HF Trainer's "Training completed", Megatron's
  "exiting program after N minutes") before any failure. Implicit ends are listed apart,
* **failed** by a ``save_error`` event for step N.

The ranks expected to take part: every rank of the world size when the job logs saves
on several ranks (as DCP trainers do); only the ranks that logged when the job logs
saves from one rank only (as HF Trainer does from the main process).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

import bisect

from ckptwatch.detectors.events import FAILURE_KINDS, Ev
from ckptwatch.detectors.jobstate import JobState


@dataclass
class SaveState:
    """One save. ``first_ts`` is the earliest start (UTC); ranks are global ranks."""

    step: int
    path: str | None = None
    first_ts: dt.datetime | None = None
    started: dict[int, Ev] = field(default_factory=dict)
    finished: dict[int, Ev] = field(default_factory=dict)
    implicit: dict[int, Ev] = field(default_factory=dict)
    failed: dict[int, Ev] = field(default_factory=dict)
    expected: set[int] = field(default_factory=set)

    @property
    def done_ranks(self) -> set[int]:
        return set(self.finished) | set(self.implicit)

    @property
    def complete(self) -> bool:
        return bool(self.expected) and self.expected <= self.done_ranks and not self.failed

    @property
    def missing(self) -> list[int]:
        return sorted(self.expected - self.done_ranks)

    def state_dict(self) -> dict[str, object]:
        """The ``checkpoint_state`` of an incident: which ranks' shards are known written."""
        return {
            "expected_ranks": sorted(self.expected),
            "finished": sorted(self.finished),
            "finished_implicitly": sorted(set(self.implicit) - set(self.finished)),
            "started_not_finished": sorted(set(self.started) - self.done_ranks),
            "not_started": sorted(self.expected - set(self.started) - self.done_ranks),
            "failed": sorted(self.failed),
        }


def _better_path(a: str | None, b: str | None) -> str | None:
    if a is None:
        return b
    if b is None:
        return a
    return a if len(a) >= len(b) else b


def saves_of(state: JobState, events: list[Ev]) -> dict[int, SaveState]:
    """All saves of a job by step, with expected ranks and implicit ends filled in."""
    saves: dict[int, SaveState] = {}
    progress: dict[int, _Progress] = {}  # rank -> its later steps, in time order
    failures: list[dt.datetime] = []  # job failures, in time order
    ends: list[Ev] = []  # the trainer said training finished
    for ev in events:
        if ev.kind == "job_end":
            ends.append(ev)
        if ev.kind in FAILURE_KINDS and ev.kind != "save_error":
            failures.append(ev.ts)
        if ev.kind in ("metric", "save_start") and ev.step is not None:
            r = state.rank_of(ev)
            if r is not None:
                progress.setdefault(r, _Progress()).add(ev)
        if ev.kind not in ("save_start", "save_end", "save_error") or ev.step is None:
            continue
        rank = state.rank_of(ev)
        if rank is None:
            rank = -1  # unknown rank: still counts as "someone"
        s = saves.setdefault(ev.step, SaveState(step=ev.step))
        s.path = _better_path(s.path, ev.path)
        if ev.kind == "save_start":
            s.started.setdefault(rank, ev)
            s.first_ts = ev.ts if s.first_ts is None or ev.ts < s.first_ts else s.first_ts
        elif ev.kind == "save_end":
            s.finished.setdefault(rank, ev)
            if s.first_ts is None:
                s.first_ts = ev.ts
        else:
            s.failed.setdefault(rank, ev)
    multi_rank = any(len(set(s.started) | set(s.finished)) > 1 for s in saves.values())
    seen_ranks = set().union(*(set(x.started) | set(x.finished) for x in saves.values())) - {-1} if saves else set()
    for s in saves.values():
        logged = set(s.started) | set(s.finished) | set(s.failed)
        if multi_rank and state.world_size:
            s.expected = set(range(state.world_size))
        elif multi_rank:
            s.expected = set(seen_ranks) or logged
        else:
            s.expected = logged
        if s.first_ts is None:
            continue
        i = bisect.bisect_left(failures, s.first_ts)
        failed_at = failures[i] if i < len(failures) else None
        ended = next((e for e in ends if e.ts >= s.first_ts), None)
        for rank in s.expected - set(s.finished):
            went_on = progress[rank].first_past(s.step) if rank in progress else None
            if went_on is None or (ended is not None and ended.ts < went_on.ts):
                went_on = ended
            if went_on is not None and (failed_at is None or went_on.ts < failed_at):
                s.implicit[rank] = went_on
    return saves


@dataclass
class _Progress:
    """One rank's step-bearing events in time order, with the running maximum of their
    steps, so that "the first event past step N" is a binary search."""

    events: list[Ev] = field(default_factory=list)
    max_step: list[int] = field(default_factory=list)

    def add(self, ev: Ev) -> None:
        assert ev.step is not None
        self.events.append(ev)
        self.max_step.append(max(ev.step, self.max_step[-1]) if self.max_step else ev.step)

    def first_past(self, step: int) -> Ev | None:
        """The earliest event with a step above ``step`` (None if there is none)."""
        i = bisect.bisect_right(self.max_step, step)
        return self.events[i] if i < len(self.events) else None
