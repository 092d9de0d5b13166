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
                  and size of every member (PKWARE APPNOTE), no member
                  overlapping another, every ``*.pkl`` member (inertly)
torch_legacy      every pickle (inertly), storage counts vs references,    flipped bits in storage
                  file length (torch/serialization.py)                     bytes (no checksum)
safetensors       header length, UTF-8 JSON, dtype x shape vs offsets,     flipped bits in the data
                  tiling, data ends at end of file (safetensors README)    section (no checksum)
dcp_metadata      the pickle (inertly, DCP classes only), storage entries  -
dcp_shard         each entry's byte range holds one torch.save zip whose   entries that are not zips
                  CRCs match (via .metadata, else walking the archives)    (stream transforms)
hf_index / json   valid JSON, ``weight_map``, shard names inside           -
pickle            every pickle in the file (inertly)                       flipped bits (no checksum)
deepspeed_latest  a tag                                                    -
megatron_tracker  an iteration number or ``release``                       -
================  =======================================================  ==========================

Everything invisible here is what the manifest's SHA-256 is for.

Hostile input (issue 14): every check's work is bounded by :class:`~..limits.Limits`
(``limit_exceeded`` past a bound), every name taken from a file stays inside the checkpoint
(``path_escape``; :mod:`.confine`), every pickle in any container goes through the
restricted unpickler (:mod:`.safe_pickle`), and a :class:`~..limits.Budget`'s ``stop``
event interrupts a check (:class:`~..limits.Cancelled`, the one exception that propagates).
"""

from __future__ import annotations

import errno
import os
import posixpath
from pathlib import Path
from typing import Any, BinaryIO

from ckptwatch.integrity.findings import FileCheck, Finding
from ckptwatch.integrity.formats import (dcp, deepspeed, hf_index, megatron, pickle_file, safetensors, torch_legacy,
                                         torch_zip)
from ckptwatch.integrity.formats.confine import PathEscape, open_inside
from ckptwatch.integrity.formats.detect import FORMATS, detect_file, detect_format, guess_by_name
from ckptwatch.integrity.formats.jsonlimits import JsonLimitError
from ckptwatch.integrity.formats.jsonlimits import loads as json_loads
from ckptwatch.integrity.formats.safe_pickle import UnsafePickleError
from ckptwatch.integrity.limits import Budget, Cancelled

__all__ = ["FORMATS", "UnsafePickleError", "check_file", "check_tree", "detect_format"]

#: Longest ``Finding.detail`` kept (characters).
MAX_DETAIL = 600


def check_file(root: Path, rel: str, budget: Budget | None = None) -> FileCheck:
    """The structural check of ``root / rel`` (``rel`` POSIX, relative to the checkpoint ``root``).

    Returns a :class:`FileCheck` with the detected ``format``, its ``facts`` (JSON values:
    counts, sizes in bytes) and ``findings`` naming member / tensor / byte offsets. Never
    raises for the file: one that cannot be opened or read (permission denied, vanished, not
    a regular file, a symlink leading out of the checkpoint: never followed) is a finding
    ``unreadable`` (unverifiable) with the reason; a checker bug is ``check_failed``
    (unverifiable); work over a limit of ``budget`` is ``limit_exceeded``. An empty file of a
    known format is ``empty`` (incomplete). Formats without a structural check give
    ``checked=False``. Raises only :class:`~..limits.Cancelled`, once ``budget.stop`` is set.
    """
    root = Path(root)
    budget = budget or Budget()
    fmt = guess_by_name(posixpath.basename(rel))  # until its bytes are read
    try:
        with open_inside(root, rel) as f:
            size = os.fstat(f.fileno()).st_size
            fmt = detect_file(posixpath.basename(rel), f, size)
            fc = _check(root, rel, fmt, f, size, budget)
    except Cancelled:
        raise
    except PathEscape as e:
        return FileCheck(rel, fmt, checked=False, findings=[Finding(
            rel, "unverifiable", "unreadable", f"not read: {e}"[:MAX_DETAIL])])
    except OSError as e:
        if e.errno == errno.EINVAL:
            return FileCheck(rel, fmt, checked=False, findings=[Finding(
                rel, "unverifiable", "unreadable", "not a regular file: not opened")])
        return FileCheck(rel, fmt, checked=False, findings=[Finding(
            rel, "unverifiable", "unreadable", f"cannot be read: {e.strerror or e} (errno {e.errno})")])
    except Exception as e:  # a checker bug must not stop a verify; it is reported, not hidden
        return FileCheck(rel, fmt, checked=False, findings=[Finding(
            rel, "unverifiable", "check_failed", f"the {fmt} check failed: {type(e).__name__}: {e}"[:MAX_DETAIL])])
    fc.findings = [_short(x) for x in fc.findings]
    return fc


def check_tree(root: Path, files: list[str], budget: Budget | None = None) -> list[Finding]:
    """Directory-level findings for the checkpoint ``root`` whose regular files are ``files``
    (relative POSIX paths; what is not listed counts as absent).

    DCP (:func:`.dcp.tree_findings`): ``no_metadata``, ``missing`` / ``truncated`` shards,
    ``unreferenced`` shards; HF (:func:`.hf_index.tree_findings`): ``missing`` shards,
    ``index_mismatch``; DeepSpeed (:func:`.deepspeed.tree_findings`): ``missing`` tag
    directory or rank files; Megatron (:func:`.megatron.tree_findings`): ``missing``
    iteration directory. Finding paths are the files concerned (a missing one included)
    or a directory with a trailing ``/``; never outside the checkpoint. Never raises but
    :class:`~..limits.Cancelled`: a part that fails gives one ``check_failed`` finding (path
    ``""``) and the other parts still run.
    """
    root = Path(root)
    out: list[Finding] = []
    for part in (dcp.tree_findings, hf_index.tree_findings, deepspeed.tree_findings, megatron.tree_findings):
        try:
            out.extend(part(root, list(files), budget))
        except Cancelled:
            raise
        except Exception as e:
            out.append(Finding("", "unverifiable", "check_failed",
                               f"{part.__module__.rsplit('.', 1)[-1]} directory check failed: {type(e).__name__}: {e}"))
    return [_short(x) for x in out]


def _short(x: Finding) -> Finding:
    return x if len(x.detail) <= MAX_DETAIL else Finding(x.path, x.verdict, x.problem, x.detail[:MAX_DETAIL - 3] + "...")


def _check(root: Path, rel: str, fmt: str, f: BinaryIO, size: int, budget: Budget) -> FileCheck:
    if fmt == "unknown":
        return FileCheck(rel, fmt, checked=False, facts={"bytes": size})
    if size == 0:
        return FileCheck(rel, fmt, findings=[Finding(rel, "incomplete", "empty", f"empty file (0 bytes) where a "
                                                     f"{fmt} file should be: never written, or lost before a flush")])
    checked = True
    f.seek(0)
    if fmt in ("torch_zip", "zip"):
        findings, facts = torch_zip.check_file(f, size, rel, budget)
    elif fmt == "torch_legacy":
        findings, facts = torch_legacy.check(f, size, rel, budget)
    elif fmt == "pickle":
        findings, facts = pickle_file.check(f, size, rel, budget)
    elif fmt == "safetensors":
        findings, facts = safetensors.check(f, size, rel, budget)
    elif fmt == "dcp_metadata":
        findings, facts = dcp.check_metadata(f, size, rel, budget)
    elif fmt == "dcp_shard":
        findings, facts, checked = dcp.check_shard(root, rel, f, size, budget)
    elif fmt == "hf_index":
        findings, facts = hf_index.check(f, size, rel, budget)
    elif fmt == "deepspeed_latest":
        findings, facts = deepspeed.check_latest(f, size, rel)
    elif fmt == "megatron_tracker":
        findings, facts = megatron.check_tracker(f, size, rel)
    elif fmt == "json":
        findings, facts, checked = _check_json(f, size, rel, budget)
    else:  # pragma: no cover - every FORMATS value is handled above
        return FileCheck(rel, fmt, checked=False)
    facts.setdefault("bytes", size)
    return FileCheck(rel, fmt, checked=checked, facts=facts, findings=findings)


def _check_json(f: BinaryIO, size: int, rel: str, budget: Budget) -> tuple[list[Finding], dict[str, Any], bool]:
    try:
        obj = json_loads(f.read(min(size, budget.limits.max_json_bytes + 1)), budget.limits, f"the {size}-byte file")
    except JsonLimitError as e:
        return [Finding(rel, "unverifiable", "limit_exceeded", str(e))], {}, True
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        return [Finding(rel, "corrupt", "bad_json", f"not valid UTF-8 JSON: {e}"[:MAX_DETAIL])], {}, True
    return [], {"top_level": type(obj).__name__}, True
