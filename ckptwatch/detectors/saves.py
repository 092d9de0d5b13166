"""The save lifecycle of one job, per step and rank, derived from its events.

A rank's part of the save of step N is

* **started** by a ``save_start`` event for step N. A save line without a step (torchtitan,
  torchtune, "Saving checkpoint...") is the save of the rank's last logged step; in a log
  that shows no step at all (a pasted console), a save of a step not shown (reported with
  step None), each such line a save of its own;
* **finished** by a ``save_end`` event for step N (one without a step ends the rank's open
  save); a saver that announces each file it writes (DeepSpeed's ``[Torch] Saving
  …/zero_pp_rank_5_mp_rank_00_model_states.pt...`` / ``[Torch] Saved ….pt.``) has finished
  only when every file it began has its end line, and a file begun after one ended opens
  the rank's part again (an end line that names no file, such as "Checkpoint global_step1000
  is ready now!", ends all of it), or implicitly when the rank logs progress (a metric line with a later step, or
  with no step at all, or a later ``save_start``) after the save started and before any
  failure of the job: a synchronous save must have returned before training went on,
  but progress logged after a failure, or in a file after a resume of this step or an older
  one (a new run: one killed in the middle of a save may log no failure at all), comes from
  another process, which says nothing of the save that was under way. Asynchronous saves (a start with
  ``attrs.async``) end only at their own end line, also when their blocking part logged its
  end before the background part began. When the trainer says training finished
  (``job_end``: HF Trainer's "Training completed", Megatron's "exiting program after N
  minutes") before any failure or restart, every expected rank's part ends. So does the
  rank's own first failure when its traceback runs through evaluation or training code
  (``attrs.during == "other"``): the process had returned from the save. Implicit ends
  are listed apart;
* **failed** by a ``save_error`` event for step N, or by any failure whose traceback passes
  through save code (``attrs.during == "save"``: see the rule packs' ``frames``), which is
  also a start when no save line was printed: at the step the error's path names, else the
  rank's open save, else the rank's last logged step.

Rank-less save and progress lines are the main process's (rank 0): trainers print them from
rank 0 only. The ranks expected to take part: when the job logs saves on several ranks (as
DCP trainers do), every rank that printed a save line in any of the job's saves; when it
logs saves from one rank only (as HF Trainer does from the main process), that rank. A rank
whose save lines are not in the logs read (a console filtered to some local ranks, files of
a node without a host label) is not expected to say anything.

**Times a line inherited.** A line without a time of its own carries the time of a line
before it (:mod:`ckptwatch.ingest.timestamps`): a bound from below only, which may be long
before the line was written (an untimed ``saving checkpoint`` print 40 minutes after the
last dated line). Such a time orders the save among the job's lines as it always did
(``first_ts``, the earliest start), but never stands for when the save began: that is
:attr:`SaveState.began`, each start dated by :class:`Dating`, the earliest time of its own
(parsed from its line or captured by a rule) among the job's lines after it in its file (the
failure that cut the save, the next dated line); an incident's ``first_ts`` and the stall
judgement (:mod:`.save_incidents`) and the picture (:mod:`ckptwatch.history.timeline`) go by it.
"""

from __future__ import annotations

import bisect
import datetime as dt
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from ckptwatch.detectors.events import FAILURE_KINDS, Ev, in_save
from ckptwatch.detectors.incident import OWN_TIME
from ckptwatch.detectors.jobstate import NO_STEP, JobState, ev_key as _key
from ckptwatch.detectors.save_points import presumed_saves
from ckptwatch.naming import CKPT_FILE_NAME, step_from_path

_SAVE_KINDS = ("save_start", "save_end", "save_error")
#: a load of the step just saved, in the saving file, this soon after the save began is the
#: same process reading back what it wrote (an evaluation, a probe); later, a new run
RELOAD_WINDOW = dt.timedelta(seconds=120)

#: the step (and key) of a save that failed where no line of the job tells a step (a pasted
#: traceback alone): reported with step None; below every other key, abandoned attempts' too
UNKNOWN_STEP = -(1 << 40)


class Dating:
    """When lines without a time of their own happened, as far as the lines after them tell.

    A time inherited from an earlier line (``ts_source`` ``inherited``) or taken from the
    file's mtime says only that the line came no earlier. Such a line is dated by the
    earliest own time (:data:`OWN_TIME`) among the lines given that come after it in its file
    (by offset: a file is written in time order), and keeps its time when none does or that
    one is earlier. A line with a time of its own keeps it.

    ``places``: ``(source_id, offset, ts, ts_source)`` of the lines known (ts UTC); those
    without an own time only need to be given to :meth:`at`. Construction is O(n log n);
    :meth:`at` a binary search."""

    def __init__(self, places: Iterable[tuple[str, int, dt.datetime, str | None]]) -> None:
        by_source: dict[str, list[tuple[int, dt.datetime]]] = {}
        for sid, offset, ts, source in places:
            if source in OWN_TIME:
                by_source.setdefault(sid, []).append((offset, ts))
        self._offsets: dict[str, list[int]] = {}
        self._earliest_from: dict[str, list[dt.datetime]] = {}  # the earliest own time from each index on
        for sid, rows in by_source.items():
            rows.sort(key=lambda r: r[0])
            earliest: list[dt.datetime] = []
            for _, ts in reversed(rows):
                earliest.append(ts if not earliest or ts < earliest[-1] else earliest[-1])
            earliest.reverse()
            self._offsets[sid] = [offset for offset, _ in rows]
            self._earliest_from[sid] = earliest

    @classmethod
    def of_events(cls, events: Iterable[Ev]) -> Dating:
        """The dating the own times of ``events`` give."""
        return cls((e.source_id, e.offset, e.ts, e.ts_source) for e in events)

    def at(self, source_id: str, offset: int, ts: dt.datetime, ts_source: str | None) -> dt.datetime:
        """The time of the line at ``offset`` of ``source_id`` whose time is ``ts`` (from
        ``ts_source``): ``ts`` if it is the line's own, else the earliest own time of a later
        line of its file when that is later than ``ts``, else ``ts``."""
        if ts_source in OWN_TIME:
            return ts
        offsets = self._offsets.get(source_id)
        if not offsets:
            return ts
        i = bisect.bisect_right(offsets, offset)
        return max(ts, self._earliest_from[source_id][i]) if i < len(offsets) else ts

    def of(self, e: Ev) -> dt.datetime:
        """:meth:`at` for event ``e``."""
        return self.at(e.source_id, e.offset, e.ts, e.ts_source)


@dataclass
class SaveState:
    """One save. ``first_ts`` is the earliest start (UTC), by the times the lines carry, an
    inherited one included: the save's place among the job's lines. ``began`` is when the save
    began as far as times of the lines' own tell: the earliest start, one whose time is
    inherited dated by :class:`Dating` (the next own time of its file); what is reported
    (an incident's ``first_ts``) and judged (a stall) goes by it. ``began_bounded``: False
    when its start has no own time and no later line of its file has one (``began`` is then
    only a lower bound: the failure that ended the save is the next thing known to come after
    it). Ranks are global ranks."""

    step: int
    path: str | None = None
    first_ts: dt.datetime | None = None
    began: dt.datetime | None = None
    began_bounded: bool = True
    #: a start line said the save goes on in the background (``attrs.async``): it ends only at
    #: its own end line, not at the next progress line
    background: bool = False
    started: dict[int, Ev] = field(default_factory=dict)
    finished: dict[int, Ev] = field(default_factory=dict)
    implicit: dict[int, Ev] = field(default_factory=dict)
    failed: dict[int, Ev] = field(default_factory=dict)
    expected: set[int] = field(default_factory=set)
    logged: set[int] = field(default_factory=set)  # ranks that printed a start or end line of it
    paths: set[str] = field(default_factory=set)  # every path its lines named

    @property
    def done_ranks(self) -> set[int]:
        return set(self.finished) | set(self.implicit)

    @property
    def complete(self) -> bool:
        return bool(self.expected) and self.expected <= self.done_ranks and not self.failed

    @property
    def missing(self) -> list[int]:
        return sorted(self.expected - self.done_ranks)

    @property
    def presumed(self) -> bool:
        """No line of the logs says this save began: it is presumed from where the job died
        (:mod:`.save_points`)."""
        return any(e.attrs.get("presumed") for e in self.started.values())

    def state_dict(self) -> dict[str, object]:
        """The ``checkpoint_state`` of an incident: which ranks' shards are known written
        (and ``presumed: True`` for a save no line of the logs announced)."""
        return {
            **({"presumed": True} if self.presumed else {}),
            "expected_ranks": sorted(self.expected),
            "finished": sorted(self.finished),
            "finished_implicitly": sorted(set(self.implicit) - set(self.finished)),
            "started_not_finished": sorted(set(self.started) - self.done_ranks),
            "not_started": sorted(self.expected - set(self.started) - self.done_ranks),
            "failed": sorted(self.failed),
        }


def _better_path(a: str | None, b: str | None) -> str | None:
    """The save's path of two its lines name: the checkpoint's directory when one lies inside
    the other and the outer one names the step by a trainer's convention (Accelerate's
    ``checkpoint_1200`` rather than its ``checkpoint_1200/pytorch_model_fsdp_0``), else the
    longer (the more precise)."""
    if a is None:
        return b
    if b is None:
        return a
    short, long_ = (a, b) if len(a) <= len(b) else (b, a)
    inner = long_.rstrip("/")
    outer = short.rstrip("/")
    if inner.startswith(outer + "/") and step_from_path(os.path.basename(outer)) is not None:
        return short
    return long_


def _per_rank_files_dir(paths: set[str]) -> str | None:
    """The directory of a checkpoint written as a file per rank (``torch.save(state,
    f"{dir}/model_rank{rank}.pt")`` in a plain loop, ``mp_rank_00_model_states.pt`` …): the
    paths share a directory and their names differ only in digits. None otherwise."""
    dirs = {os.path.dirname(p.rstrip("/")) for p in paths}
    if len(paths) < 2 or len(dirs) != 1:
        return None
    names = {re.sub(r"\d+", "#", os.path.basename(p.rstrip("/"))) for p in paths}
    d = dirs.pop()
    return d if len(names) == 1 and d not in ("", "/") else None


def _file_of(path: str | None) -> str | None:
    """The file name of ``path`` when it names one checkpoint file (``…/global_step10/
    zero_pp_rank_5_mp_rank_00_model_states.pt`` -> its base name), else None (a directory).
    A rule that keeps the checkpoint's directory as ``path`` names the file in ``attrs.file``."""
    if not path:
        return None
    name = os.path.basename(path.rstrip("/"))
    return name if CKPT_FILE_NAME.search(name) else None


def _parts(path: str) -> list[str]:
    """A path's components, without a URL scheme, empty parts or ``.``."""
    path = re.sub(r"^[a-z][a-z0-9+.-]*://", "", path.strip())
    return [x for x in re.split(r"[/\\]+", path) if x and x != "."]


def _holds(seq: list[str], sub: list[str]) -> bool:
    """``sub`` is a contiguous run of ``seq`` (both component lists; an empty ``sub`` is not)."""
    n = len(sub)
    return n > 0 and any(seq[i:i + n] == sub for i in range(len(seq) - n + 1))


def stored_elsewhere(e: Ev, checkpoint: str | None) -> bool:
    """``e`` is a storage error on a path that has nothing to do with the checkpoint being
    saved (wandb's ``[Errno 28] No space left on device: '/tmp/wandb/…/output.log'`` during
    the save of ``out/checkpoint-200``): not the save's failure. Related, and so False, when
    either path is unknown or the error's path holds the checkpoint's path, its directory
    (a temporary sibling such as HF's ``tmp-checkpoint-200``) or its last component (an
    upload named from the checkpoint's folder), or is one of the checkpoint's parents (the
    mount it lives on; for a relative checkpoint, any absolute path of one or two
    components). Paths are compared by component, a URL scheme dropped."""
    if e.kind != "storage_error" or not e.path or not checkpoint:
        return False
    err, ckpt = _parts(e.path), _parts(checkpoint)
    if not err or not ckpt:
        return False
    if _holds(err, ckpt) or _holds(err, ckpt[:-1]) or ckpt[-1] in err:
        return False
    if checkpoint.startswith("/"):
        return ckpt[:len(err)] != err
    # a relative checkpoint lies under a working directory the logs do not name: a short
    # absolute path (a mount such as /data) may be its parent
    return len(err) > 2


def _before(a: Ev, b: Ev) -> bool:
    """``a`` came before ``b``: by time, and for lines that share a time (undated lines
    inherit one) by their order in one file; in two files such lines are not ordered, so
    ``a`` is not held to be after ``b``."""
    if a.ts != b.ts:
        return a.ts < b.ts
    return a.offset < b.offset if a.source_id == b.source_id else True


def _went_on_between(bucket, after: tuple, before: tuple) -> bool:
    """The rank's progress stream (a ``ProgressBucket`` or None) logged a line between the
    event keys ``after`` and ``before``."""
    if bucket is None:
        return False
    i = bucket.last_before(before)
    return i is not None and bucket.key(i) > after


def saves_of(state: JobState, events: list[Ev]) -> dict[int, SaveState]:
    """All saves of a job by step, with expected ranks and implicit ends filled in.
    ``events``: the job's events in time order (progress lines are in
    ``state.progress_by_rank``). A step saved again after the job failed or resumed (a
    restarted process writing the same step) is a new attempt: the earlier, unfinished one is
    kept under a negative key (its ``step`` is the step)."""
    saves: dict[int, SaveState] = {}
    progress = state.progress_by_rank
    presumed = presumed_saves(state, events)  # a job that logs no save line, killed where trainers save
    if presumed:
        events = sorted([*events, *presumed], key=_key)
    failures: list[Ev] = []  # job failures, in time order
    ends: list[Ev] = []  # the trainer said training finished
    started_step: dict[int, tuple[tuple, int]] = {}  # rank -> (key, step) of its latest save line with a step
    open_save: dict[int, int] = {}  # rank -> the step of its latest started save not ended
    stepless_start: dict[int, tuple] = {}  # rank -> key of its save line that no step came before
    restarts: list[dt.datetime] = []  # deaths, loads and resumes: after one, a save of the same step is a new attempt
    rewinds: list[Ev] = []  # loads and resumes of a known step: a run that went back to an older step
    abandoned: list[SaveState] = []  # earlier attempts of a step saved again after a restart
    open_files: dict[tuple[int, int], set[str]] = {}  # (step, rank) -> files begun, not yet ended
    by_file: set[tuple[int, int]] = set()  # (step, rank) whose part a file's end line finished
    # progress that names a step (a Keras bar or a loss dict names none: a log may show no step at all)
    stepped = any(len(p.step) and max(p.step) != NO_STEP for p in progress.values())

    def last_step(rank: int, key: tuple, *, anyone: bool) -> int | None:
        """The rank's last logged step before ``key`` (a progress line or a save line with a
        step), else (``anyone``) the latest of any rank's."""
        ranks = [rank] if rank in progress or rank in started_step or not anyone else []
        if anyone and not ranks:
            ranks = list(set(progress) | set(started_step))
        best: tuple[tuple, int] | None = None
        for r in ranks:
            for cand in (progress[r].last_step_before(key) if r in progress else None, started_step.get(r)):
                if cand is not None and cand[0] < key and (best is None or cand[0] > best[0]):
                    best = cand
        return best[1] if best is not None else None

    for ev in events:
        if ev.kind == "job_end":
            ends.append(ev)
        during_save = in_save(ev)
        if ev.kind in FAILURE_KINDS and ev.kind != "save_error":
            failures.append(ev)
        if ev.kind in ("job_failed", "process_exit", "oom_kill", "job_signal", "resume", "load_start"):
            restarts.append(ev.ts)  # processes died, or a new run loaded a checkpoint
            if ev.kind in ("resume", "load_start") and ev.step is not None:
                rewinds.append(ev)
        if ev.kind not in _SAVE_KINDS and not during_save:
            continue
        rank = state.main_rank_of(ev)
        step = ev.step
        if step is None:
            if ev.kind == "save_start":
                step = last_step(rank, _key(ev), anyone=True)
            elif rank in open_save:
                step = open_save[rank]
            elif rank in stepless_start and last_step(rank, stepless_start[rank], anyone=True) is None:
                # the save line came before any step: what counted after it (unsloth's layers,
                # a shard writer's bar) is the save's own loop, not the step it saves
                step = None
            else:
                step = last_step(rank, _key(ev), anyone=True)
        if step is None and ev.kind == "save_start":
            stepless_start[rank] = _key(ev)
        if step is None and (stepped or started_step or ev.kind == "save_end") and not (
                during_save and rank in stepless_start):
            continue  # a step is logged, just not before this line: not a save of its own
        if step is None:
            # no step anywhere (a pasted console, a traceback): a save all the same, of a step not shown
            step = UNKNOWN_STEP
        if ev.kind == "save_start" and ev.step is not None:
            started_step[rank] = (_key(ev), ev.step)
        s = saves.setdefault(step, SaveState(step=step))
        if (ev.kind == "save_start" and step == UNKNOWN_STEP and rank in s.started and rank not in s.failed
                and (rank in s.finished or _went_on_between(progress.get(rank), _key(s.started[rank]), _key(ev)))):
            # saves of no known step, one after another (ended, or the rank trained on between
            # them: ColossalAI's 'Start saving model checkpoint…' at each interval): each is its own
            abandoned.append(s)
            s = saves[step] = SaveState(step=step)
        if ev.kind == "save_start" and rank in s.started and rank not in s.failed:
            since = s.started[rank].ts
            # the job died or a new run loaded a checkpoint: a new attempt (one that finished
            # before stays a save of its own: a run resumed from an older step writes it again)
            if any(since < t < ev.ts for t in restarts):
                abandoned.append(s)
                s = saves[step] = SaveState(step=step)
        s.path = _better_path(s.path, ev.path if ev.kind in _SAVE_KINDS else None)
        if ev.path and ev.kind in _SAVE_KINDS:
            s.paths.add(ev.path)
        if ev.kind in ("save_start", "save_end"):
            s.logged.add(rank)
        if ev.kind == "save_start" or (during_save and rank not in s.started):
            s.started.setdefault(rank, ev)
            s.first_ts = ev.ts if s.first_ts is None or ev.ts < s.first_ts else s.first_ts
            open_save[rank] = step
        if ev.kind == "save_start" and ev.attrs.get("async"):
            s.background = True
        if ev.kind == "save_start" and ev.attrs.get("async") and rank in s.finished and rank not in s.failed:
            # the blocking part ended ('[step=4000] Finished synchronous save.'), then the save went
            # on in the background (MaxText's 'Started an asynchronous checkpoint save for step
            # 4000'): the part is open again until its own end line
            s.finished.pop(rank)
            s.started[rank] = ev
        fname = (ev.attrs.get("file") or _file_of(ev.path)) if ev.kind in ("save_start", "save_end") else None
        if ev.kind == "save_start" and fname:
            open_files.setdefault((step, rank), set()).add(fname)
            if (step, rank) in by_file:  # another file after one ended: the part is open again
                by_file.discard((step, rank))
                s.finished.pop(rank, None)
        if ev.kind == "save_end" and fname and open_files.get((step, rank)):
            open_files[(step, rank)].discard(fname)
            if open_files[(step, rank)]:
                continue  # one file of several begun: the rank's part goes on
            by_file.add((step, rank))
        elif ev.kind == "save_end":
            open_files.pop((step, rank), None)
            by_file.discard((step, rank))
        if ev.kind == "save_end":
            s.finished.setdefault(rank, ev)
            if s.first_ts is None:
                s.first_ts = ev.ts
            if open_save.get(rank) == step:
                del open_save[rank]
        elif ev.kind == "save_error" or during_save:
            s.failed.setdefault(rank, ev)
    for i, old in enumerate(abandoned):
        saves[-(i + 1)] = old  # keyed apart; SaveState.step is the step
    dating: Dating | None = None
    for s in saves.values():
        s.path = _per_rank_files_dir(s.paths) or s.path
        firsts = list(s.started.values()) or list(s.finished.values())
        s.began = s.first_ts
        if any(e.ts_source not in OWN_TIME for e in firsts):  # a start no earlier than its time: dated by later lines
            dating = dating or Dating.of_events(events)
            dated = [(dating.of(e), e) for e in firsts]
            s.began = min(ts for ts, _ in dated)
            s.began_bounded = any(e.ts_source in OWN_TIME or ts > e.ts for ts, e in dated)
    # ranks that print save lines (not those only known from an error in save code)
    # (those of saves let go count: :mod:`.retire`)
    multi_rank = state.retired_multi or any(len(s.logged) > 1 for s in saves.values())
    seen_ranks = set(state.retired_ranks).union(*(x.logged for x in saves.values()))
    for s in saves.values():
        logged = set(s.started) | set(s.finished) | set(s.failed)
        if multi_rank and state.world_size:
            s.expected = set(range(state.world_size)) & (seen_ranks | logged)
        elif multi_rank:
            s.expected = set(seen_ranks) or logged
        else:
            s.expected = logged
        if s.first_ts is None:
            continue
        failed_at = next((f for f in failures if f.ts >= s.first_ts and not stored_elsewhere(f, s.path)), None)
        # a run that, after the save began, resumed from this step or an older one is another
        # process: what its file logs after that (progress, end of training, saves) ends
        # nothing of this save (a run killed mid-save may log no failure; the next one goes
        # past the step again). Not so a load of this very step in the save's own file within
        # RELOAD_WINDOW of its start (an evaluation, ckptwatch's probe after a save: the
        # process reads what it wrote), a load of a later step, or a run in another file.
        own_files = {e.source_id for e in s.started.values()}
        back = [e for e in rewinds if e.ts > s.first_ts and e.step <= s.step
                and not (e.step == s.step and e.source_id in own_files and e.ts - s.first_ts <= RELOAD_WINDOW)]

        def own(end: Ev | None, back: list[Ev] = back) -> Ev | None:
            """``end``, unless a run that went back to an older step logged it."""
            return None if end is not None and any(r.source_id == end.source_id and _before(r, end)
                                                   for r in back) else end
        ended = own(next((e for e in ends if e.ts >= s.first_ts), None))
        # any of its start lines may say so (NeMo's 'Global Checkpoint Save : Rank: 0' comes
        # before its 'Scheduled async checkpoint save for …', both of rank 0)
        is_async = s.background
        for rank in s.expected - set(s.finished):
            start_ev = s.started.get(rank)
            memo = (s.step, rank, start_ev.dedup_key if start_ev is not None else "")
            # (an end found before a later line said the save goes on in the background is none)
            went_on = None if is_async else state.implicit_memo.get(memo)
            if went_on is None and not is_async and rank in progress:
                where = state.copies.get(start_ev.dedup_key, {}) if start_ev is not None else {}
                went_on = progress[rank].first_after(start_ev, s.first_ts, s.step, where)
            went_on = own(went_on)
            if went_on is None or (ended is not None and ended.ts < went_on.ts):
                went_on = ended
            if went_on is not None and (failed_at is None or _before(went_on, failed_at)):
                s.implicit[rank] = went_on
                if went_on.kind == "metric":
                    state.implicit_memo[memo] = went_on
        # a traceback through evaluation or training code (the frame vocabulary's "other"),
        # after the save began, in the process that saved: that process had returned from a
        # synchronous save (detectron2's EvalHook running out of memory after the checkpointer
        # wrote model_0004999.pth); the failure is the job's, not the save's
        if not is_async:
            for rank in s.expected - s.done_ranks:
                start_ev = s.started.get(rank)
                moved_on = next((e for e in failures if e.attrs.get("during") == "other" and start_ev is not None
                                 and state.main_rank_of(e) == rank and _before(start_ev, e)
                                 and (failed_at is None or not _before(failed_at, e))), None)
                if moved_on is not None:
                    s.implicit[rank] = moved_on
        # a later save of the same rank that started before any failure also ends this one
        if not is_async:
            for rank in s.expected - s.done_ranks:
                later = [x.started[rank] for x in saves.values() if x.step > s.step and rank in x.started
                         and x.started[rank].ts >= s.first_ts]
                nxt = own(min(later, key=_key, default=None))
                # cut by a failure of its own (or of no rank: its host's) before it began the next
                # save; another rank's failure in the next save ends nothing of this one (Paddle's
                # ranks log no end of save: each one's step-400 save ends at its step-600 start,
                # also when rank 6 ran out of memory in the step-600 save a few ms before another's)
                mine = next((f for f in failures if f.ts >= s.first_ts and not stored_elsewhere(f, s.path)
                             and state.rank_of(f) in (None, rank)), None)
                if nxt is not None and (mine is None or _before(nxt, mine)):
                    s.implicit[rank] = nxt
    return saves
