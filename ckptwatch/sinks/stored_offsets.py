"""Which events the store holds already, in bounded memory: the events table's dedup.

An event is identified by ``(source_id, offset)``: the same bytes read twice give the same
pair. Events come twice in three ways: a restart re-reads a file from its committed offset
(which never passes a record still held back, so the records of other streams after it
come again); a collector killed between the broker's acknowledgement and saving its
offsets publishes its last events again; a message is sent again after a lost
acknowledgement. (A host event's copies on every partition of the events topic are not
repeats here: the sink stores only the copy its header names.)

In each case a repeated event lies at or past a **floor**: the offset of its source before
which everything is stored and nothing is sent again (the source's committed offset in
``run``; the collector's saved offset in fleet mode, sent with each message). So the store
keeps in memory only the pairs it holds at or past each source's floor (what is read but
not yet committed: a few held-back records per source) and drops incoming events found
there. A source with no known floor, whose floor went back (a collector that lost its
offsets file), or with events in a message that carried no floor, is checked against the
events table itself: exact, one scan per batch. The class docstring says how what is held
stays bounded.

This replaces the table's primary key ``(source_id, offset)``, whose index DuckDB keeps in
memory (about 24 bytes a row, growing with the table and counted against its memory
limit: inserting 5 M events into a keyed table took 729 MB, and failed under a 64 MB
limit; see benchmarks/RESULTS.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping

import polars as pl

#: the columns of a pair frame
PAIR_SCHEMA = {"source_id": pl.Utf8, "offset": pl.Int64}

#: ``lookup(pairs)``: of the pairs ``(source_id, offset)`` (PAIR_SCHEMA), those the events
#: table holds
Lookup = Callable[[pl.DataFrame], pl.DataFrame]


#: seconds a source may go without events or a new floor before its held pairs are let go
#: (it is then looked up in the table: a collector re-sending after that costs a scan)
IDLE_SECONDS = 60.0
#: held pairs of one source at most (a floor that does not move while the source's other
#: streams write); past it they are let go and the source looked up until its floor passes
HELD_MAX = 10_000


class StoredOffsets:
    """The stored ``(source_id, offset)`` pairs at or past each source's floor.

    ``floors``: ``source_id`` -> offset before which every event of the source is stored;
    ``held``: the stored pairs at or past their floor (PAIR_SCHEMA). Use :meth:`new_events`
    before an insert and :meth:`stored` after its commit.

    Memory is bounded by the active sources: a source holding pairs that is idle for
    :data:`IDLE_SECONDS` lets them and its floor go, and one holding more than :data:`HELD_MAX` pairs lets them go; either
    is then looked up in the table until its floor passes what it let go (exact, slower)."""

    def __init__(self, floors: Mapping[str, int] | None = None, held: pl.DataFrame | None = None) -> None:
        self.floors: dict[str, int] = dict(floors or {})
        self.held = held.select(list(PAIR_SCHEMA)).cast(PAIR_SCHEMA) if held is not None else _pairs()  # type: ignore[arg-type]
        # source -> the offset its floor must reach before the source is trusted again: pairs
        # below it were let go (its floor went back, or they were too many), so until then it
        # is looked up in the table
        self._unsure: dict[str, int] = {}
        # sources whose floor was let go (idle) -> the offset past every pair they had held
        self._expired: dict[str, int] = {}
        started = time.monotonic()  # source -> monotonic time of its last events or floor
        self._touched: dict[str, float] = dict.fromkeys(self.floors, started)

    def new_events(self, events: pl.DataFrame, lookup: Lookup, *, unfloored: Iterable[str] = ()) -> pl.DataFrame:
        """The rows of ``events`` (any frame with ``source_id`` and ``offset``) not stored
        yet, each pair once (its first row), in order. Sources without a floor, whose floor
        went back or who let pairs go, and the ``unfloored`` ones (some of their events came
        without a floor), are looked up in the table (``lookup``)."""
        if events.is_empty():
            return events
        events = events.unique(["source_id", "offset"], keep="first", maintain_order=True)
        if not self.held.is_empty():
            events = events.join(self.held, on=["source_id", "offset"], how="anti", maintain_order="left")
        ask_too = set(unfloored)
        unknown = [s for s in events["source_id"].unique().to_list()
                   if s not in self.floors or s in self._unsure or s in ask_too]
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
            self._went_back(sid, floor)

    def unstored(self, sources: Iterable[str]) -> None:
        """``sources`` have nothing stored (``run``: never committed): their floor is 0, so
        their events need no look-up in the table. Not for a source whose floor was let go."""
        for sid in sources:
            if sid not in self._expired:
                self.floors.setdefault(sid, 0)

    def stored(self, events: pl.DataFrame, floors: Mapping[str, int] = {}, *, now: float | None = None) -> None:
        """After the commit of ``events`` (what :meth:`new_events` let through) and of the
        sources' new ``floors``: hold the pairs at or past them, let the rest go (and what
        the bounds say, see the class docstring). ``now``: monotonic seconds (tests)."""
        now = time.monotonic() if now is None else now
        for sid, floor in floors.items():
            if sid in self._expired:  # its pairs were let go: trusted once the floor passes them
                high = self._expired.pop(sid)
                if floor < high:
                    self._unsure[sid] = max(high, self._unsure.get(sid, high))
            else:
                self._went_back(sid, floor)
            if sid in self._unsure and floor >= self._unsure[sid]:
                del self._unsure[sid]
            self.floors[sid] = floor
            self._touched[sid] = now
        pairs = events.select(list(PAIR_SCHEMA)) if not events.is_empty() else _pairs()
        for sid in pairs["source_id"].unique().to_list():
            self._touched[sid] = now
        held = pl.concat([self.held, pairs.cast(PAIR_SCHEMA)]) if not pairs.is_empty() else self.held  # type: ignore[arg-type]
        if not held.is_empty():
            floor = pl.DataFrame({"source_id": list(self.floors), "_floor": list(self.floors.values())},
                                 schema={"source_id": pl.Utf8, "_floor": pl.Int64})
            # a source with no floor keeps nothing here: it is looked up in the table
            held = (held.join(floor, on="source_id", how="inner")
                    .filter(pl.col("offset") >= pl.col("_floor")).select(list(PAIR_SCHEMA)))
        self.held = self._bounded(held, now)

    def _went_back(self, sid: str, floor: int) -> None:
        """A floor of ``sid`` below the one known: its source is looked up in the table
        until its floor passes the old one."""
        old = self.floors.get(sid)
        if old is not None and floor < old:
            self._unsure[sid] = max(old, self._unsure.get(sid, old))

    def _bounded(self, held: pl.DataFrame, now: float) -> pl.DataFrame:
        """``held`` without the pairs of idle sources (their floors go too) and of sources
        over :data:`HELD_MAX`; both are looked up in the table until their floor passes
        what went."""
        # only sources holding pairs: a floor alone is an integer (and in `run` a source's
        # floor is exact, so keeping it spares its next events a look-up)
        highs = dict(held.group_by("source_id").agg(pl.col("offset").max() + 1).iter_rows())
        idle = [sid for sid in highs if now - self._touched.get(sid, now) > IDLE_SECONDS]
        for sid in idle:
            floor = self.floors.pop(sid, None)
            if floor is not None:
                self._expired[sid] = max(highs[sid], self._unsure.pop(sid, floor))
        if idle:
            held = held.filter(~pl.col("source_id").is_in(idle))
        counts = held.group_by("source_id").agg(pl.len().alias("n"), (pl.col("offset").max() + 1).alias("high"))
        over = counts.filter(pl.col("n") > HELD_MAX)
        for sid, _, high in over.iter_rows():
            self._unsure[sid] = max(high, self._unsure.get(sid, high))
        if not over.is_empty():
            held = held.filter(~pl.col("source_id").is_in(over["source_id"].to_list()))
        return held

    def __len__(self) -> int:
        return self.held.height


def _pairs() -> pl.DataFrame:
    return pl.DataFrame(schema=PAIR_SCHEMA)
