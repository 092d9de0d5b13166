"""Private files: state that holds raw log lines or alert history is readable by its owner only.

Files are created ``0600`` and the directories ckptwatch creates ``0700``; directories that
already exist keep their mode (they are the user's). Modes are set at creation (``os.open``
with a mode, ``mkdir`` with a mode) rather than fixed afterwards, so no other user can open
the file in between; :func:`tighten` repairs files made looser by an older version.

Files created by a library we do not control (DuckDB's ``.wal``) are covered by
:func:`private_umask` around the call that creates them, or by a process-wide
``os.umask(0o077)`` at the CLI entry point.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator

from ckptwatch import atomic

FILE_MODE = 0o600
DIR_MODE = 0o700


def ensure_dir(path: str) -> None:
    """Create directory ``path`` and any missing parents, each ``0700``; existing ones are
    left as they are. Raises OSError (e.g. a parent is a file, or permission denied)."""
    path = os.path.abspath(path)
    missing = []
    while not os.path.isdir(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for d in reversed(missing):
        try:
            os.mkdir(d, DIR_MODE)
        except FileExistsError:
            continue  # made meanwhile by another process: not ours to change
        os.chmod(d, DIR_MODE)  # mkdir's mode is masked by the umask: make it exact


def open_private(path: str, flags: int = os.O_RDWR | os.O_CREAT) -> int:
    """``os.open`` of ``path`` creating it ``0600`` (its directory made by :func:`ensure_dir`
    when missing); returns the descriptor. An existing file is tightened to ``0600``.
    Raises OSError."""
    ensure_dir(os.path.dirname(os.path.abspath(path)))
    fd = os.open(path, flags | os.O_CLOEXEC, FILE_MODE)
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) & ~FILE_MODE:
            os.fchmod(fd, FILE_MODE)
    except OSError:
        os.close(fd)
        raise
    return fd


def write_private(path: str, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically (:func:`ckptwatch.atomic.replace_file`),
    as a ``0600`` file in a directory made ``0700`` when missing. Raises OSError."""
    ensure_dir(os.path.dirname(os.path.abspath(path)))
    atomic.replace_file(path, data, mode=FILE_MODE)


def tighten(path: str) -> None:
    """Make an existing ``path`` ``0600`` if it allows more (nothing when it does not
    exist, or is not ours to change). Never raises."""
    try:
        st = os.stat(path)
        if stat.S_IMODE(st.st_mode) & ~FILE_MODE and stat.S_ISREG(st.st_mode):
            os.chmod(path, FILE_MODE)
    except OSError:
        pass


@contextlib.contextmanager
def private_umask() -> Iterator[None]:
    """Run the block with umask ``077`` (files another library creates are ``0600`` at
    most), then restore the previous umask. The umask is process-wide: keep the block short."""
    old = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(old)
