"""Structural checks of checkpoint files, without torch: what each format lets one verify.

Public API (used by :mod:`ckptwatch.integrity.scan` / ``verify`` / ``manifest``):

* :func:`detect_format` ``(path) -> str``: the format, from name and magic bytes;
* :func:`check_file` ``(root, rel) -> FileCheck``: one file's structure (streaming, constant
  memory; sizes and offsets in bytes);
* :func:`check_tree` ``(root, files) -> list[Finding]``: relations between files (DCP
  ``.metadata`` vs shards, ``*.index.json`` vs shards, DeepSpeed ``latest`` vs rank files,
  Megatron ``latest_checkpointed_iteration.txt`` vs its iteration directory).

``check_file`` and ``check_tree`` complement each other: per-file problems come from the
first, cross-file ones (a missing shard, a save that never committed) from the second. A
DCP shard shorter than ``.metadata`` needs is ``truncated`` in both (same code, same path).

What each check can and cannot see (module docstrings have the details and sources):

================  =======================================================  ==========================
format            checked                                                  invisible structurally
================  =======================================================  ==========================
torch_zip / zip   end record, central directory, local headers, CRC-32     nothing in member bytes
                  and size of every member (PKWARE APPNOTE)
torch_legacy      every pickle (inertly), storage counts vs references,    flipped bits in storage
                  file length (torch/serialization.py)                     bytes (no checksum)
safetensors       header length, UTF-8 JSON, dtype x shape vs offsets,     flipped bits in the data
                  tiling, data ends at end of file (safetensors README)    section (no checksum)
dcp_metadata      the pickle (inertly, DCP classes only), storage entries  -
dcp_shard         each entry's byte range holds one torch.save zip whose   entries that are not zips
                  CRCs match (via .metadata, else walking the archives)    (stream transforms)
hf_index / json   valid JSON, ``weight_map``                               -
deepspeed_latest  a tag                                                    -
megatron_tracker  an iteration number or ``release``                       -
================  =======================================================  ==========================

Everything invisible here is what the manifest's SHA-256 is for.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO

from ckptwatch.integrity.findings import FileCheck, Finding
from ckptwatch.integrity.formats import dcp, deepspeed, hf_index, megatron, safetensors, torch_legacy, zipcheck
from ckptwatch.integrity.formats.detect import FORMATS, detect_format
from ckptwatch.integrity.formats.safe_pickle import UnsafePickleError

__all__ = ["FORMATS", "UnsafePickleError", "check_file", "check_tree", "detect_format"]

#: Longest ``Finding.detail`` kept (characters).
MAX_DETAIL = 600
#: Largest plain JSON file parsed (bytes); larger ones are left unchecked.
MAX_JSON = 256 << 20


def check_file(root: Path, rel: str) -> FileCheck:
    """The structural check of ``root / rel`` (``rel`` POSIX, relative to the checkpoint ``root``).

    Returns a :class:`FileCheck` with the detected ``format``, its ``facts`` (JSON values:
    counts, sizes in bytes) and ``findings`` naming member / tensor / byte offsets. Never
    raises: a file that cannot be opened or read (permission denied, vanished, not a
    regular file) is a finding ``unreadable`` (unverifiable) with the OS error; a checker bug
    is ``check_failed`` (unverifiable). An empty file of a known format is ``empty``
    (incomplete). Formats without a structural check give ``checked=False``.
    """
    root = Path(root)
    path = root / rel
    fmt = detect_format(path)
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            return FileCheck(rel, fmt, checked=False, findings=[Finding(
                rel, "unverifiable", "unreadable", "not a regular file: not opened")])
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            fc = _check(root, rel, fmt, f, size)
    except OSError as e:
        return FileCheck(rel, fmt, checked=False, findings=[Finding(
            rel, "unverifiable", "unreadable", f"cannot be read: {e.strerror or e} (errno {e.errno})")])
    except Exception as e:  # a checker bug must not stop a verify; it is reported, not hidden
        return FileCheck(rel, fmt, checked=False, findings=[Finding(
            rel, "unverifiable", "check_failed", f"the {fmt} check failed: {type(e).__name__}: {e}"[:MAX_DETAIL])])
    fc.findings = [_short(x) for x in fc.findings]
    return fc


def check_tree(root: Path, files: list[str]) -> list[Finding]:
    """Directory-level findings for the checkpoint ``root`` whose regular files are ``files``
    (relative POSIX paths; what is not listed counts as absent).

    DCP (:func:`.dcp.tree_findings`): ``no_metadata``, ``missing`` / ``truncated`` shards,
    ``unreferenced`` shards; HF (:func:`.hf_index.tree_findings`): ``missing`` shards,
    ``index_mismatch``; DeepSpeed (:func:`.deepspeed.tree_findings`): ``missing`` tag
    directory or rank files; Megatron (:func:`.megatron.tree_findings`): ``missing``
    iteration directory. Finding paths are the files concerned (a missing one included)
    or a directory with a trailing ``/``. Never raises: a part that fails gives one
    ``check_failed`` finding (path ``""``) and the other parts still run.
    """
    root = Path(root)
    out: list[Finding] = []
    for part in (dcp.tree_findings, hf_index.tree_findings, deepspeed.tree_findings, megatron.tree_findings):
        try:
            out.extend(part(root, list(files)))
        except Exception as e:
            out.append(Finding("", "unverifiable", "check_failed",
                               f"{part.__module__.rsplit('.', 1)[-1]} directory check failed: {type(e).__name__}: {e}"))
    return [_short(x) for x in out]


def _short(x: Finding) -> Finding:
    return x if len(x.detail) <= MAX_DETAIL else Finding(x.path, x.verdict, x.problem, x.detail[:MAX_DETAIL - 3] + "...")


def _check(root: Path, rel: str, fmt: str, f: BinaryIO, size: int) -> FileCheck:
    if fmt == "unknown":
        return FileCheck(rel, fmt, checked=False, facts={"bytes": size})
    if size == 0:
        return FileCheck(rel, fmt, findings=[Finding(rel, "incomplete", "empty", f"empty file (0 bytes) where a "
                                                     f"{fmt} file should be: never written, or lost before a flush")])
    checked = True
    if fmt in ("torch_zip", "zip"):
        findings, facts = _check_zip(f, size, rel)
    elif fmt == "torch_legacy":
        findings, facts = torch_legacy.check(f, size, rel)
    elif fmt == "safetensors":
        findings, facts = safetensors.check(f, size, rel)
    elif fmt == "dcp_metadata":
        findings, facts = dcp.check_metadata(f, size, rel)
    elif fmt == "dcp_shard":
        findings, facts, checked = dcp.check_shard(root, rel, f, size)
    elif fmt == "hf_index":
        findings, facts = hf_index.check(f, size, rel)
    elif fmt == "deepspeed_latest":
        findings, facts = deepspeed.check_latest(f, size, rel)
    elif fmt == "megatron_tracker":
        findings, facts = megatron.check_tracker(f, size, rel)
    elif fmt == "json":
        findings, facts, checked = _check_json(f, size, rel)
    else:  # pragma: no cover - every FORMATS value is handled above
        return FileCheck(rel, fmt, checked=False)
    facts.setdefault("bytes", size)
    return FileCheck(rel, fmt, checked=checked, facts=facts, findings=findings)


def _check_zip(f: BinaryIO, size: int, rel: str) -> tuple[list[Finding], dict[str, Any]]:
    """A whole-file zip archive (``torch.save``): see :func:`.zipcheck.check_archive`, plus
    ``truncated`` (incomplete: no end record, the file begins like a zip), ``bad_magic``
    (corrupt: neither), ``trailing_data`` (corrupt: bytes after the end record). Facts:
    ``entries``, ``uncompressed_bytes``, ``top_folder``."""
    eocd = zipcheck.find_tail_eocd(f, 0, size)
    if eocd is None:
        f.seek(0)
        if f.read(4) == zipcheck.LOCAL_SIG:
            return [Finding(rel, "incomplete", "truncated", f"{size} bytes and no zip end-of-central-directory "
                            "record: the archive was cut short (a complete torch.save file ends with one)")], {}
        return [Finding(rel, "corrupt", "bad_magic", "neither a zip archive (no local header at byte 0, no end "
                        "record) nor torch's legacy format")], {}
    r = zipcheck.check_archive(f, eocd, path=rel, start=0)
    if eocd.end < size:
        r.findings.append(Finding(rel, "corrupt", "trailing_data", f"{size - eocd.end} bytes after the archive's end "
                                  f"record at byte {eocd.end}"))
    return r.findings, {"entries": r.entries, "uncompressed_bytes": r.uncompressed_bytes, "top_folder": r.top_folder}


def _check_json(f: BinaryIO, size: int, rel: str) -> tuple[list[Finding], dict[str, Any], bool]:
    if size > MAX_JSON:
        return [], {}, False
    try:
        obj = json.loads(f.read(size).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        return [Finding(rel, "corrupt", "bad_json", f"not valid UTF-8 JSON: {e}"[:MAX_DETAIL])], {}, True
    return [], {"top_level": type(obj).__name__}, True
