"""Where each source's tailing resumes after a restart (Vector's checkpointer).

A :class:`SourceCheckpoint` says, for one source id, the byte offset from which a restart
loses and repeats nothing, the job learned from the file's lines, and the SHA-256 of the
file's first line (``head_hash``: lets a restart recognize a copy of a file truncated by
``copytruncate`` while it was down, see :mod:`ckptwatch.ingest.rotation`).

:class:`FileCheckpointer` keeps them in one JSON file, replaced atomically on each save::

    {"version": 1, "sources": [{"source_id": ..., "path": ..., "offset": ..., "job": ..., "head_hash": ...}]}

Which entries to keep is the caller's business (:meth:`ckptwatch.ingest.watcher.SourceWatcher.checkpoints`).
"""

from __future__ import annotations

from ckptwatch import atomic

import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass

FORMAT_VERSION = 1


class CheckpointError(Exception):
    """A checkpoint file that cannot be read or written; the message names the file and the problem."""


@dataclass(frozen=True)
class SourceCheckpoint:
    """Resume point of one source.

    Attributes:
        source_id: the source's id (:mod:`ckptwatch.ingest.identity`).
        path: where the file was last seen.
        offset: byte offset from which tailing resumes (never past a held-back line).
        job: the job learned from the file's lines, if any.
        head_hash: hex SHA-256 of the file's first line (without newline, at most 1 KiB).
    """

    source_id: str
    path: str
    offset: int
    job: str | None
    head_hash: str


_FIELDS = {"source_id": str, "path": str, "offset": int, "job": (str, type(None)), "head_hash": str}


class FileCheckpointer:
    """The checkpoints of a set of sources in the JSON file at ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def load(self) -> dict[str, SourceCheckpoint]:
        """The saved checkpoints by source id; empty if the file does not exist yet.

        Raises:
            CheckpointError: the file cannot be read, is not JSON, or does not hold valid
                entries (the message names the file and the problem).
        """
        try:
            with open(self.path, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            return {}
        except (OSError, UnicodeDecodeError) as e:
            raise CheckpointError(f"checkpoint file {self.path}: cannot read: {getattr(e, 'strerror', None) or e}") from None
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            raise CheckpointError(f"checkpoint file {self.path}: not valid JSON ({e.msg}; line {e.lineno}, "
                                  f"column {e.colno}); move it aside to start over from the beginning of "
                                  "every file") from None
        return {c.source_id: c for c in self._entries(doc)}

    def _entries(self, doc: object) -> list[SourceCheckpoint]:
        if not isinstance(doc, dict) or not isinstance(doc.get("sources"), list):
            raise CheckpointError(f"checkpoint file {self.path}: expected an object with a \"sources\" list")
        if doc.get("version") != FORMAT_VERSION:
            raise CheckpointError(f"checkpoint file {self.path}: unsupported version {doc.get('version')!r} "
                                  f"(this ckptwatch reads version {FORMAT_VERSION})")
        out = []
        for i, entry in enumerate(doc["sources"]):
            if not isinstance(entry, dict):
                raise CheckpointError(f"checkpoint file {self.path}: sources[{i}] is not an object")
            for name, typ in _FIELDS.items():
                value = entry.get(name)
                if not isinstance(value, typ) or isinstance(value, bool):
                    raise CheckpointError(f"checkpoint file {self.path}: sources[{i}].{name} is missing or "
                                          f"not a {'string' if typ is str else 'valid value'}: {value!r}")
            if entry["offset"] < 0:
                raise CheckpointError(f"checkpoint file {self.path}: sources[{i}].offset is negative")
            out.append(SourceCheckpoint(**{k: entry[k] for k in _FIELDS}))
        return out

    def save(self, entries: Iterable[SourceCheckpoint]) -> None:
        """Replace the file's content with ``entries``, atomically: a temporary file in the
        same directory is written, flushed and fsynced, renamed over the file, and the
        directory is fsynced, so a crash leaves either the old or the new content.

        Raises:
            CheckpointError: the file cannot be written (names the file and the reason).
        """
        doc = {"version": FORMAT_VERSION,
               "sources": [asdict(e) for e in sorted(entries, key=lambda e: (e.path, e.source_id))]}
        try:
            # named after the file (and ending in .tmp) so that log discovery passes it over
            atomic.replace_file(self.path, json.dumps(doc, indent=1).encode("utf-8"),
                                tmp_prefix=os.path.basename(self.path) + ".")
        except OSError as e:
            raise CheckpointError(f"checkpoint file {self.path}: cannot write: {e.strerror or e}") from None
