"""Source identity: a stable ``source_id`` for a log file.

The id is the SHA-256 of the file's device and inode numbers and its first line (at most
1 KiB of it), cut to 16 hex digits. So:

* a rename (logrotate's rename + create) keeps the id: same inode, same first line;
* a new file at the same path (or a file truncated and rewritten) gets a new id: its
  inode or its first line differ;
* a reused inode is not mistaken for the old file unless the new file also begins with
  the very same first line.

A file without a complete first line has no id yet (``None``): tailing waits for it.
"""

from __future__ import annotations

import hashlib
import os

FIRST_LINE_BYTES = 1024


def first_line(path: str, *, final: bool = False) -> bytes | None:
    """The first line of ``path`` (without newline, at most 1 KiB), or None if not complete yet.

    With ``final=True`` (the file will not grow) a file without a newline yields its
    first 1 KiB. Raises OSError if the file cannot be read.
    """
    with open(path, "rb") as f:
        head = f.read(FIRST_LINE_BYTES + 1)
    nl = head.find(b"\n")
    if nl >= 0:
        return head[:nl]
    if len(head) > FIRST_LINE_BYTES or (final and head):
        return head[:FIRST_LINE_BYTES]
    return None


def source_id(path: str, *, final: bool = False) -> str | None:
    """Stable id of the file at ``path`` (16 hex digits), or None while it has no first line.

    Raises OSError if the file cannot be stat'ed or read.
    """
    st = os.stat(path)
    head = first_line(path, final=final)
    if head is None:
        return None
    h = hashlib.sha256(f"{st.st_dev}:{st.st_ino}:".encode() + head)
    return h.hexdigest()[:16]
