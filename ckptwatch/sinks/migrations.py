"""The database's schema version, and the forward migrations that bring an older file up
to it.

A database records its version in ``schema_version`` (one row per migration applied:
``version``, ``applied_ts`` UTC, ``release``: the ckptwatch version that applied it). A file
without that table was written before versions were recorded (ckptwatch 0.1.0 up to commit
b0a5e39): it is version 1, whatever ``CREATE ... IF NOT EXISTS`` and ``ADD COLUMN IF NOT
EXISTS`` of :data:`ckptwatch.sinks.duckdb_store._DDL` already give it. Each later version is
a list of statements in :data:`MIGRATIONS`, applied in order, in one transaction, when the
writer (:class:`~ckptwatch.sinks.duckdb_store.Store`) opens the file; readers never migrate
(they read an old file as it is: :mod:`ckptwatch.history` copes with both).

A file newer than this ckptwatch knows is refused (:class:`SchemaTooNew`), never written:
an older release could not keep the newer columns true.

The tables and their columns are documented in ``docs/schema.md``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import duckdb

from ckptwatch import __version__

#: what this release writes
SCHEMA_VERSION = 4

#: version -> the statements that bring a file from the version before it
MIGRATIONS: dict[int, tuple[str, ...]] = {
    2: (
        # versions recorded from now on
        "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, applied_ts TIMESTAMPTZ, "
        "release VARCHAR)",
        # the machine a source was read on (the collector's host in fleet mode; this machine embedded)
        "ALTER TABLE sources ADD COLUMN IF NOT EXISTS host VARCHAR",
        # every evidence row with the file and machine it was read from
        "CREATE OR REPLACE VIEW evidence AS SELECT e.*, s.file, s.host AS read_on "
        "FROM incident_evidence e LEFT JOIN sources s ON s.source_id = e.source_id",
    ),
    3: (
        # an incident concluded before its evidence window closed: shown, not paged yet
        "ALTER TABLE incidents ADD COLUMN IF NOT EXISTS provisional BOOLEAN DEFAULT false",
        # what to paste: verify, resume from the last good checkpoint, reshard, longer timeout
        "ALTER TABLE incidents ADD COLUMN IF NOT EXISTS commands JSON",
    ),
    4: (
        # where an evidence line's time came from: its own, or inherited from an earlier line
        "ALTER TABLE incident_evidence ADD COLUMN IF NOT EXISTS ts_source VARCHAR DEFAULT 'line'",
        "CREATE OR REPLACE VIEW evidence AS SELECT e.*, s.file, s.host AS read_on "
        "FROM incident_evidence e LEFT JOIN sources s ON s.source_id = e.source_id",
    ),
}


class SchemaTooNew(duckdb.IOException):
    """The database was written by a newer ckptwatch (its schema version is above
    :data:`SCHEMA_VERSION`); the message is one line naming the file and both versions."""


def version_of(con: Any) -> int:
    """The schema version of the database ``con`` is connected to (1 when it records none).
    ``con``: a DuckDB connection or :class:`~ckptwatch.sinks.duckdb_store.Connection`."""
    found = con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'schema_version' "
                        "AND database_name = current_database() AND schema_name = 'main'").fetchall()
    if not found[0][0]:
        return 1
    rows = con.execute("SELECT max(version) FROM schema_version").fetchall()
    return int(rows[0][0] or 1)


def check_not_newer(con: Any, path: str) -> int:
    """The file's version; raises :class:`SchemaTooNew` when it is above
    :data:`SCHEMA_VERSION`."""
    found = version_of(con)
    if found > SCHEMA_VERSION:
        raise SchemaTooNew(f"database {path}: schema version {found} was written by a newer ckptwatch; this one "
                           f"({__version__}) knows up to {SCHEMA_VERSION}: upgrade ckptwatch to open it")
    return found


def create_current(con: duckdb.DuckDBPyConnection) -> None:
    """Bring a database just created with the version-1 schema to :data:`SCHEMA_VERSION`
    on ``con`` (a new file is made whole at the current version: no migration at its first
    open)."""
    now = dt.datetime.now(dt.timezone.utc)
    for version in sorted(MIGRATIONS):
        for statement in MIGRATIONS[version]:
            con.execute(statement)
        con.execute("INSERT INTO schema_version VALUES (?, ?, ?)", [version, now, __version__])


def upgrade(store: Any, found: int) -> list[int]:
    """Apply the migrations after version ``found`` to ``store`` (a
    :class:`~ckptwatch.sinks.duckdb_store.Store`), in one transaction of the store (so a
    full disk waits and retries as any write does); returns the versions applied."""
    todo = [v for v in sorted(MIGRATIONS) if v > found]
    if not todo:
        return []
    now = dt.datetime.now(dt.timezone.utc)
    with store.transaction():
        for version in todo:
            for statement in MIGRATIONS[version]:
                store.con.execute(statement)
            store.con.execute("INSERT OR REPLACE INTO schema_version VALUES (?, ?, ?)", [version, now, __version__])
    return todo
