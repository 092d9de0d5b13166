"""Silences: label matchers with an expiry; a silenced incident is not sent to any channel.

Silences come from the config (``[[alerts.silences]]``) and from ``ckptwatch silence``,
which keeps them in a JSON file beside the database (``<db>.silences.json`` unless
``[alerts] silences_file`` says otherwise), not in DuckDB: the running pipeline holds the
database's lock, and a silence must be addable while it runs. The file is rewritten
atomically (temporary file, fsync, rename) under an exclusive ``flock`` of ``FILE.lock``;
the pipeline re-reads it when its modification time changes. Both files are created
``0600``, and a missing directory ``0700`` (:mod:`ckptwatch.private_files`).

File format: ``{"silences": [{"id", "matchers": {label: glob}, "expires", "created",
"comment"}]}`` with times in ISO 8601 UTC.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import secrets
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ckptwatch import private_files
from ckptwatch.sinks.alerts.routing import matches
from ckptwatch.sinks.alerts.settings import LABELS, AlertConfigError, parse_time


@dataclass(frozen=True)
class Silence:
    """Labels globs (``matchers``, at least one) muted until ``expires`` (UTC)."""

    id: str
    matchers: dict[str, str]
    expires: dt.datetime
    comment: str = ""
    created: dt.datetime | None = None

    def active(self, now: dt.datetime) -> bool:
        """Not yet expired at ``now`` (UTC)."""
        return now < self.expires

    def mutes(self, lbls: Mapping[str, str], now: dt.datetime) -> bool:
        """Active and every matcher matches ``lbls``."""
        return self.active(now) and matches(self.matchers, lbls)

    @classmethod
    def from_dict(cls, d: Any, where: str) -> Silence:
        """From a config table (labels as keys) or a file entry (``matchers`` table).
        Raises AlertConfigError naming ``where`` and the key."""
        if not isinstance(d, dict):
            raise AlertConfigError(f"{where}: must be a table")
        matchers = dict(d.get("matchers") or {})
        for k, v in d.items():
            if k in ("id", "matchers", "expires", "comment", "created"):
                continue
            if k not in LABELS:
                raise AlertConfigError(f"{where} {k}: unknown key (labels: {', '.join(LABELS)}; "
                                       "also expires, comment)")
            matchers[k] = v
        for k, v in matchers.items():
            if k not in LABELS or not isinstance(v, str) or not v:
                raise AlertConfigError(f"{where} {k}: a label ({', '.join(LABELS)}) with a non-empty glob")
        if not matchers:
            raise AlertConfigError(f"{where}: needs at least one label to match ({', '.join(LABELS)})")
        if "expires" not in d:
            raise AlertConfigError(f"{where}: needs expires (silences always end)")
        created = parse_time(d["created"], f"{where} created") if d.get("created") else None
        return cls(id=str(d.get("id") or ""), matchers=matchers, expires=parse_time(d["expires"], f"{where} expires"),
                   comment=str(d.get("comment") or ""), created=created)

    def to_dict(self) -> dict[str, Any]:
        """The file entry (see the module docstring); times in ISO 8601."""
        return {"id": self.id, "matchers": self.matchers, "expires": self.expires.isoformat(),
                "created": self.created.isoformat() if self.created else None, "comment": self.comment}


@dataclass
class SilenceFile:
    """The silences of ``ckptwatch silence``, in ``path`` (see the module docstring).
    ``on_error`` hears, once per change of the file, that it could not be read."""

    path: str
    on_error: Callable[[str], None] | None = None
    _mtime: int | None = None
    _cached: list[Silence] = field(default_factory=list)

    def read(self) -> list[Silence]:
        """Every silence in the file ([] when it does not exist). Raises AlertConfigError
        naming the file for one that is not a silence file."""
        try:
            with open(self.path) as f:
                text = f.read()
            if not text.strip():
                return []  # emptied by hand: no silence
            doc = json.loads(text)
        except FileNotFoundError:
            return []
        except OSError as e:
            raise AlertConfigError(f"{self.path}: cannot read: {e.strerror or e}") from None
        except json.JSONDecodeError as e:
            raise AlertConfigError(f"{self.path}: not a silence file (invalid JSON: {e})") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("silences"), list):
            raise AlertConfigError(f"{self.path}: not a silence file (expected {{\"silences\": [...]}})")
        return [Silence.from_dict(s, f"{self.path}: silence #{i + 1}") for i, s in enumerate(doc["silences"])]

    def current(self) -> list[Silence]:
        """:meth:`read`, re-done only when the file's modification time changed. A file
        that cannot be read keeps the last good list (the running pipeline goes on: at start,
        none), and ``on_error`` is told once."""
        try:
            mtime = os.stat(self.path).st_mtime_ns
        except OSError:
            mtime = None
        if mtime != self._mtime:
            self._mtime = mtime
            try:
                self._cached = self.read()
            except AlertConfigError as e:
                if self.on_error:
                    kept = f"keeping the {len(self._cached)} silence(s) read before" if self._cached else "no silence applies"
                    self.on_error(f"{e}; {kept} until it is fixed")
        return self._cached

    @contextlib.contextmanager
    def _locked(self) -> Iterator[list[Silence]]:
        fd = private_files.open_private(self.path + ".lock", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        with os.fdopen(fd, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            items = self.read()
            yield items
            self._write(items)

    def _write(self, items: list[Silence]) -> None:
        private_files.write_private(self.path, json.dumps({"silences": [s.to_dict() for s in items]},
                                                          indent=1).encode())

    def add(self, matchers: dict[str, str], expires: dt.datetime, comment: str = "",
            now: dt.datetime | None = None) -> Silence:
        """Add a silence; returns it with its new id (8 hex digits)."""
        now = now or dt.datetime.now(dt.timezone.utc)
        s = Silence.from_dict({"id": secrets.token_hex(4), "matchers": matchers, "expires": expires.isoformat(),
                               "comment": comment, "created": now.isoformat()}, "silence")
        with self._locked() as items:
            items.append(s)
        return s

    def expire(self, silence_id: str, now: dt.datetime | None = None) -> Silence:
        """End a silence now. Raises AlertConfigError when no silence has that id."""
        now = now or dt.datetime.now(dt.timezone.utc)
        with self._locked() as items:
            for i, s in enumerate(items):
                if s.id == silence_id:
                    items[i] = Silence(s.id, s.matchers, min(s.expires, now), s.comment, s.created)
                    return items[i]
        raise AlertConfigError(f"{self.path}: no silence with id {silence_id!r}")
