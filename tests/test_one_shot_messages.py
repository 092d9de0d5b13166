"""Honest one-shot runs (issue 35, item 8): ``run --once`` that finds nothing to read says so
and exits 2; a skipped line's warning goes to standard error, not into the report; an
error about a pasted log names ``<stdin>``, never the file it was spooled to."""

from __future__ import annotations

import subprocess
import sys


def cli(*args: object, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", "ckptwatch", *map(str, args)], capture_output=True, input=stdin,
                         timeout=60)
    out.stdout, out.stderr = out.stdout.decode(), out.stderr.decode()
    return out


def test_run_once_over_nothing_readable_exits_2_saying_so(tmp_path):
    empty, db = tmp_path / "empty", tmp_path / "x.duckdb"
    empty.mkdir()
    out = cli("run", "--logs", empty, "--db", db, "--once")
    assert out.returncode == 2
    assert f"error: nothing to read: no log file under {empty}" in out.stderr.splitlines()
    assert "Traceback" not in out.stderr
    (empty / "core.log").write_bytes(b"\x7fELF\x00\x00\x01" * 100)
    out = cli("run", "--logs", empty, "--db", db, "--once")
    assert out.returncode == 2
    assert f"error: nothing to read: no readable log file under {empty}" in out.stderr.splitlines()
    assert "binary data" in out.stderr
    (empty / "rank0.log").write_text("step 1\n")  # something to read: a clean run
    out = cli("run", "--logs", empty, "--db", db, "--once")
    assert out.returncode == 0, out.stderr
    help_text = " ".join(cli("run", "--help").stdout.replace("│", " ").split())
    assert "Exit code with --once: 0 everything read; 2 usage, config, input or database error, or nothing to read" in help_text


def test_a_skipped_long_line_is_warned_on_stderr_not_in_the_report(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("2026-11-30 10:00:00,000 INFO step 1\n" + "x" * (2 << 20) + "\n2026-11-30 10:00:01,000 INFO step 2\n")
    out = cli("diagnose", log)
    assert out.returncode == 0, out.stderr
    warning = f"warning: {log}: skipped 1 line(s) longer than 1048576 bytes"
    assert warning in out.stderr.splitlines()
    assert "longer than" not in out.stdout and "No incident found" in out.stdout
    assert "line_too_long 1" in out.stdout  # the count stays in the report's summary


def test_errors_about_a_pasted_log_name_stdin(tmp_path):
    out = cli("diagnose", "-", stdin=b"\x00\x01\x02 not a log")
    assert out.returncode == 2
    assert out.stderr.splitlines() == [
        "error: <stdin>: binary data (NUL bytes in the first 8 KiB), not a text log; skipped",
        "error: no readable log file in <stdin>",
    ]
    assert "ckptwatch-stdin-" not in out.stdout + out.stderr
    (tmp_path / "a.log").write_text("2026-11-30 10:00:00,000 INFO step 1\n")
    out = cli("diagnose", "-", tmp_path / "a.log", stdin=b"\x00\x01")
    assert out.returncode == 0, out.stderr
    assert "warning: <stdin>: binary data" in out.stderr and "ckptwatch-stdin-" not in out.stdout + out.stderr


def test_log_text_is_printed_as_written_never_as_emoji(tmp_path):
    """``:cat:`` in a log line came out as an emoji in every report (rich's emoji codes were
    on), and rich imported its emoji table lazily at the first print, which failed under a
    tiny open-file limit (the second attack round: a traceback from the snapshot thread)."""
    (tmp_path / "rank0.log").write_text("2026-11-30T10:00:01Z rank0: OSError: [Errno 28] No space left on device "
                                        ":cat: :100: while saving checkpoint /ckpt/j/step_10\n")
    out = subprocess.run([sys.executable, "-m", "ckptwatch", "diagnose", str(tmp_path)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 1, out.stderr  # an incident found
    assert "No space left on device :cat: :100: while saving" in out.stdout
    assert "\U0001f431" not in out.stdout and "\U0001f4af" not in out.stdout
