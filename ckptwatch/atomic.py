"""Atomic file replacement, shared by every state file (collector offsets, silences,
manifests, the checkpoint watcher's state): after a crash the file is whole, old or new,
never half-written.

The data goes to a temporary file in the same directory (named ``<prefix>*.tmp``, so log
discovery and checkpoint walks can pass it over), is flushed and fsynced, renamed over the
target with :func:`os.replace` (atomic on POSIX within a filesystem), and the directory is
fsynced so the rename itself survives a power loss.
"""

from __future__ import annotations

import os
import tempfile


def write_bytes(fd: int, data: bytes) -> None:
    """Write every byte of ``data`` to ``fd`` (``os.write`` may write less than asked)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def replace_file(path: str | os.PathLike[str], data: bytes, *, tmp_prefix: str | None = None,
                 mode: int | None = None) -> None:
    """Replace ``path`` with ``data`` atomically (see the module docstring). ``tmp_prefix``:
    the temporary file's name prefix (default ``.<name>.``); ``mode``: its permission bits
    (default: ``mkstemp``'s 0600). On failure the temporary file is removed and ``path`` is
    left as it was.

    Raises OSError (the caller names the file in its own error)."""
    target = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(target))
    prefix = tmp_prefix if tmp_prefix is not None else f".{os.path.basename(target)}."
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=directory)
    try:
        try:
            if mode is not None:
                os.fchmod(fd, mode)
            write_bytes(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
        tmp = None
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
