"""Structural checks of checkpoint formats (``ckptwatch.integrity.formats``), without torch.

Ground truth: the real files of the shared corpus, vendored in ``tests/fixtures/corpus``
(``<scenario>/artifacts``, written by real PyTorch runs and damaged by the corpus' scripts,
see its PROVENANCE.md) with each variant's ``provenance/scenario.json``; hostile pickles built
here; DeepSpeed and HF layouts built here.
"""

from __future__ import annotations

import ctypes
import json
import os
import pickle
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptwatch.integrity.findings import FileCheck, Finding, worst
from ckptwatch.integrity.formats import check_file, check_tree, detect_format

SHARED = ROOT / "tests" / "fixtures" / "corpus"  # the shared corpus' artifacts and ground truth, vendored

TORN_PT = SHARED / "04-torn-torch-save" / "artifacts" / "files"
TORN_ST = SHARED / "05-torn-safetensors" / "artifacts" / "files"
DCP07 = SHARED / "07-dcp-missing-shard" / "artifacts" / "checkpoints"
CLEAN01 = SHARED / "01-clean" / "artifacts" / "output"


def ground_truth(scenario: str) -> dict:
    return json.loads((SHARED / scenario / "provenance" / "scenario.json").read_text())["ground_truth"]


def files_of(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def check_all(root: Path) -> tuple[dict[str, FileCheck], list[Finding]]:
    """Every file's check and the directory-level findings, as ``verify`` combines them."""
    files = files_of(root)
    return {rel: check_file(root, rel) for rel in files}, check_tree(root, files)


def problems(checks: dict[str, FileCheck], tree: list[Finding]) -> set[tuple[str, str, str]]:
    return {(f.path, f.verdict, f.problem) for c in checks.values() for f in c.findings} | {
        (f.path, f.verdict, f.problem) for f in tree}


def verdict(checks: dict[str, FileCheck], tree: list[Finding]) -> str:
    return worst([c.verdict for c in checks.values()] + [f.verdict for f in tree])


# --- 04: torch.save zip and legacy files ---------------------------------------------------------

@pytest.mark.parametrize("name, fmt, want, problem", [
    ("checkpoint-40.pt", "torch_zip", "ok", None),
    ("checkpoint-40.trunc50.pt", "torch_zip", "incomplete", "truncated"),
    ("checkpoint-40.trunc_minus100.pt", "torch_zip", "incomplete", "truncated"),
    ("checkpoint-40.empty.pt", "torch_zip", "incomplete", "empty"),
    ("checkpoint-40.bitflip_middle.pt", "torch_zip", "corrupt", "crc_mismatch"),
    ("checkpoint-40.bitflip_datapkl.pt", "torch_zip", "corrupt", "crc_mismatch"),
    ("checkpoint-40.legacy.pt", "torch_legacy", "ok", None),
    ("checkpoint-40.legacy.trunc50.pt", "torch_legacy", "incomplete", "truncated"),
])
def test_torn_torch_save(name, fmt, want, problem):
    fc = check_file(TORN_PT, name)
    assert (fc.format, fc.verdict, [f.problem for f in fc.findings]) == (fmt, want, [problem] if problem else [])
    assert detect_format(TORN_PT / name) == fmt


def test_torch_zip_bit_flips_name_the_member_zipfile_testzip_names():
    """Both flips load silently in torch.load (scenario.json 'observed'); the CRC check names
    the member the corpus' ground truth (and zipfile.testzip) names."""
    truth = ground_truth("04-torn-torch-save")["variants"]
    for name in ("checkpoint-40.bitflip_middle.pt", "checkpoint-40.bitflip_datapkl.pt"):
        member = truth[name]["flip_location"]["member"]
        (f,) = check_file(TORN_PT, name).findings
        assert f.path == name and f"member {member}:" in f.detail
    assert "checkpoint-40/data/8" in check_file(TORN_PT, "checkpoint-40.bitflip_middle.pt").findings[0].detail


def test_torch_zip_facts_and_truncation_details():
    fc = check_file(TORN_PT, "checkpoint-40.pt")
    assert fc.facts == {"entries": 30, "uncompressed_bytes": 83553, "top_folder": "checkpoint-40", "bytes": 89359}
    assert "44679 bytes" in check_file(TORN_PT, "checkpoint-40.trunc50.pt").findings[0].detail
    legacy = check_file(TORN_PT, "checkpoint-40.legacy.pt")
    assert legacy.facts["storages"] == 24 and legacy.facts["foreign_globals"] == []
    cut = check_file(TORN_PT, "checkpoint-40.legacy.trunc50.pt").findings[0]
    assert "storage 9 of 24" in cut.detail and "ends at 42332" in cut.detail


# --- 05: safetensors ---------------------------------------------------------------------------

@pytest.mark.parametrize("name, want, problem", [
    ("model.safetensors", "ok", None),
    ("model.trunc_in_header.safetensors", "incomplete", "truncated"),
    ("model.trunc_in_data.safetensors", "incomplete", "truncated"),
    ("model.trunc_minus1.safetensors", "incomplete", "truncated"),
    ("model.trunc_4bytes.safetensors", "incomplete", "truncated"),
    ("model.empty.safetensors", "incomplete", "empty"),
    ("model.bitflip_header.safetensors", "corrupt", "bad_header"),
    # NOT detectable structurally: safetensors has no checksum. The flipped data byte leaves a
    # well-formed file (safetensors loads it silently, |diff| 6e-8); only the manifest's SHA-256
    # catches it (test_integrity_manifest).
    ("model.bitflip_data.safetensors", "ok", None),
])
def test_torn_safetensors(name, want, problem):
    fc = check_file(TORN_ST, name)
    assert (fc.format, fc.verdict, [f.problem for f in fc.findings]) == ("safetensors", want,
                                                                         [problem] if problem else [])


def test_safetensors_facts_match_ground_truth():
    fc = check_file(TORN_ST, "model.safetensors")
    assert fc.facts["header_bytes"] == ground_truth("05-torn-safetensors")["header_len"] == 448
    assert fc.facts["tensors"] == 6 and fc.facts["metadata_keys"] == ["format", "step"]
    assert fc.facts["data_bytes"] == 27624 - 8 - 448
    assert "1 bytes cut off" in check_file(TORN_ST, "model.trunc_minus1.safetensors").findings[0].detail


def _safetensors(tensors: dict[str, tuple[str, list[int], bytes]], *, offsets=None, pad=True) -> bytes:
    header, data = {}, b""
    for i, (name, (dtype, shape, raw)) in enumerate(tensors.items()):
        begin = len(data)
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": offsets[i] if offsets else [begin, begin + len(raw)]}
        data += raw
    h = json.dumps(header).encode()
    if pad:
        h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


@pytest.mark.parametrize("blob, want, problem", [
    (_safetensors({"a": ("F32", [2, 2], b"\0" * 16), "b": ("BF16", [3], b"\0" * 6)}), "ok", None),
    (_safetensors({"a": ("F4", [4], b"\0" * 2), "e": ("I64", [0], b"")}, pad=False), "ok", None),
    (_safetensors({"a": ("F32", [2, 2], b"\0" * 12)}), "corrupt", "bad_offsets"),         # 12 != 4 x 4
    (_safetensors({"a": ("F32", [1], b"\0" * 4), "b": ("F32", [1], b"\0" * 4)},
                  offsets=[[0, 4], [8, 12]]) + b"\0" * 4, "corrupt", "bad_offsets"),     # a hole
    (_safetensors({"a": ("F32", [1], b"\0" * 4)}) + b"xx", "corrupt", "trailing_data"),
    (_safetensors({"a": ("Q99", [1], b"\0" * 4)}), "corrupt", "bad_header"),
    (struct.pack("<Q", 1 << 40) + b"{}", "corrupt", "bad_header"),                         # absurd length
    (struct.pack("<Q", 13) + b'{"a":1,"a":2}', "corrupt", "bad_header"),                   # duplicate key
])
def test_safetensors_offsets_and_header_rules(tmp_path, blob, want, problem):
    (tmp_path / "m.safetensors").write_bytes(blob)
    fc = check_file(tmp_path, "m.safetensors")
    assert (fc.verdict, [f.problem for f in fc.findings]) == (want, [problem] if problem else [])


# --- 07: damaged copies of a DCP checkpoint ----------------------------------------------------

def test_dcp_missing_shard():
    checks, tree = check_all(DCP07 / "checkpoint-60.missing-shard")
    gone = ground_truth("07-dcp-missing-shard")["damage"]["checkpoint-60.missing-shard"]["how"].split()[0]
    assert gone == "pytorch_model_fsdp_0/__2_0.distcp"
    assert verdict(checks, tree) == "incomplete"
    assert problems(checks, tree) == {(gone, "incomplete", "missing")}


def test_dcp_missing_metadata():
    checks, tree = check_all(DCP07 / "checkpoint-60.missing-metadata")
    assert verdict(checks, tree) == "incomplete"
    assert problems(checks, tree) == {("pytorch_model_fsdp_0/.metadata", "incomplete", "no_metadata")}
    (f,) = tree
    assert "never committed" in f.detail and "4 .distcp" in f.detail
    # without .metadata each shard is walked archive by archive; all six are whole and sound
    assert checks["pytorch_model_fsdp_0/__1_0.distcp"].facts["archives"] == 6


def test_dcp_truncated_shard():
    truth = ground_truth("07-dcp-missing-shard")["damage"]["checkpoint-60.truncated-shard"]
    checks, tree = check_all(DCP07 / "checkpoint-60.truncated-shard")
    shard = "pytorch_model_fsdp_0/__1_0.distcp"
    assert verdict(checks, tree) == "incomplete"
    # the shard's own check (entries past its end) and the tree check (shorter than .metadata
    # needs) both say truncated: same path, same code
    assert problems(checks, tree) == {(shard, "incomplete", "truncated")}
    assert f"{truth['new_size']} bytes" in tree[0].detail and f"{truth['orig_size']}" in tree[0].detail


def test_dcp_bitflip_shard_found_by_crc_and_named_by_tensor():
    """The flipped byte loads silently through dcp.load and a 4-rank resume (scenario.json);
    the CRC of the torch.save archive holding that item catches it, and .metadata names it."""
    truth = ground_truth("07-dcp-missing-shard")["damage"]["checkpoint-60.bitflip-shard"]["flip_in_item"]
    checks, tree = check_all(DCP07 / "checkpoint-60.bitflip-shard")
    shard = "pytorch_model_fsdp_0/__1_0.distcp"
    assert verdict(checks, tree) == "corrupt"
    assert problems(checks, tree) == {(shard, "corrupt", "crc_mismatch")}
    (f,) = checks[shard].findings
    start, length = truth["item_offset"], truth["item_length"]
    assert f"storage entry {truth['fqn']} chunk {truth['chunk_offset']} at bytes {start}..{start + length}" in f.detail
    assert "member archive/data/0" in f.detail


def test_dcp_shard_without_metadata_is_walked(tmp_path):
    """A shard alone: archives back to back, each one's CRCs checked; a cut mid-archive is truncated."""
    for variant in ("bitflip-shard", "truncated-shard"):
        d = tmp_path / variant
        d.mkdir()
        shutil.copy(DCP07 / f"checkpoint-60.{variant}" / "pytorch_model_fsdp_0" / "__1_0.distcp", d)
    flip = check_file(tmp_path, "bitflip-shard/__1_0.distcp")
    assert [(f.verdict, f.problem) for f in flip.findings] == [("corrupt", "crc_mismatch")]
    assert "archive 3 at bytes 5266..10939" in flip.findings[0].detail
    cut = check_file(tmp_path, "truncated-shard/__1_0.distcp")
    assert [(f.verdict, f.problem) for f in cut.findings] == [("incomplete", "truncated")]
    assert "after 2 complete archives" in cut.findings[0].detail


# --- 01 / 02 / 03: whole and partial DCP checkpoints ---------------------------------------------

@pytest.mark.parametrize("step", [20, 40, 60, 80])
def test_clean_checkpoints_are_ok_with_their_facts(step):
    root = CLEAN01 / f"checkpoint-{step}"
    checks, tree = check_all(root)
    assert verdict(checks, tree) == "ok" and tree == [] and not any(c.findings for c in checks.values())
    model = checks["pytorch_model_fsdp_0/.metadata"].facts
    assert (model["storage_entries"], model["tensors"], model["bytes_items"], model["writer_ranks"]) == (24, 6, 0, 4)
    assert model["shard_files"] == [f"__{r}_0.distcp" for r in range(4)]
    optim = checks["optimizer_0/.metadata"].facts
    assert (optim["storage_entries"], optim["tensors"], optim["bytes_items"], optim["ranks"]) == (66, 18, 12,
                                                                                                [0, 1, 2, 3])
    for d, md in (("pytorch_model_fsdp_0", model), ("optimizer_0", optim)):
        for shard, need in md["shard_bytes_needed"].items():
            c = checks[f"{d}/{shard}"]
            assert c.format == "dcp_shard" and c.facts["bytes_needed"] == need == c.facts["bytes"]
            assert c.facts["archives_checked"] == c.facts["storage_entries"]  # every entry is a torch.save zip
    assert {checks[f"rng_state_{r}.pth"].format for r in range(4)} == {"torch_zip"}
    assert checks["trainer_state.json"].format == "json"


def test_sigkill_mid_save_partial_checkpoint():
    """02: rank 2 SIGKILLed during the iteration-40 save: four shards, no .metadata
    (scenario.json: dcp_metadata_present false). The writes were cut between items, so each
    shard alone is a sound run of whole archives: only the missing .metadata shows the save
    never committed."""
    truth = ground_truth("02-sigkill-mid-save")["saves_attempt1"]
    assert truth["40"]["dcp_metadata_present"] is False and truth["20"]["completed"] is True
    checks, tree = check_all(SHARED / "02-sigkill-mid-save" / "artifacts" / "checkpoints_after_crash")
    assert verdict(checks, tree) == "incomplete"
    assert problems(checks, tree) == {("iter_0000040/.metadata", "incomplete", "no_metadata")}
    assert [checks[f"iter_0000040/__{r}_0.distcp"].facts["archives"] for r in range(4)] == [3, 6, 5, 6]
    assert checks["latest_checkpointed_iteration.txt"].facts["names"] == "iter_0000020"
    # after the tracker-based resume re-saved 40 and 60, everything is whole
    checks, tree = check_all(SHARED / "02-sigkill-mid-save" / "artifacts" / "checkpoints")
    assert verdict(checks, tree) == "ok" and tree == []


@pytest.mark.parametrize("copy", ["checkpoints", "checkpoints_after_failure"])
def test_collective_timeout_partial_checkpoint(copy):
    """03: rank 1 stalled in write_data; ranks 0/2/3 wrote their shards; no .metadata and no
    __1_0.distcp (scenario.json partial_checkpoint). The absent rank is inferred from the gap."""
    assert "__1_0.distcp missing" in ground_truth("03-collective-timeout")["partial_checkpoint"]
    checks, tree = check_all(SHARED / "03-collective-timeout" / "artifacts" / copy)
    assert verdict(checks, tree) == "incomplete"
    assert problems(checks, tree) == {("step_0000040/.metadata", "incomplete", "no_metadata"),
                                      ("step_0000040/__1_0.distcp", "incomplete", "missing")}
    assert all(c.verdict == "ok" for rel, c in checks.items())


def test_world_size_mismatch_files_are_structurally_ok():
    checks, tree = check_all(SHARED / "06-world-size-mismatch" / "artifacts")
    assert verdict(checks, tree) == "ok" and tree == []


# --- hostile pickles ---------------------------------------------------------------------------

MARKER_NAME = "PWNED"


class _SystemCall:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class _EvalCall:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (eval, (f"__import__('os').system('touch {self.marker}')",))


def _unicode(s: str) -> bytes:
    b = s.encode()
    return b"X" + struct.pack("<I", len(b)) + b


def _getattr_chain_proto2(marker: Path) -> bytes:
    """builtins.getattr(builtins.__import__('os'), 'system')('touch MARKER'), GLOBAL opcodes."""
    return (b"\x80\x02cbuiltins\ngetattr\ncbuiltins\n__import__\n" + _unicode("os") + b"\x85R"
            + _unicode("system") + b"\x86R" + _unicode(f"touch {marker}") + b"\x85R.")


def _getattr_chain_stack_global(marker: Path) -> bytes:
    """The same chain with protocol 4 STACK_GLOBAL opcodes."""
    def sg(module: str, name: str) -> bytes:
        return _unicode(module) + _unicode(name) + b"\x93"
    return (b"\x80\x04" + sg("builtins", "getattr") + sg("builtins", "__import__") + _unicode("os") + b"\x85R"
            + _unicode("system") + b"\x86R" + _unicode(f"touch {marker}") + b"\x85R.")


def _dunder_path(marker: Path) -> bytes:
    """An allowed module, but a qualname walking into __globals__ (protocol 4 dotted names)."""
    return (b"\x80\x04" + _unicode("torch.distributed.checkpoint.metadata")
            + _unicode("Metadata.__init__.__globals__") + b"\x93.")


def _nested_in_metadata(marker: Path) -> bytes:
    """A plausible Metadata whose storage_data hides a subprocess call."""
    meta = (b"\x80\x04" + _unicode("torch.distributed.checkpoint.metadata") + _unicode("Metadata") + b"\x93)\x81"
            + b"}(" + _unicode("storage_data") + b"}(" + _unicode("k")
            + _unicode("subprocess") + _unicode("check_call") + b"\x93" + _unicode("touch") + _unicode(str(marker))
            + b"\x86\x85R" + b"uub.")
    return meta


HOSTILE = {
    "os_system_p0": (lambda m: pickle.dumps(_SystemCall(m), protocol=0), "posix.system"),
    "os_system_p2": (lambda m: pickle.dumps(_SystemCall(m), protocol=2), "posix.system"),
    "os_system_p5": (lambda m: pickle.dumps(_SystemCall(m), protocol=5), "posix.system"),
    "eval": (lambda m: pickle.dumps(_EvalCall(m), protocol=2), "builtins.eval"),
    "getattr_chain": (_getattr_chain_proto2, "builtins.getattr"),
    "getattr_stack_global": (_getattr_chain_stack_global, "builtins.getattr"),
    "dunder_path": (_dunder_path, "Metadata.__init__.__globals__"),
    "nested": (_nested_in_metadata, "subprocess.check_call"),
}


@pytest.mark.parametrize("variant", sorted(HOSTILE))
def test_hostile_metadata_pickle_is_refused_and_never_runs(tmp_path, variant):
    make, refused = HOSTILE[variant]
    marker = tmp_path / MARKER_NAME
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / ".metadata").write_bytes(make(marker))
    shutil.copy(CLEAN01 / "checkpoint-60" / "pytorch_model_fsdp_0" / "__0_0.distcp", ckpt)
    fc = check_file(ckpt, ".metadata")
    assert fc.format == "dcp_metadata"
    assert [(f.verdict, f.problem) for f in fc.findings] == [("corrupt", "unsafe_pickle")]
    assert refused in fc.findings[0].detail and "nothing was run" in fc.findings[0].detail
    # the shard next to it is still checked (walked, the metadata being unusable); the tree adds nothing
    assert check_file(ckpt, "__0_0.distcp").verdict == "ok"
    assert check_tree(ckpt, files_of(ckpt)) == []
    assert not marker.exists()


def test_hostile_legacy_torch_pickle_is_refused(tmp_path):
    marker = tmp_path / MARKER_NAME
    head = b"".join(pickle.dumps(x, protocol=2) for x in (0x1950A86A20F9469CFC6C, 1001, {"little_endian": True}))
    (tmp_path / "evil.pt").write_bytes(head + pickle.dumps(_SystemCall(marker), protocol=2)
                                       + pickle.dumps([], protocol=2))
    fc = check_file(tmp_path, "evil.pt")
    assert fc.format == "torch_legacy"
    assert [(f.verdict, f.problem) for f in fc.findings] == [("corrupt", "unsafe_pickle")]
    assert "posix.system" in fc.findings[0].detail
    assert not marker.exists()


def test_bytearray8_with_a_huge_declared_length_is_not_allocated(tmp_path):
    """CPython allocates a BYTEARRAY8's declared size before reading it: the opcode pre-pass
    refuses the length first (a 1 TiB claim in a 30-byte file)."""
    (tmp_path / ".metadata").write_bytes(b"\x80\x05\x96" + struct.pack("<Q", 1 << 40) + b"\0" * 16 + b".")
    fc = check_file(tmp_path, ".metadata")
    assert fc.verdict in ("incomplete", "corrupt") and fc.findings[0].problem in ("truncated", "bad_pickle")


# --- robustness: random damage never raises ------------------------------------------------------

_BLOBS = {name: p.read_bytes() for name, p in {
    "checkpoint-40.pt": TORN_PT / "checkpoint-40.pt",
    "model.safetensors": TORN_ST / "model.safetensors",
    "checkpoint-40.legacy.pt": TORN_PT / "checkpoint-40.legacy.pt",
    ".metadata": CLEAN01 / "checkpoint-60" / "pytorch_model_fsdp_0" / ".metadata",
}.items() if p.exists()}


@st.composite
def damaged(draw):
    name = draw(st.sampled_from(sorted(_BLOBS)))
    data = bytearray(_BLOBS[name])
    if draw(st.booleans()):
        data = data[:draw(st.integers(0, len(data)))]
    for _ in range(draw(st.integers(0, 8))):
        if data:
            i = draw(st.integers(0, len(data) - 1))
            data[i] = draw(st.integers(0, 255))
    return name, bytes(data)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=damaged())
def test_random_damage_always_gives_a_file_check(tmp_path, case):
    name, data = case
    (tmp_path / name).write_bytes(data)
    fc = check_file(tmp_path, name)
    assert isinstance(fc, FileCheck)
    assert not [f for f in fc.findings if f.problem in ("check_failed", "unreadable")], fc.findings
    if data == _BLOBS[name]:
        assert fc.verdict == "ok"


# --- errors reading files ----------------------------------------------------------------------

def test_vanished_and_non_regular_files_are_unreadable(tmp_path):
    fc = check_file(tmp_path, "gone.safetensors")
    assert (fc.verdict, fc.findings[0].problem) == ("unverifiable", "unreadable")
    assert "No such file" in fc.findings[0].detail
    os.mkfifo(tmp_path / "pipe.pt")
    fc = check_file(tmp_path, "pipe.pt")
    assert (fc.verdict, fc.findings[0].problem) == ("unverifiable", "unreadable")


def _drop_dac() -> None:  # pragma: no cover - runs in the child
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH: root ignores modes without this
        libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP


def test_permission_denied_is_a_finding(tmp_path):
    shutil.copy(TORN_ST / "model.safetensors", tmp_path)
    (tmp_path / "model.safetensors").chmod(0)
    code = ("import sys, json; from pathlib import Path; from ckptwatch.integrity.formats import check_file; "
            "fc = check_file(Path(sys.argv[1]), 'model.safetensors'); "
            "print(json.dumps([f.to_json() for f in fc.findings]))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60,
                         preexec_fn=_drop_dac if os.geteuid() == 0 else None, cwd=ROOT)
    (f,) = json.loads(out.stdout)
    assert (f["verdict"], f["problem"]) == ("unverifiable", "unreadable") and "Permission denied" in f["detail"]


# --- DeepSpeed and Hugging Face layouts (synthetic) ------------------------------------------------

def _torch_like_zip(path: Path, obj: object) -> None:
    """A zip shaped like torch.save's (STORED, one top folder, data.pkl first)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr(f"{path.stem}/data.pkl", pickle.dumps(obj, protocol=2))
        z.writestr(f"{path.stem}/version", "3\n")


def _deepspeed(root: Path, *, dp: int, recorded_dp: int | None = None, tag: str = "global_step20",
               skip: tuple[str, ...] = ()) -> Path:
    (root / tag).mkdir(parents=True)
    (root / "latest").write_text(tag)
    names = ["mp_rank_00_model_states.pt"] + [f"bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(dp)]
    for n in names:
        if n not in skip:
            _torch_like_zip(root / tag / n, {"dp_world_size": recorded_dp or dp, "module": {}})
    return root


def test_deepspeed_complete_layout_is_ok(tmp_path):
    root = _deepspeed(tmp_path / "ds", dp=4)
    checks, tree = check_all(root)
    assert verdict(checks, tree) == "ok" and tree == []
    assert checks["latest"].format == "deepspeed_latest" and checks["latest"].facts["tag"] == "global_step20"
    assert checks["global_step20/mp_rank_00_model_states.pt"].format == "torch_zip"


def test_deepspeed_latest_naming_a_missing_tag_directory(tmp_path):
    root = _deepspeed(tmp_path / "ds", dp=2)
    (root / "latest").write_text("global_step40\n")
    _, tree = check_all(root)
    assert [(f.path, f.verdict, f.problem) for f in tree] == [("global_step40/", "incomplete", "missing")]


def test_deepspeed_missing_rank_file(tmp_path):
    gone = "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
    root = _deepspeed(tmp_path / "ds", dp=4, skip=(gone,))
    _, tree = check_all(root)
    assert [(f.path, f.verdict, f.problem) for f in tree] == [(f"global_step20/{gone}", "incomplete", "missing")]
    assert "data-parallel rank 1" in tree[0].detail


def test_deepspeed_missing_highest_rank_found_from_recorded_world_size(tmp_path):
    """Rank 3 of 4 absent: the names alone suggest 3 ranks; mp_rank_00_model_states.pt records 4."""
    root = _deepspeed(tmp_path / "ds", dp=3, recorded_dp=4)
    _, tree = check_all(root)
    assert [(f.path, f.problem) for f in tree] == [
        ("global_step20/bf16_zero_pp_rank_3_mp_rank_00_optim_states.pt", "missing")]
    assert "recorded in mp_rank_00_model_states.pt" in tree[0].detail
    (root / "latest").write_text("")
    assert [(f.verdict, f.problem) for f in check_file(root, "latest").findings] == [("incomplete", "empty")]


def test_hf_index_missing_shard_and_mismatch(tmp_path):
    one = _safetensors({"a": ("F32", [1], b"\0" * 4)})
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(one)
    (tmp_path / "model-00002-of-00002.safetensors").write_bytes(one)
    index = {"metadata": {"total_size": 8}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                                                           "b": "model-00002-of-00002.safetensors",
                                                           "c": "model-00003-of-00003.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    checks, tree = check_all(tmp_path)
    assert checks["model.safetensors.index.json"].format == "hf_index"
    assert checks["model.safetensors.index.json"].facts["tensors"] == 3
    assert {(f.path, f.verdict, f.problem) for f in tree} == {
        ("model-00002-of-00002.safetensors", "corrupt", "index_mismatch"),  # its header lists a, not b
        ("model-00003-of-00003.safetensors", "incomplete", "missing")}
    (tmp_path / "model.safetensors.index.json").write_text('{"weight_map": ')
    assert check_file(tmp_path, "model.safetensors.index.json").findings[0].problem == "bad_index"


def test_detect_format_by_name_and_magic(tmp_path):
    assert detect_format(CLEAN01 / "checkpoint-60" / "pytorch_model_fsdp_0" / ".metadata") == "dcp_metadata"
    assert detect_format(CLEAN01 / "checkpoint-60" / "pytorch_model_fsdp_0" / "__3_0.distcp") == "dcp_shard"
    assert detect_format(TORN_ST / "model.trunc_4bytes.safetensors") == "safetensors"
    assert detect_format(TORN_PT / "checkpoint-40.trunc50.pt") == "torch_zip"  # first member is data.pkl
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "plain.zip").write_bytes(b"")
    with zipfile.ZipFile(tmp_path / "plain.zip", "w") as z:
        z.writestr("readme.md", "x")
    assert detect_format(tmp_path / "notes.txt") == "unknown"
    assert detect_format(tmp_path / "plain.zip") == "zip"
    assert check_file(tmp_path, "notes.txt").verdict == "unverifiable"
    damaged_magic = bytearray((TORN_PT / "checkpoint-40.pt").read_bytes())
    damaged_magic[0] ^= 0xFF
    (tmp_path / "x.pt").write_bytes(damaged_magic)
    fc = check_file(tmp_path, "x.pt")
    assert (fc.format, fc.verdict, fc.findings[0].problem) == ("torch_zip", "corrupt", "bad_local_header")
