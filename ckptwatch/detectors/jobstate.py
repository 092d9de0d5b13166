"""What is known of one job: its events (deduplicated), rank/pid/host maps, world size.

Events are kept in a dict keyed by ``dedup_key`` so the same worker line read from the
torchrun console and from the per-rank file counts once (the same text again in the same
file is another occurrence, not a copy); metrics are reduced to the
last step each rank logged. ``events_sorted()`` gives them in event-time order, ties
broken by ``(source_id, offset)`` so the order never depends on arrival.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import datetime as dt
import json
import re
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

import polars as pl

from ckptwatch.detectors.events import LOADING_KINDS, Ev, task_ranks
from ckptwatch.detectors.incident import EvidenceItem
from ckptwatch.frames import detached
from ckptwatch.naming import world_size_from_path

#: progress lines kept per rank (past it, the oldest half goes): their time, step and place
MAX_PROGRESS = 256
#: of those, the newest ones that keep their text, attrs and labels too (the rest are "bare":
#: a query returning one gets an :class:`Ev` with its time, step, rank and place, no text).
#: No incident quotes a progress line (a save's implicit end counts by its time); the
#: payload serves a job ``unknown`` folded into a named one, which keeps all of it.
PAYLOAD_KEEP = 4
#: payload rows a job may hold beyond twice those referenced before they are compacted (per job:
#: a fleet of 312 small jobs held every row with 50,000)
COMPACT_SLACK = 1_024
#: loss lines remembered to count the console's copy of a rank file's line once
LOSS_SEEN = 16_384


class Retired(NamedTuple):
    """What stays of a save let go (:mod:`.retire`): the newest time of its lines, its
    earliest start (UTC) and its checkpoint's path."""

    until: dt.datetime
    first_ts: dt.datetime
    path: str | None


def _source_clock(ts: dt.datetime, at: dt.datetime, now: dt.datetime | None,
                  idle: dt.timedelta | None) -> dt.datetime | None:
    """The clock of one source (file) of a job, for :meth:`JobState.watermark` and
    :meth:`JobState.clock_of`: ``ts``, the newest event time it has shown (UTC), moved on by
    the wall time since ``at``, its last arrival, up to ``now`` (UTC; None: not moved on; an
    arrival after ``now`` moves nothing). None when the source is idle: silent ``idle`` or
    longer (None: never idle)."""
    if now is None:
        return ts
    quiet = max(now - at, dt.timedelta(0))
    if idle is not None and quiet >= idle:
        return None
    return ts + quiet


def ev_key(ev: Ev) -> tuple:
    """An event's place in time: ``(ts, source_id, offset)``."""
    return (ev.ts, ev.source_id, ev.offset)


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
#: progress lines of :meth:`JobState.add_metrics` held as frames before they are filed by rank:
#: per job, and over all jobs of a :class:`~ckptwatch.detectors.runner.Detector`
SETTLE_ROWS = 100_000
#: a progress line without a step, in :attr:`RankProgress.step`
NO_STEP = -(1 << 62)
#: a progress line whose payload was let go, in :attr:`RankProgress.ref`
BARE = -(1 << 62)
#: what else a progress line keeps, to be an :class:`Ev` again when a query returns it
PAYLOAD = ("line", "attrs", "dedup_key", "rule_id", "job", "host", "rank", "local_rank", "pid", "path",
           "ts_source", "source_kind")


def to_us(ts: dt.datetime) -> int:
    """A UTC datetime as microseconds since the epoch (the resolution of Python's datetime)."""
    return (ts - _EPOCH) // dt.timedelta(microseconds=1)


def from_us(us: int) -> dt.datetime:
    return _EPOCH + dt.timedelta(microseconds=us)


class LossCurve:
    """A job's loss curve: ``(time UTC, step, loss)`` points in arrival order, kept as three
    arrays (24 bytes a point; a list of tuples of a datetime, an int and a float took about
    170). A point comes back as such a tuple when iterated. A long job logs a loss every
    step, so this grows with its length: 600,000 steps are 14 MB, not 100."""

    __slots__ = ("_loss", "_step", "_ts")

    def __init__(self, points: Iterable[tuple[dt.datetime, int, float]] = ()) -> None:
        self._ts = array("q")  # microseconds since the epoch, UTC
        self._step = array("q")
        self._loss = array("d")
        for point in points:
            self.append(point)

    def append(self, point: tuple[dt.datetime, int, float]) -> None:
        ts, step, loss = point
        self._ts.append(to_us(ts))
        self._step.append(step)
        self._loss.append(loss)

    def clear(self) -> None:
        for a in (self._ts, self._step, self._loss):
            del a[:]

    def __len__(self) -> int:
        return len(self._ts)

    def __iter__(self) -> Iterator[tuple[dt.datetime, int, float]]:
        return ((from_us(t), s, v) for t, s, v in zip(self._ts, self._step, self._loss))

    def __getitem__(self, i: int) -> tuple[dt.datetime, int, float]:
        return (from_us(self._ts[i]), self._step[i], self._loss[i])

    def __repr__(self) -> str:
        return f"LossCurve({len(self)} points)"


class Payloads:
    """The fields of a job's progress lines that only a returned line needs (its text,
    attrs, labels: :data:`PAYLOAD`), kept as the polars frames they arrived in, each row
    numbered job-wide. A line added one :class:`Ev` at a time keeps that Ev (a negative
    number)."""

    __slots__ = ("job", "frames", "bases", "rows", "single")

    def __init__(self, job: str = "") -> None:
        self.job = job
        self.frames: list[pl.DataFrame] = []
        self.bases: list[int] = []  # job-wide number of each frame's first row
        self.rows = 0
        self.single: list[Ev] = []

    def stored(self) -> int:
        """Rows held (frames and single events), referenced or not."""
        return self.rows - (self.bases[0] if self.bases else self.rows) + len(self.single)

    def compact(self, buckets: list[RankProgress]) -> None:
        """Keep only the rows ``buckets`` still reference (one frame, one list), renumbering
        their refs: rows of lines trimmed or made bare are let go."""
        refs: list[int] = []  # the old numbers of the rows kept, in their new order
        single: list[Ev] = []
        at = self.rows
        for b in buckets:
            for i, r in enumerate(b.ref):
                if r >= 0:
                    refs.append(r)
                    b.ref[i] = at + len(refs) - 1
                elif r > BARE:
                    single.append(self.single[-r - 1])
                    b.ref[i] = -len(single)
        old = pl.concat(self.frames) if self.frames and refs else None
        first = self.bases[0] if self.bases else 0
        frame = old[[r - first for r in refs]] if old is not None else None
        at += len(refs)
        self.frames = [detached(frame)] if frame is not None else []
        self.bases = [self.rows] if frame is not None else []
        self.rows = at
        self.single = single

    def add_frame(self, frame: pl.DataFrame) -> int:
        """Keep ``frame`` (:data:`PAYLOAD` columns); returns the number of its first row."""
        base = self.rows
        self.frames.append(detached(frame))
        self.bases.append(base)
        self.rows += frame.height
        return base

    def add_ev(self, ev: Ev) -> int:
        self.single.append(ev)
        return -len(self.single)

    def ev(self, ref: int, ts_us: int, sid: str, offset: int, step: int, rank: int | None = None) -> Ev:
        """Row ``ref`` as an :class:`Ev` of kind ``metric`` (:data:`BARE`: one without text,
        attrs or labels but ``rank``)."""
        if ref == BARE:
            return Ev(ts=from_us(ts_us), kind="metric", job=self.job, host=None, rank=rank, local_rank=None,
                      pid=None, step=None if step == NO_STEP else step, path=None, rule_id="", source_id=sid,
                      offset=offset, line="", dedup_key=f"{sid}:{offset}")
        if ref < 0:
            return self.single[-ref - 1]
        k = bisect.bisect_right(self.bases, ref) - 1
        r = self.frames[k].row(ref - self.bases[k], named=True)
        attrs = r["attrs"]
        return Ev(ts=from_us(ts_us), kind="metric", job=r["job"], host=r["host"], rank=r["rank"],
                  local_rank=r["local_rank"], pid=r["pid"], step=None if step == NO_STEP else step,
                  path=r["path"], rule_id=r["rule_id"], source_id=sid, offset=offset, line=r["line"],
                  dedup_key=r["dedup_key"] or f"{sid}:{offset}", ts_source=r["ts_source"] or "line",
                  source_kind=r["source_kind"] or "log", attrs=json.loads(attrs) if attrs else {})


class RankProgress:
    """One rank's progress lines in time order, kept as arrays (event time in microseconds,
    offset, step, the row of the rest in the job's :class:`Payloads`) and a list of source
    ids (shared strings): a long job's hundreds of thousands of metric lines cost a few dozen
    bytes each here rather than an :class:`Ev` each. "The first one after a time" and "the
    last step before a time" are binary searches; a line becomes an :class:`Ev` again only
    when a query returns it.

    Blocks arrive mostly in order (appended); one that starts before the newest line kept
    (a console read a poll behind a rank's own file) is merged into the tail. What is kept
    is bounded by :meth:`JobState._prune`: the newest :data:`MAX_PROGRESS` lines, the
    newest :data:`PAYLOAD_KEEP` of them with their payload; ``bare`` lines at the front have
    none (ref :data:`BARE`)."""

    __slots__ = ("ts", "sid", "off", "step", "ref", "payloads", "rank", "bare")

    def __init__(self, payloads: Payloads | None = None, rank: int | None = None) -> None:
        self.ts = array("q")  # event time, microseconds since the epoch, UTC
        self.sid: list[str] = []
        self.off = array("q")
        self.step = array("q")  # NO_STEP: the line names none
        self.ref = array("q")  # the line's row in ``payloads``; BARE: let go
        self.payloads = payloads or Payloads()
        self.rank = rank
        self.bare = 0  # lines [0, bare) are bare

    def __len__(self) -> int:
        return len(self.ts)

    def add(self, ev: Ev) -> None:
        """Insert ``ev``."""
        self.extend([to_us(ev.ts)], [ev.source_id], [ev.offset], [NO_STEP if ev.step is None else ev.step],
                    [self.payloads.add_ev(ev)])

    def extend(self, ts: list[int], sid: list[str], off: list[int], step: list[int], ref) -> None:
        """Insert a block of lines given column by column (``ts`` in microseconds, ``step``
        :data:`NO_STEP` for none, ``ref`` their rows in :attr:`payloads`), sorted by
        ``(ts, sid, off)``."""
        if not ts:
            return
        if self.ts and (ts[0], sid[0], off[0]) < (self.ts[-1], self.sid[-1], self.off[-1]):
            self._merge(ts, sid, off, step, ref)
        else:
            self.ts.extend(ts)
            self.sid.extend(sid)
            self.off.extend(off)
            self.step.extend(step)
            self.ref.extend(ref)

    def cut(self, n: int) -> None:
        """Let the oldest ``n`` lines go."""
        del self.ts[:n], self.sid[:n], self.off[:n], self.step[:n], self.ref[:n]
        self.bare = max(0, self.bare - n)

    def strip(self, upto: int) -> None:
        """Let the payload of lines ``[bare, upto)`` go (they become bare)."""
        for i in range(self.bare, upto):
            self.ref[i] = BARE
        self.bare = max(self.bare, upto)

    def _merge(self, ts, sid, off, step, ref) -> None:
        """Merge an out-of-order block with the kept lines from the block's first time on."""
        i = bisect.bisect_left(self.ts, ts[0])
        self.bare = min(self.bare, i)  # merged lines with a payload may now sit among bare ones
        rows = sorted([*zip(self.ts[i:], self.sid[i:], self.off[i:], self.step[i:], self.ref[i:]),
                       *zip(ts, sid, off, step, ref)], key=lambda r: (r[0], r[1], r[2]))
        del self.ts[i:], self.sid[i:], self.off[i:], self.step[i:], self.ref[i:]
        for column, values in zip((self.ts, self.sid, self.off, self.step, self.ref), zip(*rows)):
            column.extend(values)

    def key(self, i: int) -> tuple:
        """``(ts, source_id, offset)`` of line ``i``, as :func:`ev_key` gives it."""
        return (from_us(self.ts[i]), self.sid[i], self.off[i])

    def ev(self, i: int) -> Ev:
        """Line ``i`` as an :class:`Ev`."""
        return self.payloads.ev(self.ref[i], self.ts[i], self.sid[i], self.off[i], self.step[i], self.rank)

    @property
    def events(self) -> list[Ev]:
        """Every kept line as an :class:`Ev`, in time order."""
        return [self.ev(i) for i in range(len(self.ts))]

    def _index(self, key: tuple) -> int:
        """How many kept lines come before ``key`` (``(ts, source_id, offset)``, ts a datetime)."""
        us = to_us(key[0])
        i = bisect.bisect_left(self.ts, us)
        rest = key[1:]
        while i < len(self.ts) and self.ts[i] == us and (self.sid[i], self.off[i]) < rest:
            i += 1
        return i

    def last_before(self, key: tuple) -> int | None:
        """The index of the latest kept line before ``key``, or None."""
        i = self._index(key)
        return i - 1 if i else None

    def first_in_file_after(self, source_id: str, offset: int, ts: dt.datetime) -> int | None:
        """The file offset of the first kept line of file ``source_id`` past ``offset``, looking
        from event time ``ts`` on (UTC: the lines of one file come in time order), or None."""
        found = [self.off[i] for i in range(bisect.bisect_left(self.ts, to_us(ts)), len(self.ts))
                 if self.sid[i] == source_id and self.off[i] > offset]
        return min(found, default=None)

    def last_step_before(self, key: tuple) -> tuple[tuple, int] | None:
        """``(key, step)`` of the latest line with a step before ``key``, or None."""
        i = self._index(key)
        while i > 0:
            i -= 1
            if self.step[i] != NO_STEP:
                return self.key(i), self.step[i]
        return None

    def first_after(self, start: Ev | None, first_ts: dt.datetime, step: int,
                    copies: dict[str, int]) -> Ev | None:
        """The line :meth:`first_after_index` finds, as an :class:`Ev` (None if none)."""
        i = self.first_after_index(start, first_ts, step, copies)
        return None if i is None else self.ev(i)

    def first_after_index(self, start: Ev | None, first_ts: dt.datetime, step: int,
                          copies: dict[str, int]) -> int | None:
        """The index of the earliest progress line after the save line ``start`` (else after
        ``first_ts``, UTC) with a step above ``step`` or none at all (None if there is none). Lines that
        share the start's time (undated lines inherit one) are after it only in a file where
        they come after it (``copies``: source_id -> offset of the save line in that file)."""
        ts = to_us(start.ts if start is not None else first_ts)
        where = dict(copies)
        if start is not None:
            where.setdefault(start.source_id, start.offset)
        for i in range(bisect.bisect_left(self.ts, ts), len(self.ts)):
            if self.ts[i] == ts and not (self.sid[i] in where and self.off[i] > where[self.sid[i]]):
                continue
            s = self.step[i]
            if s == NO_STEP or s > step:
                return i
        return None


#: host names a launcher reports that name no machine
NO_HOST_NAMES = frozenset({"localhost", "localhost.localdomain", "127.0.0.1", "::1", "<N/A>", "N/A"})
#: a shell's command that is a Python script run by the interpreter itself (not torchrun, deepspeed,
#: accelerate, srun, mpirun, ``python -m torch.distributed.run``)
_PLAIN_PYTHON = re.compile(r"^(?:\S*/)?python[\d.]*(?:\s+-[A-Za-ln-z]\S*)*\s+(?!-m\b)\S+\.py\b")
#: hosts of a job's lines kept (:attr:`JobState.named_hosts`): one is all :meth:`JobState.host_of` asks about
HOSTS_KEPT = 8


@dataclass
class JobState:
    """Per-job state. ``job`` is the job id (torchrun run id)."""

    job: str
    events: dict[str, Ev] = field(default_factory=dict)
    last_metric_step: dict[int, int] = field(default_factory=dict)
    world_size: int | None = None
    pid_rank: dict[int, int] = field(default_factory=dict)
    rank_pid: dict[int, int] = field(default_factory=dict)
    rank_host: dict[int, str] = field(default_factory=dict)
    #: rank -> the host a launcher's failure report names for it (torchrun's ``host :``)
    reported_host: dict[int, str] = field(default_factory=dict)
    local_to_rank: dict[tuple[str | None, int], int] = field(default_factory=dict)
    #: hosts the job's lines name (labels, a kernel log's host), the first :data:`HOSTS_KEPT`
    named_hosts: set[str] = field(default_factory=set)
    #: newest event time of the job (UTC), never past the wall clock by more than a day; of
    #: the events dated by a line of their own (or inheriting one's time) when there are any,
    #: else of those dated by their file's mtime (see :meth:`_clock`)
    max_ts: dt.datetime | None = None
    #: newest event time dated by a file's mtime, not by a line (a file copied today, a paste
    #: without times): the job's clock only while no line has dated one of its events
    _max_mtime_ts: dt.datetime | None = None
    _line_dated: bool = False
    #: wall time (UTC) the job's last event arrived: its watermark moves on with wall time after it
    last_arrival: dt.datetime | None = None
    #: the job's loss curve: (time UTC, step, loss) of the lowest rank that logs losses, in arrival order
    losses: LossCurve = field(default_factory=LossCurve)
    _loss_rank: int | None = None
    _loss_seen: dict[str, None] = field(default_factory=dict)  # ordered: the oldest half goes past LOSS_SEEN
    #: its load, resume and load-error events (few), kept apart for the resume detectors
    loading: list[Ev] = field(default_factory=list)
    #: its checkpoint verifications (``integrity`` events), for :mod:`.integrity_incidents`
    integrity: list[Ev] = field(default_factory=list)
    #: its progress lines (``metric`` events, deduplicated) per rank, in time order, the newest
    #: ``progress_cap`` of each (past it, the oldest half goes), the newest ``payload_keep``
    #: with their text: a save without an end line ends at its rank's next one, a save line
    #: without a step takes the rank's last one's (:meth:`_prune`)
    _progress: dict[int, RankProgress] = field(default_factory=dict)
    progress_cap: int = MAX_PROGRESS
    payload_keep: int = PAYLOAD_KEEP
    #: batches of :meth:`add_metrics` not yet filed under their ranks (:meth:`_settle`)
    _pending: list[pl.DataFrame] = field(default_factory=list)
    #: the rest of each progress line, for the few a query returns
    _payloads: Payloads = field(default_factory=Payloads)
    #: its synchronous save lines (few) by rank (new ones under None until a prune files
    #: them), whose next progress line :meth:`_prune` finds before the lines around it are
    #: let go (kept in ``implicit_memo``)
    _starts: dict[int | None, list[Ev]] = field(default_factory=dict)
    _compact_at: int = COMPACT_SLACK
    _sids: dict[str, str] = field(default_factory=dict)
    #: implicit save ends found once (step, rank, dedup key of the start) -> the progress line: they
    #: stay found when that line is later dropped from a long job's progress
    implicit_memo: dict[tuple[int, int, str], Ev] = field(default_factory=dict)
    #: (rank, step) -> the newest time of that rank's own end line of that step's save: a start
    #: ended so needs no implicit end memoized
    _ended: dict[tuple[int, int], dt.datetime] = field(default_factory=dict)
    #: highest rank / local rank any event of the job carried (-1: none): 0 means one process
    max_rank: int = -1
    #: ranks some event names as its own (a ``[rankN]:`` prefix, a rank field): a rank known only
    #: because a rank-less line is taken as the main process's is not among them
    labelled_ranks: set[int] = field(default_factory=set)
    #: a line of a node other than the first carried no host: unlabelled local ranks map to nothing
    unlabelled_nodes: bool = False
    #: save lines read in several files (console and rank file): dedup key -> {source_id: offset}
    copies: dict[str, dict[str, int]] = field(default_factory=dict)
    #: per source (file) of the job: (its newest event time, wall time its last event arrived), UTC,
    #: for the low watermark (:meth:`watermark` with ``source_idle``) and its hosts' own clocks (:meth:`clock_of`)
    sources: dict[str, tuple[dt.datetime, dt.datetime]] = field(default_factory=dict)
    #: saves let go (:mod:`.retire`) by step; a save line of that step no newer than the
    #: newest of its lines is a copy read late and is dropped. They still end failure windows
    #: and stand as the last good checkpoint (:mod:`.save_incidents`)
    retired: dict[int, Retired] = field(default_factory=dict)
    #: the ranks that logged a retired save, and whether one was logged by several ranks:
    #: what :func:`~ckptwatch.detectors.saves.saves_of` expects of the saves that stay
    retired_ranks: set[int] = field(default_factory=set)
    retired_multi: bool = False

    def __post_init__(self) -> None:
        self._payloads.job = self.job

    def _clock(self, ts: dt.datetime, by_mtime: bool, ts_limit: dt.datetime | None) -> None:
        """Move the job's clock (:attr:`max_ts`) to ``ts`` (UTC) if later, unless past
        ``ts_limit``. A time ``by_mtime`` (the file's mtime stood in for a line's own) counts
        only while no line has dated an event of the job: a file copied today, or a tool's
        time-less output beside dated logs, must not age the job's saves past its own dated
        lines (issue 36, item 8: a week-old mtime turned a clean job's last save into a
        ``stalled_save``)."""
        if ts_limit is not None and ts > ts_limit:
            return
        if by_mtime:
            if self._max_mtime_ts is None or ts > self._max_mtime_ts:
                self._max_mtime_ts = ts
            if self._line_dated:
                return
        elif not self._line_dated:
            self._line_dated = True
            if self._max_mtime_ts is not None and self.max_ts is not None and self.max_ts <= self._max_mtime_ts:
                self.max_ts = None  # the mtimes seen so far were only standing in
        if self.max_ts is None or ts > self.max_ts:
            self.max_ts = ts

    def add(self, ev: Ev, *, ts_limit: dt.datetime | None = None) -> bool:
        """Record ``ev``; False if it was already known (same dedup key). An event time past
        ``ts_limit`` (UTC) does not move ``max_ts`` (a clock far ahead)."""
        self._clock(ev.ts, ev.ts_source == "mtime", ts_limit)
        self._learn(ev)
        if ev.kind == "metric":
            rank = self.rank_of(ev)
            self._add_progress(ev, 0 if rank is None else rank)
            self._add_loss(ev, rank)
            if rank is not None and ev.step is not None and ev.step >= self.last_metric_step.get(rank, -1):
                self.last_metric_step[rank] = ev.step
            return True
        gone = self.retired.get(ev.step) if ev.kind in ("save_start", "save_end") and ev.step is not None else None
        if gone is not None and ev.ts <= gone.until:
            return False  # a copy of a line of a save let go (:meth:`forget_saves`)
        known = self.events.get(ev.dedup_key)
        if known is not None and known.source_id == ev.source_id and known.offset != ev.offset:
            # a file never holds a copy of its own line: an undated line again further down (a
            # second run appended to the same log prints its "`Trainer.fit` stopped" again) is
            # another occurrence, keyed by its place (a copy of it in another file stays a copy)
            ev = dataclasses.replace(ev, dedup_key=f"{ev.dedup_key}@{ev.offset}")
            if ev.dedup_key in self.events:
                return False
            known = None
        if known is not None and ev.kind in ("save_start", "save_end"):
            # where else the line was read: undated copies are ordered within their own file only
            self.copies.setdefault(ev.dedup_key, {known.source_id: known.offset}).setdefault(ev.source_id, ev.offset)
        if known is not None:
            if known.rank is not None and ev.rank is not None and known.rank != ev.rank:
                # the same local rank, text and second on two hosts: two workers, not one line seen twice
                key = f"{ev.dedup_key}/r{ev.rank}"
                if key in self.events:
                    return False
                self.events[key] = ev
                return True
            if known.rank is None and ev.rank is not None:
                self.events[ev.dedup_key] = ev  # the better-labelled copy of the same line
            return False
        self.events[ev.dedup_key] = ev
        if ev.kind == "save_end" and ev.step is not None:
            end = (self.main_rank_of(ev), ev.step)
            self._ended[end] = max(ev.ts, self._ended.get(end, ev.ts))
        if ev.kind == "save_start" and not ev.attrs.get("async"):
            self._starts.setdefault(None, []).append(ev)
        if ev.kind in LOADING_KINDS:
            self.loading.append(ev)
        elif ev.kind == "integrity":
            self.integrity.append(ev)
        return True

    def forget_saves(self, newest: dict[int, Retired], lines: list[Ev], ranks: set[int], *,
                     multi_rank: bool) -> int:
        """Let finished saves go (:mod:`.retire` chooses them): ``newest`` maps each one's
        step to what stays of it, ``lines`` are their save lines (as kept in
        :attr:`events`), ``ranks`` the ranks that logged them, ``multi_rank`` whether one
        was logged by several ranks. Their copies and implicit ends noted go too. Returns
        how many events went."""
        gone = {id(e) for e in lines}
        for step, r in newest.items():
            self.note_retired(step, r)
        self.retired_ranks.update(ranks)
        self.retired_multi = self.retired_multi or multi_rank
        before = len(self.events)
        self.events = {k: e for k, e in self.events.items() if id(e) not in gone}
        for e in lines:
            self.copies.pop(e.dedup_key, None)
        self.implicit_memo = {k: v for k, v in self.implicit_memo.items() if k[0] not in newest}
        self._ended = {k: v for k, v in self._ended.items() if k[1] not in newest}
        for rank, starts in self._starts.items():
            self._starts[rank] = [e for e in starts if id(e) not in gone]
        return before - len(self.events)

    def note_retired(self, step: int, r: Retired) -> None:
        """Note the save of ``step`` let go (the one whose lines are newest, if noted twice)."""
        known = self.retired.get(step)
        if known is None or r.until > known.until:
            self.retired[step] = r

    def add_metrics(self, rows: pl.DataFrame, arrival: dt.datetime, *, ts_limit: dt.datetime | None = None) -> None:
        """Record a batch of this job's progress lines (EVENT_SCHEMA rows of kind ``metric``,
        none from ckptwatch's own rules) arrived at wall time ``arrival`` (UTC): what
        :meth:`add` and :meth:`arrived` do for each, per batch. The ranks the batch names are
        learned first, then each line is filed under its rank (:meth:`rank_of`)."""
        if rows.is_empty():
            return
        limit_us = to_us(ts_limit) if ts_limit is not None else None
        rows = rows.with_columns(_us=pl.col("ts").dt.epoch("us"), _i=pl.int_range(pl.len()))
        dated = rows if limit_us is None else rows.filter(pl.col("_us") <= limit_us)
        if not dated.is_empty():
            by_mtime = dated["ts_source"] == "mtime" if "ts_source" in dated.columns else None
            for mtime, part in ((False, dated if by_mtime is None else dated.filter(~by_mtime)),
                                (True, dated.filter(by_mtime) if by_mtime is not None else dated.clear())):
                if not part.is_empty():
                    self._clock(from_us(part["_us"].max()), mtime, None)
            for sid, us in dated.group_by("source_id").agg(pl.col("_us").max()).iter_rows():
                ts, known = from_us(us), self.sources.get(sid)
                self.sources[sid] = (ts if known is None or ts > known[0] else known[0], arrival)
        labels = ["rank", "local_rank", "pid", "host"]
        combos = rows.select(labels).unique(maintain_order=True)
        probes = [Ev(ts=_EPOCH, kind="metric", job=self.job, host=host, rank=rank, local_rank=local, pid=pid,
                     step=None, path=None, rule_id="", source_id="", offset=0, line="", dedup_key="")
                  for rank, local, pid, host in combos.iter_rows()]
        for probe in probes:
            self._learn(probe)
        resolved = combos.with_columns(_r=pl.Series([self.rank_of(p) for p in probes], dtype=pl.Int64))
        rows = rows.join(resolved, on=labels, how="left", nulls_equal=True, maintain_order="left")
        for rank, step in rows.filter(pl.col("_r").is_not_null() & pl.col("step").is_not_null()).group_by(
                "_r").agg(pl.col("step").max()).iter_rows():
            if step >= self.last_metric_step.get(rank, -1):
                self.last_metric_step[rank] = step
        self._add_losses(rows)
        self._pending.append(rows.select(pl.col("_r").fill_null(0), "_us", "source_id", "offset", "step", *PAYLOAD))
        if self.pending_rows() > SETTLE_ROWS:
            self.settle()
        self.last_arrival = arrival

    def pending_rows(self) -> int:
        """Progress lines of :meth:`add_metrics` not filed yet."""
        return sum(p.height for p in self._pending)

    def settle(self) -> None:
        """File the progress lines of :meth:`add_metrics` batches under their ranks: all
        pending batches sorted at once (batches of different files overlap in time, and a
        rank's lines inserted batch by batch would mostly be merges)."""
        if not self._pending:
            return
        ordered = pl.concat(self._pending, how="vertical_relaxed").sort("_r", "_us", "source_id", "offset")
        self._pending.clear()
        base = self._payloads.add_frame(ordered.select(PAYLOAD))
        intern = self._sids
        ts, off = ordered["_us"].to_list(), ordered["offset"].to_list()
        sid = [intern.setdefault(x, x) for x in ordered["source_id"].to_list()]
        step = ordered["step"].fill_null(NO_STEP).to_list()
        at = 0
        for rank, n in ordered.group_by("_r", maintain_order=True).len().iter_rows():
            bucket = self._progress.get(rank)
            if bucket is None:
                bucket = self._progress[rank] = RankProgress(self._payloads, rank)
            end = at + n
            bucket.extend(ts[at:end], sid[at:end], off[at:end], step[at:end], range(base + at, base + end))
            self._prune(rank, bucket)
            at = end
        self._compact()

    def _prune(self, rank: int, bucket: RankProgress) -> None:
        """Bound what ``bucket`` (rank ``rank``'s progress) keeps: past ``progress_cap``
        lines the oldest half goes, and only the newest ``payload_keep`` keep their payload.
        Before a line is let go, each save line of the rank whose next progress line it is
        (the save's implicit end, :func:`~ckptwatch.detectors.saves.saves_of`) has that
        line put in ``implicit_memo``, so the save ends there however long the job runs."""
        over = len(bucket) - self.progress_cap
        cut = len(bucket) - self.progress_cap // 2 if over > 0 else 0
        upto = max(cut, len(bucket) - self.payload_keep)
        if upto <= bucket.bare and not cut:
            return
        self._memo_ends(rank, bucket, upto)
        bucket.strip(upto)
        if cut:
            bucket.cut(cut)

    def _memo_ends(self, rank: int, bucket: RankProgress, upto: int) -> None:
        """Memoize the implicit ends among lines ``[0, upto)`` of ``bucket`` (see :meth:`_prune`)."""
        for start in self._starts.pop(None, []):
            self._starts.setdefault(self.main_rank_of(start), []).append(start)
        keep = []
        for start in self._starts.get(rank, []):
            step = start.step
            if step is None:
                before = bucket.last_step_before(ev_key(start))
                step = before[1] if before is not None else None
            memo = (step, rank, start.dedup_key)
            if step is None or memo in self.implicit_memo:
                continue
            if self._ended.get((rank, step), _EPOCH) >= start.ts:
                continue  # the rank printed its own end of this save: no implicit one is asked
            i = bucket.first_after_index(start, start.ts, step, self.copies.get(start.dedup_key, {}))
            if i is None or i >= upto:
                keep.append(start)  # its end is still to come, or still kept
            else:
                self.implicit_memo[memo] = bucket.ev(i)
        self._starts[rank] = keep

    def _compact(self) -> None:
        """Let go of payload rows no line references any more, once they are most of them."""
        if self._payloads.stored() <= self._compact_at:
            return
        live = sum(len(b) - b.bare for b in self._progress.values())
        if self._payloads.stored() > 2 * live + COMPACT_SLACK:
            self._payloads.compact(list(self._progress.values()))
        self._compact_at = 2 * live + COMPACT_SLACK

    def _add_losses(self, rows: pl.DataFrame) -> None:
        """:meth:`_add_loss` for a batch (``rows`` with their rank resolved in ``_r``), in arrival order."""
        losses = rows.select(
            "ts", "step", pl.coalesce("dedup_key", pl.format("{}:{}", "source_id", "offset")).alias("key"),
            r=pl.col("_r").fill_null(-1),
            loss=pl.col("attrs").str.json_path_match("$.loss").cast(pl.Float64, strict=False),
        ).filter(pl.col("loss").is_not_null() & pl.col("step").is_not_null())
        if losses.is_empty():
            return
        self._follow_loss_rank(losses["r"].min())
        for ts, step, key, r, value in losses.filter(pl.col("r") == self._loss_rank).iter_rows():
            self._append_loss(r, key, ts, step, value)

    @property
    def progress_by_rank(self) -> dict[int, RankProgress]:
        """The job's progress lines (``metric`` events, deduplicated) per rank, in time order,
        the newest ``progress_cap`` of each (:meth:`_prune`): a save without an end line ends at its
        rank's next one, a save line without a step takes the rank's last one's."""
        self.settle()
        return self._progress

    def _add_progress(self, ev: Ev, rank: int) -> None:
        """File ``ev`` under its rank (the same line read twice, console and rank file, may be
        kept twice: harmless for "the next progress line" and "the last step")."""
        self.settle()
        bucket = self._progress.get(rank)
        if bucket is None:
            bucket = self._progress[rank] = RankProgress(self._payloads, rank)
        bucket.add(ev)
        self._prune(rank, bucket)
        self._compact()

    @property
    def progress(self) -> list[Ev]:
        """Every kept progress line, rank by rank."""
        return [e for b in self.progress_by_rank.values() for e in b.events]

    def _add_loss(self, ev: Ev, rank: int | None) -> None:
        loss = ev.attrs.get("loss")
        if loss is None or ev.step is None:
            return
        try:
            value = float(loss)
        except (TypeError, ValueError):
            return
        r = -1 if rank is None else rank
        self._follow_loss_rank(r)
        self._append_loss(r, ev.dedup_key, ev.ts, ev.step, value)

    def _follow_loss_rank(self, r: int) -> None:
        """Follow rank ``r``'s losses (-1: no rank) if it is lower than the one followed."""
        if self._loss_rank is None or r < self._loss_rank:
            if self._loss_rank is not None:
                self.losses.clear()  # a lower rank showed up: follow it from now on
                self._loss_seen.clear()
            self._loss_rank = r

    def _append_loss(self, r: int, key: str, ts: dt.datetime, step: int, value: float) -> None:
        if r == self._loss_rank and key not in self._loss_seen:  # console + rank file: once
            self._loss_seen[key] = None
            if len(self._loss_seen) > LOSS_SEEN:  # a copy of a line comes within a poll or two
                for old in list(itertools.islice(self._loss_seen, LOSS_SEEN // 2)):
                    del self._loss_seen[old]
            self.losses.append((ts, step, value))

    def _learn(self, ev: Ev) -> None:
        for r in (ev.rank, ev.local_rank):
            if r is not None and r > self.max_rank:
                self.max_rank = r
        if ev.kind == "world_size" or ev.rule_id.startswith("ckptwatch."):  # its own lines say it too
            ws = ev.attrs.get("world_size")
            if isinstance(ws, int) and ws > 0:
                self.world_size = max(self.world_size or 0, ws)
        elif ev.kind in ("save_start", "save_end") and (ws := world_size_from_path(ev.path)) is not None:
            self.world_size = max(self.world_size or 0, ws)  # a shard's name states it (verl's)
        if ev.host:
            self.saw_host(ev.host)
        if ev.rank is None and ev.pid is not None and ev.pid not in self.pid_rank:
            if ev.local_rank is None and ev.attrs.get("reporter") == "shell" and (
                    self.single_process or self._main_process(ev)):
                self._map_pid(ev.pid, 0)  # the shell names the one process of a single-process job
            elif ev.local_rank is not None and ev.kind == "world_size" and (r := self.rank_of(ev)) is not None:
                self._map_pid(ev.pid, r)  # a launcher's "process N spawned ... --local_rank=1" on a one-host job
        if ev.host and ev.attrs.get("tasks") is not None:  # srun names the node of a task list
            for r in task_ranks(ev.attrs.get("tasks")):
                self.reported_host.setdefault(r, ev.host)
        if ev.rank is not None:
            self.labelled_ranks.add(ev.rank)
            if ev.pid is not None:
                self._map_pid(ev.pid, ev.rank)
            reported = ev.attrs.get("reported_host")  # a launcher's report names the rank's host (torchrun's 'host :')
            if ev.host:
                self.rank_host.setdefault(ev.rank, ev.host)
            elif isinstance(reported, str) and reported not in NO_HOST_NAMES:
                # a name only, not where the node's lines are; torchrun numbers a node's ranks
                # as a block (rank = group_rank * local_world_size + local_rank), so the ranks
                # below this one in its block are on that host too
                block = range(ev.rank - ev.local_rank, ev.rank + 1) if (
                    ev.local_rank is not None and 0 <= ev.local_rank <= ev.rank) else (ev.rank,)
                for r in block:
                    self.reported_host.setdefault(r, reported)
            if ev.local_rank is not None:
                if ev.host is None and ev.rank != ev.local_rank:
                    # a node other than the first, with no host label: its local ranks say
                    # nothing of another unlabelled node's
                    self.unlabelled_nodes = True
                else:
                    self.local_to_rank[(ev.host, ev.local_rank)] = ev.rank

    def _main_process(self, ev: Ev) -> bool:
        """The shell's report names the main process of a one-node job: a plain ``python
        script.py`` (no launcher between: Lightning's DDP launcher and the like start the other
        ranks from it and keep global rank 0 there), in a job whose lines name one host at most."""
        return bool(_PLAIN_PYTHON.match(str(ev.attrs.get("command") or ""))) and len(set(self.rank_host.values())) <= 1

    def saw_host(self, host: str) -> None:
        """Note that a line of the job (its own, or a kernel log's among its files) names ``host``."""
        if host not in NO_HOST_NAMES and len(self.named_hosts) < HOSTS_KEPT:
            self.named_hosts.add(host)

    def _map_pid(self, pid: int, rank: int) -> None:
        self.pid_rank[pid] = rank
        self.rank_pid.setdefault(rank, pid)

    @property
    def single_process(self) -> bool:
        """The job is one process (no rank above 0 and a world size of at most 1 seen): its
        rank-less lines are rank 0's."""
        return self.max_rank <= 0 and (self.world_size or 1) <= 1

    def main_rank_of(self, ev: Ev) -> int:
        """:meth:`rank_of`, with a rank-less line taken as the main process's (rank 0):
        trainers print saves and progress from rank 0 only, without a rank."""
        r = self.rank_of(ev)
        return 0 if r is None else r

    def rank_of(self, ev: Ev) -> int | None:
        """The global rank of an event: its own, else by pid, else by (host, local_rank);
        on a single-host job a local rank is the rank; in a single-process job, 0."""
        if ev.rank is not None:
            return ev.rank
        if ev.pid is not None and ev.pid in self.pid_rank:
            return self.pid_rank[ev.pid]
        if ev.local_rank is not None:
            keys = ((ev.host, ev.local_rank), (None, ev.local_rank)) if not self.unlabelled_nodes else (
                ((ev.host, ev.local_rank),) if ev.host is not None else ())
            for key in keys:
                if key in self.local_to_rank:
                    return self.local_to_rank[key]
            hosts = set(self.rank_host.values())
            if len(hosts) <= 1 and not self.unlabelled_nodes:
                return self._on_the_one_node(ev.local_rank)
        # one process: its lines are rank 0's (a kernel line only when it names that process's pid)
        if self.single_process and (ev.attrs.get("scope") != "host" or ev.pid in self.pid_rank) and (
                ev.pid is None or ev.pid in self.pid_rank or not self.pid_rank):
            return 0
        return None

    def _on_the_one_node(self, local_rank: int) -> int:
        """The global rank of a local rank when every rank seen is on one node: the local
        rank itself, unless the node's ranks are a block that does not start at 0 (a paste
        of the second node's console: ``node1:4:`` ... ``node1:7:``), where torchrun gives
        local rank i the block's i-th rank."""
        ranks = sorted(self.rank_host)
        if ranks and ranks[0] > 0 and local_rank < len(ranks) and ranks[-1] - ranks[0] == len(ranks) - 1:
            return ranks[0] + local_rank
        return local_rank

    def host_of(self, rank: int | None) -> str | None:
        """The host of ``rank``: its lines' host label, else the one a launcher reported for it;
        in a single-process job whose lines name one host only (its kernel log beside its
        console), that host."""
        if rank is None:
            return None
        host = self.rank_host.get(rank) or self.reported_host.get(rank)
        if host is None and rank == 0 and len(self.named_hosts) == 1 and self.single_process:
            host = next(iter(self.named_hosts))
        return host

    def arrived(self, ev: Ev, arrival: dt.datetime, *, ts_limit: dt.datetime | None = None) -> None:
        """Note that ``ev`` (a copy already known included) arrived at wall time ``arrival``:
        its source's newest event time and last arrival, for the low watermark. An event
        time past ``ts_limit`` moves nothing, as in :meth:`add`."""
        if ts_limit is not None and ev.ts > ts_limit:
            return
        known = self.sources.get(ev.source_id)
        self.sources[ev.source_id] = (ev.ts if known is None or ev.ts > known[0] else known[0], arrival)

    def watermark(self, lateness: dt.timedelta, now: dt.datetime | None, *,
                  source_idle: float | None = None) -> dt.datetime | None:
        """The job's own event time minus ``lateness``, moved on by the wall time (``now``)
        since its last event arrived: one job's clock, or one future-dated line, never
        concludes another job's saves.

        With ``source_idle`` (seconds), a *low* watermark: never past a source of the job
        that is still being read. Each source (file) counts with its newest event time, moved
        on by the wall time since its last event arrived, while that is under
        ``source_idle`` seconds; a source silent longer (the file of a dead rank, a launcher
        log that said its piece) holds nothing. Live, with every source current, this is the
        plain watermark; it differs when the sources arrive out of step, as when a collector
        starting over a backlog publishes one file after another: rank 1's save ends are then
        not judged late by rank 0's time. (A rank not heard from at all is not waited for:
        a save is expected only of the ranks that log saves, :mod:`.saves`.)"""
        if self.max_ts is None:
            return None
        wm = self.max_ts - lateness
        if now is not None and self.last_arrival is not None and now > self.last_arrival:
            wm += now - self.last_arrival
        if source_idle is None or now is None:
            return wm
        idle = dt.timedelta(seconds=source_idle)
        clocks = (_source_clock(ts, at, now, idle) for ts, at in self.sources.values())
        return min([wm, *(c - lateness for c in clocks if c is not None)])

    def clock_of(self, source_ids: Iterable[str], lateness: dt.timedelta, now: dt.datetime | None, *,
                 source_idle: float | None = None) -> dt.datetime | None:
        """The clock of some of the job's files (``source_ids``): the newest event time any of
        them has shown, moved on by the wall time (``now``, UTC) since its last event arrived,
        less ``lateness`` (UTC): how far those files' own host has been read, by its own
        clock (:mod:`~ckptwatch.detectors.own_clock`). A file silent ``source_idle`` seconds
        or more counts for nothing, as in :meth:`watermark`. None when no file counts."""
        idle = dt.timedelta(seconds=source_idle) if source_idle is not None else None
        clocks = [_source_clock(*self.sources[sid], now, idle) for sid in source_ids if sid in self.sources]
        best = max((c for c in clocks if c is not None), default=None)
        return None if best is None else best - lateness

    def hosts(self) -> set[str]:
        return set(self.rank_host.values())

    def evidence(self, items: list[tuple[Ev, str]]) -> list[EvidenceItem]:
        """``(event, role)`` pairs as an incident's evidence: in event-time order, each event
        once, with its global rank and host filled in from what the job taught us. An event in
        two roles keeps the telling one: ``root_cause``, then ``collateral``, then the rest (a
        CUDA OOM in the save code is one of the save's lines and its root cause)."""
        seen: set[tuple[str, int]] = set()
        out = []
        telling = {"root_cause": 0, "collateral": 1}
        for ev, role in sorted(items, key=lambda x: (x[0].ts, x[0].source_id, x[0].offset, telling.get(x[1], 2))):
            if ev.ref in seen:
                continue
            seen.add(ev.ref)
            rank = self.rank_of(ev)
            out.append(EvidenceItem(source_id=ev.source_id, offset=ev.offset, ts=ev.ts, kind=ev.kind, rank=rank,
                                    host=ev.host or self.host_of(rank), rule_id=ev.rule_id,
                                    line=ev.first_line(), role=role, ts_source=ev.ts_source))
        return out

    def events_sorted(self) -> list[Ev]:
        return sorted(self.events.values(), key=lambda e: (e.ts, e.source_id, e.offset))
