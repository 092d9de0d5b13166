"""SHA-256 of checkpoint files: streaming, in parallel, and honest about files that move.

Each file is read in fixed-size chunks (:data:`CHUNK_SIZE` bytes) into one reused buffer,
so memory stays constant whatever the file size. Files are hashed on a thread pool:
``hashlib`` releases the GIL while it hashes a chunk, so N threads use N cores (one file
is never split: SHA-256 is sequential within a file).

A file that changes while it is read (its size, mtime or inode differ before and after,
or the bytes read differ from its size) gives a :class:`HashResult` with problem
``changed_while_hashing`` and no digest, never a digest of bytes that were never on disk
together. Files that vanish, cannot be opened or fail to read give a result with a problem
code too; nothing here raises for one bad file.

A ``stop`` event (the checkpoint watcher's, set when it is closed) is checked after every
chunk: once set, :func:`hash_files` raises :class:`~ckptwatch.integrity.limits.Cancelled`
within one chunk per worker (milliseconds), whatever the files' sizes.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from ckptwatch.integrity.formats.confine import PathEscape, open_fd_inside, stat_inside
from ckptwatch.integrity.limits import Cancelled

#: Bytes read per ``readinto`` call (and hashed per ``update``).
CHUNK_SIZE = 4 << 20

#: Problem codes of a :class:`HashResult` that has no digest.
PROBLEMS = ("vanished", "permission_denied", "not_regular", "read_error", "changed_while_hashing", "symlink_outside")

T = TypeVar("T")

#: ``progress(n)`` is called with the number of bytes just hashed (an increment), from worker threads.
Progress = Callable[[int], None]


@dataclass(frozen=True)
class HashResult:
    """The SHA-256 of one file, or why there is none.

    ``path`` is as given to :func:`hash_file` (relative POSIX path for :func:`hash_files`);
    ``size`` in bytes (as read; the size found at open when the read failed, None when the
    file could not be opened); ``sha256`` lowercase hex, None when ``problem`` is set;
    ``mtime_ns`` the modification time at open (ns since the epoch); ``seconds`` wall time spent.
    ``problem`` is one of :data:`PROBLEMS`, ``detail`` a sentence naming what happened.
    """

    path: str
    size: int | None
    sha256: str | None
    mtime_ns: int | None = None
    seconds: float = 0.0
    problem: str | None = None
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.problem is None


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _changed(before: os.stat_result, after: os.stat_result, now: os.stat_result | None, nread: int) -> str:
    """What changed while the file was read, as a phrase ("" when nothing did)."""
    what = []
    if nread != before.st_size:
        what.append(f"{nread} bytes read but it had {before.st_size} at open")
    if after.st_size != before.st_size:
        what.append(f"size {before.st_size} -> {after.st_size} bytes")
    if after.st_mtime_ns != before.st_mtime_ns:
        what.append("mtime changed")
    if now is None:
        what.append("its name was removed")
    elif (now.st_dev, now.st_ino) != (before.st_dev, before.st_ino):
        what.append("its name now points to another file (replaced by rename)")
    return ", ".join(what)


def hash_file(path: str | os.PathLike[str], *, chunk_size: int = CHUNK_SIZE,
              progress: Progress | None = None, name: str | None = None,
              root: str | os.PathLike[str] | None = None) -> HashResult:
    """SHA-256 of the regular file at ``path`` (symlinks followed), read ``chunk_size`` bytes at a time.

    ``progress(n)`` gets each chunk's byte count. ``name`` is the ``path`` of the result
    (default: ``path``). With ``root``, ``path`` is relative to it and is resolved and opened
    without ever leaving it (:mod:`.formats.confine`): a symlink leading out, even one
    swapped in while the directory is checked, gives ``symlink_outside``. Never raises for
    the file itself: a missing file, permission denied, a FIFO or device (never opened for
    reading: it could block), an I/O error or a file that changed while it was read each
    give a result with ``problem`` set.
    """
    label = name if name is not None else os.fspath(path)
    t0 = time.perf_counter()

    def fail(problem: str, detail: str, size: int | None = None, mtime: int | None = None) -> HashResult:
        return HashResult(label, size, None, mtime, time.perf_counter() - t0, problem, detail)

    def stat_now() -> os.stat_result:
        return os.stat(path) if root is None else stat_inside(root, os.fspath(path))

    try:
        st0 = stat_now()
        if not stat.S_ISREG(st0.st_mode):
            return fail("not_regular", "not a regular file (a FIFO, socket or device): not read")
        # O_NONBLOCK: a FIFO swapped in after the stat must not block the open; no effect on regular files.
        flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(path, flags) if root is None else open_fd_inside(root, os.fspath(path), flags)
    except PathEscape as e:
        return fail("symlink_outside", f"{e}: not read")
    except FileNotFoundError:
        return fail("vanished", "no longer exists (deleted or renamed while checking)")
    except PermissionError as e:
        return fail("permission_denied", f"cannot be read: {e.strerror or 'permission denied'}")
    except OSError as e:
        if e.errno == errno.ELOOP:
            return fail("read_error", "symlink loop: never reaches a file")
        return fail("read_error", f"cannot be opened: {e.strerror or e}")
    before: os.stat_result | None = None
    try:
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode):
            return fail("not_regular", "not a regular file (a FIFO, socket or device): not read")
        h = hashlib.sha256()
        buf = bytearray(chunk_size)
        view = memoryview(buf)
        nread = 0
        with open(fd, "rb", buffering=0, closefd=False) as f:
            while True:
                n = f.readinto(buf)
                if not n:
                    break
                h.update(view[:n])
                nread += n
                if progress is not None:
                    progress(n)
        after = os.fstat(fd)
    except OSError as e:
        return fail("read_error", f"read failed: [Errno {e.errno}] {e.strerror or e}",
                    size=before.st_size if before else None, mtime=before.st_mtime_ns if before else None)
    finally:
        os.close(fd)
    try:
        now: os.stat_result | None = stat_now()
    except (OSError, PathEscape):
        now = None
    changed = _changed(before, after, now, nread)
    if changed:
        return fail("changed_while_hashing", f"changed while it was being hashed ({changed}): a writer still "
                    "has it open? check again once the save has finished", size=nread, mtime=before.st_mtime_ns)
    return HashResult(label, nread, h.hexdigest(), before.st_mtime_ns, time.perf_counter() - t0)


def default_workers() -> int:
    """Threads used when none are asked for: one per core the process may run on (at least 1, at most 32)."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(32, n))


def hash_files(root: str | os.PathLike[str], rels: Sequence[str], *, workers: int | None = None,
               chunk_size: int = CHUNK_SIZE, progress: Progress | None = None,
               then: Callable[[HashResult], T] | None = None, stop: threading.Event | None = None
               ) -> dict[str, tuple[HashResult, T | None]]:
    """SHA-256 of each file ``root/rel`` on ``workers`` threads (default :func:`default_workers`).

    ``rels`` are POSIX paths relative to ``root``. Largest files are started first, so one
    big file does not finish last on its own. ``progress`` (bytes) is called from worker
    threads and must be thread-safe (rich's ``Progress.advance`` is). ``then(result)``, when
    given, runs in the same worker right after a file is hashed, while it is still in the
    page cache (``verify`` runs the structural check there); its return value is the second
    element of the pair (None without ``then``). Exceptions from ``then`` propagate.
    ``stop``: once set, raises :class:`~ckptwatch.integrity.limits.Cancelled` (checked after
    every chunk and before every file).

    Returns ``{rel: (HashResult, then_value)}`` in the order of ``rels``.
    """
    base = Path(root)
    n = max(1, workers or default_workers())

    def size(rel: str) -> int:
        try:
            return stat_inside(base, rel).st_size
        except (OSError, PathEscape):
            return 0

    def stopped() -> None:
        if stop is not None and stop.is_set():
            raise Cancelled("verification stopped before it finished (the checkpoint watcher was closed)")

    def one(rel: str, prog: Progress | None) -> tuple[HashResult, T | None]:
        stopped()
        r = hash_file(rel, chunk_size=chunk_size, progress=prog, name=rel, root=base)
        stopped()  # a file hashed while the stop came (hash_file reports no exception of its own)
        return r, (then(r) if then is not None else None)

    order = sorted(rels, key=size, reverse=True)
    interrupted = threading.Event()

    def checked_progress(k: int) -> None:
        if interrupted.is_set():  # the caller gave up (Ctrl-C): workers stop mid-file instead of hashing on
            raise _Cancelled
        stopped()
        if progress is not None:
            progress(k)

    if n == 1 or len(order) <= 1:
        done = {rel: one(rel, checked_progress) for rel in order}
        return {rel: done[rel] for rel in rels}

    pool = ThreadPoolExecutor(max_workers=min(n, len(order)), thread_name_prefix="ckptwatch-hash")
    try:
        futures = {rel: pool.submit(one, rel, checked_progress) for rel in order}
        done = {rel: f.result() for rel, f in futures.items()}
    except BaseException:
        interrupted.set()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return {rel: done[rel] for rel in rels}


class _Cancelled(Exception):
    """Raised inside a worker once :func:`hash_files` was interrupted."""
