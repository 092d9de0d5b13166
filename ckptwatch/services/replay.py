"""Where a detector member's replay of a partition starts, so a restart does not replay
the events topic from the start of its retention.

A new owner of a partition (after a start, a crash or a rebalance) must rebuild the state
of the jobs still live in it, and only those: a job the detector released (concluded and
idle, see :class:`~ckptwatch.detectors.runner.DetectorConfig`) needs nothing replayed. So
each event's job and offset are noted as they are fed: the replay of a partition may start
at the first offset of its oldest live job, moved back to the first offset of any released
job whose events span that offset, so that no job is ever replayed in part (a part would
look like a save that never ended). The start only moves forward. It is committed with
the group's offset, as the offset's metadata (``{"replay_from": N}``): a partition
committed without it (an older version) is replayed from its beginning.

Events without a job (kernel and storage lines of a host) keep no start: those older than
the start are not replayed (the detector keeps host events for ``release_after`` around its
live jobs anyway).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

#: the key of the replay start in a committed offset's metadata
METADATA_KEY = "replay_from"


@dataclass
class _Span:
    first: int
    last: int


class ReplayStart:
    """Job spans of one partition: ``(first offset, last offset)`` of each live job, and of
    released jobs that may still straddle the start. Memory: the live jobs plus the
    released ones not yet behind the start."""

    def __init__(self) -> None:
        self.live: dict[str, _Span] = {}
        self.released: list[_Span] = []
        self._start = 0

    def begin_at(self, start: int) -> None:
        """The partition is replayed from ``start`` (read from the previous owner's commit):
        no start returned later is below it."""
        self._start = max(self._start, start)

    def note(self, jobs: Sequence[str | None], offsets: Sequence[int]) -> None:
        """Record events fed: ``jobs[i]`` (None: no job) at partition offset ``offsets[i]``."""
        for job, off in zip(jobs, offsets, strict=True):
            if job is None:
                continue
            span = self.live.get(job)
            if span is None:
                self.live[job] = _Span(off, off)
            elif off > span.last:
                span.last = off
            elif off < span.first:
                span.first = off

    def note_spans(self, spans: Iterable[tuple[str | None, int, int]]) -> None:
        """:meth:`note` for events summed up per job: ``(job, lowest offset, highest offset)``
        of its events fed (None: no job)."""
        for job, first, last in spans:
            if job is None:
                continue
            span = self.live.get(job)
            if span is None:
                self.live[job] = _Span(first, last)
            else:
                span.first, span.last = min(span.first, first), max(span.last, last)

    def release(self, jobs: Iterable[str]) -> None:
        """The detector released ``jobs``: they stop holding the start back, unless their
        events span it."""
        for job in jobs:
            span = self.live.pop(job, None)
            if span is not None:
                self.released.append(span)

    def start(self, position: int) -> int:
        """The offset to replay from, given the partition's ``position`` (next offset to
        read): the oldest live job's first offset, moved back over released jobs that span
        it; ``position`` when no job is live. Never less than a start returned before."""
        start = min((s.first for s in self.live.values()), default=position)
        moved = True
        while moved:
            moved = False
            for s in self.released:
                if s.first < start <= s.last:
                    start, moved = s.first, True
        start = max(start, self._start)
        self._start = start
        self.released = [s for s in self.released if s.last >= start]
        return start


def encode_metadata(start: int) -> str:
    """The committed offset's metadata for a replay start (a few bytes, well under the
    broker's ``offset.metadata.max.bytes``)."""
    return json.dumps({METADATA_KEY: start}, separators=(",", ":"))


def decode_metadata(metadata: str | None) -> int | None:
    """The replay start in a committed offset's metadata, None when there is none or it is
    not ours (then the partition is replayed from its beginning)."""
    if not metadata:
        return None
    try:
        value = json.loads(metadata).get(METADATA_KEY)
    except (ValueError, AttributeError, RecursionError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
