"""The check shared by "latest" pointer files (DeepSpeed's ``latest``, Megatron-LM's
``latest_checkpointed_iteration.txt``): a small text file naming the checkpoint to resume
from. Empty is ``incomplete`` (the pointer was never written out); unreadable as a name is
``corrupt`` (``bad_tag``). Whether the directory it names exists is a tree check of each format.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, BinaryIO

from ckptwatch.integrity.findings import Finding


def check_pointer(f: BinaryIO, size: int, path: str, *, read: Callable[[BinaryIO, int], str], fact: str,
                  names: str) -> tuple[list[Finding], dict[str, Any]]:
    """``check_file`` for a pointer file: ``read(f, size)`` returns the name it holds or raises
    ValueError (the reason); the name is kept as fact ``fact``; ``names`` says what an empty
    file fails to name (``"no tag"``)."""
    if size == 0:
        return [Finding(path, "incomplete", "empty", f"empty file (0 bytes): names {names}")], {}
    try:
        return [], {fact: read(f, size)}
    except ValueError as e:
        return [Finding(path, "corrupt", "bad_tag", str(e))], {}
