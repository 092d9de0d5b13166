"""DuckDB store: events (with their source and offset), source offsets, incidents and
their evidence, in one database file.

Tables (timestamps are ``TIMESTAMPTZ``, UTC; every column with its type and unit in
``docs/schema.md``; the file's schema version in ``schema_version``, older files brought up
to date when opened: :mod:`ckptwatch.sinks.migrations`):

* ``events``: EVENT_SCHEMA; each ``(source_id, offset)`` once: re-reading the same bytes
  inserts nothing (:mod:`ckptwatch.sinks.stored_offsets` drops the repeats in bounded
  memory; the table has no key, whose index DuckDB would keep in memory, growing with it).
  A database made before this loses its key when first opened (the table copied once).
* ``sources``: ``source_id`` -> ``file``, ``committed_offset`` (where tailing resumes),
  the ``job`` learned from the file's lines and ``head_hash`` (hex SHA-256 of the file's
  first line, to recognize a ``copytruncate`` copy after a restart), ``followed`` (False
  once tailing forgot the source: a restart does not resume it), ``host`` (the machine the
  file was read on). Written in the same transaction as the events read up to it. In fleet
  mode the sink records each source's file and collector host as the messages name them
  (``committed_offset`` NULL, ``followed`` FALSE: the collector keeps its own offsets).
* ``source_floors``: fleet mode: ``source_id`` -> ``floor``, the collector's saved offset
  of the source as its last message said (no event of the source below it is sent again;
  see :mod:`ckptwatch.sinks.stored_offsets`).
* ``incidents``: one row per incident id (upsert; ``detected_ts`` keeps its first value);
  root cause and last good checkpoint flattened into columns for SQL, the full shapes
  as JSON.
* ``incident_evidence``: ``(incident_id, seq)`` -> the cited event's
  ``(source_id, offset)``, role, time, rank and line.
* ``released_jobs``: jobs the detector released (concluded and idle): ``job`` -> newest
  event time ``max_ts`` and when (``released_ts``); a restart does not replay their events.
* ``detector_state``: ``name`` -> JSON; ``registry``: the checkpoint registry as of the
  last release (:meth:`CheckpointRegistry.to_dict
  <ckptwatch.detectors.checkpoints.CheckpointRegistry.to_dict>`).

The tables hold raw log lines (secrets included: redaction applies to alerts only), so the
database file and its ``.wal`` are private (``0600``, see :mod:`ckptwatch.private_files`):
created under umask 077, tightened when opened and after every transaction.

**A new database is created whole or not at all**: in a temporary file next to it
(``.<name>.<random>.tmp``), schema written and checkpointed, then linked into place. A
creation that fails (a full disk) leaves nothing behind and raises :class:`StoreError`,
one line naming the cause (e.g. ``no space left on device (ENOSPC)``). A 0-byte file at
the path (left by a creation that failed before this) is replaced.

**A full disk does not lose or half-write anything, and does not stop the store.** Every
write is a transaction (a statement outside :meth:`Store.transaction` is made one), and
the statements of the open transaction are kept. When DuckDB cannot write for lack of
space (ENOSPC, EDQUOT: at a statement, at ``COMMIT`` or at the automatic checkpoint after
it, which invalidates DuckDB's instance), the transaction is rolled back as DuckDB left it,
``say`` is told once (then every minute) that the store waits, and the transaction is
tried again from its first statement, every few seconds, until it commits (the database
reopened first when DuckDB invalidated it; a commit DuckDB reports durable is not
repeated). The caller just sees a slow call. Offsets are written in the transaction of
the data they cover, so a process stopped while waiting (Ctrl-C, SIGTERM: the wait is
interruptible) resumes from what was stored, as after a crash. With
``wait_for_space=False``, or while SIGTERM is ignored (the CLI's shutdown), nobody could
stop the wait: :class:`DiskFull` is raised instead, the transaction rolled back.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import json
import os
import secrets
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import duckdb
import polars as pl

from ckptwatch import private_files
from ckptwatch.detectors.incident import EvidenceItem, Incident
from ckptwatch.schema import EVENT_SCHEMA
from ckptwatch.sinks import migrations
from ckptwatch.sinks.snapshot import DEFAULT_EVERY, SnapshotPublisher
from ckptwatch.sinks.stored_offsets import PAIR_SCHEMA, StoredOffsets

_DDL = """
CREATE TABLE IF NOT EXISTS events (
    ts TIMESTAMPTZ, ts_source VARCHAR, job VARCHAR, host VARCHAR, rank INTEGER, local_rank INTEGER,
    pid BIGINT, kind VARCHAR, step BIGINT, path VARCHAR, rule_id VARCHAR, attrs JSON,
    source_id VARCHAR NOT NULL, source_kind VARCHAR, "offset" BIGINT NOT NULL, line VARCHAR, dedup_key VARCHAR);
CREATE TABLE IF NOT EXISTS sources (
    source_id VARCHAR PRIMARY KEY, file VARCHAR, committed_offset BIGINT, job VARCHAR, updated_ts TIMESTAMPTZ,
    head_hash VARCHAR);
ALTER TABLE sources ADD COLUMN IF NOT EXISTS head_hash VARCHAR;
ALTER TABLE sources ADD COLUMN IF NOT EXISTS followed BOOLEAN DEFAULT TRUE;
ALTER TABLE sources ADD COLUMN IF NOT EXISTS collector VARCHAR;
CREATE TABLE IF NOT EXISTS incidents (
    id VARCHAR PRIMARY KEY, kind VARCHAR, severity VARCHAR, status VARCHAR, job VARCHAR, step BIGINT,
    checkpoint_path VARCHAR, root_cause_class VARCHAR, root_rank INTEGER, root_host VARCHAR, root_pid BIGINT,
    root_ts TIMESTAMPTZ, root_line VARCHAR, root_cause JSON, collateral INTEGER[], checkpoint_state JSON,
    last_good_step BIGINT, last_good_path VARCHAR, remediation VARCHAR, first_ts TIMESTAMPTZ,
    detected_ts TIMESTAMPTZ, updated_ts TIMESTAMPTZ);
CREATE TABLE IF NOT EXISTS incident_evidence (
    incident_id VARCHAR, seq INTEGER, source_id VARCHAR, "offset" BIGINT, role VARCHAR, ts TIMESTAMPTZ,
    kind VARCHAR, rank INTEGER, host VARCHAR, rule_id VARCHAR, line VARCHAR,
    PRIMARY KEY (incident_id, seq));
CREATE TABLE IF NOT EXISTS released_jobs (
    job VARCHAR PRIMARY KEY, max_ts TIMESTAMPTZ, released_ts TIMESTAMPTZ);
CREATE TABLE IF NOT EXISTS detector_state (name VARCHAR PRIMARY KEY, doc JSON, updated_ts TIMESTAMPTZ);
CREATE TABLE IF NOT EXISTS source_floors (source_id VARCHAR PRIMARY KEY, floor BIGINT, updated_ts TIMESTAMPTZ);
CREATE TABLE IF NOT EXISTS kafka_offsets (
    topic VARCHAR, "partition" INTEGER, next_offset BIGINT, updated_ts TIMESTAMPTZ, PRIMARY KEY (topic, "partition"));
"""

#: seconds a store waits for another process's lock on its file before it fails
LOCK_WAIT = 5.0
#: DuckDB's memory limit while a restart reads the events to replay (it spills past it)
REPLAY_MEMORY_LIMIT = "64MB"
#: DuckDB's memory limit for the store's connection: its buffer pool caches what it writes
#: and reads up to it (DuckDB's default, 80 % of RAM, let a long run grow with the table);
#: queries spill past it to ``<database>.tmp``
STORE_MEMORY_LIMIT = "128MB"

#: A source's row: ``(source_id, file, committed_offset, job)``, optionally ``head_hash`` last.
SourceRow = tuple[str, str, int, str | None] | tuple[str, str, int, str | None, str | None]

_EVENT_COLS = ", ".join(f'"{c}"' for c in EVENT_SCHEMA)

#: errno -> its text, as DuckDB's IO errors quote it (strerror); the errors a full disk gives
_NO_SPACE = {errno.ENOSPC: "No space left on device", errno.EDQUOT: "Disk quota exceeded"}
#: first words of the statements that write: outside a transaction, one is made for them
_WRITES = ("INSERT", "UPDATE", "DELETE", "CREATE", "ALTER", "DROP")
#: seconds between two attempts while the disk is full (doubling from the first to the last)
RETRY_FIRST, RETRY_MAX = 0.25, 5.0
#: seconds between two "still waiting" messages
SAY_EVERY = 60.0


class StoreError(duckdb.IOException):
    """The database cannot be created or written; the message is one line naming the cause.
    A ``duckdb.Error``, so callers that report DuckDB's errors report it too."""


class DiskFull(StoreError):
    """No space (ENOSPC, EDQUOT) to write the database, and the store could not wait for
    some (``wait_for_space=False``, or SIGTERM ignored): the transaction was rolled back."""


def no_space(e: BaseException) -> int | None:
    """``errno.ENOSPC`` / ``errno.EDQUOT`` when ``e`` is a DuckDB (or OS) error caused by a
    full disk or quota, else None."""
    if isinstance(e, OSError):
        return e.errno if e.errno in _NO_SPACE else None
    if not isinstance(e, duckdb.Error):
        return None
    text = str(e)
    for code, words in _NO_SPACE.items():
        if words in text or os.strerror(code) in text:
            return code
    return None


#: OS errors named by their errno in messages (DuckDB quotes only their strerror text)
_NAMED = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.ENOENT, errno.ENOTDIR, errno.EACCES, errno.EPERM,
          errno.EROFS, errno.EIO, errno.EISDIR)


def _cause(e: BaseException) -> str:
    """``no space left on device (ENOSPC)`` and the like, or the error's first line."""
    code = no_space(e)
    if code is None and isinstance(e, OSError):
        code = e.errno
    if code is None and isinstance(e, duckdb.Error):
        code = next((c for c in _NAMED if os.strerror(c) in str(e)), None)
    if code is not None:
        return f"{_NO_SPACE.get(code, os.strerror(code)).lower()} ({errno.errorcode.get(code, code)})"
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def _durable(e: BaseException) -> bool:
    """DuckDB says the commit is durable and only the automatic checkpoint after it failed
    (the instance is invalidated all the same)."""
    return "COMMIT succeeded and is durable" in str(e)


def _invalidating(e: BaseException) -> bool:
    """After ``e``, DuckDB's instance refuses every statement: it must be reopened."""
    return isinstance(e, duckdb.FatalException) or "database has been invalidated" in str(e)


def _say_stderr(msg: str) -> None:
    print(f"warning: {msg}", file=sys.stderr, flush=True)


def _fsync(path: str, flags: int = os.O_RDONLY) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _is_new(path: str) -> bool:
    """``path`` names a file database not created yet: missing, or an empty regular file
    (what a creation that failed before atomic creation left)."""
    if path.startswith(":memory:") or not path:
        return False
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False  # DuckDB's own error says why
    return st.st_size == 0 and os.path.isfile(path) and not os.path.exists(path + ".wal")


def create_database(path: str) -> None:
    """Create the database file ``path`` with the schema (at
    :data:`~ckptwatch.sinks.migrations.SCHEMA_VERSION`), atomically: built and
    checkpointed in a temporary file of the same directory (``0600``), fsynced, then linked
    into place (a database another process made meanwhile wins; an empty file is
    replaced). On failure nothing is left behind. Raises :class:`StoreError` (:class:`DiskFull`
    for a full disk), one line naming the cause."""
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{secrets.token_hex(6)}.tmp")
    try:
        with private_files.private_umask():
            con = duckdb.connect(tmp)
            try:
                con.execute(_DDL)
                migrations.create_current(con)
                con.execute("CHECKPOINT")
            finally:
                con.close()
        if os.path.exists(tmp + ".wal"):  # not all of it reached the file
            raise StoreError("the new database was not checkpointed")
        _fsync(tmp)
        try:
            os.link(tmp, path)  # never over a database made meanwhile
        except FileExistsError:
            if _is_new(path):
                os.replace(tmp, path)  # an empty leftover
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
                raise
            if _is_new(path):  # no hard links here (some network and FUSE file systems)
                os.replace(tmp, path)
        _fsync(directory)
    except (duckdb.Error, OSError) as e:
        kind = DiskFull if no_space(e) is not None else StoreError
        cause = _cause(e).replace(tmp, path)  # the temporary file is ours, not the user's to know
        raise kind(f"cannot create the database: {cause}; nothing was left behind") from None
    finally:
        for p in (tmp, tmp + ".wal"):
            with contextlib.suppress(OSError):
                _unlink(p)


class _Rows:
    """The rows of a statement run in a transaction of its own, fetched before its commit
    (``fetchone`` / ``fetchall``, like DuckDB's connection after ``execute``)."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.description = con.description
        try:
            self._rows = con.fetchall() if con.description else []
        except duckdb.Error:
            self._rows = []
        self._next = 0

    def fetchall(self) -> list[tuple[Any, ...]]:
        rows, self._next = self._rows[self._next:], len(self._rows)
        return rows

    def fetchone(self) -> tuple[Any, ...] | None:
        if self._next >= len(self._rows):
            return None
        self._next += 1
        return self._rows[self._next - 1]


class Connection:
    """``Store.con``: DuckDB's connection, with every write made safe on a full disk (see
    the module docstring). ``execute`` and ``executemany`` go through the store; everything
    else (``sql``, ``close``, ...) is DuckDB's own, on the current connection."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def execute(self, query: str, parameters: Any = None) -> Any:
        if parameters is None:
            return self._store._run(lambda raw: raw.execute(query), _writes(query))
        return self._store._run(lambda raw: raw.execute(query, parameters), _writes(query))

    def executemany(self, query: str, parameters: Any) -> Any:
        return self._store._run(lambda raw: raw.executemany(query, parameters), _writes(query))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store.raw, name)


def _writes(query: str) -> bool:
    words = query.lstrip().split(None, 1)
    return bool(words) and words[0].upper() in _WRITES


_EVIDENCE_SCHEMA = {"incident_id": pl.Utf8, "seq": pl.Int32, "source_id": pl.Utf8, "offset": pl.Int64,
                    "role": pl.Utf8, "ts": pl.Datetime("us", "UTC"), "kind": pl.Utf8, "rank": pl.Int32,
                    "host": pl.Utf8, "rule_id": pl.Utf8, "line": pl.Utf8, "ts_source": pl.Utf8}


class Store:
    """A DuckDB database file (``":memory:"`` works too), created atomically when missing.
    Raises duckdb.Error when the file cannot be opened (e.g. locked by another process),
    :class:`StoreError` when it cannot be created.

    ``say``: one-line messages for the operator (waiting for disk space; default: standard
    error); ``wait_for_space``: on a full disk, wait and retry (default) rather than raise
    :class:`DiskFull` (see the module docstring)."""

    def __init__(self, path: str, *, say: Callable[[str], None] | None = None, wait_for_space: bool = True) -> None:
        self.path = path
        self.say = say or _say_stderr
        self.wait_for_space = wait_for_space
        self._depth = 0  # nesting of transaction()
        # source_id -> (file, offset, job, head hash) as last committed: unchanged sources are not rewritten
        self._sources_written: dict[str, tuple[Any, ...]] = {}
        self._journal: list[Callable[[duckdb.DuckDBPyConnection], Any]] | None = None  # the open transaction's
        self._invalid = False  # DuckDB invalidated its instance (a failed checkpoint): reopen before use
        #: the machine this process reads files on (``sources.host`` of the files it tails)
        self.host = socket.gethostname()
        #: transactions committed since the store opened (what read snapshots follow)
        self.commits = 0
        #: the read snapshot publisher, once :meth:`publish_snapshots` started it
        self.snapshots: SnapshotPublisher | None = None
        self._snapshot_cursor: duckdb.DuckDBPyConnection | None = None
        if _is_new(path):
            create_database(path)
        self.raw = self._connect()
        self.con = Connection(self)
        try:
            found = migrations.check_not_newer(self.con, path)
            self._check_ours()
        except (migrations.SchemaTooNew, StoreError):
            self.raw.close()
            raise
        self.con.execute(_DDL)  # a database from before versions were recorded gains the newer columns
        self._drop_events_key()
        self.migrated = migrations.upgrade(self, found)  # the versions this open applied
        self._private()
        self._offsets: StoredOffsets | None = None  # loaded at the first insert

    def _check_ours(self) -> None:
        """Raises :class:`StoreError` when the file holds tables and none of ours: another
        application's database, not to be written into."""
        tables = {t for (t,) in self.con.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = "
                                                 "current_database() AND schema_name = 'main'").fetchall()}
        if tables and not tables & {"events", "incidents", "sources"}:
            shown = ", ".join(sorted(tables)[:3]) + (", ..." if len(tables) > 3 else "")
            raise StoreError(f"database {self.path}: a DuckDB database, but not a ckptwatch one (tables {shown}): "
                             "give run/sink a new file or one they wrote")

    def publish_snapshots(self, every: float = DEFAULT_EVERY) -> SnapshotPublisher | None:
        """Publish read snapshots of this database every ``every`` seconds while it is
        written (:mod:`ckptwatch.sinks.snapshot`; the last one at :meth:`close`). None for an
        in-memory database."""
        if self.path.startswith(":memory:") or not self.path or self.snapshots is not None:
            return self.snapshots
        self._snapshot_cursor = self.raw.cursor()
        self.snapshots = SnapshotPublisher(self.path, lambda: self._snapshot_cursor,  # type: ignore[arg-type,return-value]
                                           lambda: self.commits, every=every, say=self.say).start()
        return self.snapshots

    def _connect(self) -> duckdb.DuckDBPyConnection:
        """DuckDB's connection to the file. A lock held by another process is waited for
        up to :data:`LOCK_WAIT` seconds: a reader of the history that opened the file at rest
        holds it for one query (:mod:`ckptwatch.history.read`); a writer holds it for good,
        and the error says so after the wait."""
        deadline = time.monotonic() + LOCK_WAIT
        while True:
            try:
                with private_files.private_umask():  # the file and its first WAL are created 0600
                    return duckdb.connect(self.path, config={"memory_limit": STORE_MEMORY_LIMIT})
            except duckdb.IOException as e:
                if "lock" not in str(e).lower() or time.monotonic() >= deadline:
                    raise
                time.sleep(0.1)

    def _drop_events_key(self) -> None:
        """A database made before the events table lost its primary key: the table copied
        into one without it (once; its index would be loaded into memory whole)."""
        keyed = self.con.execute("SELECT count(*) FROM duckdb_constraints() WHERE table_name = 'events' "
                                 "AND constraint_type = 'PRIMARY KEY'").fetchall()
        if not keyed[0][0]:
            return
        ddl = _DDL.split(";")[0].replace("CREATE TABLE IF NOT EXISTS events", "CREATE TABLE events_unkeyed")
        with self.transaction():
            self.con.execute(ddl)
            self.con.execute(f"INSERT INTO events_unkeyed ({_EVENT_COLS}) SELECT {_EVENT_COLS} FROM events")
            self.con.execute("DROP TABLE events")
            self.con.execute("ALTER TABLE events_unkeyed RENAME TO events")

    def _private(self) -> None:
        """The database file and its WAL (re-created after each checkpoint) made ``0600``."""
        if not self.path.startswith(":memory:"):
            for p in (self.path, self.path + ".wal"):
                private_files.tighten(p)

    def close(self) -> None:
        """Close the connection. DuckDB checkpoints on close; on a full disk that fails
        harmlessly (what was committed is in the WAL, replayed at the next open). The read
        snapshot, when published, is published one last time first."""
        if self.snapshots is not None:
            self.snapshots.close()
        try:
            self.raw.close()
        except duckdb.Error as e:
            if no_space(e) is None and not _invalidating(e):
                raise
            self.say(f"database {self.path}: not checkpointed on close ({_cause(e)}); "
                     "nothing is lost: the next start replays its WAL")

    def commit_batch(self, events: pl.DataFrame, offsets: Iterable[SourceRow], *,
                     unfollowed: Iterable[str] = ()) -> int:
        """Insert events (EVENT_SCHEMA) and the sources' committed offsets
        ``(source_id, file, offset, job[, head_hash])`` in one transaction; the sources
        ``unfollowed`` (ids tailing forgot) are kept as history but no longer resumed.
        Returns the number of new events."""
        now = dt.datetime.now(dt.timezone.utc)
        # only the sources whose offset, job or file changed (10,000 idle files cost nothing)
        rows = [(sid, f, off, job, now, rest[0] if rest else None) for sid, f, off, job, *rest in offsets
                if self._sources_written.get(sid) != (f, off, job, rest[0] if rest else None)]
        gone = [(now, sid) for sid in unfollowed]
        with self.transaction():
            offsets_known = self._stored_offsets()
            offsets_known.unstored(sid for sid, *_ in rows if sid not in offsets_known.floors)  # first commit
            new = self._insert_events(events)
            if rows:
                self._replace_sources(rows)
            if gone:
                self.con.executemany("UPDATE sources SET followed = FALSE, updated_ts = ? WHERE source_id = ?", gone)
            offsets_known.stored(new, {sid: off for sid, _, off, *_ in rows})
        self._sources_written.update({sid: (f, off, job, head) for sid, f, off, job, _, head in rows})
        for _, sid in gone:
            self._sources_written.pop(sid, None)
        return new.height

    def committed_offsets(self) -> dict[str, tuple[int, str | None]]:
        """``source_id`` -> (offset from which tailing resumes, job learned so far)."""
        rows = self.con.execute("SELECT source_id, committed_offset, job FROM sources").fetchall()
        return {sid: (off, job) for sid, off, job in rows}

    def sources(self) -> list[tuple[str, str, int, str | None, str | None]]:
        """The sources tailing still follows (where a restart resumes):
        ``(source_id, file, committed_offset, job, head_hash)``."""
        return self.con.execute("SELECT source_id, file, committed_offset, job, head_hash FROM sources "
                                "WHERE followed IS NOT FALSE").fetchall()

    def events(self) -> pl.DataFrame:
        """All stored events (EVENT_SCHEMA), in ``(ts, source_id, offset)`` order. The whole
        table in memory: DuckDB's memory limit is lifted while it is read."""
        with self._memory_limit(None):
            df = self.con.sql(f'SELECT {_EVENT_COLS} FROM events ORDER BY ts, source_id, "offset"').pl()
        return df.with_columns(pl.col("attrs").cast(pl.Utf8)).cast(EVENT_SCHEMA)  # type: ignore[arg-type]

    def events_to_replay(self, unlabelled: str = "unknown", roots: Sequence[str] | None = None) -> pl.DataFrame:
        """The stored events a restarted detector needs (EVENT_SCHEMA, in ``(ts, source_id,
        offset)`` order): those of jobs not released, and of released jobs newer than their
        tombstone. Its size follows the live jobs, not the age of the database.

        ``unlabelled``: the job the detector gives the events that name none (the name its
        tombstone has). ``roots``: the directories (or files) the run reads; events that name
        no job are replayed only from the files under them, so a run over another directory
        never takes in an earlier run's job-less lines (issue 36: they were judged again as
        part of the new run's job). None: every file's."""
        # a join with the (small) released_jobs as build side streams the events (a NOT EXISTS
        # subquery held every row: 400 MB at 1 M stored events), and a memory limit keeps
        # DuckDB's buffer pool from caching the whole table as it scans it
        try:
            with self._memory_limit(REPLAY_MEMORY_LIMIT):
                df = self._replay_query(unlabelled, roots)
        except duckdb.OutOfMemoryException:  # more live events than the limit sorts: read them unbounded
            with self._memory_limit(None):
                df = self._replay_query(unlabelled, roots)
        return df.with_columns(pl.col("attrs").cast(pl.Utf8)).cast(EVENT_SCHEMA)  # type: ignore[arg-type]

    @contextlib.contextmanager
    def _memory_limit(self, limit: str | None) -> Iterator[None]:
        """DuckDB's memory limit ``limit`` (None: its default, 80 % of RAM) for a read, then
        :data:`STORE_MEMORY_LIMIT` again."""
        self.con.execute(f"SET memory_limit = '{limit}'" if limit else "RESET memory_limit")
        try:
            yield
        finally:
            self.con.execute(f"SET memory_limit = '{STORE_MEMORY_LIMIT}'")

    def _replay_query(self, unlabelled: str, roots: Sequence[str] | None) -> pl.DataFrame:
        where, params = "", [unlabelled]
        if roots is not None:
            under = " OR ".join("s.file = ? OR starts_with(s.file, ?)" for _ in roots)
            params += [x for root in roots for x in (root, root.rstrip(os.sep) + os.sep)]
            # a job-less event of a file no longer in the sources table (forgotten) is not replayed either
            where = (f"AND (e.job IS NOT NULL OR e.source_id IN (SELECT s.source_id FROM sources s WHERE {under})) "
                     if roots else "AND e.job IS NOT NULL ")
        return self.con.sql(
            f"SELECT {', '.join('e.' + c for c in _EVENT_COLS.split(', '))} FROM events e "
            "LEFT JOIN released_jobs r ON r.job = coalesce(e.job, ?) "
            f'WHERE (r.job IS NULL OR e.ts > r.max_ts) {where}ORDER BY e.ts, e.source_id, e."offset"',
            params=params).pl()

    def save_released(self, released: Iterable[tuple[str, dt.datetime]], registry: dict) -> None:
        """Record released jobs ``(job, newest event time)`` and the registry snapshot, in one
        transaction."""
        now = dt.datetime.now(dt.timezone.utc)
        with self.transaction():
            rows = [(job, ts, now) for job, ts in released]
            if rows:
                self.con.executemany("INSERT OR REPLACE INTO released_jobs VALUES (?, ?, ?)", rows)
            self.con.execute("INSERT OR REPLACE INTO detector_state VALUES ('registry', ?, ?)",
                             [json.dumps(registry), now])

    def released(self) -> tuple[list[tuple[str, dt.datetime, dt.datetime]], dict | None]:
        """(released jobs ``(job, max_ts, released_ts)``, the registry snapshot or None)."""
        jobs = self.con.execute("SELECT job, max_ts, released_ts FROM released_jobs").fetchall()
        rows = self.con.execute("SELECT doc FROM detector_state WHERE name = 'registry'").fetchall()
        return jobs, json.loads(rows[0][0]) if rows else None

    def delete_events_before(self, before: dt.datetime, *, quiet_jobs: bool = False) -> int:
        """Retention: delete events older than ``before`` (UTC) of released jobs and of no job
        (host lines); a live job keeps all its events (a restart replays them). With
        ``quiet_jobs`` (the fleet sink, whose detectors release jobs in their own state), a
        job with no event since ``before`` counts as released. Incidents keep their evidence
        lines. Returns how many went."""
        ended = "SELECT job FROM released_jobs"
        params: list[Any] = [before]
        if quiet_jobs:
            ended += " UNION SELECT job FROM events WHERE job IS NOT NULL GROUP BY job HAVING max(ts) < ?"
            params.append(before)
        with self.transaction():
            n = self.con.execute(f"DELETE FROM events WHERE ts < ? AND (job IS NULL OR job IN ({ended}))",
                                 params).fetchall()
        return int(n[0][0]) if n else 0

    def upsert_incidents(self, incidents: Iterable[Incident]) -> int:
        """Insert or update incidents and replace their evidence rows; returns how many."""
        now = dt.datetime.now(dt.timezone.utc)
        with self.transaction():
            n = self._upsert(incidents, now)
        return n

    def incident_statuses(self, ids: Iterable[str]) -> dict[str, str]:
        """incident id -> status (``open``, ``resolved``, ``superseded``) of those stored."""
        rows = self.con.execute("SELECT id, status FROM incidents WHERE list_contains(?, id)", [list(ids)])
        return dict(rows.fetchall())

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """One DuckDB transaction; nested uses join the outer one (e.g. the incidents and
        the alerts queued for them commit together). On a full disk it waits for space and
        is tried again from its first statement (see the module docstring)."""
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        self._begin()
        self._journal = []
        self._depth = 1
        try:
            try:
                yield
            except BaseException:
                self._rollback()
                self._offsets = None  # it may hold pairs not stored: read again from the tables
                raise
            finally:
                self._depth = 0
            try:
                self._commit()
            except BaseException:  # a stop while waiting for space: no transaction left open
                self._rollback()
                self._offsets = None
                raise
        finally:
            self._journal = None
        self.commits += 1
        self._private()

    # -- writes that survive a full disk -------------------------------------------------

    def _run(self, op: Callable[[duckdb.DuckDBPyConnection], Any], writes: bool) -> Any:
        """``op(connection)``: in the open transaction (kept for a retry), or as a
        transaction of its own when it ``writes`` (its rows fetched before the commit)."""
        if self._journal is not None:
            result = self._attempt(op)
            if writes:  # what a retry replays (reads change nothing)
                self._journal.append(op)
            return result
        if not writes:
            self._ready()
            try:
                return op(self.raw)
            except duckdb.Error as e:
                if _invalidating(e):  # e.g. a CHECKPOINT that found no space
                    self._invalid = True
                raise
        rows: list[_Rows] = []

        def fetched(raw: duckdb.DuckDBPyConnection) -> Any:
            rows[:] = [_Rows(op(raw))]  # a retry's rows are the ones that count
            return raw

        with self.transaction():
            self._run(fetched, True)
        return rows[0]

    def _attempt(self, op: Callable[[duckdb.DuckDBPyConnection], Any]) -> Any:
        """``op`` in the open transaction; when it fails for lack of space, the transaction
        is started again once there is space (its statements so far replayed) and ``op``
        tried again."""
        try:
            return op(self.raw)
        except duckdb.Error as e:
            if no_space(e) is None:
                raise
            return self._wait_for_space(e, lambda: self._replay(op))

    def _begin(self) -> None:
        def begin() -> None:
            self._ready()
            self.raw.execute("BEGIN")
        try:
            begin()
        except duckdb.Error as e:
            if no_space(e) is None:
                raise
            self._wait_for_space(e, begin)  # e.g. reopening after an invalidating checkpoint

    def _commit(self) -> None:
        try:
            self.raw.execute("COMMIT")
            return
        except duckdb.Error as e:
            if no_space(e) is None:
                self._rollback()
                raise
            if _durable(e):  # committed; only the checkpoint after it failed, and DuckDB must be reopened
                self._invalid = True
                return
            self._wait_for_space(e, lambda: self._replay(None, commit=True))

    def _replay(self, op: Callable[[duckdb.DuckDBPyConnection], Any] | None, *, commit: bool = False) -> Any:
        """Begin the open transaction again, replay its statements, then ``op`` (its result
        returned) or the commit."""
        self._ready()
        self.raw.execute("BEGIN")
        for done in self._journal or ():
            done(self.raw)
        if op is not None:
            return op(self.raw)
        if commit:
            try:
                self.raw.execute("COMMIT")
            except duckdb.Error as e:
                if _durable(e):
                    self._invalid = True
                    return None
                raise
        return None

    def _wait_for_space(self, first: duckdb.Error, attempt: Callable[[], Any]) -> Any:
        """After ``first`` (no space): roll back what DuckDB left of the transaction, then
        ``attempt()`` every few seconds until it no longer fails for lack of space; its
        result. Raises :class:`DiskFull` when the store may not wait (see the module
        docstring); a KeyboardInterrupt (Ctrl-C, SIGTERM in the CLI) ends the wait."""
        self._after_failure(first)
        if not self._may_wait():
            raise DiskFull(f"database {self.path}: {_cause(first)}: nothing was written "
                           "(what was read is read again at the next start)") from None
        started = time.monotonic()
        self.say(f"database {self.path}: {_cause(first)}: waiting for space to write, retrying every "
                 f"{RETRY_MAX:g} s; nothing read is lost (a stop now resumes from what was stored)")
        said, delay = started, RETRY_FIRST
        while True:
            time.sleep(delay)
            delay = min(RETRY_MAX, delay * 2)
            try:
                result = attempt()
            except duckdb.Error as e:
                if no_space(e) is None:
                    self._rollback()
                    raise
                self._after_failure(e)
                if time.monotonic() - said >= SAY_EVERY:
                    said = time.monotonic()
                    self.say(f"database {self.path}: still {_cause(e)} after {said - started:.0f} s; waiting")
                continue
            self.say(f"database {self.path}: written after waiting {time.monotonic() - started:.0f} s for space")
            return result

    def _after_failure(self, e: duckdb.Error) -> None:
        """Leave no transaction open after ``e``; mark DuckDB's instance for reopening when
        ``e`` invalidated it."""
        if _invalidating(e):
            self._invalid = True
        else:
            self._rollback()

    def _may_wait(self) -> bool:
        """Waiting is allowed, and someone can stop it (SIGTERM is not ignored)."""
        if not self.wait_for_space:
            return False
        try:
            return signal.getsignal(signal.SIGTERM) != signal.SIG_IGN
        except ValueError:
            return True

    def _rollback(self) -> None:
        """Roll back the transaction DuckDB has open, if any (after a failed commit it has none)."""
        if self._invalid:
            return
        with contextlib.suppress(duckdb.Error):
            self.raw.execute("ROLLBACK")

    def _ready(self) -> None:
        """Reopen the database when DuckDB invalidated its instance (what was committed is in
        its WAL, replayed on open). Raises duckdb.Error (e.g. still no space to open it)."""
        if not self._invalid:
            return
        with self.snapshots.copying() if self.snapshots else contextlib.nullcontext():  # not under a copy
            with contextlib.suppress(duckdb.Error):
                self.raw.close()
            self.raw = self._connect()
            if self.snapshots is not None:
                self._snapshot_cursor = self.raw.cursor()
        self._invalid = False
        self._private()

    def _replace_sources(self, rows: list[tuple[Any, ...]]) -> None:
        """``INSERT OR REPLACE`` the sources ``(source_id, file, offset, job, updated_ts,
        head_hash)``, followed."""
        self._insert_rows("INSERT OR REPLACE INTO sources (source_id, file, committed_offset, job, updated_ts, "
                          f"head_hash, followed, host) SELECT *, TRUE, '{_sql_text(self.host)}' FROM arrow", rows, {
                              "source_id": pl.Utf8, "file": pl.Utf8, "committed_offset": pl.Int64, "job": pl.Utf8,
                              "updated_ts": pl.Datetime("us", "UTC"), "head_hash": pl.Utf8})

    def _insert_rows(self, statement: str, rows: list[tuple[Any, ...]], schema: dict[str, Any]) -> None:
        """Run ``statement`` (``… SELECT … FROM arrow``) over ``rows`` as one Arrow scan:
        DuckDB's ``executemany`` costs ~5 ms a row."""
        batch = pl.DataFrame(rows, orient="row", schema=schema).to_arrow()

        def insert(raw: duckdb.DuckDBPyConnection) -> Any:  # a closure: replayable after a full disk
            arrow = batch  # noqa: F841 (read by DuckDB's replacement scan, from this frame)
            return raw.execute(statement)

        self._run(insert, True)

    def _insert_events(self, events: pl.DataFrame, unfloored: Iterable[str] = ()) -> pl.DataFrame:
        """Insert the events (EVENT_SCHEMA) whose ``(source_id, offset)`` is not stored yet
        (each once); returns those. ``unfloored``: sources some of whose events came without
        a floor (checked against the table). The caller tells :meth:`StoredOffsets.stored`
        in the same transaction."""
        if events.is_empty():
            return events
        new = self._stored_offsets().new_events(events.select(list(EVENT_SCHEMA)), self._stored_pairs,
                                                unfloored=unfloored)
        if new.is_empty():
            return new
        batch = new.to_arrow()

        def insert(raw: duckdb.DuckDBPyConnection) -> Any:  # a closure: replayable after a full disk
            arrow = batch  # noqa: F841 (read by DuckDB's replacement scan, from this frame)
            return raw.execute(f"INSERT INTO events ({_EVENT_COLS}) SELECT {_EVENT_COLS} FROM arrow")

        self._run(insert, True)
        return new

    def _stored_pairs(self, pairs: pl.DataFrame) -> pl.DataFrame:
        """Of ``pairs`` (PAIR_SCHEMA), those the events table holds: for sources with no
        known floor (one scan of the table)."""
        return self._pairs_joined('SELECT DISTINCT e.source_id, e."offset" FROM events e '
                                  'JOIN arrow a ON e.source_id = a.source_id AND e."offset" = a."offset"',
                                  pairs.to_arrow())

    def _pairs_joined(self, sql: str, table: Any) -> pl.DataFrame:
        """The ``(source_id, offset)`` rows (PAIR_SCHEMA) of ``sql``, a read in which ``arrow``
        is the Arrow ``table`` (DuckDB's replacement scan)."""
        def query(raw: duckdb.DuckDBPyConnection) -> Any:
            arrow = table  # noqa: F841 (read by DuckDB's replacement scan, from this frame)
            return raw.sql(sql).to_arrow_table()

        return _pairs_of(self._run(query, False))

    def _stored_offsets(self) -> StoredOffsets:
        """What dedups inserts: the floors of the sources (their committed offsets; in fleet
        mode what the collectors sent) and the stored pairs at or past them, read from the
        tables when first needed or after a rollback."""
        if self._offsets is None:
            floors = dict(self.con.execute("SELECT source_id, committed_offset FROM sources "
                                           "WHERE committed_offset IS NOT NULL").fetchall())
            floors.update(self.con.execute("SELECT source_id, floor FROM source_floors").fetchall())
            table = pl.DataFrame({"source_id": list(floors), "floor": list(floors.values())},
                                 schema={"source_id": pl.Utf8, "floor": pl.Int64}).to_arrow()
            held = (self._pairs_joined('SELECT e.source_id, e."offset" FROM events e JOIN arrow f '
                                       'ON e.source_id = f.source_id AND e."offset" >= f.floor', table)
                    if floors else pl.DataFrame(schema=PAIR_SCHEMA))
            self._offsets = StoredOffsets(floors, held)
        return self._offsets

    def _upsert(self, incidents: Iterable[Incident], now: dt.datetime) -> int:
        n = 0
        for inc in incidents:
            rc = inc.root_cause
            lg = inc.last_good_checkpoint or {}
            self.con.execute(
                """INSERT INTO incidents (id, kind, severity, status, job, step, checkpoint_path, root_cause_class,
                   root_rank, root_host, root_pid, root_ts, root_line, root_cause, collateral, checkpoint_state,
                   last_good_step, last_good_path, remediation, first_ts, detected_ts, updated_ts, provisional,
                   commands)
                   VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)
                   ON CONFLICT (id) DO UPDATE SET kind=excluded.kind, severity=excluded.severity,
                   status=excluded.status, job=excluded.job, step=excluded.step,
                   checkpoint_path=excluded.checkpoint_path, root_cause_class=excluded.root_cause_class,
                   root_rank=excluded.root_rank, root_host=excluded.root_host, root_pid=excluded.root_pid,
                   root_ts=excluded.root_ts, root_line=excluded.root_line, root_cause=excluded.root_cause,
                   collateral=excluded.collateral, checkpoint_state=excluded.checkpoint_state,
                   last_good_step=excluded.last_good_step, last_good_path=excluded.last_good_path,
                   remediation=excluded.remediation, first_ts=excluded.first_ts,
                   updated_ts=excluded.updated_ts, provisional=excluded.provisional, commands=excluded.commands""",
                [inc.id, inc.kind, inc.severity, inc.status, inc.job, inc.step, inc.checkpoint_path,
                 rc.cls if rc else None, rc.rank if rc else None, rc.host if rc else None,
                 rc.pid if rc else None, rc.ts if rc else None, rc.line if rc else None,
                 json.dumps(rc.to_dict()) if rc else None, inc.collateral,
                 json.dumps(inc.checkpoint_state), lg.get("step"), lg.get("path"), inc.remediation,
                 inc.first_ts, inc.detected_ts or now, now, inc.provisional, json.dumps(inc.commands)],
            )
            self.con.execute("DELETE FROM incident_evidence WHERE incident_id = ?", [inc.id])
            rows = [(inc.id, i, e.source_id, e.offset, e.role, e.ts, e.kind, e.rank, e.host, e.rule_id, e.line,
                     e.ts_source) for i, e in enumerate(inc.evidence)]
            if rows:
                self._insert_rows("INSERT INTO incident_evidence SELECT * FROM arrow", rows, _EVIDENCE_SCHEMA)
            n += 1
        return n

    def open_incidents(self) -> list[Incident]:
        """The stored incidents whose status is ``open``, as last upserted (evidence
        included): what a detector rebuilt on start adopts
        (:meth:`~ckptwatch.detectors.Detector.adopt`), so that late lines can still withdraw
        or resolve them."""
        evidence: dict[str, list[EvidenceItem]] = {}
        for iid, *item in self.con.execute(
                'SELECT e.incident_id, e.source_id, e."offset", e.ts, e.kind, e.rank, e.host, e.rule_id, e.line, e.role, '
                "coalesce(e.ts_source, 'line') "
                "FROM incident_evidence e JOIN incidents i ON i.id = e.incident_id WHERE i.status = 'open' "
                "ORDER BY e.incident_id, e.seq").fetchall():
            evidence.setdefault(iid, []).append(EvidenceItem(*item))
        out = []
        for (iid, kind, severity, status, job, step, path, rc, collateral, cs, lg_step, lg_path, remediation,
             first_ts, detected_ts, provisional, cmds) in self.con.execute(
                "SELECT id, kind, severity, status, job, step, checkpoint_path, root_cause, collateral, "
                "checkpoint_state, last_good_step, last_good_path, remediation, first_ts, detected_ts, provisional, "
                "commands "
                "FROM incidents WHERE status = 'open' ORDER BY id").fetchall():
            inc = Incident.from_dict({
                "id": iid, "kind": kind, "severity": severity, "status": status, "job": job, "step": step,
                "checkpoint_path": path, "root_cause": json.loads(rc) if rc else None, "collateral": collateral or [],
                "checkpoint_state": json.loads(cs) if cs else {},
                "last_good_checkpoint": {"step": lg_step, "path": lg_path} if lg_step is not None else None,
                "remediation": remediation, "first_ts": first_ts.isoformat(),
                "detected_ts": detected_ts.isoformat() if detected_ts else None, "provisional": bool(provisional),
                "commands": json.loads(cmds) if cmds else []})
            inc.evidence = evidence.get(iid, [])
            out.append(inc)
        return out

    def kafka_offsets(self) -> dict[tuple[str, int], int]:
        """``(topic, partition)`` -> next offset to read, as stored with the data it covers."""
        rows = self.con.execute('SELECT topic, "partition", next_offset FROM kafka_offsets').fetchall()
        return {(t, p): o for t, p, o in rows}

    def commit_kafka_batch(self, events: pl.DataFrame, incidents: Iterable[Incident],
                           offsets: Mapping[tuple[str, int], int],
                           floors: Mapping[str, int] | None = None,
                           unfloored: Iterable[str] = (),
                           files: Mapping[str, tuple[str, str | None]] | None = None,
                           collectors: Mapping[str, str] | None = None) -> tuple[int, int]:
        """Events, incidents and the Kafka offsets ``(topic, partition) -> next offset`` they
        were read up to, in one transaction: the database says itself how far it is, so a
        new database file re-reads the topics from their start and a crash re-reads only
        what was not committed here. ``floors``: ``source_id`` -> the floor the events'
        messages carried; ``unfloored``: sources with events in a message that carried none
        (:mod:`ckptwatch.sinks.stored_offsets`); ``files``: ``source_id`` -> ``(path, host)``
        where the collector read it (recorded in ``sources``, first, so the incidents'
        evidence in the same batch names its file); ``collectors``: ``source_id`` -> the
        collector that published it, kept for a source that has none yet (a source named in
        ``files``). Returns (new events, incidents written)."""
        now = dt.datetime.now(dt.timezone.utc)
        floors = dict(floors or {})
        named = [(sid, path, host, now) for sid, (path, host) in (files or {}).items()
                 if self._sources_written.get(sid) != (path, host)]
        with self.transaction():
            if named:
                self._insert_rows(
                    "INSERT INTO sources (source_id, file, host, updated_ts, followed) SELECT *, FALSE FROM arrow "
                    "ON CONFLICT (source_id) DO UPDATE SET file = excluded.file, host = excluded.host, "
                    "updated_ts = excluded.updated_ts", named,
                    {"source_id": pl.Utf8, "file": pl.Utf8, "host": pl.Utf8, "updated_ts": pl.Datetime("us", "UTC")})
            self._stored_offsets().expect(floors)
            new = self._insert_events(events, unfloored)
            n = self._upsert(incidents, now)
            rows = [(t, p, o, now) for (t, p), o in offsets.items()]
            if rows:
                self.con.executemany("INSERT OR REPLACE INTO kafka_offsets VALUES (?, ?, ?, ?)", rows)
            if floors:
                self._insert_rows("INSERT OR REPLACE INTO source_floors SELECT * FROM arrow",
                                  [(sid, f, now) for sid, f in floors.items()],
                                  {"source_id": pl.Utf8, "floor": pl.Int64, "updated_ts": pl.Datetime("us", "UTC")})
            if collectors:  # the first collector that published each source keeps it
                self._insert_rows(
                    "UPDATE sources SET collector = arrow.collector FROM arrow "
                    "WHERE sources.source_id = arrow.source_id AND sources.collector IS NULL",
                    list(collectors.items()), {"source_id": pl.Utf8, "collector": pl.Utf8})
            self._stored_offsets().stored(new, floors)
        self._sources_written.update((sid, (path, host)) for sid, path, host, _ in named)
        return new.height, n

    def collectors_of(self, source_ids: Iterable[str]) -> dict[str, str]:
        """The collector (``host:offsets file``) recorded as the first to publish each of
        ``source_ids`` (fleet sink; see :mod:`ckptwatch.sinks.shared_sources`); sources
        without one are left out."""
        ids = list(source_ids)
        if not ids:
            return {}
        return dict(self.con.execute("SELECT source_id, collector FROM sources WHERE collector IS NOT NULL "
                                     "AND list_contains(?, source_id)", [ids]).fetchall())


def _sql_text(text: str) -> str:
    """``text`` quoted for a SQL string literal (its single quotes doubled)."""
    return text.replace("'", "''")


def _pairs_of(table: Any) -> pl.DataFrame:
    """An Arrow table of ``(source_id, offset)`` as a PAIR_SCHEMA frame."""
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    return frame.cast(PAIR_SCHEMA)  # type: ignore[arg-type]


def read_incidents(path: str | Path, *, superseded: bool = False) -> list[dict[str, Any]]:
    """The incidents stored in the database file at ``path`` (opened read-only: the writer
    must have stopped), in the shape of ``diagnose --json``'s for what they share: ``id``,
    ``kind``, ``status``, ``job``, ``step``, ``root_cause`` (``class`` and ``rank``) and
    ``detected_ts`` (UTC). Superseded ones only with ``superseded``."""
    con = duckdb.connect(str(path), read_only=True)
    try:
        rows = con.execute("SELECT id, kind, status, job, step, root_cause_class, root_rank, detected_ts "
                           "FROM incidents" + ("" if superseded else " WHERE status <> 'superseded'")).fetchall()
    finally:
        con.close()
    return [{"id": i, "kind": k, "status": st, "job": j, "step": s, "root_cause": {"class": c, "rank": r},
             "detected_ts": d} for i, k, st, j, s, c, r, d in rows]
