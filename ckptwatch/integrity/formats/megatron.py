"""Megatron-LM's tracker file ``latest_checkpointed_iteration.txt`` and the directory it names.

Layout (Megatron-LM ``megatron/training/checkpointing.py``: ``get_checkpoint_tracker_filename``,
``read_metadata``, ``get_checkpoint_name``): the tracker holds an iteration number (or
``release``) and is rewritten after a save completes; the checkpoint is
``iter_{iteration:07d}/`` (or ``release/``) next to it.
"""

from __future__ import annotations

import os
import posixpath
from pathlib import Path
from typing import Any, BinaryIO

from ckptwatch.integrity.findings import Finding
from ckptwatch.integrity.formats.confine import open_inside
from ckptwatch.integrity.formats.pointer import check_pointer
from ckptwatch.integrity.limits import Budget

TRACKER_NAME = "latest_checkpointed_iteration.txt"


def read_iteration(f: BinaryIO, size: int) -> str:
    """The directory the tracker names (``iter_0000040`` or ``release``); ``ValueError`` otherwise."""
    if size > 64:
        raise ValueError(f"{size} bytes: too long for an iteration number")
    try:
        text = f.read(size).decode("ascii").strip()
    except UnicodeDecodeError:
        raise ValueError("not ASCII text") from None
    if text == "release":
        return "release"
    if not text.isdigit():
        raise ValueError(f"{text[:40]!r} is neither an iteration number nor 'release'")
    return f"iter_{int(text):07d}"


def check_tracker(f: BinaryIO, size: int, path: str) -> tuple[list[Finding], dict[str, Any]]:
    """``check_file`` for the tracker: ``empty`` (incomplete) or ``bad_tag`` (corrupt); fact ``names``."""
    return check_pointer(f, size, path, read=read_iteration, fact="names", names="no iteration")


def tree_findings(root: Path, files: list[str], budget: Budget | None = None) -> list[Finding]:
    """Each tracker in ``files`` must name a directory holding files (``missing``, incomplete).
    The name is ``iter_NNNNNNN`` or ``release`` (never a path), so it stays inside."""
    out: list[Finding] = []
    for rel in sorted(r for r in files if posixpath.basename(r) == TRACKER_NAME):
        try:
            with open_inside(root, rel) as f:
                name = read_iteration(f, os.fstat(f.fileno()).st_size)
        except (OSError, ValueError):
            continue
        d = posixpath.join(posixpath.dirname(rel), name)
        if not any(r.startswith(d + "/") for r in files):
            out.append(Finding(d + "/", "incomplete", "missing", f"{rel} names {name} but there is no {d}/ with "
                               "files"))
    return out
