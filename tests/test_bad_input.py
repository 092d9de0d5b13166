"""Bad input: a clear message or a counted skip, never a traceback, and the good lines
around it still processed."""

from __future__ import annotations

import subprocess
import sys

from ckptwatch.pipeline import diagnose
from conftest import CORPUS

SIGKILL_RUN = CORPUS / "02-sigkill-mid-save" / "logs" / "attempt-1-train"


def cli(*args):
    return subprocess.run([sys.executable, "-m", "ckptwatch", *map(str, args)], capture_output=True, text=True)


def test_binary_file_invalid_utf8_and_huge_line_beside_real_logs(tmp_path, copy_scenario):
    logs = copy_scenario("02-sigkill-mid-save", "attempt-1-train")
    (logs / "core.dump.log").write_bytes(b"\x7fELF\x00\x00\x01" * 1000)
    rank2 = next(logs.rglob("attempt_0/2/stdout.log"))
    data = rank2.read_bytes()
    cut = data.index(b"[2026-11-30 10:21:21.111]")
    rank2.write_bytes(data[:cut] + b"\xff\xfe garbage \xc3\x28 line\n" + b"x" * (10 << 20) + b"\n" + data[cut:])
    incidents, stats = diagnose([str(logs)])
    assert [(i.kind, i.step, i.root_cause.rank) for i in incidents] == [("interrupted_save", 40, 2)]
    assert stats.invalid_utf8 == 1
    assert stats.skipped["line_too_long"] == 1
    assert stats.skipped["unreadable_file"] == 1
    assert any("core.dump.log: binary data" in e for e in stats.errors)
    assert any("stdout.log: 1 line(s) with invalid UTF-8" in e for e in stats.errors)
    out = cli("diagnose", logs)
    assert out.returncode == 1 and "Traceback" not in out.stderr + out.stdout
    assert "binary data" in out.stdout + out.stderr


def test_missing_path_empty_dir_and_broken_symlink(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "dangling.log").symlink_to(tmp_path / "gone.log")
    out = cli("diagnose", tmp_path / "nope")
    assert out.returncode == 2 and "nope: does not exist" in out.stderr
    out = cli("diagnose", tmp_path / "empty")
    assert out.returncode == 2 and "no readable log file" in out.stderr
    (tmp_path / "only").mkdir()
    (tmp_path / "only" / "x.log").write_bytes(b"\x00\x01" * 5000)
    out = cli("diagnose", tmp_path / "only")
    assert out.returncode == 2 and "binary data" in out.stderr and "no readable log file" in out.stderr
    (tmp_path / "blank").mkdir()
    for name in ("rank0.log", "rank1.log"):
        (tmp_path / "blank" / name).write_text("")
    out = cli("diagnose", tmp_path / "blank")  # not "No incident found", exit 0: nothing was read
    assert out.returncode == 2 and "no line to read: the 2 file(s)" in out.stderr and "are empty" in out.stderr
    out = cli("diagnose", tmp_path / "dangling.log", SIGKILL_RUN)
    assert out.returncode == 1, out.stderr
    assert "dangling.log: does not exist" in out.stderr + out.stdout
    for o in (out,):
        assert "Traceback (most recent call last)" not in o.stderr


def test_usage_errors_are_one_line(tmp_path):
    out = cli("diagnose", "--path-template", "{job}/{nope}.log", SIGKILL_RUN)
    assert out.returncode == 2 and "unknown field(s) ['nope']" in out.stderr
    out = cli("diagnose", "--path-template", "{job", SIGKILL_RUN)
    assert out.returncode == 2 and "unbalanced" in out.stderr
    out = cli("run", "--logs", tmp_path / "missing", "--db", tmp_path / "x.duckdb", "--once")
    assert out.returncode == 2 and "not a directory" in out.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules: [")
    out = cli("diagnose", "--rules", bad, SIGKILL_RUN)
    assert out.returncode == 2 and f"{bad}: invalid YAML" in out.stderr


def test_absurd_and_missing_timestamps_do_not_stop_the_pipeline(tmp_path):
    log = tmp_path / "job" / "rank0.log"
    log.parent.mkdir()
    log.write_text(
        "9999-99-99 99:99:99,999 INFO [rank0/1] train: saving checkpoint step 10 to /c/step_10\n"
        "saved checkpoint step 10 (0.1s)\n"
        "0000-00-00 00:00:00,000 INFO nothing\n"
    )
    incidents, stats = diagnose([str(log)])
    assert incidents == [] and stats.events == 2 and stats.errors == []


# -- issue 14: hostile config files and rule packs end the command with one line and exit 2

def _one_error_line(out) -> str:
    assert "Traceback" not in out.stderr, out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, out.stderr
    return errors[0]


def test_hostile_config_files_exit_2_with_file_and_key(tmp_path):
    cases = {
        "inf.toml": (b"[metrics]\nport = 1e400\n", "[metrics] port: expected int, got inf"),
        "range.toml": (b"[detect]\nallowed_lateness = 1e300\n", "[detect] allowed_lateness: must be at most"),
        "latin1.toml": (b"[detect]\ngroup = 'caf\xe9'\n", "not UTF-8 text (line 2, byte 0xe9)"),
        "deep.toml": (b"[detect]\ngroup = " + b"[" * 5000 + b"]" * 5000 + b"\n", "nested too deeply"),
        "hex.toml": (b"[kafka]\npartitions = 0x" + b"f" * 5000 + b"\n", "[kafka] partitions: must be at most 100000"),
    }
    for name, (raw, reason) in cases.items():
        path = tmp_path / name
        path.write_bytes(raw)
        for args in (["detect", "--config", path], ["run", "--config", path, "--logs", tmp_path, "--db",
                                                    tmp_path / "x.duckdb", "--once"]):
            out = cli(*args)
            assert out.returncode == 2, (name, out.stderr)
            line = _one_error_line(out)
            assert line.startswith(f"error: {path}: ") and reason in line, (name, line)


def test_hostile_rule_packs_exit_2_naming_file_and_rule(tmp_path):
    rule = ("rules:\n  - id: mine.r\n    event: save_start\n    prefilter: saving\n"
            "    pattern: 'saving step (?P<step>\\d+) to (?P<path>\\S+)'\n"
            "    examples: {match: ['saving step 5 to /c']}\n")
    cases = {
        "date_key.yaml": (rule + "    attrs: {2024-01-01: x}\n", "rule mine.r: 'attrs' key 2024-01-01: a date"),
        "date_value.yaml": (rule + "    attrs: {since: 2024-01-01}\n", "rule mine.r: 'attrs' since: a date"),
        "width.yaml": (rule + "    path_format: '{step:300000000d}'\n", "rule mine.r: 'path_format'"),
        "redos.yaml": (rule.replace("saving step (?P<step>\\d+) to (?P<path>\\S+)", "saving (\\w+\\s?)*"),
                       "rule mine.r: nested unbounded repetition"),
    }
    for name, (text, reason) in cases.items():
        path = tmp_path / name
        path.write_text(text)
        for args in (["diagnose", "--rules", path, SIGKILL_RUN],
                     ["run", "--rules", path, "--logs", tmp_path, "--db", tmp_path / "y.duckdb", "--once"]):
            out = cli(*args)
            assert out.returncode == 2, (name, out.stderr)
            line = _one_error_line(out)
            assert line.startswith(f"error: {path}: ") and reason in line, (name, line)
