"""Read snapshots: how the history is read while ``run`` or ``sink`` writes it.

DuckDB lets one process write a database file and no other process open it meanwhile, not
even read-only ("Conflicting lock is held"); copying the file gives an empty or stale
database, since what was written since the last checkpoint is in its ``.wal``. So the
writing process itself publishes a **read snapshot** next to the database
(:func:`snapshot_path`: ``incidents.duckdb`` -> ``incidents.snapshot.duckdb``): a complete
DuckDB file, built from one read transaction of the writer's database (DuckDB's MVCC: a
consistent state, while the writer goes on committing) in a temporary file of the same
directory and renamed over the previous one. Any reader (``ckptwatch incidents``, the
notebook, the ``duckdb`` CLI, pandas) opens it read-only and takes no lock the writer
needs; a reader that has it open keeps the version it opened (the rename replaces the
name, not the file).

Why a snapshot and not a server answering queries: every DuckDB client reads a file, with
no client of ours, and a snapshot outlives the writer (a crash leaves the last one).

**What it holds.** Every table of the database (incidents, evidence, alerts, sources,
released jobs, the schema version) and the view ``evidence``, whole, with one exception:
``events`` without its ``metric`` rows (loss and throughput lines, most of a fleet's
events: the snapshot stays a fraction of the database and quick to copy; the save, load,
exit and error events a timeline draws are all there). A table ``snapshot`` says when it
was taken (``taken_ts``, UTC), from which database, at which schema version, and how long
the copy took.

**How old it is** (the lag): a snapshot is taken ``every`` seconds (2 by default) after a
transaction was committed, and never sooner than ten times the previous copy's duration
after it (the copy runs in a thread of its own, with a cursor of its own: ingestion does
not wait for it, but it shares the machine). So a reader sees a state at most ``every``
seconds old plus the copy's duration, or, for a database whose copy takes more than a
fifth of ``every``, ten copies' durations. The last snapshot is taken when the store closes,
so at rest it is what the database holds.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

import duckdb

from ckptwatch import private_files

#: seconds between two snapshots of a database that keeps changing (the documented lag)
DEFAULT_EVERY = 2.0
#: a snapshot is never taken sooner than this many times the last copy's duration after it
COPY_SHARE = 10.0
#: events of these kinds are left out of a snapshot (see the module docstring)
LEFT_OUT_KINDS = ("metric",)


def snapshot_path(db_path: str) -> str:
    """Where the writer of ``db_path`` publishes its read snapshot: ``.snapshot`` before the
    file's suffix (``incidents.duckdb`` -> ``incidents.snapshot.duckdb``; ``x`` -> ``x.snapshot``)."""
    root, ext = os.path.splitext(db_path)
    return f"{root}.snapshot{ext}" if ext else f"{db_path}.snapshot"


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def copy_snapshot(cursor: duckdb.DuckDBPyConnection, out: str, *, source: str = "") -> float:
    """Write a snapshot of the database ``cursor`` is connected to into a new file at ``out``
    (which must not exist), from one read transaction: every table of its ``main`` schema
    (``events`` without :data:`LEFT_OUT_KINDS`), the ``evidence`` view when the database has
    one, and the table ``snapshot``. Returns the seconds it took. Raises duckdb.Error."""
    started = time.perf_counter()
    alias = "ckptwatch_snapshot"
    cursor.execute(f"ATTACH {_literal(out)} AS {alias}")
    try:
        cursor.execute("BEGIN TRANSACTION")
        try:
            db = cursor.execute("SELECT current_database()").fetchall()[0][0]
            tables = [t for (t,) in cursor.execute(
                "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() "
                "AND schema_name = 'main' ORDER BY table_name").fetchall()]
            views = {v: sql for v, sql in cursor.execute(
                "SELECT view_name, sql FROM duckdb_views() WHERE database_name = current_database() "
                "AND schema_name = 'main' AND NOT internal").fetchall()}
            for t in tables:
                where = ""
                if t == "events":
                    where = " WHERE kind IS NULL OR kind NOT IN (" + ", ".join(map(_literal, LEFT_OUT_KINDS)) + ")"
                cursor.execute(f"CREATE TABLE {alias}.{_quote(t)} AS SELECT * FROM {_quote(db)}.main.{_quote(t)}{where}")
            version = 1
            if "schema_version" in tables:
                version = cursor.execute(f"SELECT max(version) FROM {_quote(db)}.main.schema_version").fetchall()[0][0] or 1
            cursor.execute(f"CREATE TABLE {alias}.snapshot (taken_ts TIMESTAMPTZ, db VARCHAR, schema_version INTEGER, "
                           "copy_seconds DOUBLE)")
            cursor.execute(f"INSERT INTO {alias}.snapshot VALUES (?, ?, ?, ?)",
                           [dt.datetime.now(dt.timezone.utc), source, version, time.perf_counter() - started])
            cursor.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(duckdb.Error):
                cursor.execute("ROLLBACK")
            raise
        if views:  # a view binds its names in the catalog it is made in: made from inside the snapshot
            cursor.execute(f"USE {alias}")
            try:
                for sql in views.values():
                    cursor.execute(sql)
            finally:
                cursor.execute(f"USE {_quote(db)}")
    finally:
        with contextlib.suppress(duckdb.Error):
            cursor.execute(f"DETACH {alias}")
    return time.perf_counter() - started


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


class SnapshotPublisher:
    """Publishes read snapshots of a database that this process writes (see the module
    docstring), from a daemon thread.

    ``cursor``: returns a DuckDB cursor of the writer's database, made on the writer's
    thread (DuckDB's connections are not thread-safe; its cursors are); ``commits``: a
    counter the writer bumps at every commit (no commit since the last snapshot: none is
    taken); ``db_path``: the database file (the snapshot goes to :func:`snapshot_path` of
    it); ``every``: seconds (> 0); ``say``: one-line messages (a failed copy, once until one
    succeeds)."""

    def __init__(self, db_path: str, cursor: Callable[[], duckdb.DuckDBPyConnection], commits: Callable[[], int], *,
                 every: float = DEFAULT_EVERY, say: Callable[[str], None] | None = None) -> None:
        if every <= 0:
            raise ValueError("every must be > 0 seconds")
        self.db_path = db_path
        self.path = snapshot_path(db_path)
        self.every = every
        self._cursor = cursor
        self._commits = commits
        self._say = say or (lambda msg: None)
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one copy at a time (the thread's, or the last one at close)
        self._published_at = -1  # the commit count of the newest snapshot
        self._failing = False
        #: snapshots published, and the last copy's duration (seconds)
        self.published = 0
        self.last_copy_seconds = 0.0
        self._thread = threading.Thread(target=self._loop, name="ckptwatch-snapshot", daemon=True)

    def start(self) -> SnapshotPublisher:
        """Start the thread; the first snapshot is taken at once."""
        self._thread.start()
        return self

    def publish(self, *, force: bool = False) -> bool:
        """Take a snapshot now if anything was committed since the last one (any time with
        ``force``); True when one was published. Errors are said, not raised."""
        with self._lock:
            commits = self._commits()
            if commits == self._published_at and not force:
                return False
            tmp = os.path.join(os.path.dirname(os.path.abspath(self.path)),
                               f".{os.path.basename(self.path)}.{secrets.token_hex(6)}.tmp")
            try:
                with private_files.private_umask():  # raw log lines: as private as the database
                    self.last_copy_seconds = copy_snapshot(self._cursor(), tmp, source=os.path.abspath(self.db_path))
                os.replace(tmp, self.path)
            except (duckdb.Error, OSError) as e:
                if not self._failing:
                    self._say(f"read snapshot {self.path}: not published ({str(e).splitlines()[0]}); "
                              "readers see the previous one")
                self._failing = True
                return False
            finally:
                for p in (tmp, tmp + ".wal"):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(p)
            if self._failing:
                self._say(f"read snapshot {self.path}: published again")
            self._failing = False
            self._published_at = commits
            self.published += 1
            return True

    def copying(self) -> threading.Lock:
        """The lock a copy holds: the writer takes it to replace its connection (and the
        cursor) while no copy runs."""
        return self._lock

    def _loop(self) -> None:
        while True:
            self.publish()
            if self._stop.wait(max(self.every, COPY_SHARE * self.last_copy_seconds)):
                return

    def close(self) -> None:
        """Stop the thread and publish the last snapshot (what the database holds at rest).
        Call it before the writer's connection closes."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.publish()

    def __enter__(self) -> SnapshotPublisher:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()
