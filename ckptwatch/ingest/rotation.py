"""Recognizing a copy made by logrotate's ``copytruncate``, so it is not read twice.

``copytruncate`` copies ``train.log`` to ``train.log.1`` and then truncates ``train.log``
in place while the writer goes on. The tail of ``train.log`` notices the truncation
(:class:`ckptwatch.ingest.tail.FileTail`): the old content becomes a :class:`Superseded`
generation (its source id, read offset, first line and a hash of the bytes read), and
the file is read again from 0 under a new id. When a new file then shows up that
:func:`is_copy` of a superseded generation, it is read from the old read offset on, under
the generation's id: the lines before it were read already, the lines after it (written
after our last read and before the copy) are new, and each line keeps the ``(source_id,
offset)`` it had in the original. So lines read from the original but not checkpointed (a
collector killed after publishing them) are read from the copy again under the same pair,
which consumers drop. The generation is known by the path it had when it was last read
(logrotate names the copy after it, even if the file was renamed since: ``copytruncate``
then a ``.1 -> .2`` shift).

Limitations:

* Lines written between the copy and the truncation are in neither file; logrotate
  itself loses them (see its ``copytruncate`` documentation).
* A copy is only recognized under a *rotated name* of the original: same directory, name
  starting with the original's name (``train.log.1``, ``train.log-20261130``), not in
  logrotate's ``olddir``.
* Without a hash of the bytes read (a source resumed from a checkpoint at an offset > 0,
  or a checkpoint entry after a restart), the first line, the rotated name and a size of
  at least the old offset have to do.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from typing import BinaryIO

from ckptwatch.ingest import identity
from ckptwatch.ingest.checkpoint import SourceCheckpoint

_BLOCK = 1 << 20
#: How many bytes before the read offset :func:`same_bytes_before` compares.
WINDOW_BYTES = 4096


@dataclass(frozen=True)
class Superseded:
    """A generation of a source that is not followed any more but whose lines may go on in
    a copy. ``prefix_sha256``: hex SHA-256 of the bytes ``[0, checkpoint.offset)`` as read,
    None if unknown. ``mtime_ns``: the file's mtime when it was last seen before the
    truncation was noticed (a copy made since is no older), None if unknown."""

    checkpoint: SourceCheckpoint
    prefix_sha256: str | None = None
    mtime_ns: int | None = None


def update_digest(digest: hashlib._Hash, f: BinaryIO, start: int, end: int) -> None:
    """Feed bytes ``[start, end)`` of the open file ``f`` to ``digest`` (positioned reads,
    ``f``'s position is left alone). Raises OSError if the file cannot be read."""
    pos = start
    while pos < end:
        block = os.pread(f.fileno(), min(_BLOCK, end - pos), pos)
        if not block:
            break
        digest.update(block)
        pos += len(block)


_FAMILY = re.compile(r"^(?P<base>.+?\.[A-Za-z]\w*)(?:[.-]\d{1,8})?(?:\.gz)?$")


def family(path: str) -> str:
    """The path a file and its rotated generations share: ``train.log``, ``train.log.1``,
    ``train.log-20261130.gz`` -> ``<dir>/train.log``. Only a name with an extension loses a
    suffix (``worker-1`` stays itself: it is not ``worker`` rotated)."""
    d, name = os.path.split(os.path.abspath(path))
    m = _FAMILY.match(name)
    return os.path.join(d, m.group("base") if m else name)


def is_rotated_name(original: str, candidate: str) -> bool:
    """True if ``candidate`` is a name logrotate gives a rotated ``original``: same
    directory, a different name that starts with the original's (``train.log.1``)."""
    o_dir, o_name = os.path.split(os.path.abspath(original))
    c_dir, c_name = os.path.split(os.path.abspath(candidate))
    return o_dir == c_dir and c_name != o_name and c_name.startswith(o_name)


def is_copy(gen: Superseded, f: BinaryIO, path: str, head: bytes) -> bool:
    """True if the file ``f`` at ``path`` with first line ``head`` is a copy of the
    superseded generation ``gen``: same first line, rotated name, at least as long as the
    old read offset, and (when known) the same bytes up to it. The offset may be 0 (a
    source checkpointed before anything of it was, see
    :meth:`ckptwatch.services.collect.Collector.step`). Raises OSError if ``f`` cannot be
    read."""
    c = gen.checkpoint
    if identity.head_hash(head) != c.head_hash or not is_rotated_name(c.path, path):
        return False
    if os.fstat(f.fileno()).st_size < c.offset:
        return False
    if gen.prefix_sha256 is None:
        return True
    digest = hashlib.sha256()
    update_digest(digest, f, 0, c.offset)
    return digest.hexdigest() == gen.prefix_sha256


def same_bytes_before(a: BinaryIO, b: BinaryIO, end: int) -> bool:
    """True if the files ``a`` and ``b`` both hold the same :data:`WINDOW_BYTES` bytes (or
    fewer, from 0) just before offset ``end`` (a cheap test for "``b`` is a copy of ``a``
    being written"). Raises OSError if a file cannot be read."""
    start = max(0, end - WINDOW_BYTES)
    block = os.pread(a.fileno(), end - start, start)
    return len(block) == end - start and block == os.pread(b.fileno(), end - start, start)
