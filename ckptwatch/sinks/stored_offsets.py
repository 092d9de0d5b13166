"""Which events the store holds already, in bounded memory: the events table's dedup.

An event is identified by ``(source_id, offset)``: the same bytes read twice give the same
pair. Events come twice in three ways: a restart re-reads a file from its committed offset
(which never passes a record still held back, so the records of other streams after it
come again); a collector killed between the broker's acknowledgement and saving its
offsets publishes its last events again; a host event is fanned out to every partition of
the events topic.

In each case a repeated event lies at or past a **floor**: the offset of its source before
which everything is stored and nothing is sent again (the source's committed offset in
``run``; the collector's saved offset in fleet mode, sent with each message). So the store
keeps in memory only the pairs it holds at or past each source's floor (what is read but
not yet committed: a few held-back records per source) and drops incoming events found
there. A source with no known floor, or whose floor went back (a collector that lost its
offsets file), is checked against the events table itself: exact, one scan per batch.

This replaces the table's primary key ``(source_id, offset)``, whose index DuckDB keeps in
memory (about 24 bytes a row, growing with the table and counted against its memory
limit: a 5 M-event ``run --once`` held 729 MB; see benchmarks/RESULTS.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import polars as pl

#: the columns of a pair frame
PAIR_SCHEMA = {"source_id": pl.Utf8, "offset": pl.Int64}

#: ``lookup(pairs)``: of the pairs ``(source_id, offset)`` (PAIR_SCHEMA), those the events
#: table holds
Lookup = Callable[[pl.DataFrame], pl.DataFrame]


class StoredOffsets:
    """The stored ``(source_id, offset)`` pairs at or past each source's floor.

    ``floors``: ``source_id`` -> offset before which every event of the source is stored;
    ``held``: the stored pairs at or past their floor (PAIR_SCHEMA). Use :meth:`new_events`
    before an insert and :meth:`stored` after its commit."""

    def __init__(self, floors: Mapping[str, int] | None = None, held: pl.DataFrame | None = None) -> None:
        self.floors: dict[str, int] = dict(floors or {})
        self.held = held.select(list(PAIR_SCHEMA)).cast(PAIR_SCHEMA) if held is not None else _pairs()  # type: ignore[arg-type]
        # source -> the floor it had before it went back: its pairs below that were let go, so
        # it is looked up in the table until its floor passes that again
        self._unsure: dict[str, int] = {}

    def new_events(self, events: pl.DataFrame, lookup: Lookup) -> pl.DataFrame:
        """The rows of ``events`` (any frame with ``source_id`` and ``offset``) not stored
        yet, each pair once (its first row), in order. Sources without a floor, or whose
        floor went back, are looked up in the table (``lookup``)."""
        if events.is_empty():
            return events
        events = events.unique(["source_id", "offset"], keep="first", maintain_order=True)
        if not self.held.is_empty():
            events = events.join(self.held, on=["source_id", "offset"], how="anti", maintain_order="left")
        unknown = [s for s in events["source_id"].unique().to_list()
                   if s not in self.floors or s in self._unsure]
        if unknown:
            ask = events.filter(pl.col("source_id").is_in(unknown)).select(list(PAIR_SCHEMA))
            found = lookup(ask)
            if not found.is_empty():
                events = events.join(found.cast(PAIR_SCHEMA), on=["source_id", "offset"],  # type: ignore[arg-type]
                                     how="anti", maintain_order="left")
        return events

    def expect(self, floors: Mapping[str, int]) -> None:
        """Before :meth:`new_events`: the floors the incoming events came with. A floor
        lower than the one known (a collector that lost its offsets file sends its files
        again) has its source looked up in the table until its floor passes the old one."""
        for sid, floor in floors.items():
            old = self.floors.get(sid)
            if old is not None and floor < old:
                self._unsure[sid] = max(old, self._unsure.get(sid, old))

    def unstored(self, sources: Iterable[str]) -> None:
        """``sources`` have nothing stored (``run``: never committed): their floor is 0, so
        their events need no look-up in the table."""
        for sid in sources:
            self.floors.setdefault(sid, 0)

    def stored(self, events: pl.DataFrame, floors: Mapping[str, int] = {}) -> None:
        """After the commit of ``events`` (what :meth:`new_events` let through) and of the
        sources' new ``floors``: hold the pairs at or past them, let the rest go."""
        for sid, floor in floors.items():
            old = self.floors.get(sid)
            if old is not None and floor < old:
                self._unsure[sid] = max(old, self._unsure.get(sid, old))
            elif sid in self._unsure and floor >= self._unsure[sid]:
                del self._unsure[sid]
            self.floors[sid] = floor
        pairs = events.select(list(PAIR_SCHEMA)) if not events.is_empty() else _pairs()
        held = pl.concat([self.held, pairs.cast(PAIR_SCHEMA)]) if not pairs.is_empty() else self.held  # type: ignore[arg-type]
        if held.is_empty():
            return
        floor = pl.DataFrame({"source_id": list(self.floors), "_floor": list(self.floors.values())},
                             schema={"source_id": pl.Utf8, "_floor": pl.Int64})
        # a source with no floor keeps nothing here: it is looked up in the table
        self.held = (held.join(floor, on="source_id", how="inner")
                     .filter(pl.col("offset") >= pl.col("_floor"))
                     .select(list(PAIR_SCHEMA)))

    def __len__(self) -> int:
        return self.held.height


def _pairs() -> pl.DataFrame:
    return pl.DataFrame(schema=PAIR_SCHEMA)
