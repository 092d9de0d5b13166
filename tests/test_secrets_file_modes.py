"""Issue 14: the database (raw log lines), its WAL and the alert state files are private:
files 0600, directories ckptwatch creates 0700, whatever the process umask."""

from __future__ import annotations

import datetime as dt
import os
import stat

import polars as pl
import pytest

from ckptwatch import private_files
from ckptwatch.schema import EVENT_SCHEMA
from ckptwatch.sinks.alerts.silences import SilenceFile
from ckptwatch.sinks.duckdb_store import Store

T0 = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.timezone.utc)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def loose_umask():
    """The usual 022 umask, under which files are created 0644 unless asked otherwise."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def one_event() -> pl.DataFrame:
    row = {c: None for c in EVENT_SCHEMA}
    row.update(ts=T0, source_id="s", offset=0, kind="save_start", line="password=hunter2 raw line")
    return pl.DataFrame([row], schema=EVENT_SCHEMA)


def test_database_and_wal_are_0600(tmp_path, loose_umask):
    db = tmp_path / "inc.duckdb"
    store = Store(str(db))
    try:
        assert mode(db) == 0o600
        store.commit_batch(one_event(), [("s", "f.log", 10, None)])
        wal = tmp_path / "inc.duckdb.wal"
        assert wal.exists() and mode(wal) == 0o600  # after a write, before any checkpoint
        store.con.execute("CHECKPOINT")  # the WAL is deleted; the next write creates it again
        with store.transaction():
            store.con.execute("UPDATE sources SET committed_offset = 20")
        assert wal.exists() and mode(wal) == 0o600
    finally:
        store.close()
    assert mode(db) == 0o600


def test_a_database_created_world_readable_before_is_tightened(tmp_path, loose_umask):
    db = tmp_path / "old.duckdb"
    Store(str(db)).close()
    os.chmod(db, 0o644)
    Store(str(db)).close()
    assert mode(db) == 0o600


def test_memory_database_touches_no_file(tmp_path, loose_umask):
    Store(":memory:").close()


def test_silence_file_and_its_lock_are_0600_in_a_0700_directory(tmp_path, loose_umask):
    path = tmp_path / "state" / "deeper" / "silences.json"
    sf = SilenceFile(str(path))
    sf.add({"job": "job-02*"}, T0 + dt.timedelta(hours=1), now=T0)
    assert mode(path) == 0o600 and mode(str(path) + ".lock") == 0o600
    assert mode(tmp_path / "state") == 0o700 and mode(tmp_path / "state" / "deeper") == 0o700
    sf.expire(sf.read()[0].id, now=T0)
    assert mode(path) == 0o600


def test_an_existing_directory_keeps_its_mode(tmp_path, loose_umask):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    private_files.ensure_dir(str(shared / "mine"))
    assert mode(shared) == 0o755 and mode(shared / "mine") == 0o700


def test_private_file_helpers(tmp_path, loose_umask):
    p = tmp_path / "d" / "state.json"
    private_files.write_private(str(p), b"{}")
    assert p.read_bytes() == b"{}" and mode(p) == 0o600 and mode(tmp_path / "d") == 0o700
    loose = tmp_path / "loose"
    loose.write_text("x")
    os.chmod(loose, 0o664)
    private_files.tighten(str(loose))
    assert mode(loose) == 0o600
    private_files.tighten(str(tmp_path / "absent"))  # nothing to do, no error
    with private_files.private_umask():
        (tmp_path / "made-under-umask").write_text("x")
    assert mode(tmp_path / "made-under-umask") == 0o600
    assert os.umask(0o022) == 0o022  # restored
