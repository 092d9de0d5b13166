"""More log files than the open-file limit (issue 35, item 3): every file is read, in turns,
none twice, and running out of descriptors is one line, never a file skipped in silence.

The CLI runs as its real process under a low ``ulimit -n`` (set in the child before exec);
the watcher's own cases run in this process with a small budget of open files, or in a
child whose descriptors are used up for real."""

from __future__ import annotations

import collections
import datetime as dt
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import polars as pl

from ckptwatch.ingest.watcher import SourceWatcher

LIMIT = 256  # ulimit -n of the CLI runs below
HEADROOM = 64  # ckptwatch.ingest.handles.HEADROOM: what the log files leave to the rest
T0 = dt.datetime(2026, 11, 30, 10, 0, tzinfo=dt.timezone.utc)


def save_line(i: int, k: int) -> str:
    """A line that is an event (a save's end), unique by file ``i`` and line ``k``."""
    it = i * 10 + k
    return f"[2026-11-30 10:00:{k:02d}] rank0: successfully saved checkpoint from iteration {it} to /ckpt/j/iter_{it:07d}\n"


def low_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, LIMIT))


def ckptwatch(*args: object) -> list[str]:
    return [sys.executable, "-m", "ckptwatch", *map(str, args)]


def stored(db: Path) -> collections.Counter[str]:
    with duckdb.connect(str(db), read_only=True) as con:
        return collections.Counter(line for (line,) in con.execute("SELECT line FROM events").fetchall())


def log_fds(pid: int, logs: Path) -> int:
    """Descriptors process ``pid`` holds open on files under ``logs``."""
    n = 0
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return 0
    for fd in names:
        try:
            n += os.readlink(f"/proc/{pid}/fd/{fd}").startswith(str(logs) + os.sep)
        except OSError:
            continue
    return n


def test_run_once_stores_every_line_of_more_files_than_the_open_file_limit(tmp_path):
    logs, db = tmp_path / "logs", tmp_path / "x.duckdb"
    logs.mkdir()
    want = collections.Counter()
    for i in range(1000):
        (logs / f"rank{i}.log").write_text(save_line(i, 1))
        want[save_line(i, 1).rstrip("\n")] += 1
    out = subprocess.run(ckptwatch("run", "--logs", logs, "--db", db, "--once"), capture_output=True, text=True,
                         preexec_fn=low_limit, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "Too many open files" not in out.stderr and "Traceback" not in out.stderr
    assert "1000 files, 1000 lines, 1000 events" in out.stderr
    assert stored(db) == want  # each line once
    with duckdb.connect(str(db), read_only=True) as con:
        offsets = dict(con.execute("SELECT file, committed_offset FROM sources").fetchall())
    assert offsets == {str(p): p.stat().st_size for p in logs.iterdir()}  # a re-run has nothing left to read


def test_tail_mode_follows_more_files_than_the_limit_through_appends_and_renames(tmp_path):
    logs, db = tmp_path / "logs", tmp_path / "x.duckdb"
    logs.mkdir()
    n = 600  # more than twice the limit itself; kept smaller than --once's 1,000 for the suite's time
    for i in range(n):
        (logs / f"rank{i}.log").write_text(save_line(i, 1))
    proc = subprocess.Popen(ckptwatch("run", "--logs", logs, "--db", db, "--interval", "0.1", "--until-idle", "1"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=low_limit)
    try:
        peak, deadline = 0, time.monotonic() + 60
        while peak < 100 and proc.poll() is None and time.monotonic() < deadline:  # reading has begun
            peak = max(peak, log_fds(proc.pid, logs))
            time.sleep(0.02)
        for i in range(n):  # a line more in every file, then half of them renamed away and created anew
            with (logs / f"rank{i}.log").open("a") as f:
                f.write(save_line(i, 2))
        for i in range(0, n, 2):
            (logs / f"rank{i}.log").rename(logs / f"rank{i}.log.1")
            (logs / f"rank{i}.log").write_text(save_line(i, 3))
        while proc.poll() is None:
            peak = max(peak, log_fds(proc.pid, logs))
            time.sleep(0.05)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "Too many open files" not in err and "Traceback" not in err
    assert 100 <= peak <= LIMIT - HEADROOM
    want = collections.Counter(save_line(i, k).rstrip("\n") for i in range(n) for k in (1, 2))
    want.update(save_line(i, 3).rstrip("\n") for i in range(0, n, 2))
    assert stored(db) == want


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def test_files_past_the_budget_are_reopened_and_followed_through_rename_and_copytruncate(tmp_path):
    """Four files open at most among thirty: a file closed to make room is opened again by
    path, found under its rotated name once renamed out of the pattern, and its truncation
    seen, with its copy read from where the original was left."""
    budget, n = 4, 30
    logs = [tmp_path / f"r{i}.log" for i in range(n)]
    for i, p in enumerate(logs):
        p.write_text(save_line(i, 1) + save_line(i, 2))
    w = SourceWatcher([str(tmp_path / "*.log")], max_open_files=budget, flush_after=1, watch_changes=False)
    got, held = [], []

    def poll(t: float, **kw: bool) -> None:
        got.append(w.poll(now=at(t), **kw))
        held.append(log_fds(os.getpid(), tmp_path))

    poll(0)
    for i, p in enumerate(logs):
        with p.open("a") as f:
            f.write(save_line(i, 3))
    poll(0.5)
    for i, p in enumerate(logs[:10]):  # renamed to a name the pattern does not take; the writer goes on there
        p.rename(f"{p}.1")
        with open(f"{p}.1", "a") as f:
            f.write(save_line(i, 4))
        p.write_text(save_line(i, 5))
    for i, p in enumerate(logs[10:20], start=10):  # copytruncate, a line written just before the copy
        with p.open("a") as f:
            f.write(save_line(i, 4))
        shutil.copyfile(p, f"{p}.1")
        with p.open("r+") as f:
            f.truncate(0)
        p.write_text(save_line(i, 5))
    poll(1)
    poll(3)
    poll(6, final=True)
    w.close()
    records = pl.concat(got)
    pairs = list(zip(records["source_id"], records["offset"], strict=True))
    assert len(pairs) == len(set(pairs))
    want = collections.Counter(save_line(i, k).rstrip("\n") for i in range(n) for k in (1, 2, 3))
    want.update(save_line(i, k).rstrip("\n") for i in range(20) for k in (4, 5))
    assert collections.Counter(records["line"].to_list()) == want
    assert max(held) <= budget and w.budget.evictions > 0
    assert w.stats.errors == []


OUT_OF_DESCRIPTORS = r"""
import os, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
from ckptwatch.ingest.handles import OpenFileLimitError
from ckptwatch.ingest.watcher import SourceWatcher

def hog(free):
    fds = []
    try:
        while True:
            fds.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        pass
    for _ in range(free):
        os.close(fds.pop())
    return fds

warm = SourceWatcher(sys.argv[1:2], watch_changes=False)  # polars' threads and the rest, before the hog
warm.poll(final=True)
warm.close()
for free in (2, 0):  # 2: fewer than the budget of 8 (EMFILE closes the least recently used); 0: none at all
    w = SourceWatcher(sys.argv[1:], max_open_files=8, watch_changes=False)
    fds = hog(free)
    try:
        lines = w.poll(final=True).height
        result = f"read {lines} lines, {len(w.stats.errors)} errors"
    except OpenFileLimitError as e:
        result = f"error {e}"
    for fd in fds:
        os.close(fd)
    w.close()
    print(result)
"""


def test_out_of_descriptors_closes_other_files_first_then_is_one_clear_error(tmp_path):
    files = []
    for i in range(6):
        files.append(tmp_path / f"rank{i}.log")
        files[-1].write_text(save_line(i, 1))
    out = subprocess.run([sys.executable, "-c", OUT_OF_DESCRIPTORS, *map(str, files)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    read, error = out.stdout.splitlines()
    assert read == "read 6 lines, 0 errors"  # never "cannot read: Too many open files", a file skipped
    assert error.startswith(f"error {files[0]}: cannot open: too many open files, and no other log file open to close")
    assert "the limit is 64 (ulimit -n)" in error and "raise it" in error


CLI_OUT_OF_DESCRIPTORS = r"""
import os, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))
from ckptwatch.ingest import watcher

poll, hog = watcher.SourceWatcher.poll, []

def poll_with_no_descriptor_left(self, **kw):  # the rest of the process took every descriptor
    if not hog:
        try:
            while True:
                hog.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            pass
    try:
        return poll(self, **kw)
    finally:
        while hog:
            os.close(hog.pop())

watcher.SourceWatcher.poll = poll_with_no_descriptor_left
from ckptwatch.cli import main
sys.argv = ["ckptwatch", *sys.argv[1:]]
main()
"""


def test_the_cli_says_out_of_descriptors_in_one_line(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "rank0.log").write_text(save_line(0, 1))
    out = subprocess.run([sys.executable, "-c", CLI_OUT_OF_DESCRIPTORS, "run", "--logs", str(logs),
                          "--db", str(tmp_path / "x.duckdb"), "--once"], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "CKPTWATCH_SINK_SNAPSHOT_EVERY": "0"})  # no thread wanting one meanwhile
    assert out.returncode == 2
    assert out.stderr.splitlines() == [
        f"error: {logs}: cannot open: too many open files, and no other log file open to close; the limit is 128 "
        "(ulimit -n): raise it (ulimit -n, LimitNOFILE= in systemd) or watch fewer files"]
