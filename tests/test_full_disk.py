"""A full disk under the database: a new database is created whole or not at all, and a
running pipeline waits for space (saying so, once) instead of dying, then goes on; nothing
read is lost or stored twice, whether the space returns or the process is stopped while
it waits. Each test mounts a small tmpfs of its own (the suite runs as root, here and in
CI) and fills it: real ENOSPC from the kernel, a real DuckDB file, real CLI processes."""

from __future__ import annotations

import datetime as dt
import errno
import io
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb
import polars as pl
import pytest
from rich.console import Console

from ckptwatch.config import AlertSettings
from ckptwatch.embedded import EmbeddedRunner
from ckptwatch.ingest.layout import compile_template
from ckptwatch.pipeline import PipelineOptions, diagnose
from ckptwatch.schema import EVENT_SCHEMA
from ckptwatch.sinks.alerts.setup import alerter_from_config
from ckptwatch.sinks.duckdb_store import DiskFull, Store, StoreError

TEMPLATE = "{job}/rank{rank}.log"
T0 = dt.datetime(2026, 11, 30, 8, 0, tzinfo=dt.timezone.utc)


class Disk:
    """A tmpfs mounted at ``path``; :meth:`fill` takes every free byte, :meth:`free` gives them back."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.filler = path / "filler"

    def fill(self, leave: int = 0) -> None:
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            for chunk in (1 << 20, 1 << 12, 1):
                while True:
                    try:
                        os.write(fd, b"\0" * chunk)
                    except OSError as e:
                        assert e.errno == errno.ENOSPC
                        break
            if leave:
                os.ftruncate(fd, max(0, os.fstat(fd).st_size - leave))
        finally:
            os.close(fd)

    def free(self) -> None:
        self.filler.unlink()


@pytest.fixture
def disk(tmp_path):
    mnt = tmp_path / "disk"
    mnt.mkdir()
    got = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(mnt)],
                         capture_output=True, text=True)
    if got.returncode != 0:
        raise AssertionError(f"these tests mount a 4 MiB tmpfs and must run as root: {got.stderr.strip()}")
    try:
        yield Disk(mnt)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def lines(path: Path, first: int, last: int) -> None:
    """Append save_start lines ``first..last`` (one event each) to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        for i in range(first, last + 1):
            f.write(f"2026-11-30T08:{i // 60 % 60:02d}:{i % 60:02d}.000000Z ckptwatch event=save_start step={i * 10} "
                    f"rank=0 world_size=1 path=/ckpt/job-a/step_{i * 10}\n")


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "ckptwatch", *args]


def stored(db: Path) -> tuple[int, list[tuple[str, int]]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        n = con.execute("SELECT count(*) FROM events").fetchone()[0]
        return n, con.execute("SELECT file, committed_offset FROM sources").fetchall()
    finally:
        con.close()


def run_once(logs: Path, db: Path) -> None:
    """``ckptwatch run --once`` in this process, alerting on the console (its tables made, as by the CLI)."""
    runner = EmbeddedRunner(str(logs), str(db), PipelineOptions(template=compile_template(TEMPLATE)),
                            alerter=lambda store, metrics: alerter_from_config(
                                AlertSettings(), store, db_path=str(db), console=Console(file=io.StringIO())))
    try:
        runner.run(once=True)
    finally:
        runner.close()


class Stderr:
    """A process's standard error, read as it comes."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.text = ""
        self._t = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._t.start()

    def _read(self, proc: subprocess.Popen) -> None:
        for line in proc.stderr:
            self.text += line

    def wait_for(self, words: str, proc: subprocess.Popen, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while words not in self.text:
            assert proc.poll() is None, f"the process ended ({proc.returncode}) before saying {words!r}:\n{self.text}"
            assert time.monotonic() < deadline, f"never said {words!r}:\n{self.text}"
            time.sleep(0.1)

    def done(self) -> str:
        self._t.join(10)
        return self.text


# -- creating the database ----------------------------------------------------------------

def test_a_new_database_on_a_full_disk_leaves_nothing_behind_and_says_why(disk, tmp_path):
    """It used to leave a 0-byte file, and every later start refused it as not a DuckDB file."""
    lines(tmp_path / "logs" / "job-a" / "rank0.log", 1, 1)
    db = disk.path / "x.duckdb"
    disk.fill()
    full = subprocess.run(cli("run", "--logs", str(tmp_path / "logs"), "--db", str(db), "--once"),
                          capture_output=True, text=True, timeout=120)
    assert full.returncode == 2, full.stderr
    err = full.stderr.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert str(db) in err and "no space left on device (ENOSPC)" in err
    assert sorted(os.listdir(disk.path)) == ["filler"]  # no database, no WAL, no temporary file

    disk.free()
    run_once(tmp_path / "logs", db)  # a later start creates it and reads the logs
    assert stored(db)[0] == 1


def test_an_empty_file_left_by_an_earlier_failed_creation_is_replaced(tmp_path):
    db = tmp_path / "x.duckdb"
    db.touch()
    Store(str(db)).close()
    assert stored(db) == (0, [])
    with pytest.raises(StoreError, match=r"cannot create the database: no such file or directory \(ENOENT\)"):
        Store(str(tmp_path / "missing" / "x.duckdb"))


# -- writing on a full disk -----------------------------------------------------------------

def test_run_waits_for_space_says_so_and_stores_every_line_once(disk, tmp_path):
    """``ckptwatch run`` on a full disk used to die at its first commit with a DuckDB
    traceback (exit 1). Now it waits, says so once, and goes on when space returns."""
    log = tmp_path / "logs" / "job-a" / "rank0.log"
    db = disk.path / "x.duckdb"
    lines(log, 1, 100)
    run_once(tmp_path / "logs", db)
    disk.fill()
    proc = subprocess.Popen(cli("run", "--logs", str(tmp_path / "logs"), "--db", str(db), "--interval", "0.2",
                                "--until-idle", "2", "--path-template", TEMPLATE),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    err = Stderr(proc)
    try:
        lines(log, 101, 200)
        err.wait_for("waiting for space", proc)
        time.sleep(1)  # a few attempts fail meanwhile
        disk.free()
        lines(log, 201, 300)
        assert proc.wait(timeout=90) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    text = err.done()
    assert "Traceback" not in text, text
    said = [ln for ln in text.splitlines() if ln.startswith(f"warning: database {db}:")]
    assert len(said) == 2, text
    assert "no space left on device (ENOSPC): waiting for space" in said[0]
    assert "written after waiting" in said[1]
    assert stored(db) == (300, [(str(log), log.stat().st_size)])


def test_a_run_stopped_while_waiting_for_space_resumes_from_what_was_stored(disk, tmp_path):
    log = tmp_path / "logs" / "job-a" / "rank0.log"
    db = disk.path / "x.duckdb"
    lines(log, 1, 100)
    run_once(tmp_path / "logs", db)
    size_stored = log.stat().st_size
    disk.fill()
    proc = subprocess.Popen(cli("run", "--logs", str(tmp_path / "logs"), "--db", str(db), "--interval", "0.2",
                                "--path-template", TEMPLATE),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    err = Stderr(proc)
    try:
        lines(log, 101, 200)
        err.wait_for("waiting for space", proc)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "Traceback" not in err.done(), err.text
    assert stored(db) == (100, [(str(log), size_stored)])  # the offset did not move past what was stored
    disk.free()
    run_once(tmp_path / "logs", db)
    assert stored(db) == (200, [(str(log), log.stat().st_size)])


@pytest.fixture(scope="module")
def incident():
    from conftest import CORPUS

    (inc,) = diagnose([str(CORPUS / "02-sigkill-mid-save" / "logs" / "attempt-1-train")])[0]
    return inc


def events(n: int) -> pl.DataFrame:
    rows = []
    for i in range(n):
        row = dict.fromkeys(EVENT_SCHEMA)
        row.update(ts=T0 + dt.timedelta(seconds=i), source_id="src", offset=i * 100, kind="save_start", step=i,
                   line=f"line {i}")
        rows.append(row)
    return pl.DataFrame(rows, schema=EVENT_SCHEMA)


def waits_for_space_then_completes(disk, said: list[str], fn) -> None:
    """Run ``fn`` in a thread on a full disk: it must say it waits for space (within 30 s)
    rather than fail, and complete without error once ``disk`` is freed."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 (reported by the test)
            errors.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    deadline = time.monotonic() + 30
    while not said and t.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not errors, errors
    assert said and "no space left on device (ENOSPC): waiting for space" in said[0], said
    disk.free()
    t.join(30)
    assert not t.is_alive() and not errors, errors


def test_the_sink_transaction_waits_and_commits_events_incident_offsets_and_alerts_once(disk, incident):
    """The sink's transaction (events, incidents, Kafka offsets and the alerts they queue)
    is replayed whole once space returns: every row once, the offsets with their data."""
    said: list[str] = []
    db = str(disk.path / "sink.duckdb")
    store = Store(db, say=said.append)
    alerter = alerter_from_config(AlertSettings(), store, db_path=db, console=Console(file=io.StringIO()))
    try:
        disk.fill()

        def write() -> None:
            with store.transaction():
                store.commit_kafka_batch(events(500), [incident], {("ckptwatch.events", 0): 500})
                alerter.notify([incident])

        waits_for_space_then_completes(disk, said, write)
        con = store.con
        assert con.execute("SELECT count(*), count(DISTINCT \"offset\") FROM events").fetchone() == (500, 500)
        assert con.execute("SELECT id, status FROM incidents").fetchall() == [(incident.id, "open")]
        assert store.kafka_offsets() == {("ckptwatch.events", 0): 500}
        assert con.execute("SELECT channel, action, status FROM alerts").fetchall() == [("console", "trigger", "pending")]
    finally:
        alerter.close()
        store.close()


def test_a_checkpoint_without_space_invalidates_duckdb_and_the_store_reopens_it(disk, incident):
    """DuckDB's automatic checkpoint at a commit finds no space and invalidates its
    instance. A commit it did not make durable (a table with a key: the checkpoint was to
    write it) is replayed once there is space; one it says is durable is not repeated (an
    alert queued twice would be sent twice). Either way the store reopens the database."""
    said: list[str] = []
    db = str(disk.path / "x.duckdb")
    store = Store(db, say=said.append)
    alerter = alerter_from_config(AlertSettings(), store, db_path=db, console=Console(file=io.StringIO()))
    try:
        store.commit_batch(events(2000), [("src", "f.log", 200_000, None)])
        store.con.execute("CREATE TABLE scratch (v VARCHAR)")  # no key: DuckDB writes its WAL first
        store.raw.execute("SET checkpoint_threshold = '1KB'")  # every commit checkpoints
        disk.fill(leave=32 << 10)  # room for a WAL record, not for a checkpoint
        before = store.raw

        def write() -> None:
            with store.transaction():
                store.upsert_incidents([incident])
                alerter.notify([incident])

        waits_for_space_then_completes(disk, said, write)
        assert store.raw is not before  # reopened
        assert store.con.execute("SELECT count(*) FROM alerts").fetchone() == (1,)
        assert store.con.execute("SELECT count(*) FROM incidents").fetchone() == (1,)

        store.raw.execute("SET checkpoint_threshold = '1KB'")
        disk.fill(leave=32 << 10)
        before, n_said = store.raw, len(said)
        with store.transaction():  # durable at once: no wait
            store.con.execute("INSERT INTO scratch VALUES ('once')")
        assert store.con.execute("SELECT count(*) FROM scratch").fetchone() == (1,)
        assert store.raw is not before and len(said) == n_said
        disk.free()
    finally:
        alerter.close()
        store.close()
    reopened = duckdb.connect(db, read_only=True)
    try:
        assert reopened.execute("SELECT (SELECT count(*) FROM alerts), (SELECT count(*) FROM scratch)").fetchone() == (1, 1)
    finally:
        reopened.close()


def test_without_waiting_a_full_disk_is_one_error_and_the_store_goes_on(disk):
    store = Store(str(disk.path / "x.duckdb"), wait_for_space=False)
    try:
        disk.fill()
        with pytest.raises(DiskFull, match=r"x\.duckdb: no space left on device \(ENOSPC\): nothing was written"):
            store.commit_batch(events(10), [("src", "f.log", 1000, None)])
        assert store.committed_offsets() == {}
        disk.free()
        assert store.commit_batch(events(10), [("src", "f.log", 1000, None)]) == 10
        assert store.committed_offsets() == {"src": (1000, None)}
    finally:
        store.close()


def test_a_one_shot_run_gives_up_on_a_full_disk_with_one_line_and_a_rerun_resumes(disk, tmp_path):
    """``run --once`` is a script's step, not a service: on a full disk it stops with one
    line and exit 2 (it used to retry every 5 s for ever), keeping what was stored."""
    log = tmp_path / "logs" / "job-a" / "rank0.log"
    db = disk.path / "x.duckdb"
    lines(log, 1, 100)
    run_once(tmp_path / "logs", db)
    size_stored = log.stat().st_size
    disk.fill()
    lines(log, 101, 200)
    proc = subprocess.run(cli("run", "--logs", str(tmp_path / "logs"), "--db", str(db), "--once",
                              "--path-template", TEMPLATE), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"error: --db {db}:" in proc.stderr and "ENOSPC" in proc.stderr
    assert stored(db) == (100, [(str(log), size_stored)])
    disk.free()
    run_once(tmp_path / "logs", db)
    assert stored(db) == (200, [(str(log), log.stat().st_size)])
