"""Symlinks in a watched directory (issue 35, item 6): one that leads out of the watched
paths is not read (one warning naming it), one that leads to a file inside is read once,
under the file's own name; a symlink beside a rotated log is not taken for its rotation."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import polars as pl

from ckptwatch.ingest import discovery
from ckptwatch.ingest.watcher import SourceWatcher

T0 = dt.datetime(2026, 11, 30, 10, 0, tzinfo=dt.timezone.utc)
SECRET = "[2026-11-30 10:00:09] rank0: successfully saved checkpoint from iteration 99 to /secret/root-password\n"


def save_line(it: int) -> str:
    return f"[2026-11-30 10:00:01] rank0: successfully saved checkpoint from iteration {it} to /ckpt/j/iter_{it:07d}\n"


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def layout(tmp_path: Path) -> tuple[Path, Path]:
    """``logs/`` with a real log, a link leading out to ``outside/secret.log``, and two links
    to the real log (one from a subdirectory); returns (logs, the real log)."""
    logs, outside = tmp_path / "logs", tmp_path / "outside"
    (logs / "sub").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret.log").write_text(SECRET)
    real = logs / "rank1.log"
    real.write_text(save_line(1))
    (logs / "shadow.log").symlink_to(outside / "secret.log")
    (logs / "a-current.log").symlink_to("rank1.log")  # listed before its target
    (logs / "sub" / "again.log").symlink_to("../rank1.log")
    (logs / "etc").symlink_to(outside)  # a directory leading out (the second attack round: skipped in silence)
    (logs / "sub-again").symlink_to("sub")  # and one inside: its target is walked anyway
    return logs, real


def test_run_once_does_not_read_a_symlink_leading_out_and_says_so_once(tmp_path):
    logs, real = layout(tmp_path)
    db = tmp_path / "x.duckdb"
    out = subprocess.run([sys.executable, "-m", "ckptwatch", "run", "--logs", str(logs), "--db", str(db), "--once"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    warned = [line for line in out.stderr.splitlines() if "symbolic link" in line]
    assert sorted(warned) == [
        f"warning: {logs / 'etc'}: a symbolic link to the directory {tmp_path / 'outside'}, outside the watched paths; "
        "not read",
        f"warning: {logs / 'shadow.log'}: a symbolic link to {tmp_path / 'outside' / 'secret.log'}, "
        "outside the watched paths; not read"]
    with duckdb.connect(str(db), read_only=True) as con:
        events = con.execute("SELECT line FROM events").fetchall()
        files = [f for (f,) in con.execute("SELECT file FROM sources").fetchall()]
    assert events == [(save_line(1).rstrip("\n"),)]  # the link inside read once, the one out not at all
    assert files == [str(real)]


def test_a_live_watcher_reads_a_link_inside_once_under_its_own_name_and_never_the_one_out(tmp_path):
    for mode in ("directory", "patterns"):
        logs, real = layout(tmp_path / mode)
        paths = [str(logs)] if mode == "directory" else [str(logs / "*.log"), str(logs / "sub" / "*.log")]
        w = SourceWatcher(paths, flush_after=1)
        got = [w.poll(now=at(0))]
        with real.open("a") as f:
            f.write(save_line(2))
        with (tmp_path / mode / "outside" / "secret.log").open("a") as f:
            f.write(SECRET)
        got += [w.poll(now=at(1)), w.poll(now=at(3)), w.poll(final=True, now=at(4))]
        w.close()
        records = pl.concat(got)
        assert records["line"].to_list() == [save_line(1).rstrip("\n"), save_line(2).rstrip("\n")], mode
        assert set(records["file"]) == {str(real)}
        out_dir = ([f"{logs / 'etc'}: a symbolic link to the directory {tmp_path / mode / 'outside'}, outside the "
                    "watched paths; not read"] if mode == "directory" else [])  # a pattern matches files only
        assert sorted(w.stats.errors) == out_dir + [
            f"{logs / 'shadow.log'}: a symbolic link to {tmp_path / mode / 'outside' / 'secret.log'}, "
            "outside the watched paths; not read"]


def test_discovery_roots_and_named_links(tmp_path):
    logs, real = layout(tmp_path)
    found = discovery.discover([str(logs)])
    assert sorted((f.path, f.error is None) for f in found) == [(str(logs / "etc"), False),
                                                                 (str(logs / "rank1.log"), True),
                                                                 (str(logs / "shadow.log"), False)]
    # a link named on the command line is the user's choice: read; and a second watched root
    # makes the target inside
    assert [f.real for f in discovery.discover([str(logs / "shadow.log")])] == [str(tmp_path / "outside" / "secret.log")]
    both = discovery.discover([str(logs), str(tmp_path / "outside")])
    assert sorted(f.path for f in both if f.error is None) == [str(logs / "rank1.log"), str(tmp_path / "outside" / "secret.log")]


def test_a_symlink_named_like_a_rotation_is_not_read_as_a_missed_generation(tmp_path):
    """After a truncation the watcher reads the rotated-name files written since (a
    generation that came and went between two polls): a symlink is none of them."""
    logs, outside = tmp_path / "logs", tmp_path / "outside"
    logs.mkdir()
    outside.mkdir()
    log = logs / "train.log"
    log.write_text(save_line(1) + save_line(2))
    w = SourceWatcher([str(logs / "*.log")], flush_after=1, watch_changes=False)
    got = [w.poll(now=at(0))]
    (outside / "secret.log").write_text(SECRET)  # written after the log: looks like a generation missed
    os.utime(outside / "secret.log", ns=(log.stat().st_mtime_ns + 10**9,) * 2)
    (logs / "train.log.1").symlink_to(outside / "secret.log")
    with log.open("r+") as f:  # truncated and written again
        f.truncate(0)
    log.write_text(save_line(3))
    got += [w.poll(now=at(1)), w.poll(final=True, now=at(3))]
    w.close()
    lines = pl.concat(got)["line"].to_list()
    assert lines == [save_line(k).rstrip("\n") for k in (1, 2, 3)]


def test_a_log_swapped_for_a_link_out_after_the_listing_is_not_opened(tmp_path, monkeypatch):
    """The race a writer of the directory can try: a plain log when listed, a link to a file
    outside by the time it is stat'ed and opened."""
    logs, outside = tmp_path / "logs", tmp_path / "outside"
    logs.mkdir()
    outside.mkdir()
    (outside / "secret.log").write_text(SECRET)
    log = logs / "rank1.log"
    log.write_text(save_line(1))
    listed = discovery.discover

    def discover_then_swap(paths, **kw):
        found = listed(paths, **kw)
        if log.exists() and not log.is_symlink():
            log.unlink()
            log.symlink_to(outside / "secret.log")
        return found

    monkeypatch.setattr("ckptwatch.ingest.watcher.discovery.discover", discover_then_swap)
    w = SourceWatcher([str(logs)], watch_changes=False)
    records = pl.concat([w.poll(final=True, now=at(0)), w.poll(final=True, now=at(1))])
    w.close()
    assert records.is_empty()
    assert w.stats.errors == [f"{log}: a symbolic link to {outside / 'secret.log'}, outside the watched paths; not read"]
