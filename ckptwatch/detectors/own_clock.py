"""Whether a rank missing from a save is late by its own host's clock.

Each host stamps its lines with its own clock, and hosts' clocks differ (NTP off, a VM
resumed: seconds to minutes). A job's watermark is one clock for all its hosts: the
newest event time of its files (the low watermark in ``run`` and the fleet: the least of
the files still being read). A host whose clock is ahead by as much as its lines are read
behind (a collector catching up, a tail a few polls late, a time-ordered merge of the
hosts' logs) looks current to it: its files' newest times are as new as everyone's. Its
ranks' part of a save then seems not to have begun when the job's watermark is ``settle``
past the save's first start (stamped by another host's clock), and a healthy save was
paged as a ``partial_checkpoint`` (issue 35).

So a rank that has not finished a save the others finished and went on from is judged on
its own clock: that of the files its lines come from (its host's), as far as they have been
read, moved on by the wall time since they last grew (:meth:`JobState.clock_of
<ckptwatch.detectors.jobstate.JobState.clock_of>`). It is late (:func:`overdue`) once that
clock is ``settle`` past

* its own start line of the save, if it printed one;
* else, if its own progress has not gone past the save's step, its newest line: it has
  not reached the save in what was read of it, and is missing only once its files have been
  quiet that long (a rank hung before the save; one whose lines are still coming is not);

and at once when its progress went past the save's step without it (it went on without
saving), when its files are silent longer than ``source_idle`` (nothing more is coming:
the job's watermark judges, as before), or when nothing places it (no file known). A rank
hung in a save is paged as soon as before: its files go quiet, or its host-mates' lines in
the same file move its clock on. A rank whose lines keep coming without ever reaching the
save is waited for until the job's watermark is ``stall_after`` past the save's start
(:mod:`.save_incidents`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable

from ckptwatch.detectors.jobstate import JobState, from_us
from ckptwatch.detectors.saves import SaveState

#: the clock of a set of the job's files (source ids): UTC, or None when none of them is
#: being read (see :meth:`JobState.clock_of <ckptwatch.detectors.jobstate.JobState.clock_of>`)
Clock = Callable[[Iterable[str]], dt.datetime | None]


def _lines_of(rank: int, saves: dict[int, SaveState]):
    """The save lines of ``rank`` in ``saves`` (starts, ends, failures)."""
    for x in saves.values():
        for part in (x.started, x.finished, x.failed):
            e = part.get(rank)
            if e is not None:
                yield e


def overdue(state: JobState, s: SaveState, rank: int, saves: dict[int, SaveState], clock: Clock,
            settle: dt.timedelta) -> bool:
    """``rank`` (expected in save ``s``, not finished) is late by its own clock (see the
    module's docstring). ``saves``: the job's saves (where its save lines are found);
    ``clock``: the clock of a set of the job's files (``JobState.clock_of`` with the
    lateness, wall time and ``source_idle`` of the caller)."""
    start = s.started.get(rank)
    if start is None and state.last_metric_step.get(rank, -1) > s.step:
        return True  # it logged steps past the save without it: it went on without saving
    progress = state.progress_by_rank.get(rank)
    own = list(_lines_of(rank, saves))
    sources = {e.source_id for e in own} | set(progress.sid if progress is not None else ())
    now = clock(sources)
    if now is None:
        return True  # no file of it known, or all silent past source_idle: the job's watermark judges
    if start is not None:
        anchor = start.ts
    else:
        newest = [e.ts for e in own]
        if progress is not None and len(progress):
            newest.append(from_us(progress.ts[-1]))
        if not newest:
            return True
        anchor = max(newest)
    return now >= anchor + settle


def any_overdue(state: JobState, s: SaveState, saves: dict[int, SaveState], clock: Clock,
                settle: dt.timedelta) -> bool:
    """Some rank missing from save ``s`` is late by its own clock (:func:`overdue`)."""
    return any(overdue(state, s, rank, saves, clock, settle) for rank in s.missing)
