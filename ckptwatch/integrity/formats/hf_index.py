"""Hugging Face sharded-checkpoint indexes: ``*.index.json`` (e.g. ``model.safetensors.index.json``).

Format (``transformers`` / ``huggingface_hub`` ``save_torch_state_dict``, documented under
"Sharded checkpoints" at https://huggingface.co/docs/transformers/main/en/big_models):
``{"metadata": {"total_size": <bytes>, ...}, "weight_map": {tensor_name: shard_file_name}}``;
shard names are relative to the index's directory.

``check_file`` checks the JSON and ``weight_map``, and that every shard name stays inside the
checkpoint directory (:func:`.confine.join_inside`): an absolute name, one that climbs out
with ``..`` or holds a NUL byte is ``path_escape`` (corrupt, naming the index and the
entries) and is never looked up. :func:`tree_findings` checks the other shards exist and,
for safetensors shards, that each shard's header lists the tensors the index maps to it
(opened through :func:`.confine.open_inside`). Each shard's own structure is
``check_file``'s job. The JSON is parsed within the limits of :mod:`.jsonlimits`.
"""

from __future__ import annotations

import posixpath
from pathlib import Path
from typing import Any, BinaryIO

from ckptwatch.integrity.findings import Finding
from ckptwatch.integrity.formats.confine import PathEscape, join_inside, open_inside
from ckptwatch.integrity.formats.jsonlimits import JsonLimitError, loads
from ckptwatch.integrity.formats.safetensors import header_tensor_names
from ckptwatch.integrity.limits import Budget, Limits

#: Largest index read (bytes); real ones are a few MB at most.
MAX_INDEX = 256 << 20


def parse_index(f: BinaryIO, size: int, limits: Limits | None = None) -> dict[str, str]:
    """``weight_map`` of the index in ``f``; raises ``ValueError`` with the reason when the
    file is not JSON or has no ``weight_map`` of strings to strings, :class:`.JsonLimitError`
    (a ``ValueError``) when it is over a JSON limit."""
    limits = limits or Limits()
    if size > MAX_INDEX:
        raise JsonLimitError(f"{size} bytes: too large for an index (more than {MAX_INDEX})")
    try:
        obj = loads(f.read(size), limits, "the index")
    except JsonLimitError:
        raise
    except (UnicodeDecodeError, RecursionError) as e:
        raise ValueError(f"not UTF-8 JSON: {e}"[:300]) from None
    except ValueError as e:
        raise ValueError(f"not valid JSON: {e}"[:300]) from None
    wm = obj.get("weight_map") if isinstance(obj, dict) else None
    if not isinstance(wm, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in wm.items()):
        raise ValueError("no weight_map mapping tensor names to shard files")
    return wm


def escapes(rel: str, wm: dict[str, str]) -> list[tuple[str, str, str]]:
    """(tensor, shard name, why) for every ``weight_map`` entry of the index ``rel`` whose
    shard name leads outside the checkpoint."""
    d = posixpath.dirname(rel)
    out = []
    for tensor, shard in wm.items():
        try:
            join_inside(d, shard)
        except PathEscape as e:
            out.append((tensor, shard, str(e)))
    return out


def check(f: BinaryIO, size: int, path: str, budget: Budget | None = None) -> tuple[list[Finding], dict[str, Any]]:
    """``check_file`` for an index: ``bad_index`` (corrupt) unless it parses, ``path_escape``
    (corrupt) for shard names leading outside the checkpoint, ``limit_exceeded``
    (unverifiable) over a JSON limit; facts ``tensors``, ``shard_files``."""
    if size == 0:
        return [Finding(path, "incomplete", "empty", "empty file (0 bytes)")], {}
    try:
        wm = parse_index(f, size, (budget or Budget()).limits)
    except JsonLimitError as e:
        return [Finding(path, "unverifiable", "limit_exceeded", str(e))], {}
    except ValueError as e:
        return [Finding(path, "corrupt", "bad_index", str(e))], {}
    out: list[Finding] = []
    bad = escapes(path, wm)
    if bad:
        tensor, shard, why = bad[0]
        out.append(Finding(path, "corrupt", "path_escape", f"{len(bad)} weight_map entries name shards outside "
                           f"the checkpoint directory, e.g. {tensor!r} -> {shard!r} ({why}): not looked up"))
    return out, {"tensors": len(wm), "shard_files": sorted(set(wm.values()))}


def tree_findings(root: Path, files: list[str], budget: Budget | None = None) -> list[Finding]:
    """For each ``*.index.json`` in ``files``: every shard its ``weight_map`` names must be
    present (``missing``, incomplete); a safetensors shard whose readable header lacks a
    tensor the index maps to it is ``index_mismatch`` (corrupt). Unreadable indexes and
    shard names that leave the checkpoint add nothing here (``check_file`` reports them)."""
    limits = (budget or Budget()).limits
    present = set(files)
    out: list[Finding] = []
    for rel in sorted(r for r in files if r.endswith(".index.json")):
        try:
            with open_inside(root, rel) as f:
                wm = parse_index(f, _size(f), limits)
        except (OSError, ValueError):
            continue
        d = posixpath.dirname(rel)
        by_shard: dict[str, list[str]] = {}
        for tensor, shard in wm.items():
            try:
                by_shard.setdefault(join_inside(d, shard), []).append(tensor)
            except PathEscape:
                continue
        for srel, tensors in sorted(by_shard.items()):
            if budget is not None:
                budget.check()
            if srel not in present:
                out.append(Finding(srel, "incomplete", "missing", f"named by {rel} for {len(tensors)} tensors "
                                   f"(e.g. {tensors[0]}) but not on disk"))
                continue
            if srel.endswith(".safetensors"):
                try:
                    with open_inside(root, srel) as f:
                        names = header_tensor_names(f, limits)
                except (OSError, ValueError):
                    names = None
                lacking = [t for t in tensors if names is not None and t not in names]
                if lacking:
                    out.append(Finding(srel, "corrupt", "index_mismatch", f"{rel} maps {len(lacking)} tensors to "
                                       f"this shard that its header does not list (e.g. {lacking[0]})"))
    return out


def _size(f: BinaryIO) -> int:
    f.seek(0, 2)
    n = f.tell()
    f.seek(0)
    return n
