"""Opening the incident history for reading, whether a pipeline is writing it or not.

:func:`open_history` opens the database file read-only when no process holds it (a
database at rest: what it holds, to the last commit), and otherwise the read snapshot its
writer publishes (:mod:`ckptwatch.sinks.snapshot`: a consistent state a few seconds old).
Either way the connection is read-only, and it is meant to be held for one read (a
command, a notebook cell): a reader holding the database file itself would keep a writer
from starting (the writer waits :data:`~ckptwatch.sinks.duckdb_store.LOCK_WAIT` seconds for it).

Files of every schema version are read as they are (never migrated by a reader): queries
go through :func:`evidence_relation`, which gives evidence with its file whether the file
has the ``evidence`` view (version 2) or not (version 1).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
from collections.abc import Iterator
from dataclasses import dataclass

import duckdb

from ckptwatch.sinks.snapshot import snapshot_path


class HistoryError(Exception):
    """The history cannot be read; the message is one line naming the file and why."""


@dataclass(frozen=True)
class Opened:
    """What :func:`open_history` opened: ``path`` (the database or its snapshot), whether it
    is a writer's ``snapshot`` (then ``taken_ts``, UTC, when it was taken), and the
    ``database`` asked for."""

    database: str
    path: str
    snapshot: bool
    taken_ts: dt.datetime | None = None

    def describe(self, now: dt.datetime | None = None) -> str:
        """One line for a reader: ``database X at rest`` or ``read snapshot of X (a running
        pipeline writes it), taken 1.2 s ago``."""
        if not self.snapshot:
            return f"database {self.database} (at rest)"
        if self.taken_ts is None:
            return f"read snapshot {self.path} of {self.database}"
        age = ((now or dt.datetime.now(dt.timezone.utc)) - self.taken_ts).total_seconds()
        return (f"read snapshot of {self.database} (a running pipeline writes it), taken "
                f"{self.taken_ts:%H:%M:%S} UTC, {max(age, 0):.1f} s ago")


def _locked(e: duckdb.Error) -> bool:
    return "lock" in str(e).lower()


@contextlib.contextmanager
def open_history(database: str, *, snapshot_only: bool = False) -> Iterator[tuple[duckdb.DuckDBPyConnection, Opened]]:
    """A read-only connection to the history of ``database`` (a path given to ``run --db``
    or ``sink --db``), and what was opened; closed on exit. The database itself when no
    process writes it, else its read snapshot. A snapshot path may be given directly.
    ``snapshot_only``: the snapshot and never the database (the writing process itself
    reading its own history: the web console of ``run --ui``).

    Raises :class:`HistoryError`: no such database; written by a process that publishes no
    snapshot; not a DuckDB file."""
    snap = snapshot_path(database)
    if snapshot_only:
        if not os.path.exists(snap):
            raise HistoryError(f"{snap}: no read snapshot yet (the first is published within seconds of the start)")
        try:
            con = _attach(snap)
        except duckdb.Error as e:
            raise HistoryError(f"{snap}: cannot read the snapshot ({str(e).splitlines()[0]})") from None
        try:
            yield con, Opened(database, snap, True, _taken(con))
        finally:
            con.close()
        return
    if not os.path.exists(database):
        if os.path.exists(snap):
            why = f"{database} does not exist, but its read snapshot does: its writer made none yet?"
        else:
            why = f"{database}: no such database (give the file run --db or sink --db writes)"
        raise HistoryError(why)
    try:
        con = _attach(database)
        opened = Opened(database, database, snapshot=_is_snapshot(con))
        if opened.snapshot:
            opened = Opened(database, database, True, _taken(con))
    except duckdb.Error as e:
        if not _locked(e):
            raise HistoryError(f"{database}: not a ckptwatch database ({str(e).splitlines()[0]})") from None
        if not os.path.exists(snap):
            raise HistoryError(f"{database} is being written by another process, and it has published no read "
                               f"snapshot ({snap}) yet: a ckptwatch run or sink publishes its first within seconds "
                               "of its start, unless [sink] snapshot_every = 0") from None
        try:
            con = _attach(snap)
        except duckdb.Error as e2:
            raise HistoryError(f"{snap}: cannot read the snapshot ({str(e2).splitlines()[0]})") from None
        opened = Opened(database, snap, True, _taken(con))
    if not has_table(con, "incidents"):
        con.close()
        raise HistoryError(f"{opened.path}: a DuckDB database, but not a ckptwatch one (no incidents table)")
    try:
        yield con, opened
    finally:
        con.close()


def _attach(path: str) -> duckdb.DuckDBPyConnection:
    """A new in-memory DuckDB with the file at ``path`` attached read-only as its default
    catalog. Not ``duckdb.connect(path)``: DuckDB keeps one instance per path in a process
    while any connection to it is open, so a second connect would read the snapshot an
    earlier, still open, connection saw, not the file now at that path."""
    con = duckdb.connect(":memory:")
    try:
        con.execute(f"ATTACH '{path.replace(chr(39), chr(39) * 2)}' AS history (READ_ONLY)")
        con.execute("USE history")
    except BaseException:
        con.close()
        raise
    return con


def _is_snapshot(con: duckdb.DuckDBPyConnection) -> bool:
    return has_table(con, "snapshot")


def _taken(con: duckdb.DuckDBPyConnection) -> dt.datetime | None:
    rows = con.execute("SELECT max(taken_ts) FROM snapshot").fetchall() if _is_snapshot(con) else []
    return rows[0][0] if rows else None


def has_table(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    """The connected database's ``main`` schema has a table or view ``name``."""
    return bool(con.execute(
        "SELECT count(*) FROM (SELECT table_name AS n FROM duckdb_tables() WHERE database_name = current_database() "
        "AND schema_name = 'main' UNION ALL SELECT view_name FROM duckdb_views() WHERE database_name = "
        "current_database() AND schema_name = 'main') WHERE n = ?", [name]).fetchall()[0][0])


def has_column(con: duckdb.DuckDBPyConnection, table: str, column: str) -> bool:
    """The connected database's ``main.table`` has ``column`` (an older schema may not)."""
    return bool(con.execute(
        "SELECT count(*) FROM duckdb_columns() WHERE database_name = current_database() AND schema_name = 'main' "
        "AND table_name = ? AND column_name = ?", [table, column]).fetchall()[0][0])


def evidence_relation(con: duckdb.DuckDBPyConnection) -> str:
    """SQL for the evidence rows with their ``file`` and ``read_on`` (the machine the file
    was read on; NULL before schema version 2): the ``evidence`` view, or its equivalent."""
    if has_table(con, "evidence"):
        return "evidence"
    return ("(SELECT e.*, s.file, CAST(NULL AS VARCHAR) AS read_on FROM incident_evidence e "
            "LEFT JOIN sources s ON s.source_id = e.source_id)")
