"""Structural check of a legacy (non-zip) ``torch.save`` file, walked without torch.

Layout (``torch/serialization.py``: ``_legacy_save`` / ``_legacy_load``, written by
``torch.save(..., _use_new_zipfile_serialization=False)``), one pickle after another:

1. the magic number ``0x1950a86a20f9469cfc6c`` (pickle protocol 2: ``\\x80\\x02\\x8a\\x0a`` + 10 bytes);
2. the protocol version ``1001``;
3. ``sys_info``: a dict (``little_endian``, ``type_sizes``, ...);
4. the object, whose tensors refer to storages by persistent id
   ``('storage', storage_type, key, location, numel[, view_metadata])``;
5. the sorted list of storage keys;

then, for each key in that order, the storage: an 8-byte little-endian element count and
``count x element_size`` raw bytes. Nothing follows.

The pickles are read with :class:`~.safe_pickle.InertUnpickler` (policy ``TORCH_PICKLE``:
nothing is imported or run); storages are skipped with ``seek`` after checking their count
against the persistent id (constant memory). A file cut short anywhere is ``truncated``.
The format has no checksum: flipped bits in storage bytes are invisible (the manifest's
SHA-256 is what catches them).
"""

from __future__ import annotations

import struct
from typing import Any, BinaryIO

from ckptwatch.integrity.findings import Finding
from ckptwatch.integrity.limits import Budget
from ckptwatch.integrity.formats.safe_pickle import (TORCH_PICKLE, PickleLimitError, UnsafePickleError, load_inert,
                                                    record_name)

MAGIC_NUMBER = 0x1950A86A20F9469CFC6C
PROTOCOL_VERSION = 1001
#: ``\x80\x02`` PROTO 2, ``\x8a\x0a`` LONG1 of 10 bytes, the magic number little-endian.
MAGIC_PREFIX = b"\x80\x02\x8a\x0a" + MAGIC_NUMBER.to_bytes(10, "little")

#: Bytes per element of torch's legacy storage classes.
STORAGE_ELEMENT_BYTES: dict[str, int] = {
    "DoubleStorage": 8, "FloatStorage": 4, "HalfStorage": 2, "BFloat16Storage": 2, "LongStorage": 8,
    "IntStorage": 4, "ShortStorage": 2, "CharStorage": 1, "ByteStorage": 1, "BoolStorage": 1,
    "ComplexFloatStorage": 8, "ComplexDoubleStorage": 16, "QInt8Storage": 1, "QUInt8Storage": 1,
    "QInt32Storage": 4, "QUInt4x2Storage": 1, "QUInt2x4Storage": 1, "UntypedStorage": 1,
}


class _Stop(Exception):
    def __init__(self, verdict: str, problem: str, detail: str):
        self.verdict, self.problem = verdict, problem
        super().__init__(detail)


def _load(f: BinaryIO, size: int, path: str, what: str, budget: Budget, keep_persistent: bool = False
          ) -> tuple[Any, Any]:
    budget.check()
    start = f.tell()
    try:
        return load_inert(f, source=path, policy=TORCH_PICKLE, limit=size - start, keep_persistent=keep_persistent,
                          max_bytes=budget.limits.max_pickle_bytes)
    except UnsafePickleError as e:
        raise _Stop("corrupt", "unsafe_pickle", f"{what} (byte {start}) refers to {e.global_name}: refused, "
                    "nothing was run") from None
    except PickleLimitError as e:
        raise _Stop("unverifiable", "limit_exceeded", f"{what} (byte {start}): {e}") from None
    except OSError:
        raise
    except Exception as e:  # whatever a malformed pickle raises (UnpicklingError, EOFError, TypeError, ...)
        if f.tell() >= size:
            raise _Stop("incomplete", "truncated", f"the file ends inside {what} (which begins at byte {start}; "
                        f"{size} bytes in all)") from None
        raise _Stop("corrupt", "bad_pickle", f"{what} (byte {start}) is not a valid pickle: "
                    f"{type(e).__name__}: {e}"[:300]) from None


def _storage_refs(pids: list[Any]) -> dict[str, tuple[str, int]]:
    """key -> (storage class name, element count) from ``('storage', type, key, location, numel, ...)``."""
    out: dict[str, tuple[str, int]] = {}
    for pid in pids:
        if not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage"):
            continue
        name = record_name(pid[1]) or ""
        key, numel = pid[2], pid[4]
        if isinstance(key, str) and type(numel) is int:
            out[key] = (name.rsplit(".", 1)[-1], numel)
    return out


def check(f: BinaryIO, size: int, path: str, budget: Budget | None = None) -> tuple[list[Finding], dict[str, Any]]:
    """Findings and facts for the legacy ``torch.save`` file ``f`` of ``size`` bytes.

    Facts: ``storages`` (count), ``storage_bytes`` (sum), ``foreign_globals`` (globals
    outside torch's own, e.g. user classes; inert). Findings: ``truncated`` (incomplete),
    ``bad_magic`` / ``bad_pickle`` / ``bad_storage`` / ``trailing_data`` /
    ``unsafe_pickle`` (corrupt), ``limit_exceeded`` (unverifiable: see :mod:`.pickle_scan`).
    """
    budget = budget or Budget()
    facts: dict[str, Any] = {}
    try:
        magic, _ = _load(f, size, path, "the magic number pickle", budget)
        if magic != MAGIC_NUMBER:
            raise _Stop("corrupt", "bad_magic", "the first pickle is not torch's magic number")
        version, _ = _load(f, size, path, "the protocol version pickle", budget)
        if version != PROTOCOL_VERSION:
            raise _Stop("corrupt", "bad_magic", f"protocol version {version!r}, expected {PROTOCOL_VERSION}")
        info, _ = _load(f, size, path, "the sys_info pickle", budget)
        if not isinstance(info, dict):
            raise _Stop("corrupt", "bad_pickle", "sys_info is not a dict")
        if info.get("little_endian") is False:
            facts["big_endian"] = True
        _, u = _load(f, size, path, "the object pickle", budget, keep_persistent=True)
        facts["foreign_globals"] = sorted(u.foreign)
        refs = _storage_refs(u.persisted.pids)
        keys, _ = _load(f, size, path, "the storage key list", budget)
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise _Stop("corrupt", "bad_pickle", "the storage key list is not a list of strings")
        facts["storages"] = len(keys)
        total = 0
        for i, key in enumerate(keys):
            at = f.tell()
            raw = f.read(8)
            if len(raw) < 8:
                raise _Stop("incomplete", "truncated", f"the file ends at storage {i + 1} of {len(keys)} "
                            f"(key {key}, byte {at}; {size} bytes in all)")
            count = struct.unpack("<q", raw)[0]
            kind, numel = refs.get(key, ("", -1))
            if numel >= 0 and count != numel:
                raise _Stop("corrupt", "bad_storage", f"storage {key} at byte {at} holds {count} elements, the "
                            f"object refers to {numel}")
            elem = STORAGE_ELEMENT_BYTES.get(kind)
            if elem is None or count < 0:
                facts["storage_bytes"] = total
                return [Finding(path, "unverifiable", "unsupported_entry",
                                f"storage {key} ({kind or 'unknown type'}) has an unknown element size: the "
                                "rest of the file cannot be walked")], facts
            nbytes = count * elem
            if at + 8 + nbytes > size:
                raise _Stop("incomplete", "truncated", f"storage {i + 1} of {len(keys)} (key {key}) needs "
                            f"{nbytes} bytes from byte {at + 8} but the file ends at {size}: "
                            f"{at + 8 + nbytes - size} bytes cut off")
            f.seek(at + 8 + nbytes)
            total += nbytes
        facts["storage_bytes"] = total
        if f.tell() != size:
            raise _Stop("corrupt", "trailing_data", f"{size - f.tell()} bytes after the last storage")
    except _Stop as e:
        return [Finding(path, e.verdict, e.problem, str(e))], facts  # type: ignore[arg-type]
    return [], facts
