"""Per-file tailing state: read new complete lines, label them, group them, date them.

:class:`FileTail` is the only stateful piece of ingest (Vector's ``file_watcher``). One
instance follows one file through a file descriptor it holds open, so a file renamed or
deleted while it is followed is still read to its end (like ``tail -F``):

* ``offset``: the next byte to read;
* ``held``: lines read but not yet emitted (the last, possibly unfinished, record of
  each stream); ``committed_offset`` never passes the first of them, so a restart from
  ``committed_offset`` re-reads them and nothing is lost;
* ``carry``: the last event time read from a line, per stream, for records without
  their own time;
* ``job``: the job of a console file, from the last line that named it (a relaunch
  under a new run id starts a new job in the same file);
* ``layout``: the file's label prefixes (pdsh, srun ``--label``), sniffed from its first
  lines (:func:`.prefix.sniff`);
* ``rank_map``: ``"<host>|<local rank>"`` -> global rank, from torchrun's rendezvous
  result (per host label: a pdsh console holds several nodes' agents);
* ``source_id``: the file's id (:mod:`.identity`). A file truncated in place (shorter
  than ``offset``, or with another first line: checked on each poll that sees the size
  or mtime change, by reading at most 1 KiB) starts a new *generation*: the held-back
  lines are emitted, the old generation is recorded in ``superseded`` (for recognizing
  a ``copytruncate`` copy, see :mod:`.rotation`), and the file is read again from 0
  under a new id, so ``(source_id, offset)`` never names two different lines.

``poll()`` returns a records DataFrame with :data:`ckptwatch.schema.RECORD_SCHEMA`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import gzip
import hashlib
import os
import re
from collections.abc import Container
from dataclasses import dataclass, field
from typing import BinaryIO

import polars as pl

from ckptwatch.ingest import batch, handles, identity, layout, prefix, reader, rotation
from ckptwatch.ingest.checkpoint import SourceCheckpoint
from ckptwatch.schema import RECORD_SCHEMA

# torchrun's rendezvous result (torch/distributed/elastic/agent/server/api.py, _rendezvous):
# which global rank each local rank of this node is
_LOCAL_RANKS = r"\blocal_ranks=\[(?P<v>[\d, ]*)\]"
_GLOBAL_RANKS = r"\bglobal_ranks=\[(?P<v>[\d, ]*)\]"


@dataclass
class TailStats:
    """Counters for one file; ``skipped`` maps reason -> count."""

    lines: int = 0
    records: int = 0
    invalid_utf8: int = 0
    ts_rejected: int = 0
    uptime_no_boot: int = 0  # kernel [ seconds] stamps read without a boot time
    skipped: dict[str, int] = field(default_factory=dict)

    def skip(self, reason: str, n: int = 1) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + n


class InputError(Exception):
    """A file that cannot be read as a log; the message names the file and the reason."""


class Replaced(InputError):
    """The path of a file not held open leads to another file now (renamed, replaced):
    its owner looks for it elsewhere (not the file's fault, nothing to report)."""


class FileTail:
    """Follows one log file. Not thread-safe; one owner at a time.

    Args:
        path: the file to follow; opened (and held open) at the first :meth:`open` or
            :meth:`poll`. ``path`` may be updated by the owner when the file is renamed.
        template: compiled path template for labels (:mod:`.layout`).
        offset: byte offset to start reading at (a committed offset from a checkpoint).
        boot_time: UTC boot time for kernel ``[seconds]`` stamps.
        max_line_bytes: longer lines are skipped and counted (``line_too_long``).
        chunk_bytes: how much one poll reads at most (plus one huge line).
        flush_after: seconds without growth after which held-back records are emitted.
        settle_after: seconds without growth, over at least two polls (the file unchanged
            since the previous one), after which a held-back record is emitted unless it
            may go on (a traceback's frame, a line ending in ``:``, see
            :func:`~ckptwatch.ingest.multiline.may_go_on`): a rank that dies leaves its last
            line in a file that never grows again, and that line is what an incident needs
            first. Those that may go on wait ``flush_after``.
        job: the job learned from the file's lines before a restart.
        avoid_ids: source ids not to give this file (ids of dropped files, whose inode a
            new file may reuse).
        line_prefix: the torchrun ``--log-line-prefix-template`` its lines were written with.
        budget: the open files this one shares a descriptor budget with
            (:class:`~ckptwatch.ingest.handles.HandleBudget`): opening it may close the least
            recently used other one, which is opened again (and checked to be the same file)
            when next read. None: no budget.
        job_label: the job of every line whose path the template gives no job (``--job``
            NAME: one job's paste); the lines' own mentions (a torchrun ``run_id``) then
            do not name another.

    ``moved_to``: set by the owner when the file, not held open, was found renamed away
    from ``path`` to a name no watched path takes (``train.log.1`` beside a ``*.log``
    pattern); :meth:`open` opens it there.
    """

    def __init__(
        self,
        path: str,
        *,
        template: re.Pattern[str] | None = None,
        offset: int = 0,
        boot_time: dt.datetime | None = None,
        max_line_bytes: int = reader.DEFAULT_MAX_LINE_BYTES,
        chunk_bytes: int = reader.DEFAULT_CHUNK_BYTES,
        flush_after: float = 2.0,
        settle_after: float = 0.25,
        job: str | None = None,
        avoid_ids: Container[str] = frozenset(),
        line_prefix: str | None = None,
        budget: handles.HandleBudget | None = None,
        job_label: str | None = None,
    ) -> None:
        self.path = path
        self.moved_to: str | None = None
        self.budget = budget
        self.labels = layout.labels_for(path, template)
        if job_label is not None and self.labels.job is None:  # ``--job``: the user names the job
            self.labels = dataclasses.replace(self.labels, job=job_label)
        self.job = self.labels.job or job  # ``job``: learned from the file's lines before a restart
        self.offset = offset
        self.source_id: str | None = None
        self.head: bytes | None = None  # the first line the id was made from
        self.boot_time = boot_time
        self.max_line_bytes = max_line_bytes
        self.chunk_bytes = chunk_bytes
        self.held = pl.DataFrame()
        self.carry: dict[str, dt.datetime] = {}
        self.file_carry: dt.datetime | None = None
        self.line_prefix = line_prefix
        self.layout: prefix.PrefixLayout | None = None
        #: while no label prefix is found: its newest lines, and how many were read (batch._sniff)
        self.sniff_buf: list[str] = []
        self.sniffed = 0
        self.rank_map: dict[str, int] = {}
        self._ambiguous_nodes: set[str] = set()
        #: the local ranks of the rendezvous result line last read per (node, agent pid), for
        #: the global ranks line after it
        self._last_local: dict[tuple[str, str | None], list[int]] = {}
        #: the files of its rotation family, itself included (set by the watcher; see inherit)
        self.family: list[FileTail] = []
        self.stats = TailStats()
        self.flush_after = flush_after
        self.settle_after = min(settle_after, flush_after)
        self.superseded: list[rotation.Superseded] = []  # truncated generations; the owner takes them
        self.more = False  # the last poll stopped before the end of what the file held (a backlog)
        self._avoid = avoid_ids
        self._used_ids: set[str] = set()
        self._file: BinaryIO | None = None
        self._raw: BinaryIO | None = None  # the file under a GzipFile (which does not close it)
        self._key: tuple[int, int] | None = None
        self._seen: tuple[int, int] | None = None  # (size, mtime_ns) at the last poll
        self._seen_path: str | None = None  # ``path`` at the last poll (a rename may have moved it since)
        self._copy_of_path: str | None = None  # the path of the source this file is a copy of (resume())
        self._digest = hashlib.sha256() if offset == 0 else None  # of bytes [0, offset), if known
        self._last_growth: dt.datetime | None = None
        self._gz_size: tuple[tuple[int, int], int] | None = None  # ((size, mtime_ns), decompressed length)

    @property
    def key(self) -> tuple[int, int] | None:
        """``(st_dev, st_ino)`` of the open file, None before :meth:`open`."""
        return self._key

    @property
    def handle(self) -> BinaryIO | None:
        """The open file (binary), None before :meth:`open` and after :meth:`close`."""
        return self._file

    @property
    def used_ids(self) -> frozenset[str]:
        """Every source id this tail has given its file (one per generation)."""
        return frozenset(self._used_ids)

    @property
    def committed_offset(self) -> int:
        """The offset from which a restart loses nothing: the first held-back line, else ``offset``."""
        if self.held.is_empty():
            return self.offset
        return int(self.held["offset"].min())

    def open(self) -> None:
        """Open the file and hold it open (later calls do nothing while it is open). After
        :meth:`close`, opens ``path`` (or ``moved_to``) again, which must still be the same
        file. Within a ``budget``, the least recently used other file may be closed first,
        and others are closed while the process is out of descriptors (EMFILE).

        Raises:
            Replaced: after :meth:`close`, the path leads to another file now.
            InputError: the file cannot be opened (message names the file).
            OpenFileLimitError: out of descriptors, and no other file of the budget open to
                close (:class:`~ckptwatch.ingest.handles.OpenFileLimitError`).
        """
        if self._file is not None:
            if self.budget is not None:
                self.budget.used(self)
            return
        where = self.moved_to or self.path
        if self.budget is not None:
            self.budget.admit(self)
        while True:
            try:
                raw = open(where, "rb")  # held open until close()
                break
            except OSError as e:
                if e.errno not in handles.NO_DESCRIPTORS:
                    raise InputError(f"{where}: cannot read: {e.strerror or e}") from None
                if self.budget is None or not self.budget.shed(self):
                    raise handles.out_of_descriptors(where, self.budget.limit if self.budget else None) from None
        self._file = self._raw = raw
        if self.budget is not None:
            self.budget.opened(self)
        try:
            st = os.fstat(raw.fileno())
            if where.endswith(".gz"):  # a compressed rotated log: read through gzip, offsets decompressed
                self._file = gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[assignment]
        except OSError as e:
            self.close()
            raise InputError(f"{where}: cannot read: {e.strerror or e}") from None
        if self._key is not None and self._key != (st.st_dev, st.st_ino):
            self.close()
            raise Replaced(f"{where}: another file now than the one followed; not read as its continuation")
        self._key = (st.st_dev, st.st_ino)

    def close(self) -> None:
        """Close the file descriptor (a later :meth:`open` or :meth:`poll` opens ``path`` again)."""
        if self._file is not None:
            try:
                self._file.close()
            finally:
                if self._raw is not None and self._raw is not self._file:
                    self._raw.close()
                self._file = self._raw = None
                if self.budget is not None:
                    self.budget.closed(self)

    def identify(self, *, final: bool = False) -> str | None:
        """The file's source id, computed from its first line on the first call that finds
        one complete (or any first bytes, with ``final``); None until then.

        Raises:
            InputError: the file is binary or cannot be read (message names the file).
        """
        if self.source_id is not None:
            return self.source_id
        self.open()
        assert self._file is not None and self._key is not None
        try:
            if reader.looks_binary(self._file):
                raise InputError(f"{self.path}: binary data (NUL bytes in the first 8 KiB), not a text log; skipped")
            head = identity.read_head(self._file, final=final)
        except (OSError, EOFError) as e:  # EOFError: a truncated .gz
            raise InputError(f"{self.path}: cannot read: {getattr(e, 'strerror', None) or e}") from None
        if head is not None:
            self.head = head
            dev, ino = self._key
            gen = 0
            while (sid := identity.source_id_of(dev, ino, head, gen)) in self._used_ids or sid in self._avoid:
                gen += 1
            self.source_id = sid
            self._used_ids.add(sid)
        return self.source_id

    def inherit(self, family: list[FileTail]) -> None:
        """Take what the lines of the other files of its rotation family taught (this file
        replaced one at its path: ``console.log`` renamed to ``console.log.1``, a new
        ``console.log``; or it is a generation first seen under its rotated name): the label
        prefixes sniffed and the node's local -> global rank map, the newest written first.
        The job a line named (torchrun's ``run_id`` comes once, at the top of the first file)
        is looked up when its records are made (:meth:`family_job`): the family may be read
        for the first time in the same poll."""
        for before in sorted(family, key=lambda t: t.last_write_ns() or 0):
            if self.layout is None and before.layout is not None:
                self.layout = before.layout
                self.sniffed = before.sniffed
            self.rank_map = {**before.rank_map, **self.rank_map}
            self._last_local = {**before._last_local, **self._last_local}

    def family_job(self) -> str | None:
        """The job the lines of another file of its rotation family named, if any."""
        return next((t.job for t in self.family if t is not self and t.job is not None), None)

    def resume(self, *, offset: int, job: str | None, generation: int | None = None,
               copy_of: SourceCheckpoint | None = None) -> None:
        """Continue a source known from before (a checkpoint, or a copy of a truncated file)
        at byte ``offset``, with its learned ``job``; call after :meth:`identify` found the
        id and before the first :meth:`poll`. ``generation``: the id to take is the one of
        that generation (see :func:`ckptwatch.ingest.identity.source_id_of`; earlier
        generations count as used); None keeps the id :meth:`identify` chose.

        ``copy_of``: the file is a copy (logrotate's ``copytruncate``) of that source's
        file, byte for byte up to ``offset`` at least: it goes on under that source's id, so
        a line has the same ``(source_id, offset)`` whether it was read from the original or
        from the copy (a collector killed after publishing lines it had not checkpointed
        publishes them again under the same pair, and consumers drop them). Its
        checkpoints keep that source's path, so a restart finds the copy again under a
        rotated name of it (:func:`ckptwatch.ingest.rotation.is_copy`)."""
        assert self._key is not None and self.head is not None, "resume() needs identify() first"
        if generation is not None:
            ids = identity.generation_ids(*self._key, self.head)[: generation + 1]
            self._used_ids.update(ids)
            self.source_id = ids[-1]
        if copy_of is not None:
            self.source_id = copy_of.source_id
            self._used_ids.add(copy_of.source_id)
            self._copy_of_path = copy_of.path
        self.offset = offset
        self.job = self.labels.job or job
        self._digest = hashlib.sha256() if offset == 0 else None

    def checkpoint(self) -> SourceCheckpoint | None:
        """Where a restart resumes this source, None while it has no id yet. The path is
        the file's, or for a copy that continues another source, that source's (see
        :meth:`resume`)."""
        if self.source_id is None or self.head is None:
            return None
        return SourceCheckpoint(self.source_id, self._copy_of_path or self.path, self.committed_offset, self.job,
                                identity.head_hash(self.head))

    def prefix_sha256(self) -> str | None:
        """Hex SHA-256 of the bytes ``[0, offset)`` read so far, None if not known (the
        tail started at an offset > 0)."""
        return None if self._digest is None else self._digest.copy().hexdigest()

    def last_write_ns(self) -> int | None:
        """The open file's mtime (ns); for a file not held open, the one the last read saw;
        None if it was never read or cannot be stat'ed."""
        if self._file is None:
            return None if self._seen is None else self._seen[1]
        try:
            return os.fstat(self._file.fileno()).st_mtime_ns
        except OSError:
            return None

    def idle_seconds(self, now: dt.datetime) -> float:
        """Seconds since a poll last read a line (0 before the first poll)."""
        return 0.0 if self._last_growth is None else (now - self._last_growth).total_seconds()

    def poll(self, *, final: bool = False, ingest_ts: dt.datetime | None = None) -> pl.DataFrame:
        """Read what was appended since the last poll and return its complete records.

        Args:
            final: the file will not grow (``diagnose``, ``run --once``): emit everything,
                including a last line without newline and the last record of each stream.
                Without it, the last record of each stream is held back until the next
                line, or until the file has not grown for ``flush_after`` seconds; a last
                line without newline, until the file is unchanged since the previous poll
                and no line came for ``flush_after`` seconds.
                At most ``chunk_bytes`` are read per poll; ``more`` tells that the file
                holds more (then nothing is flushed even with ``final``: poll again).
            ingest_ts: wall-clock time of this read (UTC); defaults to now.

        Many files are polled together by :meth:`read` on each, then one
        :func:`ckptwatch.ingest.batch.emit` of all the reads (what the watcher does).

        Raises:
            InputError: the file is binary or cannot be read (message names the file).
        """
        now = ingest_ts or dt.datetime.now(dt.timezone.utc)
        return batch.emit([self.read(final=final, ingest_ts=now)], now=now)

    def read(self, *, final: bool = False, ingest_ts: dt.datetime | None = None) -> batch.Read:
        """The first half of :meth:`poll`: read the new complete lines (and handle a
        truncation), without making records of them yet; pass the result to
        :func:`ckptwatch.ingest.batch.emit`, before this file is read again.

        Raises:
            InputError: the file is binary or cannot be read (message names the file).
        """
        now = ingest_ts or dt.datetime.now(dt.timezone.utc)
        self.open()
        assert self._file is not None
        emitted: list[pl.DataFrame] = []
        try:
            st = os.fstat(self._file.fileno())
            mtime = dt.datetime.fromtimestamp(st.st_mtime, dt.timezone.utc)
            size = self._size(st)
            seen, self._seen = self._seen, (st.st_size, st.st_mtime_ns)
            seen_path, self._seen_path = self._seen_path, self.path
            if self._nothing_to_do(st, seen, seen_path, size, final=final, now=now):
                self.more = False
                return batch.Read(self, [], flush=False, mtime=mtime)
            if self.source_id is not None and self._seen != seen and self._rewritten(size, final=final):
                emitted.append(self._supersede(now, mtime, seen[1] if seen else None, seen_path or self.path))
            if self.identify(final=final) is None:
                return batch.Read(self, [], flush=False, mtime=mtime, emitted=emitted)
            # a last line without newline is read once the writer went quiet: not a byte since
            # the last poll and no line for flush_after seconds (a process killed mid-line
            # never ends it); should the writer end it later, the rest is a line of its own
            quiet = (seen == self._seen and seen_path == self.path and self._last_growth is not None
                     and (now - self._last_growth).total_seconds() >= self.flush_after)
            if final or size > self.offset:
                res = reader.read_lines(self._file, self.offset, final=final or quiet,
                                        max_line_bytes=self.max_line_bytes, chunk_bytes=self.chunk_bytes,
                                        size_hint=size if not isinstance(self._file, gzip.GzipFile) else None)
            else:
                res = reader.ReadResult(next_offset=self.offset)
            self.more = res.next_offset < size
            if self._digest is not None and res.next_offset > self.offset:
                # the bytes as read: logrotate may have copied and truncated the file since
                # (read again, they would be the next generation's, and the copy not found)
                consumed = res.next_offset - self.offset
                if len(res.raw) >= consumed:
                    self._digest.update(memoryview(res.raw)[:consumed])
                else:  # a line too long was skipped without being kept: read it again
                    rotation.update_digest(self._digest, self._file, self.offset, res.next_offset)
        except (OSError, EOFError) as e:  # EOFError: a truncated .gz
            raise InputError(f"{self.path}: cannot read: {getattr(e, 'strerror', None) or e}") from None
        self.offset = res.next_offset
        self.stats.lines += res.count
        self.stats.invalid_utf8 += res.invalid_utf8
        for reason, _off, _n in res.skipped:
            self.stats.skip(reason)
        if res.count or self._last_growth is None:
            self._last_growth = now
        idle_for = (now - self._last_growth).total_seconds()
        settled = not res.count and seen == self._seen and seen_path == self.path and idle_for >= self.settle_after
        return batch.Read(self, res.pairs, flush=(final and not self.more) or idle_for >= self.flush_after,
                          mtime=mtime, emitted=emitted, block=res.block, settled=settled)

    def at_rest(self, path: str, sig: tuple[int, int]) -> bool:
        """True if a poll of this file would do nothing, judged from the ``(size, mtime_ns)``
        a directory listing just stat'ed at ``path``: same path and signature as the last
        poll saw, read to its end (a plain file), nothing held back, no backlog. The watcher
        then skips it without a ``read`` (no ``fstat``, no pass of the pipeline), so a poll
        costs what changed, not every file followed."""
        return (self.source_id is not None and self._seen == sig and self._seen_path == path
                and self.offset >= sig[0] and not self.more and self.held.is_empty()
                and not isinstance(self._file, gzip.GzipFile))

    def _nothing_to_do(self, st: os.stat_result, seen: tuple[int, int] | None, seen_path: str | None, size: int,
                       *, final: bool, now: dt.datetime) -> bool:
        """True if a poll would read and emit nothing: the file is unchanged since the last
        poll (same path, size and mtime), read to its end, and no held-back record is due
        (none held, or the file has not been idle ``settle_after`` seconds and this is not a
        final poll). Idle files then cost one ``fstat`` per poll, not a pass of the pipeline."""
        if self.source_id is None or seen != (st.st_size, st.st_mtime_ns) or seen_path != self.path:
            return False
        if size > self.offset:
            return False
        if self.held.is_empty():
            return True
        idle_for = 0.0 if self._last_growth is None else (now - self._last_growth).total_seconds()
        # a held record that may go on is read again at each poll from settle_after on, and
        # stays held (batch.Read.settled) until flush_after: a few files, a few lines each
        due = idle_for >= self.settle_after
        return not (final or due)

    def _size(self, st: os.stat_result) -> int:
        """The file's length in the offsets lines are read at: its size, or for a ``.gz`` the
        decompressed length its trailer records (ISIZE, RFC 1952; modulo 4 GiB). Raises
        OSError if it cannot be read."""
        if not isinstance(self._file, gzip.GzipFile):
            return st.st_size
        if self._gz_size is None or self._gz_size[0] != (st.st_size, st.st_mtime_ns):
            with open(self.moved_to or self.path, "rb") as raw:
                raw.seek(max(0, st.st_size - 4))
                tail = raw.read(4)
            self._gz_size = ((st.st_size, st.st_mtime_ns), int.from_bytes(tail, "little") if len(tail) == 4 else 0)
        return self._gz_size[1]

    def _rewritten(self, size: int, *, final: bool) -> bool:
        """True if the file was truncated since the last poll: shorter than the read offset,
        or its first line changed (it was truncated and written past the old offset).
        Raises OSError if the file cannot be read."""
        assert self._file is not None
        return size < self.offset or identity.read_head(self._file, final=final) != self.head

    def _supersede(self, now: dt.datetime, mtime: dt.datetime, seen_mtime_ns: int | None,
                   seen_path: str) -> pl.DataFrame:
        """End the current generation: emit its held-back records, record it in
        ``superseded`` (with the file's mtime and path at the last poll before,
        ``seen_mtime_ns`` and ``seen_path``: a ``copytruncate`` copy is named after the path
        the file had when it was copied, not after a name it was renamed to since) and
        start over at offset 0 (a new id is taken by :meth:`identify`)."""
        assert self.source_id is not None and self.head is not None
        held = self.held.with_columns(pl.lit(0, dtype=pl.Int32).alias("_t"))
        flushed = (batch.records_of([self], held, [True], [mtime], now=now) if held.height
                   else pl.DataFrame(schema=RECORD_SCHEMA))
        ckpt = SourceCheckpoint(self.source_id, seen_path, self.offset, self.job, identity.head_hash(self.head))
        self.superseded.append(rotation.Superseded(ckpt, self._digest.hexdigest() if self._digest else None,
                                                   seen_mtime_ns))
        self.source_id, self.head, self.offset, self._copy_of_path = None, None, 0, None
        self.held, self.carry, self._digest = pl.DataFrame(), {}, hashlib.sha256()
        self.file_carry = None
        self.layout, self.rank_map, self._ambiguous_nodes, self._last_local = None, {}, set(), {}
        self.sniff_buf, self.sniffed = [], 0
        return flushed

    def multi_node(self, raw: pl.DataFrame | None) -> bool:
        """True if this file's torchrun agent runs a node whose local ranks are not the
        global ones (learned before, or in ``raw``: this poll's raw lines, None when they
        hold no ``global_ranks=``): a lone ``[rankN]:`` prefix is then ``--tee`` with
        ``--role rank``, a local rank."""
        if any(int(k.rsplit("|", 1)[1]) != v for k, v in self.rank_map.items()):
            return True
        if raw is None or not raw["line"].str.contains("global_ranks=", literal=True).any():
            return False
        found = raw["line"].str.extract(_GLOBAL_RANKS, 1).drop_nulls()
        return any(_ints(g) != list(range(len(_ints(g)))) for g in found)

    def learn_rank_map(self, lines: pl.DataFrame) -> None:
        """Learn each node's local -> global ranks from torchrun's rendezvous result lines
        (``local_ranks=[…]`` then ``global_ranks=[…]``), keyed by the node label of the lines
        (``<node>|<local>``) and by the agent's pid (``pid:<pid>|<local>``). A node label two
        agents disagree on (two nodes' agents in one unlabelled file) maps nothing: only the
        agents' own lines, by pid, are mapped then."""
        if lines.is_empty() or not lines["line"].str.contains("(?:local|global)_ranks=").any():
            return
        found = lines.select(
            prefix.node_key(pl.lit(self.labels.host, dtype=pl.Utf8)).alias("node"),
            pl.col("line").str.extract(prefix.AGENT_PID, 1).alias("pid"),
            pl.col("line").str.extract(_LOCAL_RANKS, 1).alias("loc"),
            pl.col("line").str.extract(_GLOBAL_RANKS, 1).alias("glo"),
        ).filter(pl.col("loc").is_not_null() | pl.col("glo").is_not_null())
        last_local = self._last_local  # a poll may end between the two lines
        for node, pid, loc, glo in found.iter_rows():
            if loc is not None:
                last_local[(node, pid)] = _ints(loc)
            elif (node, pid) in last_local and len(last_local[(node, pid)]) == len(_ints(glo)):
                pairs = list(zip(last_local[(node, pid)], _ints(glo), strict=True))
                if pid is not None:
                    self.rank_map.update({f"pid:{pid}|{lr}": g for lr, g in pairs})
                if node in self._ambiguous_nodes:
                    continue
                if any(self.rank_map.get(f"{node}|{lr}", g) != g for lr, g in pairs):
                    self._ambiguous_nodes.add(node)
                    for lr, _ in pairs:
                        self.rank_map.pop(f"{node}|{lr}", None)
                    continue
                self.rank_map.update({f"{node}|{lr}": g for lr, g in pairs})


def _ints(text: str) -> list[int]:
    """``"0, 1, 2"`` -> ``[0, 1, 2]``."""
    return [int(x) for x in text.replace(" ", "").split(",") if x]
