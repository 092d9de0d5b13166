"""Schema versions: a database written by an earlier release opens in this one (migrated
forward by the writer, read as it is by readers), and a newer one is refused."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import duckdb
import polars as pl
import pytest

from ckptwatch.sinks import migrations
from ckptwatch.sinks.duckdb_store import Store

V1 = Path(__file__).parent / "fixtures" / "history" / "schema-v1.duckdb.gz"


@pytest.fixture
def v1_db(tmp_path: Path) -> Path:
    path = tmp_path / "old.duckdb"
    with gzip.open(V1) as src, open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return path


def _columns(con: duckdb.DuckDBPyConnection, table: str) -> list[str]:
    return [r[0] for r in con.execute(
        "SELECT column_name FROM duckdb_columns() WHERE table_name = ? ORDER BY column_index", [table]).fetchall()]


def test_the_v1_fixture_is_what_it_says(v1_db: Path) -> None:
    con = duckdb.connect(str(v1_db), read_only=True)
    try:
        assert migrations.version_of(con) == 1
        assert "host" not in _columns(con, "sources")
        assert con.execute("SELECT (SELECT count(*) FROM events), (SELECT count(*) FROM incidents), "
                           "(SELECT count(*) FROM incident_evidence), (SELECT count(*) FROM alerts)").fetchone() \
            == (1236, 6, 78, 6)
    finally:
        con.close()


def test_a_v1_database_is_migrated_forward_keeping_every_row(v1_db: Path) -> None:
    store = Store(str(v1_db))
    try:
        assert store.migrated == [2, 3, 4]
        assert migrations.version_of(store.con) == migrations.SCHEMA_VERSION == 4
        con = store.con
        assert con.execute("SELECT (SELECT count(*) FROM events), (SELECT count(*) FROM incidents), "
                           "(SELECT count(*) FROM incident_evidence), (SELECT count(*) FROM alerts)").fetchone() \
            == (1236, 6, 78, 6)
        assert "host" in _columns(raw := store.raw, "sources")
        # every evidence row names its file through the new view (sources kept their paths)
        rows = con.execute("SELECT count(*), count(file) FROM evidence").fetchone()
        assert rows == (78, 78)
        root = con.execute("SELECT file FROM evidence e JOIN incidents i ON i.id = e.incident_id "
                           "WHERE i.job = 'job-0201-sigkill' AND e.role = 'root_cause'").fetchall()
        assert root == [("/tmp/fx/logs/02-sigkill-mid-save/logs/attempt-1-train/console.log",)]
        assert raw.execute("SELECT version, release FROM schema_version").fetchall() == [(2, "0.1.0"), (3, "0.1.0"),
                                                                                   (4, "0.1.0")]
        assert raw.execute("SELECT count(*), count(*) FILTER (WHERE provisional) FROM incidents").fetchone() == (6, 0)
        # the migrated file is written as any other: tailing resumes from its sources
        assert len(store.sources()) == 29
        assert store.commit_batch(pl.DataFrame(), [("new-src", "/x/new.log", 10, "job-x")]) == 0
        assert con.execute("SELECT host FROM sources WHERE source_id = 'new-src'").fetchone() == (store.host,)
    finally:
        store.close()
    again = Store(str(v1_db))
    try:
        assert again.migrated == []
    finally:
        again.close()


def test_a_new_database_is_made_at_the_current_version(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "new.duckdb"))
    try:
        assert store.migrated == []  # made whole at the current version, nothing to migrate
        assert migrations.version_of(store.con) == migrations.SCHEMA_VERSION
        assert store.con.execute("SELECT count(*) FROM evidence").fetchone() == (0,)
    finally:
        store.close()


def test_a_database_from_a_newer_release_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "future.duckdb"
    Store(str(path)).close()
    con = duckdb.connect(str(path))
    con.execute("INSERT INTO schema_version VALUES (99, now(), '9.0.0')")
    con.close()
    with pytest.raises(migrations.SchemaTooNew) as caught:
        Store(str(path))
    text = str(caught.value)
    assert "\n" not in text
    assert f"database {path}: schema version 99 was written by a newer ckptwatch" in text
    assert "knows up to 4: upgrade ckptwatch" in text
    # refused, not written: the file still says 99, and can be opened again at once (lock released)
    con = duckdb.connect(str(path), read_only=True)
    assert migrations.version_of(con) == 99
    con.close()


def test_another_application_s_duckdb_file_is_not_written_into(tmp_path: Path) -> None:
    path = tmp_path / "analytics.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE sales AS SELECT 1 AS amount")
    con.close()
    from ckptwatch.sinks.duckdb_store import StoreError

    with pytest.raises(StoreError, match=r"analytics\.duckdb: a DuckDB database, but not a ckptwatch one \(tables "
                                         r"sales\): give run/sink a new file or one they wrote"):
        Store(str(path))
    con = duckdb.connect(str(path), read_only=True)
    assert [t for (t,) in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()] == ["sales"]
    con.close()
