"""Fuzzing every checkpoint format ``verify`` parses (issue 14).

For each format (torch zip, torch legacy, safetensors, Hugging Face index, DeepSpeed, DCP,
the manifest, plain pickles) hypothesis mutates valid files (bit flips, "interesting"
values, truncation, insertion, deletion, spliced copies of a range, for JSON also hostile
values) and runs the whole of ``verify`` on a checkpoint directory holding them. The
property, every example:

* ``verify`` returns a report: no exception, no ``check_failed`` finding (a checker that
  raised: a bug), for an unmodified seed the verdict ``ok``;
* nothing outside the checkpoint directory is opened, listed or stat-ed (audit hook on
  ``open`` / ``os.scandir`` plus wrapped ``os.stat`` / ``os.lstat``, each access resolved to
  where it really led);
* bounded work: each example finishes within :data:`MAX_SECONDS`.

Found so far: a 14-byte pickle whose memo index made the C unpickler allocate 6 GB (now
refused by :mod:`ckptwatch.integrity.formats.pickle_scan`), a manifest number of 4,783
digits that made ``verify`` raise (now ``bad_manifest``).

``CKPTWATCH_FUZZ_EXAMPLES`` (default 2,400) is the number of examples over all formats,
split evenly: a soak runs ``CKPTWATCH_FUZZ_EXAMPLES=100000``. ``CKPTWATCH_FUZZ_REPORT=FILE``
appends one JSON line per format (examples, seconds, findings by problem code).
"""

from __future__ import annotations

import collections
import json
import os
import pickle
import shutil
import struct
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from integrity_support import (SystemCall, data_pkl, dcp_metadata, deflated, outside, p_str, record_access, stored,
                               zip_archive)

from ckptwatch.integrity.manifest import create_manifest
from ckptwatch.integrity.verify import verify

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "fixtures" / "corpus"
TARGETS = ("torch_zip", "torch_legacy", "safetensors", "hf_index", "deepspeed", "dcp", "manifest", "pickle")
TOTAL = int(os.environ.get("CKPTWATCH_FUZZ_EXAMPLES", "2400"))
PER_TARGET = max(10, TOTAL // len(TARGETS))
#: Wall seconds one example may take (they take milliseconds; a blow-up takes minutes).
MAX_SECONDS = 5.0

INTERESTING = (b"\x00" * 4, b"\xff" * 4, b"\xff\xff\xff\x7f", b"\x00\x00\x00\x80", struct.pack("<Q", 1 << 40),
               struct.pack("<Q", (1 << 64) - 1), b"PK\x01\x02", b"PK\x03\x04", b"PK\x05\x06", b"PK\x06\x06",
               b"PK\x06\x07", b"\x80\x05", b"\x80\x02", b"../", b"/", b"\x00", b'"', b"{", b"[", b"]", b"}",
               b"cos\nsystem\n", b"\x93", b"R", b"\x81", b"\x96", b"Q", b"(", b"t", b"9" * 5000)
HOSTILE_NAMES = ("../outside.safetensors", "/etc/passwd", "..", ".", "", "a/../../x", "x\x00y", "//x", "./model-1"
                 ".safetensors", "sub/../model-1.safetensors", "\\..\\x", "link.safetensors", 7, None, [], {"a": 1})


# --- seeds -------------------------------------------------------------------------------------

def _safetensors(names: tuple[str, ...] = ("a", "b")) -> bytes:
    header, data = {"__metadata__": {"format": "pt"}}, b""
    for n in names:
        header[n] = {"dtype": "F32", "shape": [2], "data_offsets": [len(data), len(data) + 8]}
        data += b"\1" * 8
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def _torch_zip(obj: object = None, *, method: int = 0) -> bytes:
    pkl = pickle.dumps(obj if obj is not None else {"step": 1, "lr": [0.1, 0.2]}, protocol=2)
    first = data_pkl(raw=pkl) if method == 0 else deflated("archive/data.pkl", pkl)
    return zip_archive([first, stored("archive/byteorder", b"little"), stored("archive/data/0", b"\2" * 64),
                        deflated("archive/data/1", b"\0" * 4096), stored("archive/version", b"3\n")])


def _legacy() -> bytes:
    """A small legacy torch.save file: magic, version, sys_info, {"w": tensor of 4 floats}, keys, storage."""
    head = b"".join(pickle.dumps(x, protocol=2) for x in (
        0x1950A86A20F9469CFC6C, 1001, {"protocol_version": 1001, "little_endian": True,
                                       "type_sizes": {"short": 2, "int": 4, "long": 4}}))
    pid = b"(" + p_str("storage") + b"ctorch\nFloatStorage\n" + p_str("0") + p_str("cpu") + b"K\x04tQ"
    rebuild = (b"ctorch._utils\n_rebuild_tensor_v2\n(" + pid + b"K\x00K\x04\x85K\x01\x85\x89"
               + b"ccollections\nOrderedDict\n)RtR")
    obj = b"\x80\x02}(" + p_str("w") + rebuild + b"u."
    return head + obj + pickle.dumps(["0"], protocol=2) + struct.pack("<q", 4) + b"\0" * 16


def _dir(files: dict[str, bytes]) -> dict[str, bytes]:
    return dict(files)


SEEDS: dict[str, list[dict[str, bytes]]] = {
    "torch_zip": [{"model.pt": _torch_zip()}, {"model.pt": _torch_zip(method=8)},
                  {"model.pt": (CORPUS / "04-torn-torch-save/artifacts/files/checkpoint-40.pt").read_bytes()}],
    "torch_legacy": [{"model.pt": _legacy()},
                     {"model.pt": (CORPUS / "04-torn-torch-save/artifacts/files/checkpoint-40.legacy.pt").read_bytes()}],
    "safetensors": [{"model.safetensors": _safetensors()},
                    {"model.safetensors": (CORPUS / "05-torn-safetensors/artifacts/files/model.safetensors").read_bytes()}],
    "hf_index": [{"model-1.safetensors": _safetensors(("a",)), "model-2.safetensors": _safetensors(("b",)),
                  "model.safetensors.index.json": json.dumps({"metadata": {"total_size": 16}, "weight_map": {
                      "a": "model-1.safetensors", "b": "model-2.safetensors"}}).encode()}],
    "deepspeed": [{"latest": b"global_step1",
                   "global_step1/mp_rank_00_model_states.pt": _torch_zip({"dp_world_size": 2, "module": {}}),
                   "global_step1/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt": _torch_zip({"o": 1}),
                   "global_step1/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt": _torch_zip({"o": 2})}],
    "dcp": [{p.name: p.read_bytes() for p in (CORPUS / "01-clean/artifacts/output/checkpoint-60/pytorch_model_fsdp_0")
             .iterdir()},
            {"__0_0.distcp": _torch_zip() + _torch_zip({"x": 2}),
             ".metadata": dcp_metadata([("a", "__0_0.distcp", 0, len(_torch_zip())),
                                        ("b", "__0_0.distcp", len(_torch_zip()), len(_torch_zip({"x": 2})))])}],
    "pickle": [{"optimizer.pkl": pickle.dumps({"lr": 0.1, "betas": (0.9, 0.99), "step": [1, 2, 3]}, protocol=2)},
               {"state.bin": pickle.dumps({"a": b"xyz"}, protocol=4) + pickle.dumps([1.5], protocol=5)}],
}


def _manifest_seed() -> dict[str, bytes]:
    d = Path(tempfile.mkdtemp(prefix="ckptwatch-fuzz-seed-"))
    try:
        files = {"model.safetensors": _safetensors(), "model.pt": _torch_zip(), "trainer_state.json": b'{"step": 3}'}
        for name, blob in files.items():
            (d / name).write_bytes(blob)
        create_manifest(d)
        return {**files, "ckptwatch-manifest.json": (d / "ckptwatch-manifest.json").read_bytes()}
    finally:
        shutil.rmtree(d)


SEEDS["manifest"] = [_manifest_seed()]
#: Which file of a seed directory each target mutates (the others stay valid).
MUTATE = {"hf_index": ["model.safetensors.index.json", "model-1.safetensors"], "deepspeed": ["latest",
          "global_step1/mp_rank_00_model_states.pt"], "dcp": [".metadata", "__0_0.distcp", "__1_0.distcp"],
          "manifest": ["ckptwatch-manifest.json"]}


# --- mutations -------------------------------------------------------------------------------------

@st.composite
def _position(draw, n: int) -> int:
    """Anywhere, near the head (headers, magic) or near the tail (zip end records)."""
    where = draw(st.sampled_from(("any", "head", "tail")))
    if where == "head":
        return draw(st.integers(0, min(n - 1, 255)))
    if where == "tail":
        return n - 1 - draw(st.integers(0, min(n - 1, 1023)))
    return draw(st.integers(0, n - 1))


@st.composite
def mutate_bytes(draw, seed: bytes) -> bytes:
    data = bytearray(seed)
    for _ in range(draw(st.integers(0, 6))):
        op = draw(st.sampled_from(("flip", "set", "interesting", "truncate", "insert", "delete", "splice", "append")))
        n = len(data)
        if op == "truncate":
            del data[draw(st.integers(0, n)):]
        elif op == "append" or n == 0:
            data += draw(st.binary(min_size=1, max_size=64))
        elif op == "flip":
            data[draw(_position(n))] ^= 1 << draw(st.integers(0, 7))
        elif op == "set":
            data[draw(_position(n))] = draw(st.integers(0, 255))
        elif op == "interesting":
            i = draw(_position(n))
            v = draw(st.sampled_from(INTERESTING))
            data[i:i + len(v)] = v
        elif op == "insert":
            i = draw(_position(n))
            data[i:i] = draw(st.binary(min_size=1, max_size=64))
        elif op == "delete":
            i = draw(_position(n))
            del data[i:i + draw(st.integers(1, 256))]
        else:  # splice: a copy of one range inserted elsewhere (a repeated zip entry, a pickle opcode run)
            a = draw(_position(n))
            chunk = bytes(data[a:a + draw(st.integers(1, 512))]) * draw(st.integers(1, 8))
            i = draw(_position(n))
            data[i:i] = chunk
    return bytes(data)


def _json_mutation(draw, seed: bytes) -> bytes:
    """Replace values of a JSON document (shard names, manifest paths, sizes) with hostile ones."""
    doc = json.loads(seed)

    def visit(x, depth=0):
        if isinstance(x, dict):
            return {k: (draw(st.sampled_from(HOSTILE_NAMES)) if draw(st.integers(0, 5)) == 0 else visit(v, depth + 1))
                    for k, v in x.items()}
        if isinstance(x, list):
            return [draw(st.sampled_from(HOSTILE_NAMES)) if draw(st.integers(0, 5)) == 0 else visit(v, depth + 1)
                    for v in x]
        return x

    return json.dumps(visit(doc)).encode()


_NUMBERS = st.one_of(st.integers(-2, 70), st.sampled_from((1 << 31, 1 << 32, 1 << 40, 1 << 63, 1 << 64, 10 ** 4000)))


@st.composite
def zip_layout(draw) -> bytes:
    """A torch-like zip whose central directory repeats, renames or points entries at other
    members' bytes (``local_at``), members STORED or DEFLATEd."""
    members = [data_pkl(draw(st.sampled_from(({"a": 1}, [1, 2], SystemCall("true")))))]
    for i in range(draw(st.integers(0, 4))):
        blob = draw(st.binary(max_size=200)) * draw(st.integers(1, 50))
        members.append((deflated if draw(st.booleans()) else stored)(f"archive/data/{i}", blob))
    central = draw(st.lists(st.tuples(st.integers(0, len(members) - 1),
                                      st.sampled_from((None, b"archive/data.pkl", b"archive/x.pkl", b"../x"))),
                            min_size=1, max_size=12))
    local_at = draw(st.dictionaries(st.integers(0, len(members) - 1), st.integers(0, 2000), max_size=2))
    return zip_archive(members, central=central, local_at=local_at)


@st.composite
def safetensors_header(draw) -> bytes:
    """A safetensors file whose header JSON has hostile values (shapes, offsets, dtypes, keys)."""
    header: dict = {}
    if draw(st.booleans()):
        header["__metadata__"] = draw(st.sampled_from(({"a": "b"}, {"a": 1}, [], "x", None)))
    pos = 0
    for i in range(draw(st.integers(0, 5))):
        shape = draw(st.lists(_NUMBERS, max_size=5))
        n = draw(st.one_of(st.just(4 * (shape[0] if shape and type(shape[0]) is int and 0 <= shape[0] < 99 else 1)),
                           _NUMBERS))
        offs = draw(st.sampled_from(([pos, pos + n] if isinstance(n, int) else [pos, pos], [n, pos], [pos], "x")))
        header[f"t{i}"] = {"dtype": draw(st.sampled_from(("F32", "F4", "BOOL", "Q9", 3))), "shape": shape,
                           "data_offsets": offs}
        pos += n if isinstance(n, int) and 0 <= n < 4096 else 0
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + b"\0" * max(0, min(pos, 1 << 16))


@st.composite
def dcp_layout(draw) -> dict[str, bytes]:
    """A shard of torch zips and a .metadata whose entries name hostile paths and ranges."""
    shard = b"".join(_torch_zip({"i": i}) for i in range(draw(st.integers(1, 3))))
    names = ("__0_0.distcp", "__1_0.distcp", "../__0_0.distcp", "/etc/passwd", "sub/__0_0.distcp", "")
    entries = draw(st.lists(st.tuples(st.sampled_from(("w", "b", "x.y")), st.sampled_from(names),
                                      st.integers(0, len(shard) + 8), st.integers(0, len(shard) + 8)),
                            min_size=1, max_size=20))
    return {"__0_0.distcp": shard, ".metadata": dcp_metadata(entries)}


@st.composite
def case(draw, target: str) -> tuple[dict[str, bytes], bool]:
    """(files of a checkpoint directory, whether they are an unmodified seed)."""
    files = dict(draw(st.sampled_from(SEEDS[target])))
    choices = [n for n in MUTATE.get(target, list(files)) if n in files]
    name = draw(st.sampled_from(choices))
    kind = draw(st.sampled_from(("bytes", "bytes", "json", "none", "structure")))
    if kind == "structure" and target in ("torch_zip", "deepspeed", "safetensors", "dcp"):
        if target == "dcp":
            files = draw(dcp_layout())
        elif target == "safetensors":
            files = {"model.safetensors": draw(safetensors_header())}
        else:
            name = [n for n in files if n.endswith(".pt")][0]
            files[name] = draw(zip_layout())
        return files, False
    if kind == "structure":
        kind = "bytes"
    if kind == "json" and name.endswith(".json"):
        blob = _json_mutation(draw, files[name])
        if draw(st.booleans()):
            blob = draw(mutate_bytes(blob))
    elif kind == "none":
        return files, True
    else:
        blob = draw(mutate_bytes(files[name]))
    files[name] = blob
    if target == "hf_index" and draw(st.integers(0, 3)) == 0:  # a symlinked shard leading out
        files["link.safetensors"] = b"->../outside.safetensors"
    return files, False


# --- the property --------------------------------------------------------------------------------

STATS: dict[str, dict] = {t: {"examples": 0, "seconds": 0.0, "problems": collections.Counter()} for t in TARGETS}


@pytest.fixture(scope="module")
def base():
    d = Path(tempfile.mkdtemp(prefix="ckptwatch-fuzz-"))
    (d / "outside.safetensors").write_bytes(_safetensors(("a",)))
    yield d
    shutil.rmtree(d, ignore_errors=True)
    report = os.environ.get("CKPTWATCH_FUZZ_REPORT")
    if report:
        with open(report, "a") as f:
            for t, s in STATS.items():
                if s["examples"]:
                    f.write(json.dumps({"target": t, "examples": s["examples"], "seconds": round(s["seconds"], 2),
                                        "problems": dict(s["problems"].most_common())}) + "\n")


def check(base: Path, target: str, files: dict[str, bytes], pristine: bool) -> None:
    root = Path(tempfile.mkdtemp(prefix="checkpoint-", dir=base))
    try:
        for rel, blob in files.items():
            p = root / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            if blob.startswith(b"->"):
                p.symlink_to(blob[2:].decode())
            else:
                p.write_bytes(blob)
        t0 = time.perf_counter()
        with record_access() as seen:
            report = verify(root, workers=1)
        took = time.perf_counter() - t0
        stats = STATS[target]
        stats["examples"] += 1
        stats["seconds"] += took
        findings = [f for r in report.files for f in r.findings] + report.findings
        stats["problems"].update(f.problem for f in findings)
        assert outside(seen, root) == [], (target, outside(seen, root))
        assert not [f for f in findings if f.problem == "check_failed"], findings
        assert took < MAX_SECONDS, (target, took)
        if pristine:
            assert report.verdict == "ok", [f.to_json() for f in findings]
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _fuzz(target: str):
    # No "explain" phase: its line tracer resolves paths of Python's own files while os.lstat is
    # being recorded, which would look like reads outside the checkpoint.
    @settings(max_examples=PER_TARGET, deadline=None, database=None,
              phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
    @given(c=case(target))
    def test(base, c):
        check(base, target, *c)

    test.__name__ = f"test_fuzz_{target}"
    return test


test_fuzz_torch_zip = _fuzz("torch_zip")
test_fuzz_torch_legacy = _fuzz("torch_legacy")
test_fuzz_safetensors = _fuzz("safetensors")
test_fuzz_hf_index = _fuzz("hf_index")
test_fuzz_deepspeed = _fuzz("deepspeed")
test_fuzz_dcp = _fuzz("dcp")
test_fuzz_manifest = _fuzz("manifest")
test_fuzz_pickle = _fuzz("pickle")


def test_the_seeds_are_ok_and_hostile_ones_are_not(base):
    """The property's baseline: every seed verifies ok; the same seeds with a hostile pickle do not."""
    for target, seeds in SEEDS.items():
        for files in seeds:
            check(base, target, files, True)
    evil = pickle.dumps(SystemCall("true"), protocol=2)
    for files in ({"model.pt": _torch_zip(SystemCall("true"))}, {"optimizer.pkl": evil}):
        root = Path(tempfile.mkdtemp(dir=base))
        for rel, blob in files.items():
            (root / rel).write_bytes(blob)
        report = verify(root, workers=1)
        assert [f.problem for r in report.files for f in r.findings] == ["unsafe_pickle"]
