"""Structural check of a safetensors file, from its header alone (constant memory).

Format (https://github.com/huggingface/safetensors, README "Format" and
``safetensors/src/tensor.rs``): 8 bytes little-endian unsigned ``N``; ``N`` bytes of UTF-8
JSON, an object ``{name: {"dtype", "shape", "data_offsets": [begin, end]}}`` with an optional
``"__metadata__": {str: str}``, no duplicate keys, possibly padded with trailing spaces (the
writer pads to a multiple of 8); then the data section. Offsets are relative to the start of
the data section; sorted by offset the tensors must tile it exactly from 0 (no hole, no
overlap) and the last ``end`` must be the end of the file; ``end - begin`` must equal
``prod(shape) x bits(dtype) / 8``. The reference reader refuses headers over 100 MB.

There is no checksum in the format: a flipped bit in the data section leaves the file
structurally ``ok``. Only a recorded SHA-256 (the manifest) detects that.

Bounded work (:mod:`ckptwatch.integrity.limits`): a header over the format's 100,000,000
bytes is ``bad_header``; one naming more than ``max_tensors`` tensors (counted as
``"data_offsets"`` keys on the raw bytes, before parsing) or over the JSON limits
(:mod:`.jsonlimits`) is ``limit_exceeded`` and is not parsed: a 60 MB header of a million
tensors cost about 1 GB and 20 s before. What is parsed is kept compact: each tensor's JSON
object becomes a tuple as soon as it is read, never a dict.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from ckptwatch.integrity.findings import Finding
from ckptwatch.integrity.formats.jsonlimits import JsonLimitError, check_shape
from ckptwatch.integrity.limits import Budget, Limits

#: Bits per element of each safetensors dtype (``Dtype::bitsize`` in safetensors' tensor.rs).
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64,
    "I64": 64, "U64": 64,
}
#: The reference implementation's limit on ``N`` (``MAX_HEADER_SIZE``), bytes.
MAX_HEADER = 100_000_000


@dataclass
class Header:
    """A parsed header: ``length`` (N, bytes), ``tensors`` name -> (dtype, shape, begin, end),
    ``metadata`` the ``__metadata__`` map (or None)."""

    length: int
    tensors: dict[str, tuple[str, list[int], int, int]] = field(default_factory=dict)
    metadata: dict[str, str] | None = None


class HeaderError(Exception):
    """The header cannot be used: ``verdict`` (incomplete / corrupt), ``problem``, message."""

    def __init__(self, verdict: str, problem: str, detail: str):
        self.verdict, self.problem = verdict, problem
        super().__init__(detail)


class _Info(tuple):
    """A tensor's JSON object as read: ``(dtype, shape, data_offsets)`` (unvalidated)."""

    __slots__ = ()


def _pairs(pairs: list[tuple[str, Any]]) -> Any:
    """``object_pairs_hook``: refuses a repeated key; a tensor object (three keys, one of
    them ``data_offsets``) becomes a compact :class:`_Info`, anything else a dict."""
    if len(pairs) == 3:
        (k1, v1), (k2, v2), (k3, v3) = pairs
        if k1 != k2 and k1 != k3 and k2 != k3 and "data_offsets" in (k1, k2, k3):
            d = {k1: v1, k2: v2, k3: v3}
            return _Info((d.get("dtype"), d.get("shape"), d.get("data_offsets")))
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise HeaderError("corrupt", "bad_header", f"the header repeats the key {k!r}"[:300])
            seen.add(k)
    return out


def read_header(f: BinaryIO, size: int, limits: Limits | None = None) -> Header:
    """Read and validate the header of the safetensors file ``f`` of ``size`` bytes.

    Raises :class:`HeaderError`: ``empty`` / ``truncated`` (incomplete) when the file ends
    inside the length or the header; ``bad_header`` (corrupt) for an absurd length, bytes
    that are not UTF-8 JSON, an entry without a known dtype / integer shape / two offsets,
    a non-string ``__metadata__``; ``limit_exceeded`` (unverifiable) for more than
    ``limits.max_tensors`` tensors or a header over the JSON limits (not parsed). Offsets
    against each other and the data section are checked by :func:`check`.
    """
    limits = limits or Limits()
    if size == 0:
        raise HeaderError("incomplete", "empty", "empty file (0 bytes)")
    head = f.read(8)
    if len(head) < 8:
        raise HeaderError("incomplete", "truncated", f"{size} bytes: the file ends inside the 8-byte header length")
    n = struct.unpack("<Q", head)[0]
    if n > MAX_HEADER:
        raise HeaderError("corrupt", "bad_header", f"header length {n} bytes is over the format's limit of "
                          f"{MAX_HEADER} (damaged length field)")
    if 8 + n > size:
        raise HeaderError("incomplete", "truncated", f"the header is {n} bytes but the file ends after "
                          f"{size - 8} of them ({size} bytes in all)")
    raw = f.read(n)
    tensors = raw.count(b'"data_offsets"')
    if tensors > limits.max_tensors:
        raise HeaderError("unverifiable", "limit_exceeded", f"the {n}-byte header names about {tensors} tensors, "
                          f"more than the limit max_tensors={limits.max_tensors}: not parsed")
    try:
        check_shape(raw, limits, f"the {n}-byte header")
    except JsonLimitError as e:
        raise HeaderError("unverifiable", "limit_exceeded", str(e)) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise HeaderError("corrupt", "bad_header", f"the {n}-byte header is not UTF-8 (byte {8 + e.start} of "
                          "the file)") from None
    del raw
    if not text.startswith("{"):
        raise HeaderError("corrupt", "bad_header", "the header does not begin with '{'")
    try:
        obj = json.loads(text, object_pairs_hook=_pairs)
    except json.JSONDecodeError as e:
        raise HeaderError("corrupt", "bad_header", f"the header is not valid JSON: {e.msg} at header byte "
                          f"{e.pos}") from None
    except (ValueError, RecursionError) as e:  # e.g. an integer of over 4300 digits, absurd nesting
        raise HeaderError("corrupt", "bad_header", f"the header is not usable JSON: {e}"[:300]) from None
    del text
    if not isinstance(obj, dict):
        raise HeaderError("corrupt", "bad_header", "the header is not a JSON object")
    h = Header(n)
    for name, info in obj.items():
        if name == "__metadata__":
            if not isinstance(info, dict) or not all(isinstance(v, str) for v in info.values()):
                raise HeaderError("corrupt", "bad_header", "__metadata__ is not a map of strings to strings")
            h.metadata = info
            continue
        if not isinstance(info, (dict, _Info)):
            raise HeaderError("corrupt", "bad_header", f"tensor {name!r}: not an object")
        dtype, shape, offs = info if isinstance(info, _Info) else (info.get("dtype"), info.get("shape"),
                                                                   info.get("data_offsets"))
        if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
            raise HeaderError("corrupt", "bad_header", f"tensor {name!r}: unknown dtype {dtype!r}"[:300])
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise HeaderError("corrupt", "bad_header", f"tensor {name!r}: shape {shape!r} is not a list of "
                              "non-negative integers"[:300])
        if (not isinstance(offs, list) or len(offs) != 2 or not all(type(o) is int and o >= 0 for o in offs)
                or offs[1] < offs[0]):
            raise HeaderError("corrupt", "bad_offsets", f"tensor {name!r}: data_offsets {offs!r} is not "
                              "[begin, end] with 0 <= begin <= end"[:300])
        h.tensors[name] = (dtype, shape, offs[0], offs[1])
    return h


def check(f: BinaryIO, size: int, path: str, budget: Budget | None = None) -> tuple[list[Finding], dict[str, Any]]:
    """Findings and facts for the safetensors file ``f`` (``size`` bytes) named ``path``.

    Facts: ``header_bytes`` (N), ``tensors``, ``data_bytes`` (the data section's size),
    ``metadata`` keys. Findings: see :func:`read_header`, plus ``bad_offsets`` (corrupt: a
    tensor whose byte count disagrees with dtype x shape, a hole or an overlap),
    ``truncated`` (incomplete: the data section ends before the last tensor does) and
    ``trailing_data`` (corrupt: bytes after the last tensor).
    """
    try:
        h = read_header(f, size, (budget or Budget()).limits)
    except HeaderError as e:
        return [Finding(path, e.verdict, e.problem, str(e))], {}  # type: ignore[arg-type]
    data_len = size - 8 - h.length
    facts: dict[str, Any] = {"header_bytes": h.length, "tensors": len(h.tensors), "data_bytes": data_len,
                             "metadata_keys": sorted(h.metadata) if h.metadata else []}
    out: list[Finding] = []
    pos = 0
    for name, (dtype, shape, begin, end) in sorted(h.tensors.items(), key=lambda kv: (kv[1][2], kv[1][3])):
        bits = _bits(shape, DTYPE_BITS[dtype], (end - begin) * 8)
        if bits is None or bits % 8 or end - begin != bits // 8:
            need = ("more bytes than that" if bits is None else f"{bits // 8} bytes" if bits % 8 == 0
                    else f"{bits} bits (not whole bytes)")
            dims = repr(shape) if len(shape) <= 16 else f"[{', '.join(map(str, shape[:8]))}, ... {len(shape)} dims]"
            out.append(Finding(path, "corrupt", "bad_offsets", f"tensor {name!r}: {end - begin} bytes at "
                               f"[{begin}, {end}) but {dtype} x {dims} needs {need}"[:400]))
            return out, facts
        if begin != pos:
            what = "a hole" if begin > pos else "an overlap"
            out.append(Finding(path, "corrupt", "bad_offsets", f"tensor {name!r} begins at data byte {begin}, "
                               f"{what} after the previous tensor's end at {pos}"))
            return out, facts
        pos = end
    if pos > data_len:
        out.append(Finding(path, "incomplete", "truncated", f"the tensors need {pos} data bytes but the file "
                           f"holds {data_len} after its {h.length}-byte header: {pos - data_len} bytes cut off"))
    elif pos < data_len:
        out.append(Finding(path, "corrupt", "trailing_data", f"{data_len - pos} bytes after the last tensor "
                           f"(data section is {data_len} bytes, tensors end at {pos})"))
    return out, facts


def _bits(shape: list[int], elem_bits: int, have_bits: int) -> int | None:
    """``prod(shape) x elem_bits``, or None once the product passes ``have_bits`` (a shape of
    thousands of 4,000-digit dimensions would otherwise take minutes to multiply out)."""
    if 0 in shape:
        return 0
    bits = elem_bits
    for d in shape:
        bits *= d
        if bits > have_bits:
            return None
    return bits


def header_tensor_names(f: BinaryIO, limits: Limits | None = None) -> set[str] | None:
    """The tensor names the header of the open safetensors file ``f`` lists, or None when it
    cannot be read (damaged, over a limit, an I/O error)."""
    try:
        return set(read_header(f, os.fstat(f.fileno()).st_size, limits).tensors)
    except (OSError, HeaderError):
        return None
