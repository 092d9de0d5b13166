"""Issue 14: hostile checkpoints. Each test once hung ``verify``, blew its memory, read outside
the checkpoint, or said ``ok`` to a file that runs code when loaded.

* zip bombs: central-directory entries sharing one local header (the 256 x 64 MiB torch zip
  took 41 s and was ``ok``), members hidden inside other members, DEFLATE ratio bombs, entry
  counts: bounded, and overlaps are findings;
* a long verification stops promptly when the checkpoint watcher is closed (SIGTERM);
* safetensors headers and JSON files that would build gigabytes of Python objects;
* names taken from a file (HF index, DCP ``.metadata``, the manifest) or symlinks that lead
  outside the checkpoint: ``path_escape`` / ``symlink_outside``, and nothing outside touched;
* pickles inside containers (torch zip ``data.pkl``, ``*.pkl`` members, DCP shard archives,
  DeepSpeed files, plain ``.pkl`` files) go through the restricted unpickler.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from integrity_support import (MIB, SystemCall, copy_checkpoint, data_pkl, dcp_metadata, deflated, deflated_zeros,
                               outside, record_access, repeated_member_bomb, run_cli, stored, zip_archive)

from ckptwatch.integrity.formats import check_file, check_tree
from ckptwatch.integrity.limits import Budget, Limits
from ckptwatch.integrity.verify import verify
from ckptwatch.integrity.watch import CheckpointWatcher

ROOT = Path(__file__).resolve().parent.parent


def problems_of(fc) -> list[tuple[str, str]]:
    return [(f.verdict, f.problem) for f in fc.findings]


# --- zip bombs -------------------------------------------------------------------------------------

def test_the_issue_14_zip_bomb_is_corrupt_and_inflated_once(tmp_path):
    """One 64 MiB DEFLATEd member listed 256 times: 41 s and ``ok`` before; now each local header is
    read once, the repeats are findings and nothing is inflated twice."""
    ckpt = tmp_path / "checkpoint-1"
    ckpt.mkdir()
    (ckpt / "model.pt").write_bytes(repeated_member_bomb(256, 64 * MIB))
    budget = Budget()
    fc = check_file(ckpt, "model.pt", budget=budget)
    assert budget.inflated == 64 * MIB  # inflated once, not 256 times (16 GiB)
    assert {"zip_duplicate_member", "zip_overlap"} <= {f.problem for f in fc.findings}
    r = run_cli("verify", ckpt, timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "CORRUPT" in r.stdout
    assert "zip_duplicate_member: member archive/data/0 is listed 256 times" in r.stdout, r.stdout
    assert "zip_overlap" in r.stdout


def test_65535_entries_sharing_one_member_take_linear_time(tmp_path):
    """The report's worst case (hours before): 65,535 central entries, one local header."""
    (tmp_path / "model.pt").write_bytes(repeated_member_bomb(65_535, MIB))
    budget = Budget()
    t0 = time.perf_counter()
    fc = check_file(tmp_path, "model.pt", budget=budget)
    assert time.perf_counter() - t0 < 30  # about 0.5 s; hours before
    assert budget.inflated == MIB
    assert {"zip_duplicate_member", "zip_overlap"} <= {f.problem for f in fc.findings}
    assert fc.verdict == "corrupt" and fc.facts["entries"] == 65_536


def test_entries_with_other_names_sharing_a_local_header_overlap(tmp_path):
    members = [data_pkl(), stored("archive/data/0", b"x" * 64)]
    blob = zip_archive(members, central=[(0, None), (1, None), (1, b"archive/data/1")])
    (tmp_path / "m.pt").write_bytes(blob)
    fc = check_file(tmp_path, "m.pt")
    assert ("corrupt", "zip_overlap") in problems_of(fc)
    (f,) = [f for f in fc.findings if f.problem == "zip_overlap"]
    assert "archive/data/1" in f.detail and "archive/data/0" in f.detail


def test_a_stored_member_hidden_inside_another_is_an_overlap(tmp_path):
    """Member B's local header and data lie inside member A's data: both CRCs match, every
    byte is counted twice; torch never writes that."""
    b = stored("archive/data/1", b"y" * 64)
    b_local = zip_archive([b])[:30 + len(b.name) + len(b.payload)]
    a = stored("archive/data/0", b_local + b"z" * 16)
    pkl = data_pkl()
    a_data = 30 + len(pkl.name) + len(pkl.payload) + 30 + len(a.name)
    (tmp_path / "m.pt").write_bytes(zip_archive([pkl, a, b], local_at={2: a_data}))
    fc = check_file(tmp_path, "m.pt")
    assert problems_of(fc) == [("corrupt", "zip_overlap")], fc.findings
    assert "archive/data/1" in fc.findings[0].detail


def test_many_distinct_deflate_members_hit_the_inflate_limit(tmp_path):
    """64 members of 64 MiB of zeros, 4 MiB on disk: 4 GiB to inflate (about 10 s) before;
    now the file's allowance (100 x its size) is spent and the rest is not inflated."""
    members = [data_pkl()] + [deflated_zeros(f"archive/data/{i}", 64 * MIB) for i in range(64)]
    (tmp_path / "m.pt").write_bytes(zip_archive(members))
    size = (tmp_path / "m.pt").stat().st_size
    budget = Budget()
    fc = check_file(tmp_path, "m.pt", budget=budget)
    assert 0 < budget.inflated <= 100 * size  # the file's allowance, not 4 GiB
    assert problems_of(fc) == [("unverifiable", "limit_exceeded")], fc.findings
    assert "inflate_ratio" in fc.findings[0].detail


def test_limits_are_settings(tmp_path):
    members = [data_pkl()] + [stored(f"archive/data/{i}", b"%d" % i) for i in range(100)]
    (tmp_path / "m.pt").write_bytes(zip_archive(members))
    assert check_file(tmp_path, "m.pt").verdict == "ok"
    fc = check_file(tmp_path, "m.pt", budget=Budget(Limits(max_zip_entries=100)))
    assert problems_of(fc) == [("unverifiable", "limit_exceeded")]
    assert "101 entries" in fc.findings[0].detail and "max_zip_entries=100" in fc.findings[0].detail
    r = run_cli("verify", tmp_path, "--limit", "max_zip_entries=100")
    assert r.returncode == 1 and "limit_exceeded" in r.stdout
    r = run_cli("verify", tmp_path, "--limit", "no_such_limit=1")
    assert r.returncode == 2 and r.stderr.startswith("error: --limit no_such_limit=1: unknown limit")

    big = deflated("archive/data/0", b"\0" * (4 * MIB))
    (tmp_path / "m.pt").write_bytes(zip_archive([data_pkl(), big]))
    fc = check_file(tmp_path, "m.pt", budget=Budget(Limits(max_member_inflated=MIB)))
    assert problems_of(fc) == [("unverifiable", "limit_exceeded")] and "max_member_inflated" in fc.findings[0].detail
    (tmp_path / "n.pt").write_bytes(zip_archive([data_pkl(), big]))
    budget = Budget(Limits(max_total_inflated=6 * MIB))  # one file fits, not both
    verdicts = sorted(check_file(tmp_path, n, budget=budget).verdict for n in ("m.pt", "n.pt"))
    assert verdicts == ["ok", "unverifiable"]


def test_overlapping_dcp_storage_entries_are_checked_once(tmp_path):
    """10,000 .metadata entries naming the same archive: 10,000 CRC passes before."""
    shard = zip_archive([data_pkl({"t": 1}), stored("archive/data/0", b"\1" * (256 << 10))])
    (tmp_path / "__0_0.distcp").write_bytes(shard)
    entries = [(f"w{i}", "__0_0.distcp", 0, len(shard)) for i in range(10_000)]
    (tmp_path / ".metadata").write_bytes(dcp_metadata(entries))
    fc = check_file(tmp_path, "__0_0.distcp")
    assert problems_of(fc) == [("corrupt", "overlapping_entries")], fc.findings
    assert fc.facts["archives_checked"] == 1  # 10,000 before
    assert "9999 storage entries" in fc.findings[0].detail


def test_a_shard_full_of_fake_end_records_is_a_limit_not_minutes(tmp_path):
    """Walking a DCP shard without .metadata searches each archive's end record: 16 MB of
    ``PK\\5\\6`` took 23 s (a read per candidate); now they are counted first."""
    head = zip_archive([data_pkl({"x": 1})])
    (tmp_path / "__0_0.distcp").write_bytes(head + b"PK\x03\x04" + b"PK\x05\x06" * (4 << 20))
    t0 = time.perf_counter()
    fc = check_file(tmp_path, "__0_0.distcp")
    assert time.perf_counter() - t0 < 10  # 0.3 s; 23 s before
    assert problems_of(fc) == [("unverifiable", "limit_exceeded")], fc.findings
    assert "archive 2 at byte" in fc.findings[0].detail


# --- interruptible ---------------------------------------------------------------------------------

def _sparse_checkpoint(root: Path, gib: int) -> Path:
    ckpt = root / "checkpoint-7"
    ckpt.mkdir(parents=True)
    with open(ckpt / "weights.bin", "wb") as f:
        f.truncate(gib << 30)  # sparse: no disk, but hashing reads every byte
    old = time.time() - 3600
    os.utime(ckpt / "weights.bin", (old, old))
    return ckpt


def test_closing_the_watcher_stops_a_long_verification(tmp_path):
    ckpt = _sparse_checkpoint(tmp_path / "ckpt", 16)  # about 10 s of hashing
    log = tmp_path / "verify.log"
    w = CheckpointWatcher([str(tmp_path / "ckpt")], str(log), settle=0.0)
    assert w.poll() == 1
    time.sleep(0.5)
    t0 = time.perf_counter()
    w.close()
    assert time.perf_counter() - t0 < 2  # about 10 s before
    assert str(ckpt) not in w.verified  # not verified: tried again after a restart
    assert log.read_text() == ""
    w = CheckpointWatcher([str(tmp_path / "ckpt")], str(log), settle=0.0)
    assert w.poll() == 1
    w.close()


def test_verify_stops_when_asked(tmp_path):
    from ckptwatch.integrity.limits import Cancelled

    ckpt = _sparse_checkpoint(tmp_path, 16)
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    t0 = time.perf_counter()
    with pytest.raises(Cancelled, match="stopped"):
        verify(ckpt, stop=stop)
    assert time.perf_counter() - t0 < 2.5


def test_sigterm_stops_run_once_promptly(tmp_path):
    """``ckptwatch run --once --checkpoint-root`` verifying a huge checkpoint: SIGTERM ends it at
    once (the watcher's close() used to wait for the whole verification)."""
    _sparse_checkpoint(tmp_path / "ckpt", 64)  # about 40 s of hashing
    logs = tmp_path / "logs"
    logs.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTWATCH_")}
    p = subprocess.Popen([sys.executable, "-m", "ckptwatch", "run", "--logs", str(logs), "--db",
                          str(tmp_path / "i.duckdb"), "--once", "--checkpoint-root", str(tmp_path / "ckpt")],
                         cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 30
        state = tmp_path / "ckptwatch-verify.log"
        while not state.exists() and time.time() < deadline:
            time.sleep(0.1)
        time.sleep(2)  # well inside the verification
        assert p.poll() is None
        t0 = time.perf_counter()
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=30)
        assert time.perf_counter() - t0 < 10  # the rest of the 64 GiB would take 40 s or more
        assert p.returncode == 130, err  # stopped before the end of its input (README, run --once)
        assert "Traceback" not in err
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()


# --- safetensors and JSON ------------------------------------------------------------------------

def _peak(code: str, *args: object) -> dict:
    """Run ``code`` in a fresh interpreter; its last stdout line is JSON, plus ``maxrss_mb``
    (VmHWM, the peak of this process' own memory: ``ru_maxrss`` would carry the parent's peak
    across fork and exec)."""
    prog = textwrap.dedent(code) + textwrap.dedent("""
        import json as _j
        hwm = [ln for ln in open("/proc/self/status") if ln.startswith("VmHWM:")][0]
        out["maxrss_mb"] = int(hwm.split()[1]) / 1024
        print(_j.dumps(out))
    """)
    r = subprocess.run([sys.executable, "-c", prog, *map(str, args)], capture_output=True, text=True, timeout=120,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1])


_CHECK = """
    import sys, time
    from pathlib import Path
    from ckptwatch.integrity.formats import check_file
    t0 = time.perf_counter()
    fc = check_file(Path(sys.argv[1]), sys.argv[2])
    out = {"findings": [[f.verdict, f.problem, f.detail] for f in fc.findings], "seconds": time.perf_counter() - t0}
"""


def _many_tensors(n: int) -> bytes:
    parts = [f'"t{i}":{{"dtype":"U8","shape":[1],"data_offsets":[{i},{i + 1}]}}' for i in range(n)]
    header = ("{" + ",".join(parts) + "}").encode()
    return struct.pack("<Q", len(header)) + header + b"\0" * n


def test_a_million_tensor_safetensors_header_is_a_finding_not_a_gigabyte(tmp_path):
    (tmp_path / "m.safetensors").write_bytes(_many_tensors(1_000_000))
    out = _peak(_CHECK, tmp_path, "m.safetensors")
    assert [f[:2] for f in out["findings"]] == [["unverifiable", "limit_exceeded"]], out
    assert "1000000 tensors" in out["findings"][0][2] and "max_tensors=200000" in out["findings"][0][2]
    assert out["maxrss_mb"] < 250, out  # 921 MB and 23 s before
    assert out["seconds"] < 10


def test_a_large_legal_safetensors_header_still_parses(tmp_path):
    """Under the tensor limit a header is parsed, compactly (150,000 tensors: 114 MB peak, was 147)."""
    (tmp_path / "m.safetensors").write_bytes(_many_tensors(150_000))
    out = _peak(_CHECK, tmp_path, "m.safetensors")
    assert out["findings"] == [], out
    assert out["maxrss_mb"] < 160, out


def test_a_json_container_bomb_is_refused_before_parsing(tmp_path):
    """30 MB of ``[]`` in an index: some 10 million lists (about 600 MB) if parsed."""
    (tmp_path / "model.safetensors.index.json").write_bytes(
        b'{"weight_map": {}, "pad": [' + b"[]," * 10_000_000 + b"[]]}")
    out = _peak(_CHECK, tmp_path, "model.safetensors.index.json")
    assert [f[:2] for f in out["findings"]] == [["unverifiable", "limit_exceeded"]], out
    assert "max_json_containers" in out["findings"][0][2]
    assert out["maxrss_mb"] < 200, out


# --- paths taken from files never leave the checkpoint ---------------------------------------------

def _safetensors_one(name: str = "a") -> bytes:
    h = json.dumps({name: {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    return struct.pack("<Q", len(h)) + h + b"\0" * 4


def test_hf_index_shards_outside_the_checkpoint_are_path_escapes_and_never_touched(tmp_path):
    (tmp_path / "outside.safetensors").write_bytes(_safetensors_one("b"))
    ckpt = tmp_path / "checkpoint-1"
    ckpt.mkdir()
    (ckpt / "model-1.safetensors").write_bytes(_safetensors_one("a"))
    weight_map = {"a": "model-1.safetensors", "b": "../outside.safetensors",
                  "c": str(tmp_path / "outside.safetensors"), "d": "x/../../outside.safetensors", "e": "ok/\0"}
    (ckpt / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with record_access() as seen:
        report = verify(ckpt)
    assert outside(seen, ckpt) == []
    assert [r.path for r in report.files] == ["model-1.safetensors", "model.safetensors.index.json"]
    (idx,) = [r for r in report.files if r.path == "model.safetensors.index.json"]
    assert [(f.verdict, f.problem) for f in idx.findings] == [("corrupt", "path_escape")]
    detail = idx.findings[0].detail
    assert "'b' -> '../outside.safetensors'" in detail and "4 weight_map entries" in detail
    assert report.verdict == "corrupt"


def test_dcp_metadata_naming_a_file_outside_is_a_path_escape(tmp_path):
    shard = zip_archive([data_pkl({"t": 1})])
    (tmp_path / "__0_0.distcp").write_bytes(shard)
    (tmp_path / ".metadata").write_bytes(dcp_metadata([("w", "../__0_0.distcp", 0, len(shard))]))
    fc = check_file(tmp_path, ".metadata")
    assert problems_of(fc) == [("corrupt", "path_escape")]
    assert "storage entry w" in fc.findings[0].detail and "'../__0_0.distcp'" in fc.findings[0].detail


def test_a_manifest_naming_a_file_outside_is_a_path_escape(tmp_path):
    ckpt = copy_checkpoint(tmp_path / "checkpoint-60")
    assert run_cli("manifest", ckpt).returncode == 0
    doc = json.loads((ckpt / "ckptwatch-manifest.json").read_text())
    doc["files"][0]["path"] = "../../etc/passwd"
    (ckpt / "ckptwatch-manifest.json").write_text(json.dumps(doc))
    report = verify(ckpt)
    (m,) = [r for r in report.files if r.path == "ckptwatch-manifest.json"]
    assert [(f.verdict, f.problem) for f in m.findings] == [("corrupt", "path_escape")]
    assert "files[0].path" in m.findings[0].detail and "../../etc/passwd" in m.findings[0].detail


def test_symlinks_out_of_the_checkpoint_are_never_followed(tmp_path):
    """A ``.metadata`` symlinked to another checkpoint's: the shard check used to read it through
    the link; the walk used to stat every link's target."""
    other = tmp_path / "elsewhere"
    other.mkdir()
    shard = zip_archive([data_pkl({"t": 1})])
    (other / ".metadata").write_bytes(dcp_metadata([("w", "__0_0.distcp", 0, len(shard))]))
    (other / "big.safetensors").write_bytes(_safetensors_one())
    ckpt = tmp_path / "checkpoint-1"
    ckpt.mkdir()
    (ckpt / "__0_0.distcp").write_bytes(shard)
    (ckpt / ".metadata").symlink_to(other / ".metadata")
    (ckpt / "w.safetensors").symlink_to("../elsewhere/big.safetensors")
    (ckpt / "sub").mkdir()
    (ckpt / "sub" / "chain").symlink_to("../w.safetensors")  # a link to a link that leaves
    (ckpt / "inside.safetensors").symlink_to("sub/../__0_0.distcp")  # stays inside: read through the link
    with record_access() as seen:
        report = verify(ckpt)
        fc = check_file(ckpt, "__0_0.distcp")
    assert outside(seen, ckpt) == []
    assert fc.facts.get("from_metadata") is False
    got = {(r.path, f.problem) for r in report.files for f in r.findings}
    assert {(".metadata", "symlink_outside"), ("w.safetensors", "symlink_outside"),
            ("sub/chain", "symlink_outside")} <= got
    assert "inside.safetensors" in {r.path for r in report.files}


def test_a_file_swapped_for_an_outward_symlink_mid_verify_is_not_followed(tmp_path, monkeypatch):
    """Between the walk and the read a writer replaces a file with a link to a secret elsewhere:
    the hash and the checks open it component by component with O_NOFOLLOW, never through the link."""
    from ckptwatch.integrity import scan as scan_mod

    secret = tmp_path / "secret.safetensors"
    secret.write_bytes(_safetensors_one())
    ckpt = tmp_path / "checkpoint-1"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(_safetensors_one())
    real_walk = scan_mod.walk

    def walk_then_swap(root, **kw):
        tree = real_walk(root, **kw)
        (ckpt / "model.safetensors").unlink()
        (ckpt / "model.safetensors").symlink_to(secret)
        return tree

    monkeypatch.setattr(scan_mod, "walk", walk_then_swap)
    with record_access() as seen:
        report = verify(ckpt)
    assert outside(seen, ckpt) == []
    (r,) = report.files
    assert [(f.verdict, f.problem) for f in r.findings] == [("unverifiable", "symlink_outside")]
    assert r.sha256 is None


# --- every pickle through the restricted unpickler -------------------------------------------------

def _torch_zip(pkl: bytes, *, method: int = 0, extra: dict[str, bytes] | None = None) -> bytes:
    first = data_pkl(raw=pkl) if method == 0 else deflated("archive/data.pkl", pkl)
    return zip_archive([first, stored("archive/version", b"3\n")]
                       + [stored(f"archive/{k}", v) for k, v in (extra or {}).items()])


def test_a_torch_zip_whose_data_pkl_runs_os_system_is_unsafe(tmp_path):
    marker = tmp_path / "PWNED"
    evil = pickle.dumps(SystemCall(f"touch {marker}"), protocol=2)
    ckpt = tmp_path / "checkpoint-1"
    ckpt.mkdir()
    (ckpt / "model.pt").write_bytes(_torch_zip(evil))
    r = run_cli("verify", ckpt)
    assert r.returncode == 1 and "unsafe_pickle" in r.stdout and "posix.system" in r.stdout, r.stdout
    assert "member archive/data.pkl" in r.stdout
    for name, blob in {"deflated.pt": _torch_zip(evil, method=8),
                       "extra.pt": _torch_zip(pickle.dumps({}, protocol=2), extra={"extra/state.pkl": evil})}.items():
        (tmp_path / name).write_bytes(blob)
        fc = check_file(tmp_path, name)
        assert problems_of(fc) == [("corrupt", "unsafe_pickle")], (name, fc.findings)
    assert not marker.exists()


def test_a_clean_data_pkl_with_foreign_classes_is_ok_and_listed(tmp_path):
    (tmp_path / "m.pt").write_bytes(_torch_zip(pickle.dumps({"args": Path("/x")}, protocol=2)))
    fc = check_file(tmp_path, "m.pt")
    assert fc.verdict == "ok"
    blob = b"\x80\x02ctransformers.training_args\nTrainingArguments\n)\x81}b."
    (tmp_path / "n.pt").write_bytes(_torch_zip(blob))
    fc = check_file(tmp_path, "n.pt")
    assert fc.verdict == "ok" and fc.facts["foreign_globals"] == ["transformers.training_args.TrainingArguments"]
    (tmp_path / "bad.pt").write_bytes(_torch_zip(b"\x80\x02}q\x00(garbage"))
    assert problems_of(check_file(tmp_path, "bad.pt")) == [("corrupt", "bad_pickle")]


def test_hostile_pickles_in_dcp_shards_deepspeed_and_plain_pkl_files(tmp_path):
    marker = tmp_path / "PWNED"
    evil = pickle.dumps(SystemCall(f"touch {marker}"), protocol=4)
    archive = _torch_zip(evil)
    d = tmp_path / "dcp"
    d.mkdir()
    (d / "__0_0.distcp").write_bytes(zip_archive([data_pkl({"t": 1})]) + archive)  # walked, no .metadata
    assert ("corrupt", "unsafe_pickle") in problems_of(check_file(d, "__0_0.distcp"))
    (d / ".metadata").write_bytes(dcp_metadata([("w", "__0_0.distcp", len(zip_archive([data_pkl({"t": 1})])),
                                                 len(archive))]))
    fc = check_file(d, "__0_0.distcp")
    assert ("corrupt", "unsafe_pickle") in problems_of(fc) and "storage entry w" in fc.findings[-1].detail

    legacy = b"".join(pickle.dumps(x, protocol=2) for x in (0x1950A86A20F9469CFC6C, 1001, {})) + evil
    (d / "__1_0.distcp").write_bytes(legacy)  # a legacy torch.save as an entry: torch.load unpickles it
    (d / ".metadata").write_bytes(dcp_metadata([("w", "__0_0.distcp", len(zip_archive([data_pkl({"t": 1})])),
                                                 len(archive)), ("v", "__1_0.distcp", 0, len(legacy))]))
    fc = check_file(d, "__1_0.distcp")
    assert problems_of(fc) == [("corrupt", "unsafe_pickle")] and "storage entry v" in fc.findings[0].detail

    ds = tmp_path / "ds"
    (ds / "global_step1").mkdir(parents=True)
    (ds / "latest").write_text("global_step1")
    (ds / "global_step1" / "mp_rank_00_model_states.pt").write_bytes(_torch_zip(evil))
    assert problems_of(check_file(ds, "global_step1/mp_rank_00_model_states.pt")) == [("corrupt", "unsafe_pickle")]
    assert check_tree(ds, ["latest", "global_step1/mp_rank_00_model_states.pt"]) == []

    (tmp_path / "optimizer.pkl").write_bytes(evil)
    (tmp_path / "state.bin").write_bytes(pickle.dumps({"ok": 1}, protocol=4) + evil)
    for name in ("optimizer.pkl", "state.bin"):
        fc = check_file(tmp_path, name)
        assert (fc.format, problems_of(fc)) == ("pickle", [("corrupt", "unsafe_pickle")]), (name, fc.findings)
    (tmp_path / "clean.pkl").write_bytes(pickle.dumps({"lr": 0.1, "step": [1, 2]}, protocol=2))
    fc = check_file(tmp_path, "clean.pkl")
    assert (fc.format, fc.verdict, fc.facts["pickles"]) == ("pickle", "ok", 1)
    assert not marker.exists()


# --- found by the fuzzer: the unpickler's own allocations ----------------------------------------

_MEMO_BOMB = b"\x80\x02}r" + struct.pack("<I", 400_000_000) + b"."  # LONG_BINPUT 4e8: a 6.4 GB memo array


def _colliding_ints(n: int) -> bytes:
    """A dict pickle whose ``n`` integer keys all hash alike (k + i(2^61 - 1)): quadratic to build."""
    m = (1 << 61) - 1
    items = b"".join(b"\x8a" + bytes([len(raw)]) + raw + b"K\x00"
                     for raw in ((5 + i * m).to_bytes(16, "little") for i in range(n)))
    return b"\x80\x02}(" + items + b"u."


_CHECK_ALL = """
    import sys, time
    from pathlib import Path
    from ckptwatch.integrity.formats import check_file
    root = Path(sys.argv[1])
    out = {}
    for rel in sys.argv[2:]:
        t0 = time.perf_counter()
        fc = check_file(root, rel)
        out[rel] = [[f.verdict, f.problem] for f in fc.findings] + [round(time.perf_counter() - t0, 2)]
"""


def test_a_memo_bomb_pickle_is_refused_in_every_container(tmp_path):
    """14 bytes that cost 12 s and 6 GB in each pickle reader before (found by the fuzzer)."""
    head = b"".join(pickle.dumps(x, protocol=2) for x in (0x1950A86A20F9469CFC6C, 1001, {"little_endian": True}))
    (tmp_path / ".metadata").write_bytes(_MEMO_BOMB)
    (tmp_path / "model.pt").write_bytes(_torch_zip(_MEMO_BOMB))
    (tmp_path / "legacy.pt").write_bytes(head + _MEMO_BOMB + pickle.dumps([], protocol=2))
    (tmp_path / "opt.pkl").write_bytes(_MEMO_BOMB)
    names = [".metadata", "model.pt", "legacy.pt", "opt.pkl"]
    out = _peak(_CHECK_ALL, tmp_path, *names)
    assert out["maxrss_mb"] < 120, out
    for name in names:
        *found, seconds = out[name]
        assert found == [["corrupt", "bad_pickle"]] and seconds < 5, (name, out)


def test_hash_colliding_integer_keys_are_a_limit_not_minutes(tmp_path):
    (tmp_path / "opt.pkl").write_bytes(_colliding_ints(20_000))  # about 11 s to unpickle before
    fc = check_file(tmp_path, "opt.pkl")
    assert problems_of(fc) == [("unverifiable", "limit_exceeded")] and "2^61" in fc.findings[0].detail
    (tmp_path / "ok.pkl").write_bytes(_colliding_ints(100))  # a few big integers are fine
    assert check_file(tmp_path, "ok.pkl").verdict == "ok"


def test_join_and_resolve_inside(tmp_path):
    from ckptwatch.integrity.formats.confine import PathEscape, join_inside, open_inside, resolve_inside

    assert join_inside("sub", "a/../b.safetensors") == "sub/b.safetensors"
    assert join_inside("", "./x//y") == "x/y"
    for bad in ("../x", "/etc/passwd", "a/../../x", "", "x\0", ".", 3):
        with pytest.raises(PathEscape):
            join_inside("", bad)
    (tmp_path / "d" / "e").mkdir(parents=True)
    (tmp_path / "d" / "e" / "f").write_bytes(b"x")
    (tmp_path / "up").symlink_to("d/e/..")
    (tmp_path / "abs").symlink_to(tmp_path / "d" / "e" / "f")  # absolute but inside
    (tmp_path / "d" / "out").symlink_to("../..")
    (tmp_path / "loop").symlink_to("loop")
    assert resolve_inside(tmp_path, "up/e/f") == "d/e/f"
    assert resolve_inside(tmp_path, "abs") == "d/e/f"
    with open_inside(tmp_path, "abs") as f:
        assert f.read() == b"x"
    with pytest.raises(PathEscape, match="d/out"):
        resolve_inside(tmp_path, "d/out/x")
    with pytest.raises(OSError, match="symlink loop"):
        resolve_inside(tmp_path, "loop")
    with pytest.raises(OSError):
        open_inside(tmp_path, "d")  # a directory is not read


def test_a_manifest_with_a_huge_integer_is_damaged_not_a_crash(tmp_path):
    """Found by the fuzz soak: a 4,783-digit number made json raise ValueError out of verify."""
    ckpt = copy_checkpoint(tmp_path / "checkpoint-60")
    assert run_cli("manifest", ckpt).returncode == 0
    text = (ckpt / "ckptwatch-manifest.json").read_text()
    (ckpt / "ckptwatch-manifest.json").write_text(text.replace('"step": 60', '"step": ' + "9" * 4783, 1))
    report = verify(ckpt)
    (m,) = [r for r in report.files if r.path == "ckptwatch-manifest.json"]
    assert [(f.verdict, f.problem) for f in m.findings] == [("corrupt", "bad_manifest")]
    assert "4300 digits" in m.findings[0].detail
    r = run_cli("verify", ckpt, "--manifest", ckpt / "ckptwatch-manifest.json")
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "Traceback" not in r.stderr
