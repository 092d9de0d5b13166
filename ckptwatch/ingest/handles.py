"""How many log files are held open at once (the process's open-file limit, ``ulimit -n``).

A followed file is held open so that it is read to its end after a rename or a delete
(:mod:`.tail`). Ten thousand rank files do not fit under a limit of 1,024 descriptors, and
the database, sockets, the snapshot thread and the interpreter itself need some too. So:

* :func:`raise_open_file_limit` lifts the soft limit to the hard one (the CLI does it at
  start);
* :class:`HandleBudget` keeps at most ``limit`` files open, by default the soft limit
  minus :data:`HEADROOM` (:func:`default_limit`): opening one more closes the least
  recently used other one first. A closed file keeps its place (offset, identity, what
  was held back) and is opened again by path when next read, and checked to be the same
  file (:meth:`FileTail.open <ckptwatch.ingest.tail.FileTail.open>`), so every file is
  read, in turns, none twice;
* :class:`OpenFileLimitError` when a file cannot be opened for want of descriptors and no
  other log file is open to make room: one line, never a file skipped in silence.
"""

from __future__ import annotations

import errno
import resource
from collections import OrderedDict
from typing import Protocol

#: descriptors left for everything but the log files (DuckDB's files, sockets, the snapshot
#: thread, inotify, imports)
HEADROOM = 64
#: fewest files held open however low the limit (half of it when that is less)
MIN_LIMIT = 8
#: what an open that failed for want of descriptors raises (the process's, the system's)
NO_DESCRIPTORS = (errno.EMFILE, errno.ENFILE)


class OpenFileLimitError(Exception):
    """The process is out of file descriptors with no log file open to close (the message
    is one line: what could not be opened, the limit, what to do)."""


class Closable(Protocol):
    """What holds a file open within a budget (a :class:`~ckptwatch.ingest.tail.FileTail`):
    ``close()`` closes it and tells the budget (:meth:`HandleBudget.closed`)."""

    def close(self) -> None: ...


def open_file_limit() -> int:
    """The soft limit on open files (``RLIMIT_NOFILE``), as a count (RLIM_INFINITY: 2**20)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def raise_open_file_limit() -> int:
    """Lift the soft limit on open files to the hard limit (capped at 2**20 when the hard
    one is unlimited); returns the soft limit now in force. A limit that cannot be raised
    (a sandbox, a hard limit the kernel caps lower) is left as it is: no error."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft == resource.RLIM_INFINITY or soft >= target:
        return open_file_limit()
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        pass
    return open_file_limit()


def default_limit(headroom: int = HEADROOM) -> int:
    """How many log files to hold open: the soft limit minus ``headroom``, but at least half
    the limit (and at least :data:`MIN_LIMIT`)."""
    soft = open_file_limit()
    return max(MIN_LIMIT, soft - headroom, soft // 2)


def out_of_descriptors(path: str, limit: int | None = None) -> OpenFileLimitError:
    """The error for ``path`` not opened for want of descriptors (``limit``: the budget)."""
    held = f" ({limit} log files held open at most)" if limit is not None else ""
    return OpenFileLimitError(
        f"{path}: cannot open: too many open files, and no other log file open to close; the limit is "
        f"{open_file_limit()} (ulimit -n){held}: raise it (ulimit -n, LimitNOFILE= in systemd) or watch fewer files")


class HandleBudget:
    """At most ``limit`` files open at once, the least recently used closed to make room.

    Owners (:class:`~ckptwatch.ingest.tail.FileTail`) tell it when they open (:meth:`admit`
    before, :meth:`opened` after), use (:meth:`used`) and close (:meth:`closed`) their file.
    ``limit`` defaults to :func:`default_limit`. ``evictions`` counts files closed to make
    room. Not thread-safe (one watcher's).

    Raises:
        ValueError: ``limit`` < 2 (a file is compared with another open one: a copy in the
            making, :meth:`SourceWatcher._copy_in_progress
            <ckptwatch.ingest.watcher.SourceWatcher._copy_in_progress>`).
    """

    def __init__(self, limit: int | None = None) -> None:
        self.limit = default_limit() if limit is None else limit
        if self.limit < 2:
            raise ValueError(f"max_open_files: at least 2 files held open, got {self.limit}")
        self.evictions = 0
        self._open: OrderedDict[int, Closable] = OrderedDict()  # id(owner) -> owner, least recently used first

    def __len__(self) -> int:
        return len(self._open)

    def admit(self, owner: Closable) -> None:
        """Make room for ``owner`` to open its file: close the least recently used others
        while ``limit`` are open."""
        while len(self._open) >= self.limit and self.shed(owner):
            pass

    def shed(self, keep: Closable) -> bool:
        """Close the least recently used open file other than ``keep``'s (after an open
        failed with EMFILE, or to stay within ``limit``); False if there is none."""
        for key, owner in self._open.items():
            if owner is not keep:
                self.evictions += 1
                owner.close()  # calls closed()
                self._open.pop(key, None)
                return True
        return False

    def opened(self, owner: Closable) -> None:
        """``owner`` holds a file open now (the most recently used)."""
        self._open[id(owner)] = owner
        self._open.move_to_end(id(owner))

    def used(self, owner: Closable) -> None:
        """``owner``'s open file was just used (the most recently used now)."""
        if id(owner) in self._open:
            self._open.move_to_end(id(owner))

    def closed(self, owner: Closable) -> None:
        """``owner`` closed its file."""
        self._open.pop(id(owner), None)
