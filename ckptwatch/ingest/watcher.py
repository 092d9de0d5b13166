"""Follow every file under a set of paths, through rotation (Vector's ``file_server``).

Each :meth:`SourceWatcher.poll`:

1. discovers the files now under the paths (:mod:`.discovery`: files, directories, glob
   patterns) and stats them. A file is known by ``(device, inode)``, so a file already
   followed costs one ``stat`` per poll and no read when it did not change. Where inotify
   works (:mod:`.notify`), a poll lists nothing unless a file was created, renamed or
   deleted (or ``rescan_after`` passed), and stats only the files written to since the
   last poll: a poll of 10,000 followed files costs what changed.
2. on the first poll only, looks next to each checkpointed source for a file renamed,
   while nobody watched, to a rotated name the paths do not match (``train.log`` ->
   ``train.log.1``): it is followed from its committed offset, as in step 3. After step
   4, the same for a ``copytruncate`` copy of a checkpointed source that no file found
   claimed (under the source's id, from its committed offset).
3. polls every file it follows (a :class:`~.tail.FileTail` each, holding the file open):

   * a file renamed to another watched path is followed there (same id, same offset);
   * a file that no watched path points at any more (renamed away, to a name the paths
     may not even match, or deleted; the path may already hold a new file) is read to
     its end through the open descriptor, like ``tail -F``, and dropped (closed) once a
     poll finds that it has not grown for ``flush_after`` seconds (at once with
     ``final``);
   * a file truncated in place is read again from 0 under a new id (see :mod:`.tail`);
   * when a file is found truncated, or (the first time) renamed away, its rotated-name
     siblings in the same directory (``train.log.1``, ``train.log-20261130``; for a
     truncation, of the path the file had at the last poll, where logrotate copied it
     from) that are neither followed nor under a watched path are looked at: a
     ``copytruncate`` copy of the truncated generation (possibly an older copy rewritten
     in place) is read from the old read offset to its end, under the generation's id,
     and dropped; a file never read and written to since the
     followed one was last (a generation created and rotated away between two polls) is
     read from 0: to its end and dropped after a truncation, followed until idle after a
     rename. Older archives are left alone.

   After a ``final`` poll no file is held open (a later poll opens them again by path).
   At most ``max_open_files`` are held open at any time (:mod:`.handles`): past that, the
   least recently used one is closed and opened again by path when next read, checked to
   be the same file. One not held open that no watched path points at any more is looked
   for under its rotated names (``train.log.1``) and read there; renamed elsewhere or
   deleted while closed, its lines written since it was last read are lost.

4. starts following each new file: at its committed offset when its id (of any
   generation) is in ``committed``; at the old read offset and under the old id when it
   is the copy of a truncated file or of a checkpointed source (:mod:`.rotation`; so a
   line read from the original and again from its copy has one ``(source_id, offset)``);
   else from 0. A new file that looks like a copy of a
   followed file still being made (``copytruncate`` before the truncation: same first
   line, a rotated name, the same bytes before the followed file's offset) is left for
   the next poll, unless ``final``. A new file renamed to a rotated name of its path
   between its listing and its opening is followed there.

Year-less stamps (glog ``I1207 …``, syslog ``Dec  7 …``) in a file with no dated line
are dated with the year of the file's mtime (:mod:`.timestamps`: ``ts_year_guessed``)
and re-dated to the year of the newest dated line of the same job, else host, read so
far (files that name no job share one context). A live read may see such a file before
the dated line of its job arrives (a kernel log beside a launcher console still to be
written, a backlog read over several polls), so records whose year is still a guess are
**held back** (not returned) with every later record of their file, until a dated line
of their job or host comes (then re-dated and returned), the input is final and read
whole, ``year_hold`` seconds pass with nothing left unread, or a file holds
``year_hold_records`` records: then they go on with the mtime's year (counted as
``year_from_mtime``), and that file's later records are not held again (re-dated if a
context has come by then). A source's committed offset never passes its first held
record, so a restart reads it again; a guessed time is never carried into the file's
next read as a known one (its next records are guessed, and held, again).

Lines are still lost when a copy made by ``copytruncate`` is overwritten in place by the
next rotation before a poll has looked at it, or when the file had no complete first line
yet at the last poll before it was truncated (nothing tells the truncation then).

:meth:`SourceWatcher.checkpoints` gives what to persist. Entries of sources that are not
followed any more (a truncated generation whose copy may still show up, a checkpointed
source not found after a restart) are kept for ``forget_after_polls`` polls, then
dropped; a dropped file's entry goes with it (it was read to its end).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import os
import re
import stat
from collections.abc import Callable, Mapping, Sequence

import polars as pl

from ckptwatch.frames import detached
from ckptwatch.ingest import batch, discovery, handles, identity, layout, notify, rotation, timestamps
from ckptwatch.ingest.checkpoint import SourceCheckpoint
from ckptwatch.ingest.stats import Stats
from ckptwatch.ingest.tail import FileTail, InputError, Replaced
from ckptwatch.schema import RECORD_SCHEMA

Key = tuple[int, int]  # (st_dev, st_ino)

#: bytes one poll reads at most, over all files (see ``poll_bytes``)
DEFAULT_POLL_BYTES = 8 << 20


class SourceWatcher:
    """The files under ``paths`` (files, directories, glob patterns like ``logs/**/*.log``).

    Args:
        paths: what to watch; re-expanded on every poll, so new files are picked up.
        template: compiled path template for labels (:mod:`.layout`).
        boot_time: UTC boot time for kernel ``[seconds]`` stamps.
        committed: checkpoints from a previous run, by source id (:class:`FileCheckpointer.load
            <ckptwatch.ingest.checkpoint.FileCheckpointer>`).
        exclude: paths for which this returns True are not read (e.g. the output database).
        flush_after: seconds without growth after which a file's held-back records are
            emitted, and a file no watched path points at any more is dropped.
        settle_after: seconds without growth (over two polls) after which a held-back
            record that cannot go on is emitted (:class:`~.tail.FileTail`).
        forget_after_polls: polls for which checkpoints of sources not followed any more
            are kept (see the module docstring).
        archives: read ``.gz`` rotated logs found in directories too (one-shot reads).
        line_prefix: the torchrun ``--log-line-prefix-template`` of the consoles (:mod:`.prefix`).
        poll_bytes: about how many bytes one poll reads at most, over all files (plus one
            chunk of the file that crosses it): the files past it are read by the next poll
            (``backlog`` is True meanwhile), so a batch of records, and the memory it takes,
            stays bounded however much the files hold. 0: no bound.
        watch_changes: list the directories only when inotify says their entries changed,
            and stat only the files it says were written to (:mod:`.notify`; off, or on a
            network filesystem: every poll lists and stats everything). Final polls always list.
        rescan_after: seconds after which a poll lists everything even so (:mod:`.notify`).
        max_open_files: files held open at most (see :mod:`.handles`); None: the process's
            open-file limit minus :data:`~ckptwatch.ingest.handles.HEADROOM`, read now.
        job: the job of every file whose path the template gives none (``--job NAME``).
        year_hold: seconds (wall clock, with nothing left unread) for which records whose
            year is a guess are held back waiting for a dated line of their job or host
            (see the module docstring); 0: not held.
        year_hold_records: records of one file held back at most; past it they go on.

    A poll raises :class:`~ckptwatch.ingest.handles.OpenFileLimitError` when a file cannot
    be opened for want of descriptors and no other file is open to close (one line).
    ``stats`` counts files, lines, records, invalid UTF-8, skipped input and errors
    (messages naming the file and the reason; the same problem is reported once).
    Not thread-safe. :meth:`close` closes the files held open.
    """

    def __init__(self, paths: Sequence[str], *, template: re.Pattern[str] | None = None,
                 boot_time: dt.datetime | None = None, committed: Mapping[str, SourceCheckpoint] | None = None,
                 exclude: Callable[[str], bool] | None = None, flush_after: float = 2.0, settle_after: float = 0.25,
                 forget_after_polls: int = 5, archives: bool = False, line_prefix: str | None = None,
                 poll_bytes: int = DEFAULT_POLL_BYTES, watch_changes: bool = True,
                 rescan_after: float = 10.0, max_open_files: int | None = None,
                 job: str | None = None, year_hold: float = 5.0, year_hold_records: int = 100_000) -> None:
        self.paths = list(paths)
        self.job = job  # ``--job``: every file the template gives no job is this job's
        self.budget = handles.HandleBudget(max_open_files)
        self.template = template
        self.boot_time = boot_time
        self.exclude = exclude or (lambda path: False)
        self.flush_after = flush_after
        self.settle_after = settle_after
        self.forget_after_polls = forget_after_polls
        self.archives = archives
        self.line_prefix = line_prefix
        self.poll_bytes = poll_bytes
        self.watch_changes = watch_changes
        self.rescan_after = rescan_after
        self.listings = 0  # polls that listed every directory (the others stat'ed what inotify named)
        self._feed: notify.ChangeFeed | None = None
        self._key_at: dict[str, Key] = {}  # absolute path (and a link's target) -> the file the last listing found
        self.stats = Stats()
        self._tails: dict[Key, FileTail] = {}
        # source id -> (generation not followed any more, poll it stopped being followed at)
        self._unfollowed: dict[str, tuple[rotation.Superseded, int]] = {
            sid: (rotation.Superseded(c), 0) for sid, c in (committed or {}).items()}
        self._retired: set[str] = set()  # ids of dropped files: a new file reusing the inode gets another
        #: per rotation family (rotation.family: console.log, console.log.1, ...), its files: a new
        #: generation takes what their lines taught (FileTail.inherit, FileTail.family_job)
        self._families: dict[str, list[FileTail]] = {}
        self._dropped: dict[Key, tuple[int, int]] = {}  # dropped file -> (size, mtime_ns) when dropped
        self._missing_since: dict[Key, dt.datetime] = {}  # followed file -> first poll no watched path had it
        self._gone: set[Key] = set()  # followed files no watched path points at any more (siblings looked at)
        self._rejected: dict[Key, tuple[int, int]] = {}  # unreadable file -> (size, mtime_ns) when tried
        self._reported: set[str] = set()
        self._polls = 0
        self._dated_by_job: dict[str, dt.datetime] = {}  # newest dated line per job / host, for year-less stamps
        self._dated_by_host: dict[str, dt.datetime] = {}
        self._dated_no_job: dt.datetime | None = None  # the newest dated line of files that name no job
        self.year_hold = year_hold
        self.year_hold_records = year_hold_records
        #: records whose year is a guess, with every later record of their file, held back
        self._year_held = pl.DataFrame(schema=RECORD_SCHEMA)
        self._year_floor: dict[str, int] = {}  # source id -> offset of its first held record
        self._year_held_since: dict[str, dt.datetime] = {}  # source id -> when its records were first held
        self._year_let_go: set[str] = set()  # source ids whose hold ran out: their records are not held again
        self.backlog = False  # the last poll left bytes unread in some file: poll again before concluding
        #: files the last poll found and left for the next one without opening them (its byte
        #: budget was spent): while any, what has been read is not yet every file's beginning
        self.unopened = 0
        self._newest_dated: dict[str, dt.datetime] = {}  # source id -> newest time read from a line of it
        self._found: Mapping[Key, tuple[str, tuple[int, int]]] = {}  # what the last poll's discovery found
        self._path_job: dict[Key, str | None] = {}  # the job a found file's path names (PathLabels.job)
        self._pending: list[batch.Read] = []  # reads of this poll whose records are not made yet
        self._pending_ids: set[int] = set()  # id() of their tails
        self._by_dir: dict[str, list[FileTail]] | None = None  # followed files by directory, built once a poll
        self._out: list[pl.DataFrame] = []  # records made in this poll
        self._now = dt.datetime.now(dt.timezone.utc)  # the time of the poll under way
        self.bytes_read = 0

    def poll(self, *, final: bool = False, now: dt.datetime | None = None) -> pl.DataFrame:
        """Discover the files (paths may be files, directories, or glob patterns like
        ``logs/**/*.log``), poll every tail and return the concatenated records
        (:data:`ckptwatch.schema.RECORD_SCHEMA`).

        Args:
            final: the files will not grow (``diagnose``, ``--once``): emit everything,
                last lines without newline included, and drop the files no watched path
                points at any more. A poll reads at most a chunk of each file; while
                ``backlog`` is True after it, poll again (the rest is not flushed yet).
            now: wall-clock time of this poll (UTC); defaults to now.

        Problems with single files go to ``stats.errors``; this does not raise for them.
        """
        now = now or dt.datetime.now(dt.timezone.utc)
        self._polls += 1
        if self.watch_changes and not final and self._feed is None:
            self._feed = notify.ChangeFeed(rescan_after=self.rescan_after)
        self._now = now
        at = None if final else self._changed_since(now)
        if at is None:
            at = self._discover()
        if self._missing_but_linked(at):  # listed before a rename and stat'ed after it: look once more
            for key, found in self._discover().items():
                at.setdefault(key, found)
        if self._polls == 1:
            self._find_moved(at, final=final)
        self._by_dir = None
        start, deferred, unopened = self.bytes_read, False, 0

        def spent() -> bool:
            return self.poll_bytes > 0 and self.bytes_read - start >= self.poll_bytes

        for key, tail in list(self._tails.items()):
            where = at.get(key)
            if where is None and tail.handle is None and not self._found_moved(tail, key):
                # not held open (after a final poll, or to stay within max_open_files), gone since
                if key not in self._gone:
                    self._read_rotated_siblings(tail.path, at, since_ns=tail.last_write_ns(),
                                                truncated=False, final=final, now=now)
                self._drop(key)
                continue
            if where is not None and spent():  # the next poll reads it
                deferred = True
                continue
            if where is not None and not final and where[0] == tail.path and tail.at_rest(*where):
                self._missing_since.pop(key, None)
                continue  # unchanged since the last poll, nothing held: nothing to read or emit
            if where is not None:
                tail.path, tail.moved_to = where[0], None
                self._missing_since.pop(key, None)
            else:
                self._missing_since.setdefault(key, now)
            truncated: list[rotation.Superseded] = []
            self._poll_tail(tail, final=final, now=now, superseded=truncated)
            if truncated:
                seen = [g.mtime_ns for g in truncated if g.mtime_ns is not None]
                # copies are named after the path the file was copied from (it may have been renamed since)
                for copied_from in dict.fromkeys(g.checkpoint.path for g in truncated):
                    self._read_rotated_siblings(copied_from, at, since_ns=min(seen) if seen else None,
                                                          truncated=True, final=final, now=now)
            if where is None and key not in self._gone:
                self._gone.add(key)
                self._read_rotated_siblings(tail.path, at, since_ns=tail.last_write_ns(),
                                                      truncated=False, final=final, now=now)
            if where is None and (final or self._unwatched_for(key, tail, now) >= self.flush_after):
                if not final:
                    self._poll_tail(tail, final=True, now=now)
                self._drop(key)
        # input that does not grow: files whose path names no job (kernel, scheduler, launcher
        # logs) first, so a job is read whole once its own files are (jobs_read)
        found = sorted(at.items(), key=lambda kv: self._job_of_path(*kv) is not None) if final else at.items()
        for key, (path, sig) in found:
            if key not in self._tails and self._rejected.get(key) != sig:
                if spent():  # found again by the next poll
                    deferred, unopened = True, unopened + 1
                    continue
                tail = self._start(key, path, sig, final=final)
                if tail is not None:
                    self._poll_tail(tail, final=final, now=now)
        if self._polls == 1:  # once every file found could claim its own checkpoint
            for tail in self._find_moved(at, final=final, copies=True):
                self._poll_tail(tail, final=final, now=now)
        self.backlog = deferred or any(t.more for t in self._tails.values())
        self.unopened = unopened
        self._found = at
        if final:  # no descriptor is held between polls (many files, one diagnose)
            for tail in self._tails.values():
                tail.close()
        self._forget()
        self._flush(now)
        frames, self._out = [f for f in self._out if not f.is_empty()], []
        records = pl.concat(frames) if frames else pl.DataFrame(schema=RECORD_SCHEMA)
        records = self._release_years(records, now=now, final=final)
        self.stats.records += records.height
        if final:  # read_position's, for input that does not grow
            self._note_dated(records)
        return records

    def _note_dated(self, records: pl.DataFrame) -> None:
        newest = records.filter(pl.col("ts_source") == "line").group_by("source_id").agg(pl.col("ts").max())
        for sid, ts in newest.iter_rows():
            if sid not in self._newest_dated or ts > self._newest_dated[sid]:
                self._newest_dated[sid] = ts

    def _job_of_path(self, key: Key, found: tuple[str, tuple[int, int]]) -> str | None:
        """The job file ``key``'s path names (:attr:`PathLabels.job
        <ckptwatch.ingest.layout.PathLabels>`: ``--path-template``, a launcher's log-directory
        layout), None if none."""
        if key not in self._path_job:
            self._path_job[key] = layout.labels_for(found[0], self.template).job
        return self._path_job[key]

    def jobs_read(self) -> set[str] | None:
        """For input that does not grow (``diagnose``): the jobs every file of which has been
        read to its end, as far as the last poll found, each file's job being the one its
        path names (:meth:`_job_of_path`). None while a file whose path names no job is not
        read to its end (its lines could be any job's; a final poll reads such files first).
        Files that could not be read count as read; a job with records held back for their
        year (see the module docstring) is not read yet, nor is any while such a record
        names no job."""
        held_jobs = set(self._year_held["job"].unique()) if self._year_held.height else set()
        if None in held_jobs:
            return None
        jobs: dict[str, bool] = {job: False for job in held_jobs}
        for key, where in self._found.items():
            tail = self._tails.get(key)
            done = key in self._rejected or (tail is not None and not tail.more)
            job = self._job_of_path(key, where)
            if job is None and not done:
                return None
            if job is not None:
                jobs[job] = jobs.get(job, True) and done
        return {job for job, done in jobs.items() if done}

    def read_position(self) -> dt.datetime | None:
        """How far in event time every file has been read, for input that does not grow
        (``diagnose``): the oldest, over the files with more to read, of the newest time a
        line of it gave (UTC). A line still to come is not much older than this unless its
        file is out of order. None while a file found is not opened yet, or a file with more
        to read has given no dated line; the newest time read once every file is read."""
        if self.unopened:
            return None
        if not any(t.more for t in self._tails.values()):
            return max(self._newest_dated.values(), default=None)
        held = [self._newest_dated.get(t.source_id or "") for t in self._tails.values() if t.more]
        return None if any(ts is None for ts in held) else min(held)  # type: ignore[type-var]

    def _release_years(self, new: pl.DataFrame, *, now: dt.datetime, final: bool) -> pl.DataFrame:
        """This poll's records ``new`` and those held back before, re-dated where the year
        of a year-less stamp was a guess and a dated line of the same job or host is known
        now; returns those that go on (held ones first, file order kept), and holds back
        the files whose records' year is still a guess (see the module docstring). Sets
        each file's carried times back to the re-dated ones."""
        self._learn_year_context(new)
        held = self._year_held
        records = pl.concat([held, new]) if held.height else new
        if records.is_empty() or not records["ts_year_guessed"].any():
            self._hold_years(records.clear(), set())
            return records
        records = self._redate_guessed_years(records)
        if new["ts_year_guessed"].any():
            self._carry_redated(new, records.slice(held.height))
        holding: set[str] = set()  # the sources whose records are held
        if self.year_hold > 0 and not (final and not self.backlog):
            per_source = records.group_by("source_id").agg(pl.len(), pl.col("ts_year_guessed").any())
            for sid, n, unresolved in per_source.iter_rows():
                if not unresolved or sid in self._year_let_go:
                    continue
                since = self._year_held_since.get(sid, now)
                waited = (now - since).total_seconds() >= self.year_hold and not self.backlog and not self.unopened
                if waited or n > self.year_hold_records:
                    self._year_let_go.add(sid)  # its later records go on at once (re-dated once a context comes)
                else:
                    holding.add(sid)
        kept = pl.col("source_id").is_in(list(holding))
        self._hold_years(records.filter(kept) if holding else records.clear(), holding, now=now)
        out = records.filter(~kept) if holding else records
        self.stats.note("year_from_mtime", int(out["ts_year_guessed"].sum()))
        return out

    def _hold_years(self, held: pl.DataFrame, holding: set[str], *, now: dt.datetime | None = None) -> None:
        """Keep ``held`` (the records of the sources ``holding``) for the next poll."""
        self._year_held = detached(held) if held.height else held.clear()
        self._year_floor = ({sid: int(off) for sid, off in held.group_by("source_id").agg(pl.col("offset").min())
                             .iter_rows()} if held.height else {})
        self._year_held_since = {sid: self._year_held_since.get(sid, now or self._now) for sid in holding}

    def _learn_year_context(self, records: pl.DataFrame) -> None:
        """Note the newest dated line (not year-guessed) of each job and host in ``records``,
        and of the files that name no job."""
        dated = records.filter((pl.col("ts_source") == "line") & ~pl.col("ts_year_guessed"))
        if dated.is_empty():
            return
        for col, ctx in (("job", self._dated_by_job), ("host", self._dated_by_host)):
            newest = dated.filter(pl.col(col).is_not_null()).group_by(col).agg(pl.col("ts").max())
            for key, ts in newest.iter_rows():
                if key not in ctx or ts > ctx[key]:
                    ctx[key] = ts
        unlabelled = dated.filter(pl.col("job").is_null())["ts"].max()
        if unlabelled is not None and (self._dated_no_job is None or unlabelled > self._dated_no_job):
            self._dated_no_job = unlabelled

    def _redate_guessed_years(self, records: pl.DataFrame) -> pl.DataFrame:
        """Year-less stamps dated with their file's mtime year (no dated line in their file)
        take the year closest to the newest dated line of the same job, else of the same
        host, read so far (in any file); files that name no job share one context, so that a
        pasted ``journalctl -k`` takes its year from the console pasted beside it. The rest
        keep ``ts_year_guessed``."""
        ctx_expr = pl.coalesce(
            pl.col("job").replace_strict(self._dated_by_job, default=None, return_dtype=records["ts"].dtype),
            pl.col("host").replace_strict(self._dated_by_host, default=None, return_dtype=records["ts"].dtype),
            pl.when(pl.col("job").is_null()).then(pl.lit(self._dated_no_job, dtype=records["ts"].dtype)),
        )
        records = records.with_columns(ctx_expr.alias("_ctx"))
        return records.with_columns(
            pl.when(pl.col("ts_year_guessed")).then(timestamps.shift_to_year_of(pl.col("ts"), pl.col("_ctx")))
            .otherwise(pl.col("ts")).alias("ts"),
            (pl.col("ts_year_guessed") & pl.col("_ctx").is_null()).alias("ts_year_guessed"),
        ).drop("_ctx")

    def _forget_guessed_carries(self, reads: Sequence[batch.Read], made: pl.DataFrame) -> None:
        """A file's next read takes its streams' carried times as known: drop those the
        records ``made`` from ``reads`` left with a guessed year (the next read guesses
        again, and is re-dated like these once a context is known)."""
        guessed = made.filter((pl.col("ts_source") == "line") & pl.col("ts_year_guessed"))
        if guessed.is_empty():
            return
        tails = {r.tail.source_id: r.tail for r in reads}
        for sid, stream, ts, was_guessed in self._last_line_times(made).iter_rows():
            tail = tails.get(sid)
            if was_guessed and tail is not None and tail.carry.get(_carry_key(sid, stream)) == ts:
                del tail.carry[_carry_key(sid, stream)]
        for sid, ts, was_guessed in self._last_line_times(made, per_stream=False).iter_rows():
            tail = tails.get(sid)
            if was_guessed and tail is not None and tail.file_carry == ts:
                tail.file_carry = None

    def _carry_redated(self, new: pl.DataFrame, redated: pl.DataFrame) -> None:
        """Carry the re-dated times of this poll's records ``new`` (``redated``: the same
        rows, re-dated) into their files' next reads, where no newer time was carried
        since (see :meth:`_forget_guessed_carries`)."""
        both = new.select("source_id", "stream", "ts_source", "ts_year_guessed").with_columns(
            redated["ts"], (new["ts_year_guessed"] & ~redated["ts_year_guessed"]).alias("_fixed"))
        tails = {t.source_id: t for t in self._tails.values()}
        last = self._last_line_times(both, flag="_fixed")
        for sid, stream, ts, fixed in last.iter_rows():
            tail = tails.get(sid)
            if fixed and tail is not None:
                tail.carry.setdefault(_carry_key(sid, stream), ts)
        for sid, ts, fixed in self._last_line_times(both, per_stream=False, flag="_fixed").iter_rows():
            tail = tails.get(sid)
            if fixed and tail is not None and tail.file_carry is None:
                tail.file_carry = ts

    @staticmethod
    def _last_line_times(records: pl.DataFrame, *, per_stream: bool = True,
                         flag: str = "ts_year_guessed") -> pl.DataFrame:
        """The last record dated by its own line per file (and stream): ``source_id``,
        [``stream``,] ``ts`` and ``flag`` (what :mod:`.batch` carries into the next read)."""
        keys = ["source_id", "stream"] if per_stream else ["source_id"]
        return (records.filter(pl.col("ts_source") == "line")
                .group_by(keys, maintain_order=True).agg(pl.col("ts").last(), pl.col(flag).last()))

    def checkpoints(self) -> list[SourceCheckpoint]:
        """What to persist once the records returned so far are durable downstream: for
        each source followed, its committed offset (never past a held-back line,
        :attr:`FileTail.committed_offset <ckptwatch.ingest.tail.FileTail.committed_offset>`,
        nor a record held back for its year); and the entries of sources not followed any
        more, for ``forget_after_polls`` polls."""
        out = [c for t in self._tails.values() if (c := t.checkpoint()) is not None]
        out += [gen.checkpoint for gen, _ in self._unfollowed.values()]
        if not self._year_floor:
            return out
        floor = self._year_floor  # records held back for their year: read again after a restart
        return [dataclasses.replace(c, offset=min(c.offset, floor[c.source_id])) if c.source_id in floor else c
                for c in out]

    def close(self) -> None:
        """Close every file held open (and the inotify feed); the watcher is not used after this."""
        for tail in self._tails.values():
            tail.close()
        self._tails.clear()
        if self._feed is not None:
            self._feed.close()

    @property
    def watching(self) -> str:
        """How polls find changes: ``inotify``, or why every poll lists everything."""
        if not self.watch_changes:
            return "listing every poll (asked)"
        if self._feed is None:
            return "listing every poll (no live poll yet)"
        return "inotify" if self._feed.off is None else f"listing every poll ({self._feed.off})"

    def _changed_since(self, now: dt.datetime) -> dict[Key, tuple[str, tuple[int, int]]] | None:
        """What :meth:`_discover` would find now, from the last listing and the files inotify
        says were written to since (each stat'ed again); None when everything must be
        listed (see :mod:`.notify`), or a file written to is not the one listed there."""
        if self._feed is None or self._polls == 1:
            return None
        changes = self._feed.changes(now.timestamp())
        if changes.rescan is not None:
            return None
        at = dict(self._found)
        for path in changes.written:
            key = self._key_at.get(os.path.abspath(path))
            if key is None:
                continue  # a file no watched path takes (or excluded)
            try:
                st = os.stat(path)
            except OSError:
                return None
            if (st.st_dev, st.st_ino) != key:
                return None
            at[key] = (at[key][0], (st.st_size, st.st_mtime_ns))
        return at

    def _discover(self) -> dict[Key, tuple[str, tuple[int, int]]]:
        """The regular files under the paths now: ``(device, inode)`` -> (path, (size,
        mtime_ns)); the first path of a file wins. Watches the directories listed."""
        at: dict[Key, tuple[str, tuple[int, int]]] = {}
        archived = []
        dirs: list[str] | None = [] if self._feed is not None else None
        key_at: dict[str, Key] = {}
        self.listings += 1
        for found in discovery.discover(self.paths, archives=self.archives, dirs=dirs):
            if found.archive:
                archived.append(found.path)
                continue
            if found.error:
                self._error(f"{found.path}: {found.error}")
                continue
            if self.exclude(found.path):
                continue
            try:  # the file discovery found (a link's target, checked to be inside), not what its path may lead to now
                st = os.stat(found.real or found.path, follow_symlinks=False)
            except OSError:
                continue  # gone since it was listed: the next poll sees what replaced it
            if stat.S_ISREG(st.st_mode):
                key = (st.st_dev, st.st_ino)
                at.setdefault(key, (found.path, (st.st_size, st.st_mtime_ns)))
                if dirs is not None and found.real:  # events name a file by the directory watched: a link's target's too
                    listed_as = os.path.abspath(found.path)
                    key_at[listed_as] = key_at[found.real] = key
                    if os.path.dirname(found.real) != os.path.dirname(listed_as):
                        dirs.append(os.path.dirname(found.real))
        self.stats.archives_left = archived
        if self._feed is not None and dirs is not None:
            self._feed.listed(dirs, self._now.timestamp())
            self._key_at = key_at
        return at

    def _start(self, key: Key, path: str, sig: tuple[int, int], *, final: bool) -> FileTail | None:
        """Open, identify and place the new file ``key`` found at ``path`` with (size,
        mtime_ns) ``sig`` (see the module docstring, step 4); None if it is unreadable (not
        tried again until ``sig`` changes), or left for the next poll."""
        tail = self._new_tail(path)
        try:
            tail.open()
            if tail.key != key:  # replaced since it was listed: the next poll sees the new one
                tail.close()
                tail = self._renamed_since_listed(path, key)
                if tail is None:
                    return None
            tail.identify(final=final)
        except InputError as e:
            tail.close()
            self._rejected[key] = sig
            if self._error(str(e)):
                self.stats.files += 1
                self.stats.skip("unreadable_file")
            return None
        resumed = tail.source_id is not None and self._resume(tail)
        if tail.source_id is not None and not resumed and not final and self._copy_in_progress(tail):
            tail.close()
            return None
        members = self._families.setdefault(rotation.family(path), [])
        if not resumed and members:
            tail.inherit(members)
        members.append(tail)
        tail.family = members
        self._tails[key] = tail
        self.stats.files += 1
        return tail

    def _renamed_since_listed(self, path: str, key: Key) -> FileTail | None:
        """The file ``key`` listed at ``path`` but renamed to a rotated name of it before it
        was opened, opened there (it is under no watched path: see :meth:`_rotated_siblings`),
        None if not found (deleted, or moved elsewhere). Raises InputError if it cannot be
        opened."""
        for cand, k, _st in self._rotated_siblings(path, {}):
            if k == key:
                tail = self._new_tail(cand)
                tail.open()
                if tail.key == key:
                    return tail
                tail.close()
        return None

    def _new_tail(self, path: str) -> FileTail:
        return FileTail(path, template=self.template, boot_time=self.boot_time, flush_after=self.flush_after,
                        settle_after=self.settle_after,
                        line_prefix=self.line_prefix,
                        avoid_ids=self._retired, budget=self.budget, job_label=self.job)

    def _resume(self, tail: FileTail) -> bool:
        """Continue ``tail`` from a checkpoint of its own (any generation) or of the
        truncated file it is a copy of; False if it is new."""
        return self._resume_own(tail) or self._resume_copy(tail)

    def _resume_copy(self, tail: FileTail) -> bool:
        """Continue ``tail`` as the ``copytruncate`` copy of a source not followed any more
        (truncated in this run, or checkpointed before a restart): from that source's offset
        on, under that source's id (see :meth:`FileTail.resume
        <ckptwatch.ingest.tail.FileTail.resume>`); False if it is no such copy."""
        assert tail.head is not None and tail.handle is not None
        try:
            copies = [(since, g.checkpoint.offset, sid) for sid, (g, since) in self._unfollowed.items()
                      if rotation.is_copy(g, tail.handle, tail.path, tail.head)]
        except OSError:
            return False
        if not copies:
            return False
        gen, _ = self._unfollowed.pop(max(copies)[2])  # the most recent, then the furthest read
        tail.resume(offset=gen.checkpoint.offset, job=gen.checkpoint.job, copy_of=gen.checkpoint)
        self._retired.add(gen.checkpoint.source_id)  # no other file takes that id now
        return True

    def _followed_beside(self, path: str) -> list[FileTail]:
        """The followed files in ``path``'s directory (indexed once a poll: 10,000 files, one pass)."""
        if self._by_dir is None:
            self._by_dir = {}
            for tail in self._tails.values():
                self._by_dir.setdefault(os.path.dirname(os.path.abspath(tail.path)), []).append(tail)
        return self._by_dir.get(os.path.dirname(os.path.abspath(path)), [])

    def _copy_in_progress(self, new: FileTail) -> bool:
        """True if ``new`` may be a copy of a followed file that is still being made (a
        followed file not held open is opened again to compare)."""
        for tail in self._followed_beside(new.path):
            if tail.head == new.head and tail.offset > 0 and rotation.is_rotated_name(tail.path, new.path):
                try:
                    tail.open()
                    new.open()
                    if tail.handle is None or new.handle is None:  # one closed again to open the other
                        continue
                    size = os.fstat(new.handle.fileno()).st_size
                    if rotation.same_bytes_before(tail.handle, new.handle, min(size, tail.offset)):
                        return True
                except (OSError, InputError):
                    continue
        return False

    def _found_moved(self, tail: FileTail, key: Key) -> bool:
        """True if the followed file ``key``, not held open and under no watched path now,
        is found renamed to a rotated name of its path (``train.log.1``; symlinks not
        followed): ``tail.moved_to`` is set to it, to be opened and read there."""
        directory = os.path.dirname(os.path.abspath(tail.path))
        try:
            names = [os.path.join(directory, n) for n in sorted(os.listdir(directory))]
        except OSError:
            names = []
        for cand in [tail.moved_to, *(c for c in names if rotation.is_rotated_name(tail.path, c))]:
            if cand is None:
                continue
            try:
                st = os.stat(cand, follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) == key:
                tail.moved_to = cand
                return True
        return False

    def _find_moved(self, at: Mapping[Key, object], *, final: bool, copies: bool = False) -> list[FileTail]:
        """Follow the files of checkpointed sources that were renamed (``copies``: copied by
        ``copytruncate``), while nobody watched, to a rotated name the paths do not match
        (until read to their end: no watched path points at them). Returns the tails
        started."""
        by_dir: dict[str, set[str]] = {}
        for gen, since in self._unfollowed.values():
            if since == 0 and gen.checkpoint.path:  # only checkpoints from before this run
                directory, name = os.path.split(os.path.abspath(gen.checkpoint.path))
                by_dir.setdefault(directory, set()).add(name)
        started = []
        for directory, names in by_dir.items():
            try:
                listing = sorted(os.listdir(directory))
            except OSError:
                continue
            for name in listing:
                cand = os.path.join(directory, name)
                if (name in names or not any(name[:k] in names for k in range(1, len(name)))
                        or (copies and name.endswith(discovery.SKIP_SUFFIXES)) or self.exclude(cand)):
                    continue
                try:
                    st = os.stat(cand, follow_symlinks=False)  # a symlink is no rotated file
                except OSError:
                    continue
                if (st.st_dev, st.st_ino) in at or (st.st_dev, st.st_ino) in self._tails or not stat.S_ISREG(st.st_mode):
                    continue
                tail = self._new_tail(cand)
                try:
                    resumed = tail.identify(final=final) is not None and (
                        self._resume_copy(tail) if copies else self._resume_own(tail))
                except InputError:
                    resumed = False
                if resumed and tail.key is not None:
                    self._tails[tail.key] = tail
                    self.stats.files += 1
                    started.append(tail)
                else:
                    tail.close()
        return started

    def _resume_own(self, tail: FileTail) -> bool:
        """Continue ``tail`` from a checkpoint of its own id (any generation); False if none."""
        assert tail.key is not None and tail.head is not None
        ids = identity.generation_ids(*tail.key, tail.head)
        known = [g for g, sid in enumerate(ids) if sid in self._unfollowed
                 and self._same_prefix(tail, self._unfollowed[sid][0])]
        if not known:
            return False
        gen, _ = self._unfollowed.pop(ids[known[-1]])
        tail.resume(offset=gen.checkpoint.offset, job=gen.checkpoint.job, generation=known[-1])
        return True

    @staticmethod
    def _same_prefix(tail: FileTail, gen: rotation.Superseded) -> bool:
        """True unless the hash of the bytes read from ``gen`` is known and the file of
        ``tail`` holds other bytes before ``gen``'s offset (its inode was reused by a new
        file with the same first line)."""
        if gen.prefix_sha256 is None:
            return True
        assert tail.handle is not None
        try:
            if os.fstat(tail.handle.fileno()).st_size < gen.checkpoint.offset:
                return False
            digest = hashlib.sha256()
            rotation.update_digest(digest, tail.handle, 0, gen.checkpoint.offset)
        except OSError:
            return False
        return digest.hexdigest() == gen.prefix_sha256

    def _rotated_siblings(self, path: str, at: Mapping[Key, object]) -> list[tuple[str, Key, os.stat_result]]:
        """The regular files next to ``path`` under a rotated name of it (``train.log.1``,
        ``train.log-20261130``; not compressed ones, not symlinks) that are neither followed
        nor under a watched path, sorted by name: ``(path, key, stat)``."""
        directory = os.path.dirname(os.path.abspath(path))
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            return []
        out = []
        for name in names:
            cand = os.path.join(directory, name)
            if name.endswith(discovery.SKIP_SUFFIXES) or not rotation.is_rotated_name(path, cand) or self.exclude(cand):
                continue
            try:
                st = os.stat(cand, follow_symlinks=False)  # logrotate makes no symlink: one leads anywhere
            except OSError:
                continue
            key = (st.st_dev, st.st_ino)
            if stat.S_ISREG(st.st_mode) and key not in at and key not in self._tails:
                out.append((cand, key, st))
        return out

    def _read_rotated_siblings(self, path: str, at: Mapping[Key, object], *, since_ns: int | None,
                               truncated: bool, final: bool, now: dt.datetime) -> None:
        """Read the files rotated away from ``path`` that no watched path matches (a rotated
        name next to it, see :meth:`_rotated_siblings`), once the followed file at ``path``
        was found ``truncated`` or renamed away:

        * a ``copytruncate`` copy of a truncated generation (possibly an older copy
          rewritten in place): from the old read offset on;
        * a file never read, written to at ``since_ns`` or later (None: no such file is
          looked for) and without the first line of a followed file: a generation that
          came and went between two polls (``train.log`` rotated twice), from 0.

        After a truncation (the copies were made before it) each is read to its end and
        dropped; after a rename the writer may still append, so each is followed, like
        the renamed file, until idle (see the module docstring)."""
        for cand, key, st in self._rotated_siblings(path, at):
            missed = (since_ns is not None and st.st_mtime_ns >= since_ns
                      and self._dropped.get(key) != (st.st_size, st.st_mtime_ns))
            tail = self._new_tail(cand)
            try:
                tail.open()
                found = tail.key == key and tail.identify(final=truncated) is not None
            except InputError:
                found = False
            if not (found and (self._resume(tail) or (
                    missed and all(t.head != tail.head for t in self._tails.values())))):
                tail.close()
                continue
            self._tails[key] = tail
            self.stats.files += 1
            self._poll_tail(tail, final=final or truncated, now=now)
            if truncated and not discovery.covers(self.paths, cand, archives=self.archives):
                self._drop(key)  # read to its end; the next rotation may rewrite it in place
            elif not truncated:
                self._gone.add(key)
            # else a copy that appeared under a watched path after this poll's listing: the
            # next poll finds it there and follows it on, under the same id

    def _poll_tail(self, tail: FileTail, *, final: bool, now: dt.datetime,
                   superseded: list[rotation.Superseded] | None = None) -> None:
        """Read one tail's new lines and count them; their records are made with the other
        files' by :meth:`_flush` (one pipeline per poll, see :mod:`.batch`). A file that
        cannot be read is reported in ``stats.errors`` (once per problem) and skipped, the
        others go on. The generations the read found truncated are added to
        ``superseded`` too."""
        if id(tail) in self._pending_ids:  # read twice in one poll: records of the first read first
            self._flush(now)
        before_lines, before_skip = tail.stats.lines, dict(tail.stats.skipped)
        before_offset = tail.offset
        before_utf8 = tail.stats.invalid_utf8
        try:
            self._pending.append(tail.read(final=final, ingest_ts=now))
            self._pending_ids.add(id(tail))
        except Replaced:
            return  # not held open, and its path is another file now: the next listing finds it
        except InputError as e:
            if self._error(str(e)):
                self.stats.skip("unreadable_file")
            return
        finally:
            for gen in tail.superseded:
                self._unfollowed[gen.checkpoint.source_id] = (gen, self._polls)
            if superseded is not None:
                superseded += tail.superseded
            tail.superseded.clear()
        self.stats.add_lines(tail.labels.source_kind, tail.stats.lines - before_lines)
        self.bytes_read += max(0, tail.offset - before_offset)
        bad_utf8 = tail.stats.invalid_utf8 - before_utf8
        self.stats.invalid_utf8 += bad_utf8
        if bad_utf8:
            self.stats.errors.append(f"{tail.path}: {bad_utf8} line(s) with invalid UTF-8, "
                                     "read with replacement characters")
        for reason, n in tail.stats.skipped.items():
            if n - before_skip.get(reason, 0):
                self.stats.skip(reason, n - before_skip.get(reason, 0))
                if reason == "line_too_long":
                    self.stats.errors.append(f"{tail.path}: skipped {n - before_skip.get(reason, 0)} line(s) "
                                             f"longer than {tail.max_line_bytes} bytes")

    def _flush(self, now: dt.datetime) -> None:
        """Make the records of the reads pending in this poll, all files in one pipeline
        (:func:`ckptwatch.ingest.batch.emit`), and count what dating them found."""
        if not self._pending:
            return
        reads, self._pending = self._pending, []
        self._pending_ids.clear()
        before = [(r.tail.stats.ts_rejected, r.tail.stats.uptime_no_boot) for r in reads]
        made = batch.emit(reads, now=now)
        self._out.append(made)
        self._forget_guessed_carries(reads, made)
        for r, (rejected, uptime) in zip(reads, before, strict=True):
            self.stats.note("timestamp_out_of_range", r.tail.stats.ts_rejected - rejected)
            self.stats.note("kernel_uptime_without_boot_time", r.tail.stats.uptime_no_boot - uptime)

    def _missing_but_linked(self, at: Mapping[Key, object]) -> bool:
        """True if a followed file is missing from ``at`` but still has a name (it was
        renamed, not deleted): a rename between a directory listing and its ``stat``
        (logrotate's ``.1 -> .2`` shift) hides a file from one discovery pass. A file
        not held open (after a ``final`` poll) may still have one too."""
        for key, tail in self._tails.items():
            if key in at or key in self._gone:
                continue
            if tail.handle is None:
                return True
            try:
                if os.fstat(tail.handle.fileno()).st_nlink > 0:
                    return True
            except OSError:
                continue
        return False

    def _unwatched_for(self, key: Key, tail: FileTail, now: dt.datetime) -> float:
        """Seconds for which the followed file ``key`` has been both idle and under no
        watched path (a file that went quiet long ago and was renamed a moment ago has
        not been unwatched for long: the next poll may find it under its new name)."""
        since = self._missing_since.get(key, now)
        return min(tail.idle_seconds(now), (now - since).total_seconds())

    def _drop(self, key: Key) -> None:
        """Stop following a file read to its end: close it, retire its ids. A file that
        still has a name keeps its read offset among the unfollowed sources (with a hash of
        the bytes read, when known) for ``forget_after_polls`` polls and in the checkpoints
        persisted meanwhile: if a watched path turns out to hold it after all, it goes on
        from there under the same id instead of being read again."""
        if id(self._tails[key]) in self._pending_ids:  # its checkpoint needs its records made
            self._flush(self._now)
        tail = self._tails.pop(key)
        if tail.job is None or any(t.job == tail.job for t in tail.family if t is not tail):
            tail.family[:] = [t for t in tail.family if t is not tail]  # its family keeps one file that names the job
        self._retired.update(tail.used_ids)
        self._year_let_go.difference_update(tail.used_ids)
        self._gone.discard(key)
        self._missing_since.pop(key, None)
        linked, mtime_ns = True, None  # a file not held open may still have a name
        try:
            if tail.handle is not None:
                st = os.fstat(tail.handle.fileno())
            else:
                st = os.stat(tail.moved_to or tail.path, follow_symlinks=False)
                if (st.st_dev, st.st_ino) != key:
                    raise FileNotFoundError
            self._dropped[key] = (st.st_size, st.st_mtime_ns)
            linked, mtime_ns = st.st_nlink > 0, st.st_mtime_ns
        except OSError:
            pass
        ckpt = tail.checkpoint()
        if linked and ckpt is not None:
            self._unfollowed[ckpt.source_id] = (rotation.Superseded(ckpt, tail.prefix_sha256(), mtime_ns), self._polls)
        tail.close()

    def _forget(self) -> None:
        """Drop entries of sources not followed for more than ``forget_after_polls`` polls."""
        for sid in [s for s, (_, since) in self._unfollowed.items() if self._polls - since > self.forget_after_polls]:
            del self._unfollowed[sid]

    def _error(self, msg: str) -> bool:
        """Report ``msg`` in ``stats.errors`` unless it was reported before; True if new."""
        if msg in self._reported:
            return False
        self._reported.add(msg)
        self.stats.errors.append(msg)
        return True


def _carry_key(source_id: str, stream: str | None) -> str | None:
    """The key of a stream's carried time in :attr:`FileTail.carry
    <ckptwatch.ingest.tail.FileTail.carry>` (:mod:`.batch`'s ``stream_key``)."""
    return None if stream is None else f"{source_id}:{stream}"
