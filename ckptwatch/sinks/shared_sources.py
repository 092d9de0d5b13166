"""Files followed by more than one collector, found where their events are stored.

A line is stored once because it has one name, ``(source_id, offset)``, whoever reads it
(:mod:`ckptwatch.ingest.identity`). That holds for two collectors following the same file
as long as both see each generation of it as it is written. It does not hold for a
``copytruncate`` copy: a collector that followed the file goes on reading the copy under the
truncated generation's id (:mod:`ckptwatch.ingest.rotation`), while a collector that meets
the copy first (it was down, or started later) can only read it as a new file, under the
copy's own id, and its lines are stored a second time. Two collectors over one file is a
deployment mistake (a shared filesystem mounted on every node, each node's collector
watching all of it), and a costly one; so the sink says so as soon as it sees it, before
any copy is made: every events message names the collector that read it and the paths of
its sources (:data:`ckptwatch.kafka.codec.SOURCES_HEADER`).

:class:`SharedSources` remembers which collector published each source and reports a
source published by a second one; the sink keeps each source's first collector in its
``sources`` table, so a second collector that starts after a sink restart is found too.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

#: sources remembered (the newest published); a source forgotten and published again by the
#: other collector is reported again
SOURCES_MAX = 200_000
#: pairs of collectors remembered as found sharing a file (the newest found); a pair forgotten
#: is said again when it is found again
PAIRS_MAX = 10_000


@dataclass(frozen=True)
class SharedSource:
    """A source (``source_id``, read at ``path``) published by collector ``first`` and then
    by collector ``second`` (collector ids: ``host:offsets file``)."""

    source_id: str
    path: str
    first: str
    second: str
    #: the first source found shared by these two collectors (the one to say; later ones are counted)
    new_pair: bool = True

    def message(self) -> str:
        """One line for the operator."""
        return (f"{self.path} (source {self.source_id}) is followed by two collectors, {self.first} and "
                f"{self.second}: lines of its copytruncate copies can be stored twice; let one collector "
                "follow each file (give each node's collector only its own node's logs). Other files they "
                "share are counted in ckptwatch_sources_shared_total, not said again")


class SharedSources:
    """Which collector published each source (bounded: :data:`SOURCES_MAX`, least recently
    published forgotten first; pairs of collectors found, :data:`PAIRS_MAX`)."""

    def __init__(self, max_sources: int = SOURCES_MAX, max_pairs: int = PAIRS_MAX) -> None:
        self._by: OrderedDict[str, str] = OrderedDict()
        self._max = max_sources
        self._reported: dict[str, set[str]] = {}  # source -> the other collectors reported for it
        self._pairs: OrderedDict[tuple[str, str], None] = OrderedDict()  # collectors found sharing a file
        self._max_pairs = max_pairs

    def unknown(self, source_ids: Iterable[str]) -> list[str]:
        """The ``source_ids`` this object holds no collector for (to look up in the store)."""
        return [sid for sid in source_ids if sid not in self._by]

    def learn(self, collectors: Mapping[str, str]) -> None:
        """Sources' first collectors as recorded before (the store's ``sources.collector``)."""
        for sid, collector in collectors.items():
            self._by.setdefault(sid, collector)
        self._trim()

    def collector_of(self, source_id: str) -> str | None:
        """The first collector known to have published ``source_id``."""
        return self._by.get(source_id)

    def published(self, collector: str | None, files: Mapping[str, str]) -> list[SharedSource]:
        """Note that ``collector`` published the sources ``files`` (``source_id`` -> path).
        Returns those another collector published before, each source once for each pair of
        collectors (not again on every message); ``new_pair`` marks the first of each pair. A message naming no collector (an older
        collector) is not judged."""
        if collector is None:
            return []
        found = []
        for sid, path in files.items():
            before = self._by.get(sid)
            if before is not None and before != collector:
                reported = self._reported.setdefault(sid, set())
                if collector not in reported:
                    reported.add(collector)
                    pair = (min(before, collector), max(before, collector))
                    found.append(SharedSource(sid, path, before, collector, pair not in self._pairs))
                    self._pairs[pair] = None
                    self._pairs.move_to_end(pair)
                continue  # the first publisher keeps it: one report per pair, not one per message
            self._by[sid] = collector
            self._by.move_to_end(sid)
        self._trim()
        return found

    def _trim(self) -> None:
        while len(self._by) > self._max:
            sid, _ = self._by.popitem(last=False)
            self._reported.pop(sid, None)
        while len(self._pairs) > self._max_pairs:
            self._pairs.popitem(last=False)
