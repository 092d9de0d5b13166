"""Which followed files were written to since the last poll, as the kernel tells it (inotify).

A poll of 10,000 rank files used to list every directory and ``stat`` every file: 0.1 s
of a busy poll and most of an idle one. With a :class:`ChangeFeed`, the watcher lists
everything only when it must, and between two listings stats just the files inotify
reports written to (``IN_MODIFY``, ``IN_ATTRIB``). It lists everything again when:

* anything else happened in a watched directory: a file created, renamed or deleted
  (rotation, a new rank's file, a new job's directory), a watched directory removed;
* the kernel's event queue overflowed (``IN_Q_OVERFLOW``: events were lost);
* ``rescan_after`` seconds passed since the last listing (a safety net);
* inotify cannot be used: not Linux, no watch left (``fs.inotify.max_user_watches``), or
  a watched directory is on a network filesystem (NFS, Lustre, GPFS, CIFS, Ceph, FUSE,
  ...), where lines other hosts write raise no event here. The watcher then lists every
  poll, as it did before (``off`` says why).

Names the listing skips anyway (hidden files, ``.duckdb``/``.wal``/``.json``/``.tmp`` and
the other :data:`~ckptwatch.ingest.discovery.SKIP_SUFFIXES`) raise no listing: a database
written next to the logs does not make every poll a full one.

inotify(7) is read through ``inotify_simple`` (a thin ctypes binding of the three
syscalls), by a thread that drains the kernel's queue as events come and keeps each
written file once: 10,000 files written to 20 times a second queue 200,000 events a
second, and the kernel's queue (``fs.inotify.max_queued_events``, 16,384 by default)
overflows between two polls a second apart if nobody reads it.
"""

from __future__ import annotations

import errno
import os
import re
import select
import threading
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ckptwatch.ingest.discovery import SKIP_SUFFIXES

try:  # Linux only
    from inotify_simple import INotify
    from inotify_simple import flags as F
except (ImportError, OSError):  # pragma: no cover - not Linux
    INotify = None  # type: ignore[assignment,misc]
    F = None  # type: ignore[assignment]

#: filesystem types whose files other hosts write without an inotify event here
#: (/proc/self/mountinfo's "filesystem type" field; FUSE mounts are ``fuse.<name>``)
REMOTE_FS = ("nfs", "nfs4", "lustre", "gpfs", "cifs", "smb3", "smbfs", "ceph", "glusterfs", "beegfs",
             "afs", "panfs", "wekafs", "9p", "virtiofs", "fuse")


@dataclass
class Changes:
    """What a :meth:`ChangeFeed.changes` call found: the paths of the files written to
    (appended, truncated, attributes changed), and whether the directories must be listed
    again (``rescan``, with the reason)."""

    written: set[str] = field(default_factory=set)
    rescan: str | None = None


def mount_fs_type(path: str, mountinfo: str) -> str | None:
    """The filesystem type of the mount ``path`` is on, from the text of
    ``/proc/self/mountinfo`` (proc(5): field 5 the mount point, the field after ``-`` the
    type; octal escapes like ``\\040`` for a space); None if no mount holds it."""
    real = os.path.realpath(path)
    best, fs = -1, None
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 5 or not right:
            continue
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])  # \040: a space
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) > best:
            best, fs = len(point), right.split()[0]
    return fs


def is_remote(fs_type: str | None) -> bool:
    """True for a network or FUSE filesystem (:data:`REMOTE_FS`)."""
    return fs_type is not None and (fs_type in REMOTE_FS or fs_type.startswith("fuse."))


class _Queue:
    """The inotify descriptor and the events read from it so far, shared by a feed's owner
    and its reader thread (which holds this, not the feed: a feed dropped without
    :meth:`ChangeFeed.close` is collected, and its finalizer stops the thread)."""

    def __init__(self, ino: INotify) -> None:
        self.ino: INotify | None = ino
        self.lock = threading.Lock()
        self.written: set[tuple[int, str]] = set()  # (watch descriptor, name) written to
        self.other: list = []  # every other event, in order (judged by the owner)
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        if self.thread is None:
            self.thread = threading.Thread(target=self._drain, name="ckptwatch-inotify", daemon=True)
            self.thread.start()

    def _drain(self) -> None:
        """The reader thread: wait for events outside the lock, take them under it."""
        assert self.ino is not None
        poller = select.poll()
        poller.register(self.ino.fileno(), select.POLLIN)
        while not self.stop.is_set():
            try:
                if not poller.poll(100):
                    continue
            except (OSError, ValueError):  # closed
                return
            with self.lock:
                self.take()

    def take(self) -> None:
        """Move the events the kernel holds now into ``written`` (each file once) and
        ``other``. The caller holds ``lock``, so an owner that takes under it sees every
        event queued before, whichever thread read it."""
        assert F is not None
        if self.ino is None:
            return
        try:
            events = self.ino.read(timeout=0)
        except (BlockingIOError, ValueError):  # read by the other thread, or closed
            return
        plain = F.MODIFY | F.ATTRIB
        for ev in events:
            if ev.mask & ~plain or not ev.name:
                self.other.append(ev)
            else:
                self.written.add((ev.wd, ev.name))

    def swap(self) -> tuple[set[tuple[int, str]], list]:
        """Everything read until now (taking what the kernel holds first), emptied."""
        with self.lock:
            self.take()
            written, self.written = self.written, set()
            other, self.other = self.other, []
        return written, other

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join()
        with self.lock:
            if self.ino is not None:
                self.ino.close()
                self.ino = None


class ChangeFeed:
    """inotify watches on the directories a watcher lists; what they saw, asked at each poll.

    Args:
        rescan_after: seconds after which :meth:`changes` asks for a listing anyway.
        mountinfo: the text of ``/proc/self/mountinfo`` (read when None), to tell network
            filesystems (:func:`is_remote`).

    ``off``: why the feed is not used (None while it is); once off it stays off. One
    owner thread calls its methods; a thread of its own reads the events (started by the
    first watch). :meth:`close` (or the feed's collection) stops it and releases the
    inotify descriptor.
    """

    def __init__(self, *, rescan_after: float = 10.0, mountinfo: str | None = None) -> None:
        self.rescan_after = rescan_after
        self.off: str | None = None
        # watch descriptor -> the paths it was listed under (one directory may be reached
        # by several: a symlinked alias, a relative and an absolute path)
        self._wd: dict[int, list[str]] = {}
        self._dirs: dict[str, tuple[int, tuple[int, int]]] = {}  # path -> (wd, (device, inode)) watched
        self._listed_at: float | None = None  # time of the last listing (seconds)
        self._mountinfo = mountinfo
        self._queue: _Queue | None = None
        if INotify is None:
            self.off = "inotify is not available on this system"
            return
        try:
            self._queue = _Queue(INotify(nonblocking=True))
        except OSError as e:
            self.off = f"inotify: {e.strerror}"
            return
        weakref.finalize(self, self._queue.close)

    @staticmethod
    def mask() -> int:
        """The events watched on each directory."""
        assert F is not None
        return (F.MODIFY | F.ATTRIB | F.CREATE | F.DELETE | F.MOVED_FROM | F.MOVED_TO | F.DELETE_SELF
                | F.MOVE_SELF | F.ONLYDIR)

    def listed(self, dirs: Iterable[str], now: float) -> None:
        """The watcher just listed everything (at ``now``, seconds): watch ``dirs``, the
        directories that listing walked or found files in, if not watched yet. Turns the
        feed off if a directory is on a network filesystem or no watch is left."""
        self._listed_at = now
        queue = self._queue
        if self.off is not None or queue is None or queue.ino is None:
            return
        new = []
        for d in dict.fromkeys(dirs):
            try:
                st = os.stat(d)
            except OSError:
                continue
            known = self._dirs.get(d)
            if known is None or known[1] != (st.st_dev, st.st_ino):  # new, or deleted and made again
                new.append(d)
        if not new:
            return
        if self._mountinfo is None:
            try:
                with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
                    self._mountinfo = f.read()
            except OSError:
                self._mountinfo = ""
        for d in new:
            fs = mount_fs_type(d, self._mountinfo)
            if is_remote(fs):
                self._turn_off(f"{d} is on {fs}: other hosts' writes raise no inotify event")
                return
            try:
                wd = queue.ino.add_watch(d, self.mask())
                st = os.stat(d)
            except OSError as e:
                if e.errno == errno.ENOSPC:
                    self._turn_off("no inotify watch left (fs.inotify.max_user_watches)")
                    return
                continue  # gone since it was listed: the next listing sees what replaced it
            self._forget(d)
            self._wd.setdefault(wd, []).append(d)
            self._dirs[d] = (wd, (st.st_dev, st.st_ino))
        if self._wd:
            queue.start()

    def changes(self, now: float) -> Changes:
        """The events since the last call (at ``now``, seconds): the files written to, or
        ``rescan`` with the reason the directories must be listed again (always while
        ``off``, and before the first :meth:`listed`)."""
        if self.off is not None or self._queue is None:
            return Changes(rescan=self.off or "off")
        written, events = self._queue.swap()
        out = self.judge(events)
        for wd, name in written:
            for where in self._wd.get(wd, ()):
                out.written.add(os.path.join(where, name))
        if out.rescan is None and (self._listed_at is None or now - self._listed_at >= self.rescan_after):
            out.rescan = "never listed" if self._listed_at is None else f"{self.rescan_after:g} s since the last listing"
        return out

    def judge(self, events: Sequence) -> Changes:
        """:class:`Changes` from inotify ``events`` (``inotify_simple.Event``: wd, mask,
        cookie, name). A watched directory deleted or moved away is forgotten (the next
        listing watches whatever holds its path then), and a listing asked for."""
        assert F is not None
        out = Changes()
        for ev in events:
            if ev.mask & F.Q_OVERFLOW:
                out.rescan = "the inotify queue overflowed"
                continue
            paths = self._wd.get(ev.wd)
            if not paths:
                continue
            if ev.mask & (F.IGNORED | F.DELETE_SELF | F.MOVE_SELF):
                out.rescan = out.rescan or f"{paths[0]}: moved or deleted"
                for where in list(paths):
                    self._forget(where)
                continue
            name = ev.name
            if ev.mask & (F.CREATE | F.DELETE | F.MOVED_FROM | F.MOVED_TO):
                if name and not name.startswith(".") and not name.endswith(SKIP_SUFFIXES):
                    out.rescan = out.rescan or f"{os.path.join(paths[0], name)}: created, renamed or deleted"
            elif name:  # MODIFY, ATTRIB
                out.written.update(os.path.join(where, name) for where in paths)
        return out

    def _forget(self, path: str) -> None:
        """Stop mapping events to ``path`` (its watch stays for the other paths it has)."""
        known = self._dirs.pop(path, None)
        if known is not None:
            left = [p for p in self._wd.get(known[0], []) if p != path]
            if left:
                self._wd[known[0]] = left
            else:
                self._wd.pop(known[0], None)

    def _turn_off(self, why: str) -> None:
        self.off = why
        self.close()

    def close(self) -> None:
        """Stop the reader thread, release the inotify descriptor (and every watch with it)."""
        if self._queue is not None:
            self._queue.close()
        self._wd.clear()
        self._dirs.clear()
