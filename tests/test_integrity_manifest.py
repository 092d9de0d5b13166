"""Manifests, hashing and verify on a real checkpoint (the corpus' 01-clean checkpoint-60),
damaged the way the corpus' scenario 07 damaged it."""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import os
import threading
from pathlib import Path

import pytest
from integrity_support import CHECKPOINT, DELETED, SHARD, copy_checkpoint, flip_middle_byte, truncate_half

from ckptwatch import atomic
from ckptwatch.integrity.errors import IntegrityError, ManifestError
from ckptwatch.integrity.hashing import hash_file, hash_files
from ckptwatch.integrity.manifest import (MANIFEST_NAME, ManifestFile, create_manifest, diff, infer_world_size,
                                          read_manifest, step_from_name, write_manifest)
from ckptwatch.integrity.verify import verify

FILES = sorted(p.relative_to(CHECKPOINT).as_posix() for p in CHECKPOINT.rglob("*") if p.is_file())


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    return copy_checkpoint(tmp_path / "checkpoint-60")


def sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def by_path(report) -> dict:
    return {r.path: r for r in report.files}


def test_manifest_records_every_file_with_its_hash_step_and_world_size(ckpt):
    m, _ = create_manifest(ckpt)
    assert (ckpt / MANIFEST_NAME).is_file()
    back = read_manifest(ckpt / MANIFEST_NAME)
    assert back == m
    assert sorted(m.files) == FILES and MANIFEST_NAME not in m.files
    assert all(m.files[p].sha256 == sha256(ckpt / p) and m.files[p].size == (ckpt / p).stat().st_size for p in FILES)
    assert (m.checkpoint, m.step, m.world_size) == ("checkpoint-60", 60, 4)
    assert m.created.endswith("Z") and m.files[SHARD].format == "dcp_shard"
    doc = json.loads((ckpt / MANIFEST_NAME).read_text())
    assert doc["ckptwatch_manifest"] == 1 and doc["totals"] == {"files": len(FILES), "bytes": m.total_bytes}
    # writing it again does not list the manifest itself
    assert sorted(create_manifest(ckpt)[0].files) == FILES


@pytest.mark.parametrize(("name", "step"), [
    ("checkpoint-40", 40), ("iter_0000040", 40), ("global_step40", 40), ("step_0000040", 40),
    ("step-7", 7), ("checkpoint-60.missing-shard", 60), ("latest", None), ("checkpoint-", None), ("my_iter_5", None),
])
def test_step_comes_from_the_directory_name(name, step):
    assert step_from_name(name) == step


def test_world_size_from_shard_and_rank_files():
    def files(*paths: str, fmt: str = "unknown", facts: dict | None = None) -> dict[str, ManifestFile]:
        return {p: ManifestFile(p, 1, "0" * 64, fmt, facts or {}) for p in paths}

    assert infer_world_size(files("m/__0_0.distcp", "m/__1_0.distcp", "m/__1_1.distcp", "o/__0_0.distcp")) == (
        2, "DCP shard files (__R_I.distcp)")
    ds = files(*(f"global_step40/bf16_zero_pp_rank_{d}_mp_rank_0{m}_optim_states.pt" for d in range(4) for m in range(2)),
               "global_step40/mp_rank_00_model_states.pt")
    assert infer_world_size(ds) == (8, "DeepSpeed zero_pp_rank_*_mp_rank_* files")
    assert infer_world_size(files("rng_state_0.pth", "rng_state_1.pth")) == (2, "HF rng_state_R.pth files")
    meta = files("m/.metadata", fmt="dcp_metadata", facts={"ranks": [0, 3, 15]}) | files("m/__0_0.distcp")
    assert infer_world_size(meta) == (16, "DCP .metadata")
    assert infer_world_size(files("model.safetensors")) == (None, None)


def test_world_size_and_step_arguments_win(ckpt):
    m, _ = create_manifest(ckpt, world_size=8, step=61)
    assert (m.world_size, m.world_size_source, m.step) == (8, "given", 61)


def test_verify_clean_checkpoint_against_its_manifest_is_ok(ckpt):
    create_manifest(ckpt)
    report = verify(ckpt, workers=2)
    assert report.verdict == "ok", [f.to_json() for r in report.problems for f in r.findings]
    assert report.total_files == len(FILES) and report.total_bytes == sum((ckpt / p).stat().st_size for p in FILES)
    assert report.problems == [] and all(r.in_manifest for r in report.files)


def test_bit_flip_in_a_shard_is_corrupt_hash_mismatch(ckpt):
    m, _ = create_manifest(ckpt)
    flip_middle_byte(ckpt / SHARD)
    report = verify(ckpt)
    assert report.verdict == "corrupt"
    r = by_path(report)[SHARD]
    assert r.verdict == "corrupt" and r.findings[0].problem == "hash_mismatch"
    assert f"written {m.created}" in r.findings[0].detail and "same size 16246 bytes" in r.findings[0].detail
    assert [p.path for p in report.problems] == [SHARD]


def test_truncated_shard_is_incomplete(ckpt):
    create_manifest(ckpt)
    truncate_half(ckpt / SHARD)
    report = verify(ckpt)
    r = by_path(report)[SHARD]
    assert report.verdict == "incomplete" and r.verdict == "incomplete"
    assert r.findings[0].problem == "truncated" and "8123 bytes on disk, 16246 in the manifest" in r.findings[0].detail


def test_deleted_shard_is_incomplete_missing(ckpt):
    create_manifest(ckpt)
    (ckpt / DELETED).unlink()
    report = verify(ckpt)
    r = by_path(report)[DELETED]
    assert report.verdict == "incomplete" and r.verdict == "incomplete" and r.size is None
    assert r.findings[0].problem == "missing" and "16246 bytes" in r.findings[0].detail


def test_grown_file_is_corrupt_size_changed(ckpt):
    create_manifest(ckpt)
    with open(ckpt / "trainer_state.json", "a") as f:
        f.write(" ")
    r = by_path(verify(ckpt))["trainer_state.json"]
    assert (r.verdict, r.findings[0].problem) == ("corrupt", "size_changed")


def test_extra_file_is_a_note_and_does_not_fail_the_checkpoint(ckpt):
    create_manifest(ckpt)
    (ckpt / "notes.txt").write_text("copied by hand\n")
    report = verify(ckpt)
    r = by_path(report)["notes.txt"]
    assert report.verdict == "ok" and r.verdict == "ok" and r.in_manifest is False
    assert [f.problem for f in r.findings] == ["extra"] and [p.path for p in report.problems] == ["notes.txt"]


def test_leftover_manifest_temp_file_is_not_part_of_the_checkpoint(ckpt):
    create_manifest(ckpt)
    (ckpt / ".ckptwatch-manifest.json.k3j2.tmp").write_text('{"ckptwatch_manifest": 1, "crea')  # a crash mid-write
    assert verify(ckpt).problems == []


@pytest.mark.parametrize("fail_at", ["write", "fsync", "replace"])
def test_manifest_is_whole_or_absent_when_writing_fails(ckpt, monkeypatch, fail_at):
    m, _ = create_manifest(ckpt, write=False)

    def enospc(*args, **kw):
        if fail_at == "write":  # half of the document reaches the disk, then the disk is full
            os.write(args[0], args[1][: len(args[1]) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    def attempt() -> None:
        with monkeypatch.context() as mp:
            if fail_at == "write":
                mp.setattr(atomic, "write_bytes", enospc)
            else:
                mp.setattr(os, fail_at, enospc)
            with pytest.raises(ManifestError, match=f"{MANIFEST_NAME}: cannot write the manifest: No space left"):
                write_manifest(ckpt, m)

    def leftovers() -> list[str]:
        return sorted(p.name for p in ckpt.iterdir() if "ckptwatch-manifest" in p.name)

    attempt()
    assert leftovers() == []  # no manifest, no temporary file
    write_manifest(ckpt, m)
    before = (ckpt / MANIFEST_NAME).read_bytes()
    m.step = 61
    attempt()
    assert leftovers() == [MANIFEST_NAME] and (ckpt / MANIFEST_NAME).read_bytes() == before  # the old one, whole


@pytest.mark.parametrize(("content", "message"), [
    (None, r"damaged: not valid JSON at line \d+ column \d+"),  # torn: the first half of a real manifest
    ("[1, 2]", "document: not a JSON object"),
    ('{"created": "x"}', "ckptwatch_manifest: missing or not an integer: not a ckptwatch manifest"),
    ("VERSION", "ckptwatch_manifest: version 99 was written by a newer ckptwatch"),
    ("SHA", r"files\[3\]\.sha256: 'zz' is not 64 lowercase hex digits \(optimizer_0/__2_0.distcp\)"),
    ("SIZE", r"files\[0\]\.size: -1 is not a size in bytes"),
    ("PATH", r"files\[1\]\.path: '../x' is not a relative path inside the checkpoint"),
    (b"\xff\xfe{", r"not a ckptwatch manifest \(not UTF-8 at byte 0\)"),
])
def test_damaged_manifest_names_file_and_field(ckpt, content, message):
    create_manifest(ckpt)
    path = ckpt / MANIFEST_NAME
    good = path.read_text()
    doc = json.loads(good)
    if content is None:
        content = good[: len(good) // 2]
    elif content == "VERSION":
        content = json.dumps({**doc, "ckptwatch_manifest": 99})
    elif content in ("SHA", "SIZE", "PATH"):
        i, key, value = {"SHA": (3, "sha256", "zz"), "SIZE": (0, "size", -1), "PATH": (1, "path", "../x")}[content]
        doc["files"][i][key] = value
        content = json.dumps(doc)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ManifestError, match=message) as e:
        read_manifest(path)
    assert str(e.value).startswith(str(path) + ": ")


def test_damaged_manifest_in_the_checkpoint_is_a_corrupt_finding_and_the_rest_is_still_checked(ckpt):
    create_manifest(ckpt)
    path = ckpt / MANIFEST_NAME
    path.write_bytes(path.read_bytes()[:100])
    report = verify(ckpt)
    r = by_path(report)[MANIFEST_NAME]
    assert report.verdict == "corrupt" and r.findings[0].problem == "bad_manifest" and report.manifest is None
    assert len(report.files) == len(FILES) + 1


def test_diff_names_added_removed_resized_and_rewritten_files(ckpt, tmp_path):
    a, _ = create_manifest(ckpt)
    other = copy_checkpoint(tmp_path / "checkpoint-60-again")
    b, _ = create_manifest(other)
    assert diff(a, b).same  # the same bytes saved twice
    flip_middle_byte(other / SHARD)
    truncate_half(other / "trainer_state.json")
    (other / DELETED).unlink()
    (other / "extra.bin").write_bytes(b"\0" * 10)
    b, _ = create_manifest(other)
    d = diff(a, b)
    assert not d.same
    assert (d.added, d.removed, d.hash_changed) == (["extra.bin"], [DELETED], [SHARD])
    assert d.size_changed == [("trainer_state.json", 797, 398)]
    assert d.to_json()["size_changed"] == [{"path": "trainer_state.json", "a": 797, "b": 398}]


def test_hash_files_in_parallel_matches_hashlib_and_reports_progress_in_bytes(ckpt):
    seen: list[int] = []
    lock = threading.Lock()

    def progress(n: int) -> None:
        with lock:
            seen.append(n)

    out = hash_files(ckpt, FILES, workers=3, chunk_size=4096, progress=progress)
    assert list(out) == FILES
    assert all(r.ok and r.sha256 == sha256(ckpt / p) for p, (r, _) in out.items())
    assert sum(seen) == sum((ckpt / p).stat().st_size for p in FILES) and max(seen) <= 4096


def test_file_appended_to_while_being_hashed_is_reported_not_hashed(tmp_path):
    p = tmp_path / "__0_0.distcp"
    p.write_bytes(os.urandom(4096))
    first_chunk, appended = threading.Event(), threading.Event()

    def writer() -> None:  # a rank still writing its shard
        first_chunk.wait(5)
        with open(p, "ab") as f:
            f.write(os.urandom(1024))
        appended.set()

    t = threading.Thread(target=writer)
    t.start()

    def progress(n: int) -> None:
        if not first_chunk.is_set():
            first_chunk.set()
            appended.wait(5)

    r = hash_file(p, chunk_size=64, progress=progress)
    t.join()
    assert (r.problem, r.sha256) == ("changed_while_hashing", None)
    assert "5120 bytes read but it had 4096 at open" in r.detail and "size 4096 -> 5120 bytes" in r.detail


def test_file_replaced_by_rename_while_being_hashed_is_reported(tmp_path):
    p = tmp_path / "model.safetensors"
    p.write_bytes(b"a" * 1000)
    done = []

    def progress(n: int) -> None:
        if not done:
            (tmp_path / "new").write_bytes(b"b" * 1000)
            os.replace(tmp_path / "new", p)
            done.append(1)

    r = hash_file(p, chunk_size=100, progress=progress)
    assert r.problem == "changed_while_hashing" and "replaced by rename" in r.detail


def test_verify_reports_a_shard_still_being_written(ckpt):
    create_manifest(ckpt)
    # one worker hashes the largest file first: a rank appends to it while it is read
    largest = max(FILES, key=lambda p: (ckpt / p).stat().st_size)
    reading, appended = threading.Event(), threading.Event()

    def writer() -> None:
        reading.wait(5)
        with open(ckpt / largest, "ab") as f:
            f.write(b"\0" * 300)
        appended.set()

    def progress(n: int) -> None:
        if not reading.is_set():
            reading.set()
            appended.wait(5)

    t = threading.Thread(target=writer)
    t.start()
    report = verify(ckpt, workers=1, chunk_size=256, progress=progress)
    t.join()
    r = by_path(report)[largest]
    assert (r.verdict, r.sha256, [f.problem for f in r.findings]) == ("unverifiable", None, ["changed_while_hashing"])
    assert report.verdict == "unverifiable" and [p.path for p in report.problems] == [largest]


def test_unreadable_vanished_and_fifo_files_are_results_not_exceptions(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    out = hash_files(tmp_path, ["pipe", "gone"], workers=2)
    assert out["pipe"][0].problem == "not_regular"  # never opened: reading a FIFO would block
    assert out["gone"][0].problem == "vanished"


def test_symlinks_loops_dangling_outside_are_findings_not_crashes(ckpt, tmp_path):
    create_manifest(ckpt)
    (tmp_path / "elsewhere.bin").write_bytes(b"x")
    os.symlink("loop_b", ckpt / "loop_a")
    os.symlink("loop_a", ckpt / "loop_b")
    os.symlink("rng_state_9.pth", ckpt / "dangling")
    os.symlink(tmp_path / "elsewhere.bin", ckpt / "outside")
    os.symlink(".", ckpt / "optimizer_0" / "self")  # a directory loop: never descended
    os.symlink("trainer_state.json", ckpt / "state-link.json")  # inside: read through the link
    report = verify(ckpt)
    got = {r.path: (r.verdict, [f.problem for f in r.findings]) for r in report.problems}
    assert got == {
        "loop_a": ("incomplete", ["symlink_loop"]), "loop_b": ("incomplete", ["symlink_loop"]),
        "dangling": ("incomplete", ["dangling_symlink"]), "outside": ("unverifiable", ["symlink_outside"]),
        "optimizer_0/self": ("ok", ["symlink_dir"]), "state-link.json": ("ok", ["extra"]),
    }
    assert by_path(report)["state-link.json"].sha256 == sha256(ckpt / "trainer_state.json")


def test_missing_or_not_a_directory_raises_a_one_line_integrity_error(tmp_path):
    with pytest.raises(IntegrityError, match=f"^{tmp_path}/nope: does not exist$"):
        verify(tmp_path / "nope")
    (tmp_path / "f").write_text("x")
    with pytest.raises(IntegrityError, match="f: not a directory"):
        create_manifest(tmp_path / "f")


def test_manifest_is_refused_when_a_file_cannot_be_hashed(ckpt, monkeypatch):
    from ckptwatch.integrity import hashing

    real = hashing.hash_file

    def flaky(path, **kw):
        if str(path).endswith(SHARD):
            return hashing.HashResult(kw["name"], None, None, problem="permission_denied",
                                      detail="cannot be read: Permission denied")
        return real(path, **kw)

    monkeypatch.setattr(hashing, "hash_file", flaky)
    with pytest.raises(ManifestError, match=f"no manifest written: 1 file.*{SHARD} \\(cannot be read"):
        create_manifest(ckpt)
    assert not (ckpt / MANIFEST_NAME).exists()


def test_manifest_written_for_one_checkpoint_verifies_a_copy(ckpt, tmp_path):
    create_manifest(ckpt)
    copy = tmp_path / "copy"
    copy_checkpoint(copy)
    assert verify(copy, manifest=ckpt / MANIFEST_NAME).verdict == "ok"
    flip_middle_byte(copy / SHARD)
    m = read_manifest(ckpt)
    report = verify(copy, manifest=dataclasses.replace(m))
    assert report.verdict == "corrupt" and [p.path for p in report.problems] == [SHARD]
