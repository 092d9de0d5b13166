"""Which files to read under the paths a user gives (Vector's ``paths_provider``).

Files named directly are always read. Directories are walked (sorted, recursively,
symlinked directories not followed) and every file is taken except checkpoint payloads
and structured side files that are not logs (see :data:`SKIP_SUFFIXES`; JSON-lines logs,
``.jsonl``, are read) and compressed rotated logs unless asked for (``archives``). A path with
``*``, ``?`` or ``[`` is a glob pattern (``logs/**/*.log``; ``**`` spans directories):
the regular files it matches are taken as if named directly, the directories it matches
are not walked, and matching nothing is not an error (the files may come later). Whether
a file is text is decided when it is read (:func:`ckptwatch.ingest.reader.looks_binary`).

Symlinks: a symlinked file found in a directory walked, or matched by a pattern, is taken
only when its target lies under the watched roots (the directories given, the fixed part
of each pattern, the files named); one that leads out (``shadow.log -> /etc/shadow``) is
listed with ``error`` set, never read. A file reached both through a symlink and under its
own name is taken once, under its own name.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable
from dataclasses import dataclass

from ckptwatch.ingest import handles

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
    order; each file once (by real path, under its own name rather than a symlink's when
    both are found); a symlink whose target is outside the roots (see the module
    docstring) as an error, not to be read. ``archives``: take compressed rotated logs
    (``train.log.1.gz``) found in directories too (one-shot reads: a live tail has read
    their lines before they were rotated and compressed); without it they are listed with
    ``archive`` set, to be reported. ``dirs``: appended with the directories whose entries
    decide what is found, for :class:`~ckptwatch.ingest.notify.ChangeFeed` to watch: every
    directory walked; the directory of a file named directly, or the nearest existing one
    above a path that does not exist yet; for a pattern, the directories its directory part
    matches (every one under its root with ``**``) and the root itself."""
    skip = tuple(s for s in SKIP_SUFFIXES if not (archives and s in ARCHIVE_SUFFIXES))
    paths = list(paths)
    roots = watched_roots(paths)
    found: list[tuple[Found, bool]] = []  # (found, reached through a symlink)
    for p in paths:
        candidates: list[tuple[str, str, bool]] = []  # (path, real path, is a symlink)
        named = os.path.isfile(p)  # a file named directly is read, a symlink or not
        if named:
            candidates = [(p, os.path.realpath(p), os.path.islink(p))]
            if dirs is not None:
                dirs.append(os.path.dirname(p) or os.curdir)
        elif os.path.isdir(p):
            listed: list[Found] = []  # archives and listing errors
            _walk(p, os.path.realpath(p), skip, candidates, listed, dirs, roots)
            found += [(f, False) for f in listed]
        elif any(c in p for c in "*?["):  # an existing path is taken literally, even with these
            candidates = [(m, os.path.realpath(m), os.path.islink(m))
                          for m in sorted(glob.glob(p, recursive=True)) if os.path.isfile(m)]
            if dirs is not None:
                dirs += _pattern_dirs(p)  # (the directories of its matches among them)
        elif os.path.exists(p):
            found.append((Found(p, "not a regular file or directory"), False))
        else:
            found.append((Found(p, "does not exist"), False))
            if dirs is not None:  # where it will appear
                dirs.append(_nearest_existing(p))
        for c, real, link in candidates:
            if link and not named and not _under(real, roots):
                found.append((Found(c, f"a symbolic link to {real}, outside the watched paths; not read"), False))
            else:
                found.append((Found(c, real=real), link))
    own = {f.real for f, link in found if f.real is not None and not link}
    seen: set[str] = set()
    out = []
    for f, link in found:
        if f.real is not None:
            if f.real in seen or (link and f.real in own):
                continue
            seen.add(f.real)
        out.append(f)
    return out


def watched_roots(paths: Iterable[str]) -> list[str]:
    """The real paths under which a symlink's target may lie to be read: each directory
    given, each file named, and the fixed part of each glob pattern (the directory before
    its first wildcard)."""
    roots = []
    for p in paths:
        if os.path.exists(p):
            roots.append(os.path.realpath(p))
        elif any(c in p for c in "*?["):
            fixed = p[:min(p.find(c) for c in "*?[" if c in p)]
            roots.append(os.path.realpath(os.path.dirname(fixed) or os.curdir))
    return roots


def _under(real: str, roots: Iterable[str]) -> bool:
    """True if the real path ``real`` is one of ``roots`` or lies under one."""
    return any(real == r or real.startswith(r.rstrip(os.sep) + os.sep) for r in roots)


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
          dirs: list[str] | None = None, roots: Iterable[str] = ()) -> None:
    """Append ``(path, real path, is a symlink)`` of the files under directory ``top`` (real
    path ``real``) to ``candidates``, as ``os.walk`` would list them (sorted, a directory's
    files before its subdirectories', hidden names and symlinked directories left out), and
    archives, listing errors and symlinked directories that lead out of ``roots`` (not
    walked, said) to ``out``. A plain file's real path is its directory's joined with its
    name: no ``realpath`` (an ``lstat`` per path component) for each of 10,000 rank files."""
    try:
        with os.scandir(top) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError as e:
        if e.errno in handles.NO_DESCRIPTORS:  # not the directory's fault: say so, skip nothing in silence
            raise handles.out_of_descriptors(top) from None
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
            if link and e.is_dir():  # a symlinked directory is not walked; said when it leads out
                target = os.path.realpath(e.path)
                if roots and not _under(target, roots):
                    out.append(Found(e.path, f"a symbolic link to the directory {target}, outside the watched paths; "
                                             "not read"))
                continue
        except OSError:
            continue
        if e.name.endswith(skip):
            if e.name.endswith(ARCHIVE_SUFFIXES):
                out.append(Found(e.path, archive=True))
            continue
        candidates.append((e.path, os.path.realpath(e.path) if link else os.path.join(real, e.name), link))
    for d in subdirs:
        _walk(d.path, os.path.join(real, d.name), skip, candidates, out, dirs, roots)


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
