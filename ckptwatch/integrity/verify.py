"""Verify a checkpoint directory before resuming from it: a verdict per file and overall.

Every file is hashed and structurally checked (``formats.check_file``), the directory as a
whole too (``formats.check_tree``: DCP ``.metadata`` vs shards, HF index, DeepSpeed
``latest``); when a manifest exists the hashes are compared with it. Verdicts
(``ok < unverifiable < incomplete < corrupt``, see :mod:`ckptwatch.integrity.findings`):

================================  ===============  ===========================================
on disk vs manifest               problem          verdict
================================  ===============  ===========================================
listed, not on disk               ``missing``      incomplete
smaller than listed               ``truncated``    incomplete
larger than listed                ``size_changed`` corrupt
same size, other SHA-256          ``hash_mismatch`` corrupt
not listed                        ``extra``        ok (a note), see below
================================  ===============  ===========================================

**Extra files** (on disk, not in the manifest) are reported but do not fail the checkpoint:
the manifest defines what the checkpoint is, and a stray file (a log, a later ``latest``)
is the usual cause. Their own structural check still counts: an extra safetensors file
with a broken header is corrupt, and ``check_tree`` still flags, say, a DCP shard that
``.metadata`` does not know.

A file that matches the manifest but fails its structural check is reported with the
check's verdict (it was already broken when the manifest was written). A file with no
structural check for its format is ``unverifiable`` unless the manifest vouches for its
bytes. Files that cannot be read: ``permission_denied`` / ``changed_while_hashing`` (a
writer still has it open) / ``not_regular`` are unverifiable, ``vanished`` is incomplete, an
I/O error (``read_error``) is corrupt. Symlinks: see :mod:`ckptwatch.integrity.tree`.

**Hostile checkpoints** (issue 14): the work is bounded by :class:`~.limits.Limits`
(``limit_exceeded``, unverifiable, past a bound); no path taken from a file is followed out
of the directory (``path_escape``, corrupt; the default manifest is only read when it
resolves inside); every pickle is read by the restricted unpickler (``unsafe_pickle``). A
``stop`` event ends a verification within a chunk (:class:`~.limits.Cancelled`).
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckptwatch.integrity.errors import IntegrityError, ManifestError, ManifestPathEscape
from ckptwatch.integrity.findings import VERDICTS, Finding, Verdict, worst
from ckptwatch.integrity.formats.confine import PathEscape, join_inside, resolve_inside
from ckptwatch.integrity.hashing import CHUNK_SIZE
from ckptwatch.integrity.limits import Budget, Limits
from ckptwatch.integrity.manifest import MANIFEST_NAME, Manifest, is_manifest_file, manifest_path, read_manifest
from ckptwatch.integrity.scan import Scanned, scan
from ckptwatch.integrity.tree import Tree

__all__ = ["HASH_PROBLEM_VERDICT", "FileReport", "IntegrityError", "ManifestError", "Report", "verify"]

#: Verdict of each hashing problem (see :data:`ckptwatch.integrity.hashing.PROBLEMS`).
HASH_PROBLEM_VERDICT: dict[str, Verdict] = {
    "vanished": "incomplete", "permission_denied": "unverifiable", "not_regular": "unverifiable",
    "read_error": "corrupt", "changed_while_hashing": "unverifiable", "symlink_outside": "unverifiable",
}


@dataclass
class FileReport:
    """The verdict of one path of the checkpoint.

    ``size`` (bytes) and ``sha256`` are as found on disk (None when absent or unreadable);
    ``format`` the detected format; ``in_manifest`` None when no manifest was used;
    ``findings`` every problem (and note) about this path, most important source first.
    """

    path: str
    verdict: Verdict
    size: int | None = None
    sha256: str | None = None
    format: str = "unknown"
    in_manifest: bool | None = None
    findings: list[Finding] = field(default_factory=list)

    def add(self, f: Finding) -> None:
        """Add a finding unless one with the same problem code is already there; worsens the verdict."""
        if any(g.problem == f.problem for g in self.findings):
            return
        self.findings.append(f)
        self.verdict = worst([self.verdict, f.verdict])

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "verdict": self.verdict, "size": self.size, "sha256": self.sha256,
                "format": self.format, "in_manifest": self.in_manifest,
                "findings": [f.to_json() for f in self.findings]}


@dataclass
class Report:
    """The result of :func:`verify`.

    ``verdict`` is the worst of every file's verdict and of ``findings`` (directory-level
    findings tied to no file). ``files`` are sorted by path and include missing files.
    ``total_files`` / ``total_bytes`` count what was read from disk; ``seconds`` is wall time.
    ``manifest`` is the manifest compared with (None without one), ``manifest_path`` its file.
    """

    root: Path
    verdict: Verdict
    files: list[FileReport]
    findings: list[Finding]
    total_files: int
    total_bytes: int
    seconds: float
    manifest: Manifest | None = None
    manifest_path: Path | None = None

    @property
    def problems(self) -> list[FileReport]:
        """The files that are not plainly ok (a verdict other than ok, or a note such as ``extra``)."""
        return [f for f in self.files if f.verdict != "ok" or f.findings]

    def counts(self) -> dict[str, int]:
        """Files per verdict, every verdict present (0 when none)."""
        c = Counter(f.verdict for f in self.files)
        return {v: c.get(v, 0) for v in VERDICTS}

    def to_json(self) -> dict[str, Any]:
        """The report as JSON values: ``checkpoint``, ``verdict``, ``manifest`` (``path``,
        ``created``, ``checkpoint``, ``step``, ``world_size``, or null), ``totals`` (``files``,
        ``bytes``, ``seconds``), ``counts`` (files per verdict), ``files`` (every path with
        ``verdict``, ``size``, ``sha256``, ``format``, ``in_manifest``, ``findings``) and
        ``findings`` (directory-level)."""
        m = self.manifest
        return {
            "checkpoint": str(self.root), "verdict": self.verdict,
            "manifest": None if m is None else {
                "path": str(self.manifest_path) if self.manifest_path else None, "created": m.created,
                "checkpoint": m.checkpoint, "step": m.step, "world_size": m.world_size},
            "totals": {"files": self.total_files, "bytes": self.total_bytes, "seconds": round(self.seconds, 3)},
            "counts": self.counts(),
            "files": [f.to_json() for f in self.files],
            "findings": [f.to_json() for f in self.findings],
        }


def _load_manifest(root: Path, manifest: str | os.PathLike[str] | Manifest | None
                   ) -> tuple[Manifest | None, Path | None, Finding | None]:
    if isinstance(manifest, Manifest):
        return manifest, None, None
    if manifest is not None:
        p = Path(manifest)
        return read_manifest(p), (manifest_path(p) if p.is_dir() else p), None
    p = manifest_path(root)
    if not os.path.lexists(p):
        return None, None, None
    try:
        real = resolve_inside(root, MANIFEST_NAME)  # a symlink to another checkpoint's manifest: never followed
    except PathEscape as e:
        return None, p, Finding(MANIFEST_NAME, "unverifiable", "symlink_outside",
                                f"{e}: not read; hashes not compared")
    except OSError:
        real = MANIFEST_NAME  # dangling, a loop...: read_manifest says what is wrong
    try:
        return read_manifest(root / real), p, None
    except ManifestPathEscape as e:
        return None, p, Finding(MANIFEST_NAME, "corrupt", "path_escape", str(e))
    except ManifestError as e:
        return None, p, Finding(MANIFEST_NAME, "corrupt", "bad_manifest",
                                f"{e}; hashes not compared (the storage under this checkpoint may be damaged)")


def _file_report(rel: str, sc: Scanned, m: Manifest | None) -> FileReport:
    h, c = sc.hash, sc.check
    entry = m.files.get(rel) if m is not None else None
    r = FileReport(rel, "ok", size=h.size, sha256=h.sha256, format=c.format,
                   in_manifest=None if m is None else entry is not None)
    vouched = extra = False
    if not h.ok:
        r.add(Finding(rel, HASH_PROBLEM_VERDICT.get(h.problem or "", "unverifiable"), h.problem or "unreadable",
                      h.detail))
    elif m is not None and entry is None:
        extra = True
        r.add(Finding(rel, "ok", "extra", f"not in the manifest (written {m.created}): not part of the checkpoint "
                      "it describes (a stray or later file?); its own structure still counts"))
    elif m is not None and entry is not None:
        assert h.size is not None and h.sha256 is not None
        when = f"the manifest (written {m.created})"
        if h.size < entry.size:
            r.add(Finding(rel, "incomplete", "truncated", f"{h.size} bytes on disk, {entry.size} in {when}: "
                          f"{entry.size - h.size} bytes cut off (an interrupted write or copy)"))
        elif h.size > entry.size:
            r.add(Finding(rel, "corrupt", "size_changed", f"{h.size} bytes on disk, {entry.size} in {when}: "
                          "grew after the manifest was written (appended to or overwritten)"))
        elif h.sha256 != entry.sha256:
            r.add(Finding(rel, "corrupt", "hash_mismatch", f"sha256 differs from {when}: {h.sha256[:16]}... on "
                          f"disk, {entry.sha256[:16]}... in the manifest, same size {h.size} bytes: bytes changed "
                          "in place (bit rot, a bad copy, or a second writer)"))
        else:
            vouched = True
    for f in c.findings:
        r.add(Finding(rel, f.verdict, f.problem, f.detail) if f.path != rel else f)
    if not (c.checked or vouched or extra) and h.ok and not c.findings and not r.findings:
        r.add(Finding(rel, "unverifiable", "unchecked", f"no structural check for its format ({c.format}) and "
                      "no manifest vouching for its bytes (write one after each save: ckptwatch manifest DIR)"))
    elif not (c.checked or vouched or extra):  # already reported (a hash or size finding): no advice to add
        r.verdict = worst([r.verdict, "unverifiable"])
    return r


def _inside(rel: str) -> bool:
    """True when ``rel`` names a path inside the checkpoint (never stat a path that leaves it)."""
    try:
        return join_inside("", rel) == rel
    except PathEscape:
        return False


def verify(directory: str | os.PathLike[str], *, manifest: str | os.PathLike[str] | Manifest | None = None,
           workers: int | None = None, progress: Callable[[int], None] | None = None,
           on_listed: Callable[[Tree], None] | None = None, chunk_size: int = CHUNK_SIZE,
           limits: Limits | None = None, stop: threading.Event | None = None) -> Report:
    """Verify the checkpoint ``directory`` (see the module docstring for the verdicts).

    ``manifest``: None uses ``directory/ckptwatch-manifest.json`` when it exists (a damaged
    one is a ``bad_manifest`` finding, corrupt, and the rest is still checked); a path (file
    or checkpoint directory) or a :class:`Manifest` is used instead. ``workers``: hashing
    threads (default: one per core). ``progress(n)``: bytes hashed, from worker threads.
    ``on_listed(tree)``: called before hashing (total size for a progress bar).
    ``chunk_size``: bytes read at a time per file. ``limits``: bounds on the work
    (:class:`~ckptwatch.integrity.limits.Limits`, default its defaults). ``stop``: an event
    that, once set, ends the verification within one chunk per thread.

    Raises :class:`~ckptwatch.integrity.errors.IntegrityError` when ``directory`` does not
    exist, is not a directory or cannot be listed,
    :class:`~ckptwatch.integrity.errors.ManifestError` when an explicitly given manifest
    cannot be read, and :class:`~ckptwatch.integrity.limits.Cancelled` (an
    ``IntegrityError``) once ``stop`` is set. Everything wrong inside the checkpoint is a
    finding, never an exception.
    """
    t0 = time.perf_counter()
    root = Path(directory)
    from ckptwatch.integrity.tree import check_root

    check_root(root)
    m, m_path, m_problem = _load_manifest(root, manifest)
    s = scan(root, workers=workers, progress=progress, on_listed=on_listed, exclude=is_manifest_file,
             chunk_size=chunk_size, budget=Budget(limits, stop))
    reports: dict[str, FileReport] = {rel: _file_report(rel, sc, m) for rel, sc in s.files.items()}
    top: list[Finding] = []
    if m_problem is not None:
        reports[MANIFEST_NAME] = FileReport(MANIFEST_NAME, "corrupt", format="ckptwatch_manifest",
                                            findings=[m_problem])
    for f in s.tree.findings:
        if f.path.endswith("/"):
            top.append(f)
            continue
        entry = m.files.get(f.path) if m is not None else None
        r = reports.setdefault(f.path, FileReport(f.path, "ok", in_manifest=None if m is None else entry is not None))
        r.add(f)
    if m is not None:
        for rel, entry in m.files.items():
            if rel in reports:
                continue
            r = reports[rel] = FileReport(rel, "ok", format=entry.format, in_manifest=True)
            if s.tree.under_unreadable(rel):
                r.add(Finding(rel, "unverifiable", "unreadable", "in a directory that cannot be listed: not checked"))
            else:
                r.add(Finding(rel, "incomplete", "missing", f"listed in the manifest (written {m.created}, "
                              f"{entry.size} bytes) but not on disk"))
    for f in s.tree_findings:
        if f.path in reports:
            reports[f.path].add(f)
        elif not f.path or f.path.endswith("/") or not _inside(f.path) or os.path.isdir(root / f.path):
            top.append(f)
        else:  # a file a directory-level check names that is not on disk (a shard .metadata expects)
            reports[f.path] = FileReport(f.path, "ok", in_manifest=None if m is None else f.path in m.files)
            reports[f.path].add(f)
    files = [reports[p] for p in sorted(reports)]
    if not files and not top:  # nothing saved here (or a save that never wrote a byte): never a resume target
        top.append(Finding("", "incomplete", "empty", "the directory holds no file: nothing to resume from"))
    verdict = worst([r.verdict for r in files] + [f.verdict for f in top])
    return Report(root=root, verdict=verdict, files=files, findings=top, total_files=len(s.files),
                  total_bytes=s.bytes, seconds=time.perf_counter() - t0, manifest=m, manifest_path=m_path)
