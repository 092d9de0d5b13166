"""Which files to read under the paths a user gives (Vector's ``paths_provider``).

Files named directly are always read. Directories are walked (sorted, recursively,
symlinked directories not followed) and every file is taken except checkpoint payloads
and structured side files that are not logs (see :data:`SKIP_SUFFIXES`; JSON-lines logs,
``.jsonl``, are read) and compressed rotated logs unless asked for (``archives``). A path with
``*``, ``?`` or ``[`` is a glob pattern (``logs/**/*.log``; ``**`` spans directories):
the regular files it matches are taken as if named directly, the directories it matches
are not walked, and matching nothing is not an error (the files may come later). Whether
a file is text is decided when it is read (:func:`ckptwatch.ingest.reader.looks_binary`).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable
from dataclasses import dataclass

SKIP_SUFFIXES = (
    ".json", ".distcp", ".metadata", ".pt", ".pth", ".bin", ".safetensors", ".ckpt",
    ".duckdb", ".wal", ".tmp", ".gz", ".zip", ".tar", ".npy", ".npz", ".pkl", ".lock",
)


@dataclass(frozen=True)
class Found:
    """A discovered path, or a problem with one (``error`` set, e.g. "does not exist")."""

    path: str
    error: str | None = None
    #: a compressed rotated log left alone (``archives`` off): reported, not read
    archive: bool = False
    #: the file's real path (symlinks resolved), for a file to read
    real: str | None = None


ARCHIVE_SUFFIXES = (".gz",)


def discover(paths: Iterable[str], *, archives: bool = False, dirs: list[str] | None = None) -> list[Found]:
    """Expand files, directories and glob patterns into the files to read, in a stable
    order; each file once (by real path). ``archives``: take compressed rotated logs
    (``train.log.1.gz``) found in directories too (one-shot reads: a live tail has read
    their lines before they were rotated and compressed); without it they are listed with
    ``archive`` set, to be reported. ``dirs``: appended with the directories whose entries
    decide what is found, for :class:`~ckptwatch.ingest.notify.ChangeFeed` to watch: every
    directory walked; the directory of a file named directly, or the nearest existing one
    above a path that does not exist yet; for a pattern, the directories its directory part
    matches (every one under its root with ``**``) and the root itself."""
    skip = tuple(s for s in SKIP_SUFFIXES if not (archives and s in ARCHIVE_SUFFIXES))
    out: list[Found] = []
    seen: set[str] = set()
    for p in paths:
        if os.path.isfile(p):
            candidates = [p]
            if dirs is not None:
                dirs.append(os.path.dirname(p) or os.curdir)
        elif os.path.isdir(p):
            candidates = []
            _walk(p, os.path.realpath(p), skip, candidates, out, dirs)
        elif any(c in p for c in "*?["):  # an existing path is taken literally, even with these
            candidates = [m for m in sorted(glob.glob(p, recursive=True)) if os.path.isfile(m)]
            if dirs is not None:
                dirs += _pattern_dirs(p)  # (the directories of its matches among them)
        elif os.path.exists(p):
            out.append(Found(p, "not a regular file or directory"))
            continue
        else:
            out.append(Found(p, "does not exist"))
            if dirs is not None:  # where it will appear
                dirs.append(_nearest_existing(p))
            continue
        for c in candidates:
            c, real = c if isinstance(c, tuple) else (c, os.path.realpath(c))
            if real not in seen:
                seen.add(real)
                out.append(Found(c, real=real))
    return out


def _nearest_existing(path: str) -> str:
    """The nearest existing directory above ``path`` (``.`` at worst)."""
    parent = os.path.dirname(os.path.normpath(path)) or os.curdir
    while not os.path.isdir(parent) and parent not in (os.curdir, os.sep):
        parent = os.path.dirname(parent) or os.curdir
    return parent


def _pattern_dirs(pattern: str) -> list[str]:
    """The directories whose entries decide what ``pattern`` matches: those its directory
    part matches (every directory under the root with ``**``), and its root (the directory
    before the first wildcard, or the nearest existing one above it)."""
    root = pattern[:min(pattern.find(c) for c in "*?[" if c in pattern)]
    top = os.path.dirname(root) or os.curdir
    if not os.path.isdir(top):
        return [_nearest_existing(top)]
    if "**" in pattern:
        return [top] + [os.path.join(d, n) for d, subdirs, _ in os.walk(top) for n in subdirs
                        if not n.startswith(".")]
    head = os.path.dirname(pattern)
    return [top] + [d for d in sorted(glob.glob(head)) if os.path.isdir(d)] if head else [top]


def _walk(top: str, real: str, skip: tuple[str, ...], candidates: list, out: list[Found],
          dirs: list[str] | None = None) -> None:
    """Append ``(path, real path)`` of the files under directory ``top`` (real path ``real``)
    to ``candidates``, as ``os.walk`` would list them (sorted, a directory's files before its
    subdirectories', hidden names and symlinked directories left out), and archives and
    listing errors to ``out``. A plain file's real path is its directory's joined with its
    name: no ``realpath`` (an ``lstat`` per path component) for each of 10,000 rank files."""
    try:
        with os.scandir(top) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError as e:
        out.append(Found(top, str(e.strerror)))
        return
    if dirs is not None:
        dirs.append(top)
    subdirs = []
    for e in entries:
        if e.name.startswith("."):
            continue
        try:
            link = e.is_symlink()
            if e.is_dir(follow_symlinks=False):
                subdirs.append(e)
                continue
            if link and e.is_dir():
                continue  # a symlinked directory is not walked
        except OSError:
            continue
        if e.name.endswith(skip):
            if e.name.endswith(ARCHIVE_SUFFIXES):
                out.append(Found(e.path, archive=True))
            continue
        candidates.append((e.path, os.path.realpath(e.path) if link else os.path.join(real, e.name)))
    for d in subdirs:
        _walk(d.path, os.path.join(real, d.name), skip, candidates, out, dirs)


def covers(paths: Iterable[str], path: str, *, archives: bool = False) -> bool:
    """True if :func:`discover` over ``paths`` would take the file at ``path`` now (named
    directly, under a walked directory and not skipped, or matched by a glob pattern). For
    a file that appeared after a listing, without listing everything again (glob patterns
    are expanded, so keep this off hot paths)."""
    skip = tuple(s for s in SKIP_SUFFIXES if not (archives and s in ARCHIVE_SUFFIXES))
    real = os.path.realpath(path)
    for p in paths:
        if os.path.isfile(p):
            if os.path.realpath(p) == real:
                return True
        elif os.path.isdir(p):
            rel = os.path.relpath(path, p)
            parts = rel.split(os.sep)
            if rel.startswith(os.pardir) or any(x.startswith(".") for x in parts) or parts[-1].endswith(skip):
                continue
            parent, ok = p, True
            for d in parts[:-1]:
                parent = os.path.join(parent, d)
                ok = ok and not os.path.islink(parent)
            if ok:
                return True
        elif any(c in p for c in "*?[") and real in {os.path.realpath(m) for m in glob.glob(p, recursive=True)}:
            return True
    return False
