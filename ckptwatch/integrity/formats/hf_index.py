"""Hugging Face sharded-checkpoint indexes: ``*.index.json`` (e.g. ``model.safetensors.index.json``).

Format (``transformers`` / ``huggingface_hub`` ``save_torch_state_dict``, documented under
"Sharded checkpoints" at https://huggingface.co/docs/transformers/main/en/big_models):
``{"metadata": {"total_size": <bytes>, ...}, "weight_map": {tensor_name: shard_file_name}}``;
shard names are relative to the index's directory.

``check_file`` checks the JSON and ``weight_map``; :func:`tree_findings` checks the shards it
names exist and, for safetensors shards, that each shard's header lists the tensors the
index maps to it. Each shard's own structure is ``check_file``'s job.
"""

from __future__ import annotations

import json
import posixpath
from pathlib import Path
from typing import Any, BinaryIO

from ckptwatch.integrity.findings import Finding
from ckptwatch.integrity.formats.safetensors import header_tensor_names

#: Largest index read (bytes); real ones are a few MB at most.
MAX_INDEX = 256 << 20


def parse_index(f: BinaryIO, size: int) -> dict[str, str]:
    """``weight_map`` of the index in ``f``; raises ``ValueError`` with the reason when the
    file is not JSON or has no ``weight_map`` of strings to strings."""
    if size > MAX_INDEX:
        raise ValueError(f"{size} bytes: too large for an index")
    try:
        obj = json.loads(f.read(size).decode("utf-8"))
    except (UnicodeDecodeError, RecursionError) as e:
        raise ValueError(f"not UTF-8 JSON: {e}"[:300]) from None
    except ValueError as e:
        raise ValueError(f"not valid JSON: {e}"[:300]) from None
    wm = obj.get("weight_map") if isinstance(obj, dict) else None
    if not isinstance(wm, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in wm.items()):
        raise ValueError("no weight_map mapping tensor names to shard files")
    return wm


def check(f: BinaryIO, size: int, path: str) -> tuple[list[Finding], dict[str, Any]]:
    """``check_file`` for an index: ``bad_index`` (corrupt) unless it parses; facts
    ``tensors``, ``shard_files``."""
    if size == 0:
        return [Finding(path, "incomplete", "empty", "empty file (0 bytes)")], {}
    try:
        wm = parse_index(f, size)
    except ValueError as e:
        return [Finding(path, "corrupt", "bad_index", str(e))], {}
    return [], {"tensors": len(wm), "shard_files": sorted(set(wm.values()))}


def tree_findings(root: Path, files: list[str]) -> list[Finding]:
    """For each ``*.index.json`` in ``files``: every shard its ``weight_map`` names must be
    present (``missing``, incomplete); a safetensors shard whose readable header lacks a
    tensor the index maps to it is ``index_mismatch`` (corrupt). Unreadable indexes add
    nothing (``check_file`` reports them)."""
    present = set(files)
    out: list[Finding] = []
    for rel in sorted(r for r in files if r.endswith(".index.json")):
        try:
            with open(root / rel, "rb") as f:
                wm = parse_index(f, (root / rel).stat().st_size)
        except (OSError, ValueError):
            continue
        d = posixpath.dirname(rel)
        by_shard: dict[str, list[str]] = {}
        for tensor, shard in wm.items():
            by_shard.setdefault(shard, []).append(tensor)
        for shard, tensors in sorted(by_shard.items()):
            srel = posixpath.normpath(posixpath.join(d, shard))
            if srel not in present:
                out.append(Finding(srel, "incomplete", "missing", f"named by {rel} for {len(tensors)} tensors "
                                   f"(e.g. {tensors[0]}) but not on disk"))
                continue
            if shard.endswith(".safetensors"):
                names = header_tensor_names(root / srel)
                lacking = [t for t in tensors if names is not None and t not in names]
                if lacking:
                    out.append(Finding(srel, "corrupt", "index_mismatch", f"{rel} maps {len(lacking)} tensors to "
                                       f"this shard that its header does not list (e.g. {lacking[0]})"))
    return out
