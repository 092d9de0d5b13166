"""Watch checkpoint roots and verify each new checkpoint once it is complete.

Used by ``ckptwatch collect`` / ``run`` with ``--checkpoint-root DIR``: every direct
subdirectory of a root whose name carries a step (``checkpoint-40``, ``iter_0000040``,
``global_step40``, ``step_40``) is a checkpoint. It is verified (:func:`ckptwatch.integrity.api.verify`)
once *settled*: no file in it was modified in the last ``settle`` seconds, by its files'
mtimes (a save in progress keeps writing; a torn save stays as it is), also with
``--once``. Its ``integrity`` line is appended to ``log`` (UTC
time first), which the collector tails like any other log, so results reach the pipeline
with the same no-loss / no-duplicate guarantees as log lines. A checkpoint is verified
again only when its files change (count, total bytes or newest mtime).

Verification runs on one background thread so tailing goes on while a large checkpoint
is hashed. What was verified (path -> signature) is kept in ``<log>.state.json``, replaced
atomically, so a restart does not verify everything again.

:meth:`CheckpointWatcher.close` (called when the collector stops: Ctrl-C, SIGTERM) sets a
stop event that the verification checks after every chunk it hashes or inflates and between
zip members, so it returns within milliseconds even mid-way through a huge checkpoint or a
zip bomb; the interrupted checkpoint is not recorded as verified and is verified again after
a restart. Every verification is bounded by ``limits``
(:class:`~ckptwatch.integrity.limits.Limits`).
"""

from __future__ import annotations

from ckptwatch import atomic

import json
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from ckptwatch.config import CollectSettings
from ckptwatch.integrity import api
from ckptwatch.integrity.errors import IntegrityError
from ckptwatch.integrity.limits import Cancelled, Limits
from ckptwatch.integrity.logline import stamped
from ckptwatch.integrity.manifest import step_from_name

#: (number of files, total bytes, newest mtime in ns) of a checkpoint directory
Signature = tuple[int, int, int]


def signature(directory: Path) -> Signature | None:
    """The :data:`Signature` of ``directory`` (None when it cannot be listed). Symlinks are
    not followed."""
    n = size = newest = 0
    try:
        for dirpath, _dirs, files in os.walk(directory):
            for name in files:
                try:
                    st = os.lstat(os.path.join(dirpath, name))
                except OSError:
                    continue
                n, size, newest = n + 1, size + st.st_size, max(newest, st.st_mtime_ns)
    except OSError:
        return None
    return (n, size, newest)


class CheckpointWatcher:
    """Verifies settled checkpoints under ``roots`` and appends their ``integrity`` lines to
    ``log``. ``settle`` in seconds; ``limits`` bound each verification. Call :meth:`poll`
    regularly; :meth:`close` stops the verification in progress (promptly) and the thread.

    Raises :class:`~ckptwatch.integrity.errors.IntegrityError` at start when ``log`` cannot
    be created or its state file is damaged."""

    def __init__(self, roots: list[str], log: str, *, settle: float = 30.0, limits: Limits | None = None) -> None:
        self.roots = [Path(r) for r in roots]
        self.log = Path(log)
        self.settle = settle
        self.limits = limits or Limits()
        self._stop = threading.Event()
        self.state_path = Path(f"{log}.state.json")
        try:
            self.log.touch(exist_ok=True)
        except OSError as e:
            raise IntegrityError(f"{log}: cannot create the verification log: {e.strerror or e}") from None
        self.verified: dict[str, Signature] = self._load_state()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckptwatch-verify")
        self._running: dict[str, Future[None]] = {}
        self._lock = threading.Lock()
        self.errors: list[str] = []

    @classmethod
    def from_settings(cls, collect: CollectSettings) -> CheckpointWatcher | None:
        """The watcher of ``collect.checkpoint_roots`` (None when there are none). Limits come
        from ``collect.verify_limits`` (``NAME=VALUE`` strings, see
        :meth:`~ckptwatch.integrity.limits.Limits.replace`) when the settings have it.

        Raises :class:`~ckptwatch.integrity.errors.IntegrityError` for an unknown or bad limit."""
        if not collect.checkpoint_roots:
            return None
        try:
            limits = Limits().replace(list(getattr(collect, "verify_limits", None) or []))
        except ValueError as e:
            raise IntegrityError(f"verify_limits: {e}") from None
        return cls(collect.checkpoint_roots, collect.verify_log, settle=collect.verify_settle, limits=limits)

    def _load_state(self) -> dict[str, Signature]:
        if not self.state_path.exists():
            return {}
        try:
            doc = json.loads(self.state_path.read_text())
            return {str(k): (int(v[0]), int(v[1]), int(v[2])) for k, v in doc["verified"].items()}
        except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
            raise IntegrityError(f"{self.state_path}: damaged state ({e}); delete it to verify every "
                                 "checkpoint again") from None

    def _save_state(self) -> None:
        doc = {"verified": {k: list(v) for k, v in sorted(self.verified.items())}}
        atomic.replace_file(self.state_path, json.dumps(doc).encode())

    def candidates(self) -> list[Path]:
        """Checkpoint directories under the roots (absolute paths), by root then step."""
        out = []
        for root in self.roots:
            try:
                found = [p for p in root.absolute().iterdir()
                         if p.is_dir() and not p.is_symlink() and step_from_name(p.name) is not None]
            except OSError:
                continue  # a root that is not there yet
            out += sorted(found, key=lambda p: (step_from_name(p.name), p.name))
        return out

    def poll(self, *, wait: bool = False, now: float | None = None) -> int:
        """Start verifying each checkpoint that settled (``now``: the wall clock, seconds since
        the epoch); with ``wait``, wait for every verification started to finish (``--once``).
        Returns how many were started."""
        now = time.time() if now is None else now
        started = 0
        for path in self.candidates():
            if self._stop.is_set():
                break
            key = str(path)
            sig = signature(path)
            if sig is None or sig[0] == 0 or self.verified.get(key) == sig or key in self._running:
                continue
            if now - sig[2] / 1e9 < self.settle:
                continue  # written to in the last `settle` seconds: maybe a save in progress
            self._running[key] = self._pool.submit(self._verify, path, sig)
            started += 1
        if wait:
            for fut in list(self._running.values()):
                fut.result()
        for key in [k for k, f in self._running.items() if f.done()]:
            del self._running[key]
        return started

    def _verify(self, path: Path, sig: Signature) -> None:
        if self._stop.is_set():
            return
        try:
            api.verify(path, emit=self._append, limits=self.limits, stop=self._stop)
        except Cancelled:  # closed mid-way: not verified, so verified again after a restart
            return
        except IntegrityError as e:  # vanished or unlistable since it was seen: say so, try again if it changes
            self.errors.append(str(e))
            return
        with self._lock:
            self.verified[str(path)] = sig
            self._save_state()

    def _append(self, line: str) -> None:
        with self._lock, open(self.log, "a", encoding="utf-8") as f:
            f.write(stamped(line))
            f.flush()

    def close(self) -> None:
        """Stop: the verification in progress ends within a chunk (it is not recorded, so it
        runs again after a restart), queued ones never start; then the thread ends."""
        self._stop.set()
        self._pool.shutdown(wait=True, cancel_futures=True)
