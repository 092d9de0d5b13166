"""Save incidents: ``interrupted_save``, ``storage_failure_during_save``,
``partial_checkpoint`` and ``stalled_save``.

For each save of a job (see :mod:`.saves`) that is not complete:

* failures around it (from ``pre_window`` before its first start onwards, while it is
  unfinished) make it **interrupted** (or a **storage failure during save** when the
  root cause is a storage error), once the evidence has settled: the watermark is
  ``settle`` past the last failure, or the input is final. When the launcher reported
  the job failed (``job_failed``: its ranks are dead, what they printed is written), the
  evidence settles sooner, once the watermark (the job's *low* watermark in ``run`` and
  the fleet: every file of it read that far) is ``confirm`` past the last failure; until
  then the incident is reported at once but **provisional**
  (:attr:`Incident.provisional <ckptwatch.detectors.incident.Incident.provisional>`):
  stored and shown, not paged, as other ranks' lines or a kernel OOM line may still
  arrive and name another root cause;
* with no failure, if the ranks that did not finish went on without it while others
  finished (or a rank reported a save error), it is a **partial checkpoint**: once the
  watermark is ``settle`` past its first start and a rank that did not finish is late by
  its own host's clock (:mod:`.own_clock`: hosts' clocks differ, and one ahead by as much
  as its lines are read behind looks current to the job's watermark), or at the latest
  once the watermark is ``stall_after`` past its start;
* with no failure and no conclusion, once the watermark is ``stall_after`` past its
  start it is **stalled**.

Each incident names the last good checkpoint: the newest earlier step whose save
completed on every expected rank. An incident is ``resolved`` once a later save of the
job completed on every expected rank (the job has a good checkpoint again); a stalled
save that finishes after all is resolved by the runner (:mod:`.runner`).

A save incident whose save is later seen complete on every rank (the last end-of-save
lines arrived late, e.g. from a collector restarted after a kill) no longer holds:
:func:`withdrawal` says why it is withdrawn, unless it was a stall that really lasted
``stall_after`` in event time (then it is resolved: an in-order run saw it too).
"""

from __future__ import annotations

import bisect
import datetime as dt
from dataclasses import dataclass

from ckptwatch.detectors import own_clock, remediation
from ckptwatch.detectors.cause import Attribution, attribute
from ckptwatch.detectors.events import FAILURE_KINDS, Ev
from ckptwatch.detectors.incident import Incident
from ckptwatch.detectors.jobstate import JobState, Retired, ev_key
from ckptwatch.detectors.saves import OWN_TIME, UNKNOWN_STEP, Dating, SaveState, saves_of, stored_elsewhere


#: The kinds this module reports.
KINDS = ("interrupted_save", "storage_failure_during_save", "partial_checkpoint", "stalled_save")


@dataclass(frozen=True)
class SaveWindows:
    """Time windows in seconds."""

    pre_window: float = 60.0  # failures this long before a save's start still count
    settle: float = 30.0  # wait this long after the last failure for late evidence
    #: once the launcher reported the job failed (its ranks are dead, their lines written),
    #: wait only this long past the last failure: for other files read a poll behind
    confirm: float = 5.0
    stall_after: float = 1800.0  # a save with no end and no failure is stalled after this


def _last_good(saves: dict[int, SaveState], retired: dict[int, Retired], complete_steps: list[int],
               step: int) -> dict | None:
    """The newest complete save before ``step`` (kept or retired); ``complete_steps`` sorted
    ascending. A save of a step the logs do not show (:data:`UNKNOWN_STEP`) is no last good
    checkpoint to name: None when only such saves came before."""
    i = bisect.bisect_left(complete_steps, step)
    if i == 0 or complete_steps[i - 1] < 0:
        return None
    best = next((s for s in saves.values() if s.step == complete_steps[i - 1] and s.complete), None)
    if best is None:
        return {"step": complete_steps[i - 1], "path": retired[complete_steps[i - 1]].path}
    return {"step": best.step, "path": best.path}


def _first_key(s: SaveState) -> tuple | None:
    """The place in time of the save's first line (a start, an end or a failure): ``(ts,
    source_id, offset)``, so that lines of one file sharing an inherited time keep their order."""
    return min((ev_key(e) for e in (*s.started.values(), *s.finished.values(), *s.failed.values())), default=None)


def _next_start(saves: dict[int, SaveState], retired: dict[int, Retired]) -> dict[int, tuple | None]:
    """key -> the place in time (:func:`_first_key`) of the earliest later save: of a higher
    step (kept or retired), or the same step's next attempt; for a save of a step the logs do
    not show (:data:`UNKNOWN_STEP`), any save whose first line comes after its own. None if
    there is none."""
    out: dict[int, tuple | None] = {}
    firsts = {k: _first_key(x) for k, x in saves.items()}
    for key, s in saves.items():
        mine = firsts[key]
        if mine is None:
            out[key] = None
            continue
        later = [firsts[k] for k, x in saves.items() if firsts[k] is not None and (
            firsts[k] > mine if s.step == UNKNOWN_STEP or x.step == s.step else x.step > s.step)]
        if s.step != UNKNOWN_STEP:
            later += [(r.first_ts, "", -1) for step, r in retired.items() if step > s.step and r.first_ts is not None]
        out[key] = min(later, default=None)
    return out


def evaluate(
    state: JobState,
    host_events: list[Ev],
    watermark: dt.datetime,
    *,
    final: bool,
    windows: SaveWindows = SaveWindows(),
    saves: dict[int, SaveState] | None = None,
    events: list[Ev] | None = None,
    clock: own_clock.Clock | None = None,
) -> list[Incident]:
    """Incidents of the job's saves as of ``watermark`` (UTC). ``host_events`` are kernel /
    storage events of the job's hosts (already joined by host or pid); ``events`` (the
    job's events in time order) and ``saves`` (their :func:`saves_of`), when the caller has
    them already. ``clock``: the clock of a set of the job's files (:meth:`JobState.clock_of
    <ckptwatch.detectors.jobstate.JobState.clock_of>`), by which a rank missing from a save
    is judged late (:mod:`.own_clock`); None: by ``watermark`` alone."""
    events = events if events is not None else state.events_sorted()
    saves = saves if saves is not None else saves_of(state, events)
    job_failures = [e for e in events if e.kind in FAILURE_KINDS]
    out: list[Incident] = []
    complete_steps = sorted({s.step for s in saves.values() if s.complete} | set(state.retired))
    next_start = _next_start(saves, state.retired)
    for key in sorted(saves, key=lambda k: (saves[k].step, saves[k].first_ts or dt.datetime.min.replace(tzinfo=dt.timezone.utc))):
        s = saves[key]
        step = s.step
        if s.complete or s.first_ts is None:
            continue
        n_before = len(out)
        start = s.first_ts - dt.timedelta(seconds=windows.pre_window)
        failures = sorted(
            {e.ref: e for e in [*job_failures, *host_events] if e.ts >= start and not stored_elsewhere(e, s.path)}.values(),
            key=lambda e: (e.ts, e.source_id, e.offset),
        )
        # failures that belong to a later save's window are that save's business
        later = next_start[key]
        if later is not None:
            failures = [e for e in failures if ev_key(e) < later]
        save_items = [(e, "save") for e in (*s.started.values(), *s.finished.values(), *s.failed.values())]
        last_good = _last_good(saves, state.retired, complete_steps, step)
        went_on = _survived(failures, events, state, s)
        deaths = [e for e in failures if e.kind not in ("save_error", "job_failed") and e.ref not in went_on]
        settle = dt.timedelta(seconds=windows.settle)
        stall = dt.timedelta(seconds=windows.stall_after)
        if deaths or any(e.kind == "job_failed" for e in failures):
            launcher_said = any(e.kind == "job_failed" for e in failures)
            settled = (final or watermark >= failures[-1].ts + settle
                       or (launcher_said and watermark >= failures[-1].ts + dt.timedelta(seconds=windows.confirm)))
            if not settled and not launcher_said:
                continue
            att = _dated(attribute(deaths or failures, state, s.expected, set(s.missing)), [*events, *host_events])
            assert att is not None
            kind = "storage_failure_during_save" if att.root.cls == "storage_error" else "interrupted_save"
            items = save_items + [(e, "root_cause") for e in att.root_events] + [
                (e, "collateral") for e in att.collateral_events]
            out.append(_incident(kind, state, s, att.root, att.collateral, last_good, items,
                                 _began(s, att.root.ts), path=s.path or _named_by(att.root_events, s)))
            out[-1].provisional = not settled  # the launcher said the job failed; late lines may still come
        elif s.failed or (s.missing and s.done_ranks and _went_on(state, s)):
            if not (final or watermark >= s.first_ts + settle):
                continue
            if not (final or s.failed or clock is None or watermark - s.began >= stall
                    or own_clock.any_overdue(state, s, saves, clock, settle)):
                continue  # each rank not finished is behind on its own host's clock: its lines may be on their way
            # with the failures its ranks went on from (the OSError under a 'failed to save shard')
            caught = {e.ref: e for e in [*s.failed.values(), *(f for f in failures if f.ref in went_on)]}
            att = _dated(attribute(sorted(caught.values(), key=lambda e: (e.ts, e.source_id, e.offset)), state,
                                   s.expected), events)
            root = att.root if att else None
            out.append(_incident("partial_checkpoint", state, s, root, att.collateral if att else [], last_good,
                                 save_items + [(e, "root_cause") for e in (att.root_events if att else [])],
                                 s.began))
        elif watermark - s.began >= stall:  # from a start dated by lines' own times (an inherited one is a lower bound)
            out.append(_incident("stalled_save", state, s, None, [], last_good, save_items, s.began))
        again = any(x.step == step and x.complete and x.first_ts and x.first_ts > s.first_ts for x in saves.values())
        if step == UNKNOWN_STEP:  # of no known step: resolved only by a save that came after it
            mine = _first_key(s)
            again = any(x.complete and (k := _first_key(x)) is not None and mine is not None and k > mine
                        for x in saves.values())
        if len(out) > n_before and ((complete_steps and complete_steps[-1] > step and step != UNKNOWN_STEP) or again):
            out[-1].status = "resolved"  # a later save, or a later attempt of this step, completed
    return out


def _dated(att: Attribution | None, events: list[Ev]) -> Attribution | None:
    """``att`` with the time of its root cause dated as :class:`~ckptwatch.detectors.saves.Dating`
    dates it among ``events`` when the root line's time is not its own (inherited from an
    earlier line: the failure happened by the next own time of its file, not then)."""
    root = att.root_events[0] if att is not None and att.root_events else None
    if root is not None and root.ts_source not in OWN_TIME and att.root.ts == root.ts:
        att.root.ts = Dating.of_events(events).of(root)
    return att


#: failures a process may catch and go on from (a failed write of its shard, its save code's error)
_SURVIVABLE = frozenset({"storage_error", "exception", "host_memory"})


def _survived(failures: list[Ev], events: list[Ev], state: JobState, s: SaveState) -> set:
    """Refs of the failures in ``failures`` that their rank went on from: a storage error or an
    exception in save code after which the same rank began or finished a save of a later step
    (a loop that catches a failed shard write, logs it and trains on). Its save is partial, not
    interrupted: nothing died."""
    caught = [(e, r) for e in failures if e.kind in _SURVIVABLE and (r := state.rank_of(e)) is not None]
    if not caught:
        return set()
    later: dict[int, dt.datetime] = {}  # rank -> its newest save line of a later step (one pass)
    for x in events:
        if x.kind in ("save_start", "save_end") and x.step is not None and x.step > s.step:
            r = state.rank_of(x)
            if r is not None and (r not in later or x.ts > later[r]):
                later[r] = x.ts
    return {e.ref for e, r in caught if r in later and later[r] > e.ts}


def _began(s: SaveState, failed: dt.datetime | None) -> dt.datetime:
    """When an interrupted save began, as reported (``first_ts``): its dated start, or the
    failure's time when that is earlier; and when nothing after its undated start in its file
    has a time (a ``print`` after 48 minutes of undated evaluation, then a bash ``Killed``),
    the failure that ended it (a kernel's stamped OOM kill) is the first time known after
    the start: the save began by then, not 48 minutes before."""
    if failed is None:
        return s.began
    if not s.began_bounded and failed > s.began:
        return failed
    return min(s.began, failed)


def _named_by(root_events: list[Ev], s: SaveState) -> str | None:
    """The checkpoint path a save's failure names, when the save's own lines name none
    (mmengine's 'Saving checkpoint at 24 epochs', then ``OSError: [Errno 5] …: '…/epoch_24.pth'``):
    the path of a root event of the save's step."""
    if s.step == UNKNOWN_STEP:
        return None
    return next((e.path for e in root_events if e.path and e.step == s.step), None)


def _incident(kind: str, state: JobState, s: SaveState, root, collateral: list[int], last_good: dict | None,
              items: list[tuple[Ev, str]], first_ts: dt.datetime, *, path: str | None = None) -> Incident:
    """The incident of save ``s``; ``path``: its checkpoint's, when its failure names it (default ``s.path``)."""
    step = None if s.step == UNKNOWN_STEP else s.step
    path = path or s.path
    return Incident(
        kind=kind, job=state.job, step=step, checkpoint_path=path, root_cause=root, collateral=collateral,
        # the world size the job's lines state, beside the ranks seen saving (often rank 0 alone)
        checkpoint_state={**s.state_dict(), **({"world_size": state.world_size} if state.world_size else {})},
        last_good_checkpoint=last_good,
        remediation=remediation.for_save(kind, step, path, root, last_good, presumed=s.presumed), first_ts=first_ts,
        evidence=state.evidence(items),
    )


def _went_on(state: JobState, s: SaveState) -> bool:
    """Some rank that finished this save has logged a later step: the job moved on."""
    return any(state.last_metric_step.get(r, -1) > s.step for r in s.finished)


def began(inc: Incident) -> dt.datetime:
    """When the save a save incident is about began, as far as its evidence shows: the
    earliest event it cites as part of the save (UTC); its ``first_ts`` when it cites none."""
    return min((e.ts for e in inc.evidence if e.role == "save"), default=inc.first_ts)


def save_of(inc: Incident, saves: dict[int, SaveState]) -> SaveState | None:
    """The save (attempt) of ``saves`` that save incident ``inc`` is about: same step, and
    one of the save events it cites; None when there is none."""
    cited = {(e.source_id, e.offset) for e in inc.evidence if e.role == "save"}
    for s in saves.values():
        if s.step == inc.step and any(e.ref in cited for e in (*s.started.values(), *s.finished.values(),
                                                               *s.failed.values())):
            return s
    return None


def withdrawal(inc: Incident, s: SaveState, windows: SaveWindows = SaveWindows()) -> str | None:
    """Why save incident ``inc`` is withdrawn now that its save ``s`` is seen complete on
    every rank (see :meth:`Incident.withdraw <ckptwatch.detectors.incident.Incident.withdraw>`);
    None when it held all the same: a ``stalled_save`` whose last rank ended the save
    ``stall_after`` or more after it began (event time) did stall, and is resolved instead."""
    if not s.complete or s.first_ts is None:
        return None
    last = max(((s.finished.get(r) or s.implicit[r]).ts for r in s.expected), default=s.first_ts)
    took = (last - s.first_ts).total_seconds()
    if inc.kind == "stalled_save" and took >= windows.stall_after:
        return None
    late = sorted(set(inc.checkpoint_state.get("started_not_finished", []))
                  | set(inc.checkpoint_state.get("not_started", [])))
    who = f" of rank(s) {', '.join(map(str, late))}" if late else ""
    within = f", within the {windows.stall_after:g} s a save may take" if inc.kind == "stalled_save" else ""
    return (f"the save of step {s.step} finished on every rank after all, at {last:%H:%M:%S} UTC, {took:.0f} s after "
            f"it began{within}: the end-of-save lines{who} arrived late, and the checkpoint is whole")
