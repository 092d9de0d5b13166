"""How much work ``verify`` may do on a checkpoint, and how to stop it: :class:`Limits`, :class:`Budget`.

A checkpoint directory can be hostile (a zip bomb, a header listing a million tensors, a
JSON file of ten million empty lists). Every structural check is bounded so that
``verify`` takes time linear in the bytes on disk and memory bounded by the settings below,
whatever the files say. Going over a limit is a finding, ``limit_exceeded`` (verdict
``unverifiable``: the part over the limit was not checked; the finding names the setting),
never a hang, a crash or an out-of-memory kill.

A :class:`Budget` is one verification's state, shared by the threads checking its files:
the limits, the DEFLATE output spent so far (for the per-checkpoint cap) and an optional
``stop`` event (the checkpoint watcher sets it when it is closed, e.g. on SIGTERM); the
checks call :meth:`Budget.check` between members and chunks, which raises
:class:`Cancelled` once ``stop`` is set.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from ckptwatch.integrity.errors import IntegrityError

MIB = 1 << 20
GIB = 1 << 30


@dataclass(frozen=True)
class Limits:
    """Bounds on the work of one verification (sizes in bytes).

    * ``max_zip_entries``: central-directory entries examined per zip archive (a
      ``torch.save`` file writes one per tensor storage plus 3-4);
    * ``inflate_ratio`` / ``inflate_floor``: DEFLATE output allowed per file, ``max(floor,
      ratio x file size)`` (``torch.save`` stores members uncompressed; a zip bomb inflates
      about 1,000:1);
    * ``max_member_inflated``: DEFLATE output allowed per member;
    * ``max_total_inflated``: DEFLATE output allowed per checkpoint (all files);
    * ``max_tensors``: tensors per safetensors header (the header itself is capped at the
      format's 100,000,000 bytes);
    * ``max_json_bytes``, ``max_json_containers``, ``max_json_items``: size of a JSON file
      parsed (index, manifest, ``*.json``) and the objects/arrays and values it may hold
      (counted on the raw bytes before parsing, so a bomb is never built);
    * ``max_pickle_bytes``: a pickle read into memory (a DEFLATEd ``*.pkl`` member, a
      ``.pkl`` file's pickles).
    """

    max_zip_entries: int = 262_144
    inflate_ratio: int = 100
    inflate_floor: int = 64 * MIB
    max_member_inflated: int = 4 * GIB
    max_total_inflated: int = 32 * GIB
    max_tensors: int = 200_000
    max_json_bytes: int = 256 * MIB
    max_json_containers: int = 1_000_000
    max_json_items: int = 8_000_000
    max_pickle_bytes: int = 1 * GIB

    @classmethod
    def names(cls) -> list[str]:
        """The setting names, as ``--limit NAME=VALUE`` takes them."""
        return [f.name for f in dataclasses.fields(cls)]

    def replace(self, assignments: list[str]) -> Limits:
        """These limits with ``NAME=VALUE`` assignments applied (VALUE a non-negative integer,
        ``k``/``M``/``G`` suffixes for 2^10/2^20/2^30 allowed). Raises ``ValueError`` naming the bad one."""
        changes: dict[str, int] = {}
        for a in assignments:
            name, sep, value = a.partition("=")
            name = name.strip()
            if not sep or name not in self.names():
                raise ValueError(f"{a if a.isprintable() else repr(a)}: unknown limit (known: {', '.join(self.names())})")
            mult = {"k": 1 << 10, "m": MIB, "g": GIB}.get(value.strip()[-1:].lower(), 1)
            digits = value.strip()[:-1] if mult > 1 else value.strip()
            if not digits.isdigit():
                raise ValueError(f"{a if a.isprintable() else repr(a)}: the value is not a non-negative integer")
            changes[name] = int(digits) * mult
        return dataclasses.replace(self, **changes)

    def inflate_allowance(self, file_size: int) -> int:
        """DEFLATE output allowed for a file of ``file_size`` bytes."""
        return max(self.inflate_floor, self.inflate_ratio * file_size)


class Cancelled(IntegrityError):
    """The verification was stopped (its ``stop`` event was set) before it finished; nothing
    was concluded about the checkpoint."""


class Budget:
    """One verification's limits, stop event, DEFLATE output spent and memo (thread-safe).

    ``limits`` default :class:`Limits`; ``stop`` an optional ``threading.Event``. The memo
    (:meth:`memo`) keeps what several files' checks share (a DCP ``.metadata`` parsed once
    for all its shards) for this verification only."""

    def __init__(self, limits: Limits | None = None, stop: threading.Event | None = None) -> None:
        self.limits = limits or Limits()
        self.stop = stop
        self._inflated = 0
        self._lock = threading.Lock()
        self._memo: dict[Hashable, Any] = {}
        self._memo_lock = threading.Lock()

    def memo(self, key: Hashable, make: Callable[[], Any]) -> Any:
        """``make()``, computed once per key for this budget (exceptions are not kept)."""
        with self._memo_lock:
            if key not in self._memo:
                self._memo[key] = make()
            return self._memo[key]

    def check(self) -> None:
        """Raise :class:`Cancelled` when the stop event is set."""
        if self.stop is not None and self.stop.is_set():
            raise Cancelled("verification stopped before it finished (the checkpoint watcher was closed)")

    @property
    def inflated(self) -> int:
        """DEFLATE output bytes charged so far (all files)."""
        return self._inflated

    def inflate_left(self) -> int:
        """DEFLATE output still allowed for the whole checkpoint, bytes."""
        return max(0, self.limits.max_total_inflated - self._inflated)

    def charge_inflated(self, n: int) -> None:
        """Count ``n`` bytes of DEFLATE output against the checkpoint's cap."""
        with self._lock:
            self._inflated += n
