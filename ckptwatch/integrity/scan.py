"""One pass over a checkpoint directory: list, hash and structurally check every file.

Shared by ``ckptwatch manifest`` (which records the result) and ``ckptwatch verify``
(which compares it with a manifest). Each file is hashed and then checked by its format's
structural check in the same worker thread, while its bytes are still in the page cache.
One :class:`~ckptwatch.integrity.limits.Budget` bounds the whole pass (its limits, the
DEFLATE output of all files, its ``stop`` event).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ckptwatch.integrity import hashing
from ckptwatch.integrity.findings import FileCheck, Finding
from ckptwatch.integrity.limits import Budget, Cancelled
from ckptwatch.integrity.tree import Tree, walk


@dataclass
class Scanned:
    """One file: its hash (or why there is none) and its structural check.

    ``check`` has ``checked=False`` and no findings when the file could not be hashed
    (there is nothing stable to check then).
    """

    hash: hashing.HashResult
    check: FileCheck


@dataclass
class Scan:
    """A checkpoint directory after one pass.

    ``files`` maps each relative POSIX path (sorted) to its :class:`Scanned`; ``tree`` is
    the walk (symlink and unreadable-directory findings); ``tree_findings`` are the
    directory-level findings of the formats (DCP ``.metadata`` vs shards, HF index,
    DeepSpeed ``latest``); ``seconds`` is the wall time of the pass.
    """

    root: Path
    tree: Tree
    files: dict[str, Scanned] = field(default_factory=dict)
    tree_findings: list[Finding] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def bytes(self) -> int:
        """Bytes hashed (files that could be read)."""
        return sum(s.hash.size or 0 for s in self.files.values() if s.hash.ok)


def _check(root: Path, rel: str, budget: Budget) -> FileCheck:
    """``formats.check_file``, with a checker that raises turned into a finding (never a
    crash); only :class:`~ckptwatch.integrity.limits.Cancelled` propagates."""
    from ckptwatch.integrity import formats

    try:
        return formats.check_file(root, rel, budget)
    except Cancelled:
        raise
    except Exception as e:  # a bug or an unforeseen input in one format's checker must not stop the rest
        return FileCheck(rel, _detect(root, rel), checked=False, findings=[Finding(
            rel, "unverifiable", "check_failed", f"the structural check failed: {type(e).__name__}: {e}")])


def _detect(root: Path, rel: str) -> str:
    from ckptwatch.integrity import formats

    try:
        return formats.detect_format(root / rel)
    except Exception:
        return "unknown"


def _tree_findings(root: Path, files: list[str], budget: Budget) -> list[Finding]:
    from ckptwatch.integrity import formats

    try:
        return list(formats.check_tree(root, files, budget))
    except Cancelled:
        raise
    except Exception as e:
        return [Finding("", "unverifiable", "check_failed",
                        f"the directory-level check failed: {type(e).__name__}: {e}")]


def scan(root: str | os.PathLike[str], *, workers: int | None = None, chunk_size: int = hashing.CHUNK_SIZE,
         progress: Callable[[int], None] | None = None, on_listed: Callable[[Tree], None] | None = None,
         exclude: Callable[[str], bool] = lambda rel: False, budget: Budget | None = None) -> Scan:
    """Walk ``root``, hash every file on ``workers`` threads and check each file's structure.

    ``progress(n)`` gets bytes hashed (from worker threads); ``on_listed(tree)`` is called
    once the files are listed, before hashing (the CLI sizes its progress bar from
    ``tree.total_bytes``); ``exclude(rel)`` drops paths from the walk (the manifest itself);
    ``budget`` bounds the checks (default: the default limits, no stop event).
    Raises :class:`~ckptwatch.integrity.errors.IntegrityError` when ``root`` cannot be listed,
    :class:`~ckptwatch.integrity.limits.Cancelled` once ``budget.stop`` is set.
    """
    budget = budget or Budget()
    t0 = time.perf_counter()
    tree = walk(root, exclude=exclude)
    if on_listed is not None:
        on_listed(tree)
    base = tree.root

    def then(r: hashing.HashResult) -> FileCheck:
        if not r.ok:
            return FileCheck(r.path, _detect(base, r.path) if r.problem == "changed_while_hashing" else "unknown",
                             checked=False)
        return _check(base, r.path, budget)

    hashed = hashing.hash_files(base, tree.files, workers=workers, chunk_size=chunk_size, progress=progress,
                                then=then, stop=budget.stop)
    files = {rel: Scanned(h, c if c is not None else FileCheck(rel, "unknown", checked=False))
             for rel, (h, c) in hashed.items()}
    present = [rel for rel, s in files.items() if s.hash.problem != "vanished"]
    return Scan(root=base, tree=tree, files=files, tree_findings=_tree_findings(base, present, budget),
                seconds=time.perf_counter() - t0)
