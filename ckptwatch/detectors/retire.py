"""Retiring a long job's finished saves, so its memory does not grow with its length.

A job that trains for days logs a save every few hundred steps on every rank; each save
line is an :class:`~ckptwatch.detectors.events.Ev` its :class:`JobState` keeps, and every
evaluation walks all of them (:func:`~ckptwatch.detectors.saves.saves_of`). Most of those
saves can never matter again: they completed on every expected rank, the watermark is past
all their lines, and no incident needs them. Such a save's fact (step, path, world size,
loss window) is already in the checkpoint registry, which is what a later resume is judged
by; its lines can go.

What stays, so that every incident comes out as it would with all lines kept:

* every save not complete (no incident would be found without it), and every save whose
  lines are not all older than the cutoff (the job's watermark: a late line may still
  change it);
* the newest complete save (the job's last good checkpoint for any later failure), and
  for each incomplete save the newest complete one below it (its ``last_good_checkpoint``)
  and the first save above it (it ends the failure window and may end the save implicitly;
  the first complete one above it resolves the incident);
* every save of a job that printed a save line naming no step (such a line's step is its
  rank's last one, found from the lines around it);
* the same around an attempt given up for a later one of its step (a restart saved it again).

Retired saves still count where the saves of a job are looked at together: they end a
failure window (their earliest start) and stand as the last good checkpoint below a save that
failed (:mod:`.save_incidents`), so evaluation gives what it gives with every line kept.

A copy of a retired save's line read later (from another file) is dropped instead of
starting the save again; a line of that step newer than its newest is a new attempt, after a
restart. The ranks that logged it still count among those expected of later saves.
"""

from __future__ import annotations

import bisect
import datetime as dt

from ckptwatch.detectors.jobstate import JobState, Retired
from ckptwatch.detectors.saves import SaveState

#: save lines a job holds before retiring any is worth a pass over them
RETIRE_MIN = 256


def retirable(saves: dict[int, SaveState], cutoff: dt.datetime) -> list[SaveState]:
    """The saves of ``saves`` (:func:`~ckptwatch.detectors.saves.saves_of`, keyed by step;
    negative keys are abandoned attempts) that can be retired with event-time ``cutoff``
    (UTC): see the module docstring for what stays. In step order."""
    current = sorted((s for k, s in saves.items() if k >= 0), key=lambda s: s.step)
    steps = [s.step for s in current]
    complete = [s.step for s in current if s.complete]
    keep: set[int] = set(complete[-1:])
    # an incomplete save, or an attempt given up for a later one of its step (negative key)
    for s in [s for s in saves.values() if not s.complete]:
        keep.add(s.step)
        i = bisect.bisect_left(complete, s.step)
        if i:
            keep.add(complete[i - 1])
        j = bisect.bisect_right(steps, s.step)
        if j < len(steps):
            keep.add(steps[j])
    out = []
    for s in current:
        if s.step in keep or not s.complete:
            continue
        if any(e.ts >= cutoff for e in (*s.started.values(), *s.finished.values(), *s.implicit.values())):
            continue  # (a line naming no step keeps the whole job's saves: retire())
        out.append(s)
    return out


def retire(state: JobState, saves: list[SaveState], cutoff: dt.datetime) -> int:
    """Let ``saves`` (of :func:`retirable`) go from ``state``
    (:meth:`JobState.forget_saves <ckptwatch.detectors.jobstate.JobState.forget_saves>`):
    every save line of their steps, not only the first of each rank a save counts (a rank
    may print several, a console repeats them), unless one of those is not older than
    ``cutoff`` (UTC). Nothing goes from a job with a save line that names no step.
    Returns how many lines went."""
    steps = {s.step: s for s in saves}
    lines: dict[int, list] = {}
    for e in state.events.values():
        if e.kind not in ("save_start", "save_end"):
            continue
        if e.step is None:
            return 0  # a save line without a step: its step depends on the lines around it; keep them all
        if e.step in steps:
            lines.setdefault(e.step, []).append(e)
    gone = {step: evs for step, evs in lines.items() if max(e.ts for e in evs) < cutoff}
    if not gone:
        return 0
    return state.forget_saves({step: Retired(max(e.ts for e in evs), steps[step].first_ts or min(e.ts for e in evs),
                                             steps[step].path) for step, evs in gone.items()},
                              [e for evs in gone.values() for e in evs],
                              set().union(*(steps[step].logged for step in gone)),
                              multi_rank=any(len(steps[step].logged) > 1 for step in gone))
