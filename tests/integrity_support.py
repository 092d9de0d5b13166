"""Helpers of the integrity tests: the real checkpoint fixture, the corpus' damage, and running
the CLI as a process that file permissions apply to (also when the tests run as root)."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import pickle
import shutil
import struct
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

#: A real 4-rank DCP checkpoint (HF/accelerate FSDP layout) from the corpus' 01-clean run.
CHECKPOINT = Path(__file__).resolve().parent / "fixtures" / "corpus" / "01-clean" / "artifacts" / "output" / "checkpoint-60"
SHARD = "pytorch_model_fsdp_0/__1_0.distcp"  # the shard scenario 07 truncated and bit-flipped
DELETED = "pytorch_model_fsdp_0/__2_0.distcp"  # the shard scenario 07 deleted


def copy_checkpoint(dst: Path) -> Path:
    """A writable copy of :data:`CHECKPOINT` at ``dst`` (``dst`` must not exist)."""
    shutil.copytree(CHECKPOINT, dst)
    for p in dst.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dst


def flip_middle_byte(path: Path) -> int:
    """XOR 0xFF the byte at the middle of the file, as scenario 07's bitflip-shard; returns its offset."""
    data = bytearray(path.read_bytes())
    off = len(data) // 2
    data[off] ^= 0xFF
    path.write_bytes(bytes(data))
    return off


def truncate_half(path: Path) -> int:
    """Truncate the file to 50 %, as scenario 07's truncated-shard; returns the new size."""
    size = path.stat().st_size // 2
    os.truncate(path, size)
    return size


def _drop_dac_capabilities() -> None:  # pragma: no cover - runs in the child before exec
    """Root ignores file modes through CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH: drop both from the
    bounding set so the exec'd process (still uid 0) gets "permission denied" like a user would."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            os._exit(97)


def run_cli(*args: object, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``python -m ckptwatch ARGS`` in a subprocess where file permissions are enforced."""
    return subprocess.run([sys.executable, "-m", "ckptwatch", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, preexec_fn=_drop_dac_capabilities if os.geteuid() == 0 else None,
                          env={**os.environ, "COLUMNS": "300"})


# --- hand-built archives, pickles and DCP metadata (for the attack and fuzz tests) ----------------

MIB = 1 << 20


class Member(NamedTuple):
    """One zip member as written: ``payload`` is the bytes after the local header (compressed
    for method 8), ``usize`` / ``crc`` those of the uncompressed data."""

    name: bytes
    method: int
    crc: int
    payload: bytes
    usize: int


def stored(name: str, data: bytes) -> Member:
    return Member(name.encode(), 0, zlib.crc32(data), data, len(data))


def deflated(name: str, data: bytes) -> Member:
    co = zlib.compressobj(9, zlib.DEFLATED, -15)
    return Member(name.encode(), 8, zlib.crc32(data), co.compress(data) + co.flush(), len(data))


@functools.lru_cache(maxsize=8)
def _zeros_deflated(n: int) -> tuple[bytes, int]:
    co = zlib.compressobj(9, zlib.DEFLATED, -15)
    block, parts, crc = b"\0" * MIB, [], 0
    for _ in range(n // MIB):
        parts.append(co.compress(block))
        crc = zlib.crc32(block, crc)
    return b"".join(parts) + co.flush(), crc


def deflated_zeros(name: str, n: int) -> Member:
    """``n`` zero bytes (a multiple of 1 MiB), DEFLATEd (about 1,000:1)."""
    payload, crc = _zeros_deflated(n)
    return Member(name.encode(), 8, crc, payload, n)


def zip_archive(members: list[Member], *, central: list[tuple[int, bytes | None]] | None = None,
                local_at: dict[int, int] | None = None, prefix: bytes = b"") -> bytes:
    """A zip archive (PKWARE APPNOTE 4.3) of ``members``, their local headers back to back after
    ``prefix``. ``central``: the central directory as (member index, name or None for the
    member's own) pairs, default one entry per member; a repeated index is the zip-bomb trick
    (several entries, one local header). ``local_at``: member index -> the offset its central
    entries claim instead of the real one. ZIP64 end records when there are >= 65535 entries."""
    out = bytearray(prefix)
    offsets = []
    for m in members:
        offsets.append(len(out))
        out += struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, m.method, 0, 0, m.crc, len(m.payload), m.usize,
                           len(m.name), 0) + m.name + m.payload
    for i, off in (local_at or {}).items():
        offsets[i] = off
    cd_start = len(out)
    central = central if central is not None else [(i, None) for i in range(len(members))]
    for i, name in central:
        m = members[i]
        name = name if name is not None else m.name
        out += struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 20, 20, 0, m.method, 0, 0, m.crc, len(m.payload),
                           m.usize, len(name), 0, 0, 0, 0, 0, offsets[i]) + name
    cd_size, n = len(out) - cd_start, len(central)
    if n >= 0xFFFF:
        z64 = len(out)
        out += struct.pack("<4sQHHIIQQQQ", b"PK\x06\x06", 44, 45, 45, 0, 0, n, n, cd_size, cd_start)
        out += struct.pack("<4sIQI", b"PK\x06\x07", 0, z64, 1)
        out += struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    else:
        out += struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, n, n, cd_size, cd_start, 0)
    return bytes(out)


def data_pkl(obj: object = None, *, raw: bytes | None = None, folder: str = "archive") -> Member:
    """``<folder>/data.pkl`` holding ``obj`` pickled (protocol 2), or the bytes ``raw``."""
    return stored(f"{folder}/data.pkl", raw if raw is not None else pickle.dumps(obj or {"step": 1}, protocol=2))


def repeated_member_bomb(repeats: int = 256, member: int = 64 * MIB) -> bytes:
    """The issue-14 torch zip: ``data.pkl`` and one DEFLATEd member of ``member`` zero bytes whose
    central directory entry is repeated ``repeats`` times (same name, same local header)."""
    return zip_archive([data_pkl(), deflated_zeros("archive/data/0", member)],
                       central=[(0, None)] + [(1, None)] * repeats)


class SystemCall:
    """Pickles as ``os.system(command)``: what a hostile checkpoint runs on ``pickle.load``."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


# A minimal pickle emitter (protocol 2 opcodes, Lib/pickletools.py) for DCP .metadata without torch.

def p_str(s: str) -> bytes:
    b = s.encode()
    return b"X" + struct.pack("<I", len(b)) + b


def p_int(i: int) -> bytes:
    raw = i.to_bytes((i.bit_length() + 8) // 8 or 1, "little", signed=True)
    return b"\x8a" + bytes([len(raw)]) + raw


def p_dict(items: list[tuple[bytes, bytes]]) -> bytes:
    return b"}" + (b"(" + b"".join(k + v for k, v in items) + b"u" if items else b"")


def p_obj(module: str, name: str, fields: dict[str, bytes]) -> bytes:
    """``module.name.__new__`` then ``BUILD`` with ``fields`` (already pickled values)."""
    return (b"c" + module.encode() + b"\n" + name.encode() + b"\n" + b")\x81"
            + p_dict([(p_str(k), v) for k, v in fields.items()]) + b"b")


DCP_META = "torch.distributed.checkpoint.metadata"
DCP_FS = "torch.distributed.checkpoint.filesystem"


def dcp_metadata(entries: list[tuple[str, str, int, int]]) -> bytes:
    """A DCP ``.metadata`` pickle whose ``storage_data`` maps ``MetadataIndex(fqn)`` to
    ``_StorageInfo(relative_path, offset, length)`` for each (fqn, path, offset, length)."""
    storage = [(p_obj(DCP_META, "MetadataIndex", {"fqn": p_str(fqn), "offset": b"N", "index": b"N"}),
                p_obj(DCP_FS, "_StorageInfo", {"relative_path": p_str(rel), "offset": p_int(off),
                                               "length": p_int(length)}))
               for fqn, rel, off, length in entries]
    return b"\x80\x02" + p_obj(DCP_META, "Metadata", {"state_dict_metadata": p_dict([]),
                                                      "storage_data": p_dict(storage),
                                                      "version": p_str("1.0.0")}) + b"."


# --- what a check touches outside the checkpoint -------------------------------------------------

_RECORDING: list[list[tuple[str, str]]] = []
_HOOKED = False


def _audit(event: str, args: tuple) -> None:
    if _RECORDING and event in ("open", "os.scandir", "os.listdir") and args and isinstance(args[0], (str, bytes,
                                                                                                   os.PathLike)):
        _RECORDING[-1].append((event, os.fsdecode(args[0])))


@contextlib.contextmanager
def record_access() -> Iterator[list[tuple[str, str]]]:
    """Every path opened, listed, ``stat``-ed or ``lstat``-ed (by any thread) inside the block,
    as (what, absolute path) pairs."""
    global _HOOKED
    if not _HOOKED:
        sys.addaudithook(_audit)
        _HOOKED = True
    seen: list[tuple[str, str]] = []
    real_stat, real_lstat = os.stat, os.lstat

    def stat(p, *a, **k):
        if not isinstance(p, int):
            seen.append(("stat", os.fsdecode(os.fspath(p))))
        return real_stat(p, *a, **k)

    def lstat(p, *a, **k):
        seen.append(("lstat", os.fsdecode(os.fspath(p))))
        return real_lstat(p, *a, **k)

    _RECORDING.append(seen)
    os.stat, os.lstat = stat, lstat
    try:
        yield seen
    finally:
        os.stat, os.lstat = real_stat, real_lstat
        _RECORDING.pop()


_OWN = tuple(os.path.realpath(p) + os.sep for p in {sys.prefix, sys.base_prefix, sys.exec_prefix,
                                                        str(Path(__file__).resolve().parent.parent)})


def outside(seen: list[tuple[str, str]], root: Path) -> list[tuple[str, str]]:
    """The accesses of ``seen`` that left ``root``: where each really led (symlinks resolved; an
    ``lstat`` does not follow its last component). Python's own files, and ``lstat`` / ``stat``
    of the root's ancestors (resolving the root itself needs those), are not counted."""
    base = os.path.realpath(root)
    out = []
    for what, p in seen:
        a = os.path.abspath(p)
        if a.startswith(_OWN) or a.endswith((".py", ".pyc", ".so")):
            continue
        if what == "lstat":
            a = os.path.join(os.path.realpath(os.path.dirname(a)), os.path.basename(a))
        else:
            a = os.path.realpath(a)
        if a == base or a.startswith(base + os.sep):
            continue
        if what in ("stat", "lstat") and (base + os.sep).startswith(a.rstrip(os.sep) + os.sep):
            continue
        out.append((what, p))
    return out
