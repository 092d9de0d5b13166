"""Reading the history while a process writes it: the read snapshot (ckptwatch.sinks.snapshot)
is consistent, recent, never blocks the writer, and nothing written is lost; a reader that
opened the file at rest does not keep a writer from starting."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import duckdb
import pytest

from ckptwatch.history.read import HistoryError, open_history
from ckptwatch.sinks.snapshot import snapshot_path

#: a writer process: transaction i stores incident i with (i % 5) + 1 evidence rows, every
#: 10 ms, publishing read snapshots every 0.2 s; prints how many it committed when stopped
WRITER = textwrap.dedent("""
    import datetime as dt, signal, sys, time
    from ckptwatch.detectors.incident import EvidenceItem, Incident
    from ckptwatch.sinks.duckdb_store import Store

    store = Store(sys.argv[1])
    store.publish_snapshots(0.2)
    stop = []
    signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
    t0 = dt.datetime(2026, 12, 1, tzinfo=dt.timezone.utc)
    i = 0
    print("ready", flush=True)
    while not stop:
        inc = Incident(kind="interrupted_save", job=f"job-{i}", step=i, checkpoint_path=f"/ckpt/{i}", root_cause=None,
                       collateral=[], checkpoint_state={}, last_good_checkpoint=None, remediation="", first_ts=t0)
        inc.evidence = [EvidenceItem(f"src-{i}", k, t0, "save_start", k, "h", "r", f"line {k}", "save")
                        for k in range(i % 5 + 1)]
        store.upsert_incidents([inc])
        i += 1
        time.sleep(0.01)
    store.close()
    print(i, flush=True)
""")


def _writer(db: Path) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", WRITER, str(db)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    assert p.stdout.readline().strip() == "ready", p.stderr.read()
    return p


def _expected_evidence(n: int) -> int:
    return sum(i % 5 + 1 for i in range(n))


def test_reads_while_a_process_writes_are_consistent_recent_and_lose_nothing(tmp_path):
    db = tmp_path / "h.duckdb"
    writer = _writer(db)
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(snapshot_path(str(db))):
            assert time.monotonic() < deadline and writer.poll() is None, writer.stderr.read()
            time.sleep(0.05)
        seen, ages = [], []
        held = None
        for k in range(25):
            with open_history(str(db)) as (con, opened):
                assert opened.snapshot and opened.path == snapshot_path(str(db))
                n, ev = con.execute("SELECT (SELECT count(*) FROM incidents), (SELECT count(*) FROM evidence)").fetchall()[0]
                # one transaction's state: every incident with all of its evidence
                assert ev == _expected_evidence(n), (n, ev)
                ages.append((dt_now() - opened.taken_ts).total_seconds())
                seen.append(n)
                if k == 5:  # a reader that keeps a snapshot open does not stop the next ones
                    held = duckdb.connect(opened.path, read_only=True)
                    held_n = held.execute("SELECT count(*) FROM incidents").fetchall()[0][0]
            time.sleep(0.1)
        assert seen == sorted(seen) and seen[-1] > seen[0]  # it moves on, never back
        # documented lag: every (0.2 s) + the copy; the first reads may race the first copies
        assert max(ages[5:]) < 2.0, ages
        assert held.execute("SELECT count(*) FROM incidents").fetchall()[0][0] == held_n  # its own version
        held.close()
    finally:
        writer.send_signal(signal.SIGTERM)
        out, err = writer.communicate(timeout=60)
    committed = int(out.split()[-1])
    assert committed > 100, (out, err)  # it wrote all along, reads or not (10 ms a transaction)
    # at rest: the database and the last snapshot hold every transaction
    for path in (str(db), snapshot_path(str(db))):
        con = duckdb.connect(path, read_only=True)
        assert con.execute("SELECT count(*), (SELECT count(*) FROM incident_evidence) FROM incidents").fetchall() \
            == [(committed, _expected_evidence(committed))]
        con.close()
    with open_history(str(db)) as (con, opened):
        assert not opened.snapshot and opened.path == str(db)


def dt_now():
    import datetime as dt

    return dt.datetime.now(dt.timezone.utc)


HOLDER = textwrap.dedent("""
    import sys, time, duckdb
    con = duckdb.connect(sys.argv[1], read_only=True)
    print("holding", flush=True)
    time.sleep(float(sys.argv[2]))
    con.close()
""")


def test_a_reader_holding_the_file_at_rest_delays_a_writer_it_does_not_stop_it(tmp_path):
    from ckptwatch.sinks.duckdb_store import LOCK_WAIT, Store

    db = tmp_path / "r.duckdb"
    Store(str(db)).close()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(db), "1.5"], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "holding"
    started = time.monotonic()
    store = Store(str(db))  # waits for the reader's lock instead of failing
    waited = time.monotonic() - started
    store.close()
    holder.wait(timeout=30)
    assert 0.5 < waited < LOCK_WAIT + 1, waited


def test_a_writer_without_snapshots_is_named_in_one_line(tmp_path):
    db = tmp_path / "w.duckdb"
    writer = subprocess.Popen([sys.executable, "-c", HOLDER.replace("read_only=True", "read_only=False"), str(db), "30"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "holding"
        with pytest.raises(HistoryError) as caught, open_history(str(db)):
            pass
        assert str(caught.value) == (f"{db} is being written by another process, and it has published no read "
                                     f"snapshot ({tmp_path / 'w.snapshot.duckdb'}) yet: a ckptwatch run or sink "
                                     "publishes its first within seconds of its start, unless [sink] snapshot_every = 0")
    finally:
        writer.kill()
        writer.wait()
    with pytest.raises(HistoryError, match=r"nope\.duckdb: no such database"), open_history(str(tmp_path / "nope.duckdb")):
        pass
    other = duckdb.connect(str(tmp_path / "other.duckdb"))  # a DuckDB file of something else
    other.execute("CREATE TABLE t AS SELECT 1 AS x")
    other.close()
    with pytest.raises(HistoryError, match=r"other\.duckdb: a DuckDB database, but not a ckptwatch one"), \
            open_history(str(tmp_path / "other.duckdb")):
        pass
    (tmp_path / "text.duckdb").write_text("not a database\n")
    with pytest.raises(HistoryError, match=r"text\.duckdb: not a ckptwatch database"), \
            open_history(str(tmp_path / "text.duckdb")):
        pass


def test_incidents_list_and_show_against_a_running_run_then_at_rest(copy_scenario, tmp_path):
    """The real `ckptwatch run` (not --once) on corpus logs: the CLI reads its snapshot while
    it runs, and the database itself once it stopped, with the same answer."""
    logs = copy_scenario("02-sigkill-mid-save")
    db = tmp_path / "live.duckdb"
    env = {**os.environ, "CKPTWATCH_SINK_SNAPSHOT_EVERY": "0.5"}
    run = subprocess.Popen([sys.executable, "-m", "ckptwatch", "run", "--logs", str(logs), "--db", str(db)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 120
        live = []
        while True:
            assert run.poll() is None, run.stderr.read()
            assert time.monotonic() < deadline, "no incident in the snapshot within 120 s"
            res = subprocess.run([sys.executable, "-m", "ckptwatch", "incidents", "list", "--db", str(db), "--json"],
                                 capture_output=True, text=True)
            if res.returncode == 0:
                live = json.loads(res.stdout)
                if any(i["kind"] == "interrupted_save" for i in live):
                    break
            else:  # before the first snapshot: a one-line error, never a traceback
                assert "Traceback" not in res.stderr and res.stderr.count("\n") == 1, res.stderr
            time.sleep(0.5)
        assert "read snapshot of" in res.stderr and "a running pipeline writes it" in res.stderr
        save = next(i for i in live if i["kind"] == "interrupted_save")
        assert (save["job"], save["step"], save["root_cause_class"], save["root_rank"]) == ("job-0201-sigkill", 40, "signal", 2)
        shown = subprocess.run([sys.executable, "-m", "ckptwatch", "incidents", "show", save["id"][:8], "--db", str(db)],
                               capture_output=True, text=True)
        assert shown.returncode == 0, shown.stderr
        assert f"id {save['id']}" in shown.stdout and "root cause   signal (SIGKILL) on rank 2" in shown.stdout
        # the root cause's evidence row names its file (console.log of the copy) and line offset
        assert f"root_cause process_exit       {logs}/attempt-1-train/console.log:" in shown.stdout
    finally:
        run.send_signal(signal.SIGTERM)
        _, err = run.communicate(timeout=60)
    assert run.returncode == 0, err
    rest = subprocess.run([sys.executable, "-m", "ckptwatch", "incidents", "list", "--db", str(db), "--json"],
                          capture_output=True, text=True)
    assert rest.returncode == 0 and "(at rest)" in rest.stderr
    assert {i["id"] for i in json.loads(rest.stdout)} >= {i["id"] for i in live}
