"""Paths taken from a checkpoint never lead out of it: names read from files, and symlinks.

Files name other files: a Hugging Face index its shards (``weight_map``), DCP ``.metadata``
each entry's ``relative_path``, a manifest every file's ``path``; and a symlink names its
target. A hostile checkpoint can name ``../../etc/shadow``, ``/dev/zero`` or a link to one.
The rule: nothing outside the checkpoint directory is ever opened, listed or even
``stat``-ed on behalf of a name taken from inside it.

* :func:`join_inside` is lexical (no I/O): a name must be relative, hold no NUL byte, and
  stay inside once ``.``/``..`` are collapsed (POSIX ``normpath``); else :class:`PathEscape`
  (the checks report it as the finding ``path_escape``, naming the file and the entry);
* :func:`resolve_inside` follows symlinks itself, one component at a time, ``lstat``-ing
  only paths inside the directory (each prefix it walks is a real, symlink-free directory of
  the checkpoint); a link whose target leads out (absolute elsewhere, or ``..`` past the
  top) is a :class:`PathEscape` without its target ever being touched;
* :func:`open_inside` / :func:`open_fd_inside` open the path :func:`resolve_inside` found
  one component at a time from the root's descriptor with ``O_NOFOLLOW`` (a link swapped
  in meanwhile is refused, not followed); ``O_NONBLOCK`` (a FIFO never blocks).

Paths are POSIX (``/``-separated) and relative to the checkpoint root.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat
from typing import BinaryIO

#: Symlinks followed in one resolution before it counts as a loop (Linux: 40).
MAX_LINKS = 40


class PathEscape(ValueError):
    """A name (or a symlink's target) that leads outside the checkpoint directory, is absolute,
    empty or holds a NUL byte. The message says which and why."""


def join_inside(base: str, name: object) -> str:
    """``name`` (from a file in directory ``base``, both relative POSIX) as a normalized path
    relative to the checkpoint root. Raises :class:`PathEscape` when it is not a string, is
    empty, absolute, holds a NUL byte, or climbs out with ``..``."""
    if not isinstance(name, str) or not name:
        raise PathEscape(f"{name!r} is not a file name")
    if "\0" in name:
        raise PathEscape(f"{name!r} holds a NUL byte")
    if name.startswith("/"):
        raise PathEscape(f"{name!r} is an absolute path")
    joined = posixpath.normpath(posixpath.join(base, name) if base else name)
    if joined in (".", "..") or joined.startswith("../"):
        raise PathEscape(f"{name!r} leads outside the checkpoint directory")
    return joined


def resolve_inside(root: str | os.PathLike[str], rel: str) -> str:
    """The real path of ``root/rel`` relative to ``root`` (``""`` for the root itself), every
    symlink on the way followed without touching anything outside ``root``.

    Raises :class:`PathEscape` when a component or a link's target leads outside (the
    message names the link and its target), ``OSError`` as the system would: ``ENOENT``
    (dangling), ``ELOOP`` (more than :data:`MAX_LINKS` links), ``ENOTDIR``, ``EACCES``.
    """
    real_root = os.path.realpath(root)
    done: list[str] = []
    todo = list(reversed(rel.split("/")))
    links = 0
    last_link = ""
    while todo:
        part = todo.pop()
        if part in ("", "."):
            continue
        if part == "..":
            if not done:
                raise PathEscape(f"{last_link or repr(rel)} leads outside the checkpoint directory")
            done.pop()
            continue
        cur = os.path.join(real_root, *done, part)
        st = os.lstat(cur)
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if links > MAX_LINKS:
                raise OSError(errno.ELOOP, "symlink loop", rel)
            target = os.readlink(cur)
            last_link = f"{'/'.join([*done, part])} (a symlink to {target})"
            if target.startswith("/"):
                if target != real_root and not target.startswith(real_root.rstrip("/") + "/"):
                    raise PathEscape(f"{last_link} leads outside the checkpoint directory")
                done = []
                target = target[len(real_root):]
            todo.extend(reversed(target.split("/")))
            continue
        if any(p not in ("", ".") for p in todo) and not stat.S_ISDIR(st.st_mode):
            raise OSError(errno.ENOTDIR, "not a directory", "/".join([*done, part]))
        done.append(part)
    return "/".join(done)


def stat_inside(root: str | os.PathLike[str], rel: str) -> os.stat_result:
    """``os.stat`` of ``root/rel`` after :func:`resolve_inside` (same errors)."""
    return os.lstat(os.path.join(os.path.realpath(root), resolve_inside(root, rel)))


def open_fd_inside(root: str | os.PathLike[str], rel: str, flags: int = os.O_RDONLY) -> int:
    """A descriptor of ``root/rel`` opened with ``flags``, after :func:`resolve_inside`, one
    component at a time from the root's descriptor with ``O_NOFOLLOW`` (``openat``): a
    component swapped for a symlink meanwhile fails (``ELOOP``) instead of being followed.
    Raises :class:`PathEscape` or ``OSError``."""
    parts = [p for p in resolve_inside(root, rel).split("/") if p]
    nofollow = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(os.path.realpath(root), os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | nofollow)
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            nfd = os.open(part, (flags if last else os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)) | nofollow,
                          dir_fd=fd)
            os.close(fd)
            fd = nfd
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_inside(root: str | os.PathLike[str], rel: str) -> BinaryIO:
    """Open the regular file ``root/rel`` for reading (binary, buffered) through
    :func:`open_fd_inside` (``O_NONBLOCK``: a FIFO never blocks the open). Raises
    :class:`PathEscape`, or ``OSError`` (also ``EINVAL`` for a FIFO, socket, device or
    directory, which is never read)."""
    if not stat.S_ISREG(stat_inside(root, rel).st_mode):  # a device is never even opened
        raise OSError(errno.EINVAL, "not a regular file", rel)
    fd = open_fd_inside(root, rel, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", rel)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
