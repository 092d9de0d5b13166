"""What a first user broke (each case once hung, crashed or said ok): an empty checkpoint
directory, a FIFO where a manifest should be, a manifest nested too deeply, a diff side
that cannot be listed. Each ends with one line and the documented exit code."""

from __future__ import annotations

import os

import pytest
from integrity_support import copy_checkpoint, run_cli

from ckptwatch.integrity.api import ResumeRefused, guard_resume


def test_an_empty_directory_is_incomplete_and_never_a_resume_target(tmp_path):
    empty = tmp_path / "checkpoint-80"
    empty.mkdir()
    r = run_cli("verify", empty)
    assert r.returncode == 1 and "empty: the directory holds no file" in r.stdout and "INCOMPLETE" in r.stdout
    r = run_cli("manifest", empty)
    assert (r.returncode, r.stderr.strip()) == (2, f"error: {empty}: no manifest written: the directory holds no file")
    with pytest.raises(ResumeRefused, match=f"refusing to resume from {empty}: incomplete"):
        guard_resume(empty, emit=lambda line: None)


def test_a_fifo_as_manifest_is_refused_not_waited_on(tmp_path):
    ckpt = copy_checkpoint(tmp_path / "checkpoint-60")
    fifo = tmp_path / "m.fifo"
    os.mkfifo(fifo)
    r = run_cli("verify", ckpt, "--manifest", fifo, timeout=30)
    assert (r.returncode, r.stderr.strip()) == (2, f"error: {fifo}: not a regular file: not read")
    os.mkfifo(ckpt / "ckptwatch-manifest.json")  # the one verify reads by default
    r = run_cli("verify", ckpt, timeout=30)
    assert r.returncode == 1 and "bad_manifest" in r.stdout and "not a regular file" in r.stdout


def test_a_manifest_nested_too_deeply_is_damaged_not_a_crash(tmp_path):
    ckpt = copy_checkpoint(tmp_path / "checkpoint-60")
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    r = run_cli("verify", ckpt, "--manifest", deep)
    assert (r.returncode, r.stderr.strip()) == (2, f"error: {deep}: damaged: JSON nested too deeply")


def test_a_missing_manifest_file_does_not_suggest_hashing_its_parent(tmp_path):
    ckpt = copy_checkpoint(tmp_path / "checkpoint-60")
    r = run_cli("verify", ckpt, "--manifest", tmp_path / "nope.json")
    assert (r.returncode, r.stderr.strip()) == (2, f"error: {tmp_path / 'nope.json'}: no manifest")


def test_diff_with_a_side_that_cannot_be_listed_is_one_line(tmp_path):
    ckpt = copy_checkpoint(tmp_path / "checkpoint-60")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0)
    try:
        r = run_cli("manifest", "diff", locked, ckpt)
    finally:
        locked.chmod(0o755)
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "Traceback" not in r.stderr
    assert "ermission denied" in r.stderr


def test_a_changed_file_of_unknown_format_is_not_told_to_write_a_manifest(tmp_path):
    ckpt = copy_checkpoint(tmp_path / "checkpoint-60")
    (ckpt / "notes.dat").write_text("hello\n")
    assert run_cli("manifest", ckpt).returncode == 0
    (ckpt / "notes.dat").write_text("hellx\n")
    r = run_cli("verify", ckpt)
    lines = [x for x in r.stdout.splitlines() if "notes.dat" in x]
    assert r.returncode == 1 and len(lines) == 1 and "hash_mismatch" in lines[0], r.stdout
