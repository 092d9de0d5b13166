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


ARCHIVE_SUFFIXES = (".gz",)


def discover(paths: Iterable[str], *, archives: bool = False) -> list[Found]:
    """Expand files, directories and glob patterns into the files to read, in a stable
    order; each file once (by real path). ``archives``: take compressed rotated logs
    (``train.log.1.gz``) found in directories too (one-shot reads: a live tail has read
    their lines before they were rotated and compressed)."""
    skip = tuple(s for s in SKIP_SUFFIXES if not (archives and s in ARCHIVE_SUFFIXES))
    out: list[Found] = []
    seen: set[str] = set()
    for p in paths:
        if os.path.isfile(p):
            candidates = [p]
        elif os.path.isdir(p):
            candidates = []
            for root, dirs, files in os.walk(p, onerror=lambda e: out.append(Found(e.filename, str(e.strerror)))):
                dirs[:] = sorted(d for d in dirs if not d.startswith(".") and not os.path.islink(os.path.join(root, d)))
                for f in sorted(files):
                    if f.startswith(".") or f.endswith(skip):
                        continue
                    candidates.append(os.path.join(root, f))
        elif any(c in p for c in "*?["):  # an existing path is taken literally, even with these
            candidates = [m for m in sorted(glob.glob(p, recursive=True)) if os.path.isfile(m)]
        elif os.path.exists(p):
            out.append(Found(p, "not a regular file or directory"))
            continue
        else:
            out.append(Found(p, "does not exist"))
            continue
        for c in candidates:
            real = os.path.realpath(c)
            if real not in seen:
                seen.add(real)
                out.append(Found(c))
    return out
