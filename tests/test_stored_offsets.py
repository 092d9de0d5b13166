"""The events table stores each ``(source_id, offset)`` once without a key index (issue 15):
repeats are dropped by the floors of their sources (``ckptwatch.sinks.stored_offsets``),
and what the store keeps in memory for it stays bounded by what is read but not committed.
Real DuckDB files throughout."""

from __future__ import annotations

import datetime as dt

import duckdb
import pytest
import polars as pl

from ckptwatch.schema import EVENT_SCHEMA
from ckptwatch.sinks.duckdb_store import STORE_MEMORY_LIMIT, Store
from ckptwatch.sinks.stored_offsets import PAIR_SCHEMA, StoredOffsets

T0 = dt.datetime(2026, 12, 3, 6, 0, tzinfo=dt.timezone.utc)


def events(source: str, offsets: range | list[int], job: str = "job-1") -> pl.DataFrame:
    """Progress events of one source at ``offsets`` (EVENT_SCHEMA)."""
    offs = list(offsets)
    n = len(offs)
    return pl.DataFrame({
        "ts": [T0 + dt.timedelta(seconds=o) for o in offs], "ts_source": ["line"] * n, "job": [job] * n,
        "host": ["h1"] * n, "rank": [0] * n, "local_rank": [0] * n, "pid": [None] * n, "kind": ["progress"] * n,
        "step": offs, "path": [None] * n, "rule_id": ["r"] * n, "attrs": ["{}"] * n, "source_id": [source] * n,
        "source_kind": ["rank_log"] * n, "offset": offs, "line": [f"step {o}" for o in offs],
        "dedup_key": [f"{source}:{o}" for o in offs]}, schema=EVENT_SCHEMA)


def stored_pairs(path: str) -> list[tuple[str, int]]:
    con = duckdb.connect(path, read_only=True)
    try:
        return con.execute('SELECT source_id, "offset" FROM events ORDER BY 1, 2').fetchall()
    finally:
        con.close()


def no_lookup(pairs: pl.DataFrame) -> pl.DataFrame:
    raise AssertionError(f"looked up {pairs.height} pairs in the table")


def test_held_pairs_and_batch_repeats_are_dropped_and_floors_let_pairs_go():
    so = StoredOffsets({"a": 0})
    batch = pl.concat([events("a", range(0, 100, 10)), events("a", [20, 30])])
    new = so.new_events(batch, no_lookup)
    assert new["offset"].to_list() == list(range(0, 100, 10))  # each pair once, first row, in order
    so.stored(new, {"a": 50})
    assert sorted(so.held["offset"].to_list()) == [50, 60, 70, 80, 90]  # below the floor: let go
    again = so.new_events(events("a", range(50, 120, 10)), no_lookup)
    assert again["offset"].to_list() == [100, 110]
    so.stored(again, {"a": 120})
    assert len(so) == 0


def test_a_source_without_floor_or_whose_floor_went_back_is_looked_up():
    asked: list[list[int]] = []
    table = {("b", 5), ("b", 6), ("a", 1)}

    def lookup(pairs: pl.DataFrame) -> pl.DataFrame:
        asked.append(sorted(pairs["offset"].to_list()))
        hit = [(s, o) for s, o in pairs.iter_rows() if (s, o) in table]
        return pl.DataFrame(hit, schema=PAIR_SCHEMA, orient="row")

    so = StoredOffsets({"a": 0})
    new = so.new_events(pl.concat([events("a", [1, 2]), events("b", [5, 6, 7])]), lookup)
    # "a" has a floor and holds nothing: 1 is taken as new; "b" has none: asked, 5 and 6 found
    assert [(s, o) for s, o in new.select("source_id", "offset").iter_rows()] == [("a", 1), ("a", 2), ("b", 7)]
    assert asked == [[5, 6, 7]]
    so.stored(new, {"a": 100})
    so.expect({"a": 0})  # a collector that lost its offsets sends "a" again from 0
    assert so.new_events(events("a", [1, 3]), lookup)["offset"].to_list() == [3]
    so.stored(pl.DataFrame(schema=EVENT_SCHEMA), {"a": 0})
    assert so.new_events(events("a", [1]), lookup).is_empty()  # still looked up while under 100
    so.stored(pl.DataFrame(schema=EVENT_SCHEMA), {"a": 100})
    assert so.new_events(events("a", [1]), no_lookup).height == 1  # past it: trusted again


def test_run_restart_stores_each_event_once_and_holds_only_uncommitted_pairs(tmp_path):
    db = str(tmp_path / "c.duckdb")
    store = Store(db)
    assert store.con.execute("SELECT current_setting('memory_limit')").fetchone()[0] == (
        duckdb.connect(config={"memory_limit": STORE_MEMORY_LIMIT}).execute(
            "SELECT current_setting('memory_limit')").fetchone()[0])
    store._stored_pairs = no_lookup  # every source of a run has a floor: the table is never scanned
    for i in range(20):  # each batch reads 100 events; the committed offset trails by 30 (held back)
        assert store.commit_batch(events("s1", range(i * 100, i * 100 + 100)),
                                  [("s1", "/logs/r0.log", i * 100 + 70, "job-1")]) == 100
        assert len(store._offsets) == 30
    store.close()
    store = Store(db)  # a restart re-reads from the committed offset 1970
    store._stored_pairs = no_lookup
    assert store.commit_batch(events("s1", range(1970, 2050)), [("s1", "/logs/r0.log", 2050, "job-1")]) == 50
    assert len(store._offsets) == 0
    store.close()
    pairs = stored_pairs(db)
    assert len(pairs) == 2050 and len(set(pairs)) == 2050


def test_fleet_floors_drop_a_collectors_repeats(tmp_path):
    db = str(tmp_path / "f.duckdb")
    store = Store(db)
    assert store.commit_kafka_batch(events("k", range(0, 40)), [], {("ev", 0): 1}, {"k": 0}) == (40, 0)
    assert store.commit_kafka_batch(events("k", range(40, 80)), [], {("ev", 0): 2}, {"k": 40}) == (40, 0)
    assert len(store._offsets) == 40
    store.close()
    store = Store(db)  # the sink restarted: floors and held pairs come back from the tables
    assert len(store._stored_offsets()) == 40
    # the collector died before saving 80: it sends 40.. again, floor 40
    assert store.commit_kafka_batch(events("k", range(40, 90)), [], {("ev", 0): 3}, {"k": 40}) == (10, 0)
    # a collector that lost its offsets file sends everything again, floor 0
    assert store.commit_kafka_batch(events("k", range(0, 95)), [], {("ev", 0): 4}, {"k": 0}) == (5, 0)
    # no floor at all (another producer): checked against the table
    assert store.commit_kafka_batch(events("other", [1, 2]), [], {("ev", 0): 5}) == (2, 0)
    assert store.commit_kafka_batch(events("other", [1, 2, 3]), [], {("ev", 0): 6}) == (1, 0)
    store.close()
    pairs = stored_pairs(db)
    assert len(pairs) == 98 and len(set(pairs)) == 98


def test_a_database_with_the_old_key_is_copied_without_it_and_keeps_its_events(tmp_path):
    db = str(tmp_path / "old.duckdb")
    con = duckdb.connect(db)
    con.execute("""CREATE TABLE events (
        ts TIMESTAMPTZ, ts_source VARCHAR, job VARCHAR, host VARCHAR, rank INTEGER, local_rank INTEGER,
        pid BIGINT, kind VARCHAR, step BIGINT, path VARCHAR, rule_id VARCHAR, attrs JSON,
        source_id VARCHAR NOT NULL, source_kind VARCHAR, "offset" BIGINT NOT NULL, line VARCHAR, dedup_key VARCHAR,
        PRIMARY KEY (source_id, "offset"))""")
    arrow = events("s", range(10)).to_arrow()  # noqa: F841 (DuckDB's replacement scan)
    con.execute("INSERT INTO events SELECT * FROM arrow")
    con.execute("CREATE TABLE sources (source_id VARCHAR PRIMARY KEY, file VARCHAR, committed_offset BIGINT, "
                "job VARCHAR, updated_ts TIMESTAMPTZ, head_hash VARCHAR)")
    con.execute("INSERT INTO sources VALUES ('s', '/l', 5, 'job-1', now(), NULL)")
    con.close()
    store = Store(db)
    assert store.con.execute("SELECT count(*) FROM duckdb_constraints() WHERE table_name = 'events' "
                             "AND constraint_type = 'PRIMARY KEY'").fetchone()[0] == 0
    assert store.commit_batch(events("s", range(5, 12)), [("s", "/l", 12, "job-1")]) == 2
    store.close()
    assert [o for _, o in stored_pairs(db)] == list(range(12))


def test_a_replay_larger_than_its_memory_limit_is_read_unbounded_not_a_crash(tmp_path, monkeypatch):
    """A restart replays every event of the live jobs sorted in time; under
    REPLAY_MEMORY_LIMIT DuckDB could not sort 1.3 M of them (788 MB of logs, ``run --once``)
    and the restart died with its out-of-memory error."""
    import ckptwatch.sinks.duckdb_store as store_module

    db = str(tmp_path / "r.duckdb")
    store = Store(db)
    ev = events("s", range(60_000)).with_columns(pl.col("line") + "x" * 200)
    store.commit_batch(ev, [("s", "/l", 60_000 * 300, "job-1")])
    monkeypatch.setattr(store_module, "REPLAY_MEMORY_LIMIT", "1MB")
    with pytest.raises(duckdb.OutOfMemoryException):  # the limit alone does not fit it
        with store._memory_limit("1MB"):
            store._replay_query("unknown", None)
    replay = store.events_to_replay()
    assert replay.height == 60_000 and replay["offset"].is_sorted()
    assert store.con.execute("SELECT current_setting('memory_limit')").fetchall() == (
        duckdb.connect(config={"memory_limit": STORE_MEMORY_LIMIT}).execute(
            "SELECT current_setting('memory_limit')").fetchall())
    store.close()


def test_events_that_came_without_a_floor_are_checked_in_the_table_though_their_source_has_one(tmp_path):
    """A re-sent message with no floors header (another producer, a header that did not
    parse) for a source whose floor has moved past its events."""
    db = str(tmp_path / "h.duckdb")
    store = Store(db)
    store.commit_kafka_batch(events("s", [10, 11]), [], {("ev", 0): 1}, {"s": 10})
    store.commit_kafka_batch(events("s", [20, 21]), [], {("ev", 1): 1}, {"s": 20})
    assert store.commit_kafka_batch(events("s", [10, 11, 12]), [], {("ev", 0): 2}, {}, {"s"}) == (1, 0)
    store.close()
    assert [o for _, o in stored_pairs(db)] == [10, 11, 12, 20, 21]


def test_held_pairs_stay_bounded_by_active_sources_and_what_goes_is_looked_up(monkeypatch):
    """Each finished source leaves its last batch past its floor (no later message raises
    it); a floor that does not move while other streams of its file write holds every pair
    past it. Both are let go, and their sources answered by the table instead."""
    import ckptwatch.sinks.stored_offsets as so_module

    table: set[tuple[str, int]] = set()

    def lookup(pairs: pl.DataFrame) -> pl.DataFrame:
        return pl.DataFrame([p for p in pairs.iter_rows() if p in table], schema=PAIR_SCHEMA, orient="row")

    def commit(so: StoredOffsets, ev: pl.DataFrame, floors: dict[str, int], now: float) -> int:
        so.expect(floors)
        new = so.new_events(ev, lookup)
        table.update(new.select("source_id", "offset").iter_rows())
        so.stored(new, floors, now=now)
        return new.height

    so = StoredOffsets()
    for i in range(300):  # a finished job's rank file a second: its last 50 events stay past its floor
        assert commit(so, events(f"job{i}", range(50)), {f"job{i}": 0}, now=float(i)) == 50
    assert len(so) <= (so_module.IDLE_SECONDS + 2) * 50  # the sources idle over a minute let theirs go
    assert commit(so, events("job0", range(60)), {"job0": 0}, now=301.0) == 10  # re-sent after: the table knew

    monkeypatch.setattr(so_module, "HELD_MAX", 500)
    so = StoredOffsets({"f": 0})
    for b in range(20):  # the committed offset stays at 0 (a held-back record) while 100 events a batch come
        assert commit(so, events("f", range(b * 100, b * 100 + 100)), {}, now=float(b)) == 100
        assert len(so) <= 500
    assert commit(so, events("f", range(0, 2100)), {}, now=21.0) == 100  # 0..1999 known, 100 new
    assert commit(so, events("f", range(2100, 2200)), {"f": 2200}, now=22.0) == 100
    assert "f" not in so._unsure and len(so) == 0  # the floor passed what went: trusted again
