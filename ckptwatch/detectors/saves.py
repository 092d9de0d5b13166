"""The save lifecycle of one job, per step and rank, derived from its events.

A rank's part of the save of step N is

* **started** by a ``save_start`` event for step N,
* **finished** by a ``save_end`` event for step N, or implicitly when the rank logs a
  later step (a metric for a step > N or a later ``save_start``): a synchronous save must
  have returned before training went on. Implicit ends are listed apart,
* **failed** by a ``save_error`` event for step N.

The ranks expected to take part: every rank of the world size when the job logs saves
on several ranks (as DCP trainers do); only the ranks that logged when the job logs
saves from one rank only (as HF Trainer does from the main process).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from ckptwatch.detectors.events import Ev
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
    later_start: dict[int, int] = {}  # rank -> highest step it started saving
    for ev in events:
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
            later_start[rank] = max(later_start.get(rank, -1), ev.step)
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
        for rank in s.expected - set(s.finished):
            went_on = state.last_metric_step.get(rank, -1) > s.step or later_start.get(rank, -1) > s.step
            if went_on:
                s.implicit[rank] = state.last_metric_ev.get(rank) or s.started.get(rank) or next(iter(s.finished.values()))
    return saves
