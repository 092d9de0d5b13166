"""``ckptwatch manifest`` / ``manifest diff`` / ``verify`` through the real CLI: verdicts, paths
and exit codes on a real checkpoint damaged the way the corpus damaged it, and one-line errors
(never a traceback) for what cannot be checked."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from integrity_support import DELETED, SHARD, copy_checkpoint, flip_middle_byte, run_cli, truncate_half
from typer.testing import CliRunner

from ckptwatch.cli import app
from ckptwatch.integrity.manifest import MANIFEST_NAME, create_manifest

runner = CliRunner()


def cli(*args: object):
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "300"})


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    return copy_checkpoint(tmp_path / "checkpoint-60")


def lines(text: str) -> list[str]:
    return [" ".join(line.split()) for line in text.splitlines() if line.strip()]


def test_manifest_then_verify_ok(ckpt):
    r = cli("manifest", ckpt)
    assert r.exit_code == 0, r.output
    assert lines(r.stdout)[0].startswith(f"wrote {ckpt / MANIFEST_NAME}: 15 files, 280,585 bytes, step 60, "
                                         "world size 4 (DCP .metadata)")
    r = cli("verify", ckpt)
    assert r.exit_code == 0, r.output
    out = lines(r.stdout)
    assert len(out) == 1 and out[0].startswith(f"OK {ckpt}: 15 ok; 15 files, 280,585 bytes read in")
    assert f"manifest {ckpt / MANIFEST_NAME} written " in out[0] and "step 60, world size 4" in out[0]


def test_options_may_come_before_the_directory(ckpt):
    r = cli("manifest", "--world-size", "8", "--step", "61", ckpt)
    assert r.exit_code == 0, r.output
    assert "step 61, world size 8 (given)" in r.stdout


@pytest.mark.parametrize(("damage", "verdict", "path", "problem", "code"), [
    ("bitflip", "corrupt", SHARD, "hash_mismatch", 1),
    ("truncate", "incomplete", SHARD, "truncated", 1),
    ("delete", "incomplete", DELETED, "missing", 1),
    ("extra", "note", "notes.txt", "extra", 0),
])
def test_verify_names_the_damaged_file_with_its_verdict_and_exit_code(ckpt, damage, verdict, path, problem, code):
    assert cli("manifest", ckpt).exit_code == 0
    {"bitflip": lambda: flip_middle_byte(ckpt / SHARD), "truncate": lambda: truncate_half(ckpt / SHARD),
     "delete": lambda: (ckpt / DELETED).unlink(),
     "extra": lambda: (ckpt / "notes.txt").write_text("x")}[damage]()
    r = cli("verify", ckpt)
    assert r.exit_code == code, r.output
    out = lines(r.stdout)
    assert out[0].startswith(f"{verdict} {path} {problem}: "), out
    if damage == "bitflip":  # the shard's own structure catches it too: a CRC-32 of the tensor's zip entry
        assert out.pop(1).startswith(f"corrupt {path} crc_mismatch: ")
    overall = "OK" if verdict == "note" else verdict.upper()
    assert len(out) == 2 and out[1].startswith(f"{overall} {ckpt}: ")


def test_verify_json_is_the_whole_report(ckpt):
    cli("manifest", ckpt)
    flip_middle_byte(ckpt / SHARD)
    (ckpt / DELETED).unlink()
    r = cli("verify", "--json", ckpt)
    assert r.exit_code == 1
    doc = json.loads(r.stdout)
    assert doc["verdict"] == "corrupt" and doc["checkpoint"] == str(ckpt)
    assert doc["manifest"]["step"] == 60 and doc["manifest"]["world_size"] == 4
    assert doc["counts"] == {"ok": 13, "unverifiable": 0, "incomplete": 1, "corrupt": 1}
    assert doc["totals"]["files"] == 14 and doc["totals"]["bytes"] == 280_585 - 16_246
    files = {f["path"]: f for f in doc["files"]}
    assert len(files) == 15
    assert [(f["verdict"], f["problem"]) for f in files[SHARD]["findings"]] == [("corrupt", "hash_mismatch"),
                                                                                ("corrupt", "crc_mismatch")]
    assert files[DELETED]["verdict"] == "incomplete" and files[DELETED]["size"] is None
    assert files["trainer_state.json"]["findings"] == [] and len(files["trainer_state.json"]["sha256"]) == 64


def test_verify_all_lists_every_file(ckpt):
    cli("manifest", ckpt)
    r = cli("verify", "--all", ckpt)
    assert r.exit_code == 0
    out = lines(r.stdout)
    assert len(out) == 16 and "ok trainer_state.json (json, 797 bytes)" in out and out[-1].startswith("OK ")


def test_manifest_diff_of_directories_and_manifest_files(ckpt, tmp_path):
    other = copy_checkpoint(tmp_path / "checkpoint-60.copy")
    cli("manifest", ckpt)
    r = cli("manifest", "diff", ckpt, other)  # B has no manifest: hashed now
    assert r.exit_code == 0, r.output
    assert "hashing its files now" in r.stderr and lines(r.stdout)[0].startswith("same: 15 files, 280,585 bytes")
    flip_middle_byte(other / SHARD)
    (other / DELETED).unlink()
    (other / "extra.bin").write_bytes(b"1")
    cli("manifest", other)
    r = cli("manifest", "diff", ckpt / MANIFEST_NAME, other / MANIFEST_NAME)
    assert r.exit_code == 1, r.output
    out = lines(r.stdout)
    assert out[0].startswith(f"hash changed {SHARD} (16,246 bytes, sha256 ")
    assert out[1:3] == [f"only in A {DELETED}", "only in B extra.bin"]
    assert out[3].startswith("differ: 3 of 16 files. A: checkpoint-60 (step 60, manifest written ")
    r = cli("manifest", "diff", "--json", ckpt, other)
    assert r.exit_code == 1
    assert json.loads(r.stdout) == {"same": False, "added": ["extra.bin"], "removed": [DELETED],
                                    "size_changed": [], "hash_changed": [SHARD]}
    r = cli("manifest", "diff", ckpt, tmp_path / "nope")
    assert r.exit_code == 2 and lines(r.stderr) == [f"error: {tmp_path / 'nope'}: does not exist"]


def test_manifest_help_documents_both_forms():
    r = cli("manifest", "--help")
    assert r.exit_code == 0
    text = " ".join(r.stdout.split())
    assert "ckptwatch manifest DIR [--world-size N] [--step N]" in text and "ckptwatch manifest diff A B" in text


def test_explicit_damaged_manifest_is_a_one_line_usage_error(ckpt, tmp_path):
    bad = tmp_path / "m.json"
    bad.write_text('{"ckptwatch_manifest": 1, "created": "2026-11-30T10:00:00Z", "checkpoint": "c", "files": 3}')
    r = cli("verify", "--manifest", bad, ckpt)
    assert r.exit_code == 2 and lines(r.stderr) == [f"error: {bad}: files: missing or not a list"]


# Real processes: exit codes and one-line errors as a user sees them (file modes enforced even as root).

def test_nonexistent_directory_is_exit_2_one_line(tmp_path):
    p = run_cli("verify", tmp_path / "nope")
    assert p.returncode == 2 and p.stdout == ""
    assert lines(p.stderr) == [f"error: {tmp_path / 'nope'}: does not exist"]
    r = cli("manifest", tmp_path / "nope")
    assert r.exit_code == 2 and lines(r.stderr) == [f"error: {tmp_path / 'nope'}: does not exist"]


def test_permission_denied_directory_is_exit_2_one_line(ckpt):
    ckpt.chmod(0)
    try:
        p = run_cli("verify", ckpt)
        assert p.returncode == 2, p.stderr
        assert lines(p.stderr) == [f"error: {ckpt}: cannot list the directory: permission denied"]
    finally:
        ckpt.chmod(0o755)


def test_unreadable_file_is_unverifiable_and_blocks_the_manifest(ckpt):
    create_manifest(ckpt)
    (ckpt / SHARD).chmod(0)
    p = run_cli("verify", ckpt)
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert lines(p.stdout)[0] == f"unverifiable {SHARD} permission_denied: cannot be read: Permission denied"
    before = (ckpt / MANIFEST_NAME).read_bytes()
    p = run_cli("manifest", ckpt)
    assert p.returncode == 2 and p.stdout == ""
    assert lines(p.stderr) == [f"error: {ckpt}: no manifest written: 1 file(s) could not be hashed: "
                               f"{SHARD} (cannot be read: Permission denied)"]
    assert (ckpt / MANIFEST_NAME).read_bytes() == before


def test_read_only_checkpoint_directory_cannot_get_a_manifest(ckpt):
    ckpt.chmod(0o555)
    try:
        p = run_cli("manifest", ckpt)
    finally:
        ckpt.chmod(0o755)
    assert p.returncode == 2
    assert lines(p.stderr) == [f"error: {ckpt / MANIFEST_NAME}: cannot write the manifest: Permission denied"]
    assert sorted(x.name for x in ckpt.iterdir() if "manifest" in x.name) == []


def test_symlink_loop_is_a_finding_not_a_traceback(ckpt):
    create_manifest(ckpt)
    os.symlink("b", ckpt / "a")
    os.symlink("a", ckpt / "b")
    p = run_cli("verify", ckpt)
    assert p.returncode == 1 and p.stderr == ""
    out = lines(p.stdout)
    assert out[:2] == ["incomplete a symlink_loop: symlink loop (a -> b -> ...): never reaches a file",
                       "incomplete b symlink_loop: symlink loop (b -> a -> ...): never reaches a file"]
    assert out[2].startswith(f"INCOMPLETE {ckpt}: 2 incomplete, 15 ok; 15 files")


def test_manifest_diff_rehash_compares_the_bytes_on_disk_not_copied_manifests(ckpt, tmp_path):
    """Issue 17, "hash or size differs across saves of identical state": a damaged copy that
    carries the original's manifest diffs as the same by manifest, and differs with --rehash."""
    cli("manifest", ckpt)
    other = copy_checkpoint(tmp_path / "checkpoint-60.copy")
    (other / MANIFEST_NAME).write_bytes((ckpt / MANIFEST_NAME).read_bytes())  # the manifest copied along
    flip_middle_byte(other / SHARD)
    by_manifest = cli("manifest", "diff", ckpt, other)
    assert by_manifest.exit_code == 0 and lines(by_manifest.stdout)[0].startswith("same: 15 files")
    r = cli("manifest", "diff", "--rehash", ckpt, other)
    assert r.exit_code == 1, r.output
    assert lines(r.stdout)[0].startswith(f"hash changed {SHARD} (16,246 bytes, sha256 ")
    assert "A: checkpoint-60 (step 60, hashed now); B: checkpoint-60.copy (step 60, hashed now)" in r.stdout
    assert r.stderr.count("--rehash: hashing its files now") == 2
    r = cli("manifest", "diff", "--rehash", ckpt / MANIFEST_NAME, other / MANIFEST_NAME)  # manifests stand for dirs
    assert r.exit_code == 1
    r = cli("manifest", "diff", "--rehash", ckpt, tmp_path / "nope")
    assert r.exit_code == 2 and lines(r.stderr)[-1] == \
        f"error: {tmp_path / 'nope'}: --rehash compares the bytes on disk: give a checkpoint directory"
