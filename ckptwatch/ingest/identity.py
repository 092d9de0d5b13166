"""Source identity: a stable ``source_id`` for a log file (Vector's fingerprinter).

The id is the SHA-256 of the file's device and inode numbers and its first line (at most
1 KiB of it), cut to 16 hex digits. So:

* a rename (logrotate's rename + create) keeps the id: same inode, same first line;
* a new file at the same path (or a file truncated and rewritten) gets a new id: its
  inode or its first line differ;
* a reused inode is not mistaken for the old file unless the new file also begins with
  the very same first line.

Where that last case is known to happen (a file truncated and rewritten with the same
first line, a dropped file's inode reused), a *generation* number tells the two apart:
:func:`source_id_of` with ``generation`` > 0 hashes it in too, so every generation of a
file has an id of its own and ``(source_id, offset)`` never names two different lines.

A file without a complete first line has no id yet (``None``): tailing waits for it.
"""

from __future__ import annotations

import hashlib
import os
from typing import BinaryIO

FIRST_LINE_BYTES = 1024
#: Generations tried when looking a file up among checkpointed ids (see :func:`generation_ids`).
MAX_GENERATIONS = 64


def head_of(data: bytes, *, final: bool = False) -> bytes | None:
    """The first line in ``data`` (the file's first ``FIRST_LINE_BYTES + 1`` bytes or more),
    without newline and at most 1 KiB, or None if it is not complete yet.

    With ``final=True`` (the file will not grow) data without a newline yields its first
    1 KiB."""
    head = data[: FIRST_LINE_BYTES + 1]
    nl = head.find(b"\n")
    if nl >= 0:
        return head[:nl]
    if len(head) > FIRST_LINE_BYTES or (final and head):
        return head[:FIRST_LINE_BYTES]
    return None


def read_head(f: BinaryIO, *, final: bool = False) -> bytes | None:
    """The first line of the open file ``f`` (see :func:`head_of`); reads at most 1025 bytes
    at offset 0 without moving ``f``'s position. Raises OSError if it cannot be read."""
    return head_of(os.pread(f.fileno(), FIRST_LINE_BYTES + 1, 0), final=final)


def source_id_of(dev: int, ino: int, head: bytes, generation: int = 0) -> str:
    """The id (16 hex digits) of generation ``generation`` of the file with device ``dev``,
    inode ``ino`` and first line ``head``. Generation 0 is the plain
    ``sha256(dev:ino:first line)``; a first line never holds a newline, so the generation
    appended after one cannot make two different inputs alike."""
    data = f"{dev}:{ino}:".encode() + head
    if generation:
        data += f"\ngeneration {generation}".encode()
    return hashlib.sha256(data).hexdigest()[:16]


def generation_ids(dev: int, ino: int, head: bytes) -> list[str]:
    """The ids of generations ``0 .. MAX_GENERATIONS - 1`` of a file, oldest first."""
    return [source_id_of(dev, ino, head, g) for g in range(MAX_GENERATIONS)]


def head_hash(head: bytes) -> str:
    """Hex SHA-256 of a first line (what a checkpoint keeps to recognize a moved or copied file)."""
    return hashlib.sha256(head).hexdigest()

