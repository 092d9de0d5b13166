"""Which files make up a checkpoint directory: a walk that never leaves it and never loops.

Regular files are listed by their POSIX path relative to the directory. Symlinks are
judged, not blindly followed:

* to a regular file inside the directory: listed, read through the link;
* to a directory inside it: not descended (its files are listed under their real path);
  a note (verdict ``ok``, problem ``symlink_dir``);
* to anything outside the directory: not read; ``symlink_outside``, ``unverifiable``;
* dangling (its target does not exist): ``dangling_symlink``, ``incomplete`` (the file it
  names is not there);
* a loop (``a -> b -> a``): ``symlink_loop``, ``incomplete``.

FIFOs, sockets and devices are never opened (``not_regular``, ``unverifiable``); a
subdirectory that cannot be listed is ``unreadable``, ``unverifiable``, and its path is
kept so a manifest's files under it are not called missing.

Links are resolved by :func:`~.formats.confine.resolve_inside`, component by component:
nothing outside the directory is ever opened, listed or ``stat``-ed, not even the target of
a link that leads out (it is judged from the link's text alone).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ckptwatch.integrity.errors import IntegrityError
from ckptwatch.integrity.findings import Finding
from ckptwatch.integrity.formats.confine import PathEscape, resolve_inside


@dataclass
class Tree:
    """A walked checkpoint directory.

    ``root`` is the directory as given; ``files`` the sorted relative POSIX paths of the
    regular files (including symlinks to regular files inside it); ``sizes`` their sizes in
    bytes at listing time; ``findings`` the entries that are not readable files (see the
    module docstring); ``unreadable_dirs`` the relative paths of subdirectories that could
    not be listed.
    """

    root: Path
    files: list[str] = field(default_factory=list)
    sizes: dict[str, int] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    unreadable_dirs: list[str] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes.values())

    def under_unreadable(self, rel: str) -> bool:
        """True when ``rel`` lies in a subdirectory that could not be listed."""
        return any(rel.startswith(d + "/") for d in self.unreadable_dirs)


def check_root(root: str | os.PathLike[str]) -> Path:
    """``root`` as a Path after checking it is a directory that can be listed.

    Raises :class:`IntegrityError` naming the path: does not exist, not a directory,
    permission denied, or any other reason it cannot be listed.
    """
    p = Path(root)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise IntegrityError(f"{p}: does not exist") from None
    except OSError as e:
        raise IntegrityError(f"{p}: {_reason(e)}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise IntegrityError(f"{p}: not a directory (give the checkpoint directory)")
    try:
        with os.scandir(p):
            pass
    except OSError as e:
        raise IntegrityError(f"{p}: cannot list the directory: {_reason(e)}") from None
    return p


def _reason(e: OSError) -> str:
    if isinstance(e, PermissionError):
        return "permission denied"
    if e.errno == errno.ELOOP:
        return "symlink loop"
    return e.strerror or str(e)


def walk(root: str | os.PathLike[str], *, exclude: Callable[[str], bool] = lambda rel: False) -> Tree:
    """List the files of the checkpoint directory ``root`` (see the module docstring).

    ``exclude(rel)`` drops top-level or nested paths from the listing (the manifest itself).
    Raises :class:`IntegrityError` when ``root`` itself cannot be listed (see
    :func:`check_root`); everything below it becomes a finding instead.
    """
    base = check_root(root)
    real_root = os.path.realpath(base)
    tree = Tree(root=base)
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        try:
            with os.scandir(base / rel_dir if rel_dir else base) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as e:
            tree.unreadable_dirs.append(rel_dir)
            tree.findings.append(Finding(rel_dir + "/", "unverifiable", "unreadable",
                                         f"directory cannot be listed: {_reason(e)}; its files were not checked"))
            continue
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            if exclude(rel):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError as e:
                tree.findings.append(Finding(rel, "unverifiable", "unreadable", f"cannot be examined: {_reason(e)}"))
                continue
            if stat.S_ISLNK(st.st_mode):
                _symlink(tree, real_root, rel, entry.path)
            elif stat.S_ISDIR(st.st_mode):
                stack.append(rel)
            elif stat.S_ISREG(st.st_mode):
                tree.files.append(rel)
                tree.sizes[rel] = st.st_size
            else:
                tree.findings.append(Finding(rel, "unverifiable", "not_regular",
                                             "not a regular file (a FIFO, socket or device): not read"))
    tree.files.sort()
    tree.findings.sort(key=lambda f: f.path)
    return tree


def _symlink(tree: Tree, real_root: str, rel: str, path: str) -> None:
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    try:
        real = resolve_inside(real_root, rel)
        st = os.lstat(os.path.join(real_root, real))  # inside, and no link left on the way
    except PathEscape:
        tree.findings.append(Finding(rel, "unverifiable", "symlink_outside",
                                     f"symlink to {target}, outside the checkpoint directory: not read"))
        return
    except FileNotFoundError:
        tree.findings.append(Finding(rel, "incomplete", "dangling_symlink",
                                     f"symlink to {target}, which does not exist"))
        return
    except OSError as e:
        if e.errno == errno.ELOOP:
            tree.findings.append(Finding(rel, "incomplete", "symlink_loop",
                                         f"symlink loop ({rel} -> {target} -> ...): never reaches a file"))
        else:
            tree.findings.append(Finding(rel, "unverifiable", "unreadable",
                                         f"symlink to {target} cannot be followed: {_reason(e)}"))
        return
    if stat.S_ISDIR(st.st_mode):
        tree.findings.append(Finding(rel, "ok", "symlink_dir",
                                     f"symlink to the directory {target} inside the checkpoint: not descended "
                                     "(its files are checked under their own path)"))
    elif stat.S_ISREG(st.st_mode):
        tree.files.append(rel)
        tree.sizes[rel] = st.st_size
    else:
        tree.findings.append(Finding(rel, "unverifiable", "not_regular",
                                     f"symlink to {target}, not a regular file (a FIFO, socket or device): not read"))
