"""DuckDB store: events (with their source and offset), source offsets, incidents and
their evidence, in one database file.

Tables (timestamps are ``TIMESTAMPTZ``, UTC):

* ``events``: EVENT_SCHEMA; primary key ``(source_id, offset)``: re-reading the same
  bytes inserts nothing.
* ``sources``: ``source_id`` -> ``file``, ``committed_offset`` (where tailing resumes),
  the ``job`` learned from the file's lines and ``head_hash`` (hex SHA-256 of the file's
  first line, to recognize a ``copytruncate`` copy after a restart), ``followed`` (False
  once tailing forgot the source: a restart does not resume it). Written in the same
  transaction as the events read up to it.
* ``incidents``: one row per incident id (upsert; ``detected_ts`` keeps its first value);
  root cause and last good checkpoint flattened into columns for SQL, the full shapes
  as JSON.
* ``incident_evidence``: ``(incident_id, seq)`` -> the cited event's
  ``(source_id, offset)``, role, time, rank and line.
* ``released_jobs``: jobs the detector released (concluded and idle): ``job`` -> newest
  event time ``max_ts`` and when (``released_ts``); a restart does not replay their events.
* ``detector_state``: ``name`` -> JSON; ``registry``: the checkpoint registry as of the
  last release (:meth:`CheckpointRegistry.to_dict
  <ckptwatch.detectors.checkpoints.CheckpointRegistry.to_dict>`).

The tables hold raw log lines (secrets included: redaction applies to alerts only), so the
database file and its ``.wal`` are private (``0600``, see :mod:`ckptwatch.private_files`):
created under umask 077, tightened when opened and after every transaction.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
from collections.abc import Iterable, Iterator, Mapping

import duckdb
import polars as pl

from ckptwatch import private_files
from ckptwatch.detectors.incident import EvidenceItem, Incident
from ckptwatch.schema import EVENT_SCHEMA

_DDL = """
CREATE TABLE IF NOT EXISTS events (
    ts TIMESTAMPTZ, ts_source VARCHAR, job VARCHAR, host VARCHAR, rank INTEGER, local_rank INTEGER,
    pid BIGINT, kind VARCHAR, step BIGINT, path VARCHAR, rule_id VARCHAR, attrs JSON,
    source_id VARCHAR NOT NULL, source_kind VARCHAR, "offset" BIGINT NOT NULL, line VARCHAR, dedup_key VARCHAR,
    PRIMARY KEY (source_id, "offset"));
CREATE TABLE IF NOT EXISTS sources (
    source_id VARCHAR PRIMARY KEY, file VARCHAR, committed_offset BIGINT, job VARCHAR, updated_ts TIMESTAMPTZ,
    head_hash VARCHAR);
ALTER TABLE sources ADD COLUMN IF NOT EXISTS head_hash VARCHAR;
ALTER TABLE sources ADD COLUMN IF NOT EXISTS followed BOOLEAN DEFAULT TRUE;
CREATE TABLE IF NOT EXISTS incidents (
    id VARCHAR PRIMARY KEY, kind VARCHAR, severity VARCHAR, status VARCHAR, job VARCHAR, step BIGINT,
    checkpoint_path VARCHAR, root_cause_class VARCHAR, root_rank INTEGER, root_host VARCHAR, root_pid BIGINT,
    root_ts TIMESTAMPTZ, root_line VARCHAR, root_cause JSON, collateral INTEGER[], checkpoint_state JSON,
    last_good_step BIGINT, last_good_path VARCHAR, remediation VARCHAR, first_ts TIMESTAMPTZ,
    detected_ts TIMESTAMPTZ, updated_ts TIMESTAMPTZ);
CREATE TABLE IF NOT EXISTS incident_evidence (
    incident_id VARCHAR, seq INTEGER, source_id VARCHAR, "offset" BIGINT, role VARCHAR, ts TIMESTAMPTZ,
    kind VARCHAR, rank INTEGER, host VARCHAR, rule_id VARCHAR, line VARCHAR,
    PRIMARY KEY (incident_id, seq));
CREATE TABLE IF NOT EXISTS released_jobs (
    job VARCHAR PRIMARY KEY, max_ts TIMESTAMPTZ, released_ts TIMESTAMPTZ);
CREATE TABLE IF NOT EXISTS detector_state (name VARCHAR PRIMARY KEY, doc JSON, updated_ts TIMESTAMPTZ);
CREATE TABLE IF NOT EXISTS kafka_offsets (
    topic VARCHAR, "partition" INTEGER, next_offset BIGINT, updated_ts TIMESTAMPTZ, PRIMARY KEY (topic, "partition"));
"""

#: DuckDB's memory limit while a restart reads the events to replay (it spills past it)
REPLAY_MEMORY_LIMIT = "64MB"

#: A source's row: ``(source_id, file, committed_offset, job)``, optionally ``head_hash`` last.
SourceRow = tuple[str, str, int, str | None] | tuple[str, str, int, str | None, str | None]

_EVENT_COLS = ", ".join(f'"{c}"' for c in EVENT_SCHEMA)


class Store:
    """A DuckDB database file (``":memory:"`` works too). Raises duckdb.Error when the file
    cannot be opened (e.g. locked by another process)."""

    def __init__(self, path: str) -> None:
        self.path = path
        with private_files.private_umask():  # the file and its first WAL are created 0600
            self.con = duckdb.connect(path)
            self.con.execute(_DDL)
        self._private()
        self._depth = 0  # nesting of transaction()

    def _private(self) -> None:
        """The database file and its WAL (re-created after each checkpoint) made ``0600``."""
        if not self.path.startswith(":memory:"):
            for p in (self.path, self.path + ".wal"):
                private_files.tighten(p)

    def close(self) -> None:
        self.con.close()

    def commit_batch(self, events: pl.DataFrame, offsets: Iterable[SourceRow], *,
                     unfollowed: Iterable[str] = ()) -> int:
        """Insert events (EVENT_SCHEMA) and the sources' committed offsets
        ``(source_id, file, offset, job[, head_hash])`` in one transaction; the sources
        ``unfollowed`` (ids tailing forgot) are kept as history but no longer resumed.
        Returns the number of new events."""
        now = dt.datetime.now(dt.timezone.utc)
        with self.transaction():
            added = self._insert_events(events)
            rows = [(sid, f, off, job, now, rest[0] if rest else None) for sid, f, off, job, *rest in offsets]
            if rows:
                self.con.executemany("INSERT OR REPLACE INTO sources (source_id, file, committed_offset, job, "
                                     "updated_ts, head_hash, followed) VALUES (?, ?, ?, ?, ?, ?, TRUE)", rows)
            gone = [(now, sid) for sid in unfollowed]
            if gone:
                self.con.executemany("UPDATE sources SET followed = FALSE, updated_ts = ? WHERE source_id = ?", gone)
        return added

    def committed_offsets(self) -> dict[str, tuple[int, str | None]]:
        """``source_id`` -> (offset from which tailing resumes, job learned so far)."""
        rows = self.con.execute("SELECT source_id, committed_offset, job FROM sources").fetchall()
        return {sid: (off, job) for sid, off, job in rows}

    def sources(self) -> list[tuple[str, str, int, str | None, str | None]]:
        """The sources tailing still follows (where a restart resumes):
        ``(source_id, file, committed_offset, job, head_hash)``."""
        return self.con.execute("SELECT source_id, file, committed_offset, job, head_hash FROM sources "
                                "WHERE followed IS NOT FALSE").fetchall()

    def events(self) -> pl.DataFrame:
        """All stored events (EVENT_SCHEMA), in ``(ts, source_id, offset)`` order."""
        df = self.con.sql(f'SELECT {_EVENT_COLS} FROM events ORDER BY ts, source_id, "offset"').pl()
        return df.with_columns(pl.col("attrs").cast(pl.Utf8)).cast(EVENT_SCHEMA)  # type: ignore[arg-type]

    def events_to_replay(self) -> pl.DataFrame:
        """The stored events a restarted detector needs (EVENT_SCHEMA, in ``(ts, source_id,
        offset)`` order): those of jobs not released, and of released jobs newer than their
        tombstone. Its size follows the live jobs, not the age of the database."""
        # a join with the (small) released_jobs as build side streams the events (a NOT EXISTS
        # subquery held every row: 400 MB at 1 M stored events), and a memory limit keeps
        # DuckDB's buffer pool from caching the whole table as it scans it
        self.con.execute(f"SET memory_limit = '{REPLAY_MEMORY_LIMIT}'")
        try:
            df = self._replay_query()
        finally:
            self.con.execute("RESET memory_limit")
        return df.with_columns(pl.col("attrs").cast(pl.Utf8)).cast(EVENT_SCHEMA)  # type: ignore[arg-type]

    def _replay_query(self) -> pl.DataFrame:
        return self.con.sql(
            f"SELECT {', '.join('e.' + c for c in _EVENT_COLS.split(', '))} FROM events e "
            "LEFT JOIN released_jobs r ON r.job = coalesce(e.job, 'unknown') "
            'WHERE r.job IS NULL OR e.ts > r.max_ts ORDER BY e.ts, e.source_id, e."offset"').pl()

    def save_released(self, released: Iterable[tuple[str, dt.datetime]], registry: dict) -> None:
        """Record released jobs ``(job, newest event time)`` and the registry snapshot, in one
        transaction."""
        now = dt.datetime.now(dt.timezone.utc)
        with self.transaction():
            rows = [(job, ts, now) for job, ts in released]
            if rows:
                self.con.executemany("INSERT OR REPLACE INTO released_jobs VALUES (?, ?, ?)", rows)
            self.con.execute("INSERT OR REPLACE INTO detector_state VALUES ('registry', ?, ?)",
                             [json.dumps(registry), now])

    def released(self) -> tuple[list[tuple[str, dt.datetime, dt.datetime]], dict | None]:
        """(released jobs ``(job, max_ts, released_ts)``, the registry snapshot or None)."""
        jobs = self.con.execute("SELECT job, max_ts, released_ts FROM released_jobs").fetchall()
        rows = self.con.execute("SELECT doc FROM detector_state WHERE name = 'registry'").fetchall()
        return jobs, json.loads(rows[0][0]) if rows else None

    def delete_events_before(self, before: dt.datetime) -> int:
        """Retention: delete events older than ``before`` (UTC) of released jobs and of no job
        (host lines); a live job keeps all its events (a restart replays them). Incidents
        keep their evidence lines. Returns how many went."""
        with self.transaction():
            n = self.con.execute(
                "DELETE FROM events WHERE ts < ? AND (job IS NULL OR job IN (SELECT job FROM released_jobs))",
                [before]).fetchall()
        return int(n[0][0]) if n else 0

    def upsert_incidents(self, incidents: Iterable[Incident]) -> int:
        """Insert or update incidents and replace their evidence rows; returns how many."""
        now = dt.datetime.now(dt.timezone.utc)
        with self.transaction():
            n = self._upsert(incidents, now)
        return n

    def incident_statuses(self, ids: Iterable[str]) -> dict[str, str]:
        """incident id -> status (``open``, ``resolved``, ``superseded``) of those stored."""
        rows = self.con.execute("SELECT id, status FROM incidents WHERE list_contains(?, id)", [list(ids)])
        return dict(rows.fetchall())

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """One DuckDB transaction; nested uses join the outer one (e.g. the incidents and
        the alerts queued for them commit together)."""
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        self.con.execute("BEGIN")
        self._depth = 1
        try:
            yield
        except BaseException:
            self.con.execute("ROLLBACK")
            raise
        finally:
            self._depth = 0
        self.con.execute("COMMIT")
        self._private()

    def _insert_events(self, events: pl.DataFrame) -> int:
        """Insert events, ignoring ``(source_id, offset)`` already stored; returns how many were new."""
        if events.is_empty():
            return 0
        before = self.con.execute("SELECT count(*) FROM events").fetchone()[0]  # type: ignore[index]
        arrow = events.select(list(EVENT_SCHEMA)).to_arrow()  # noqa: F841 (read by DuckDB)
        self.con.execute(f"INSERT OR IGNORE INTO events ({_EVENT_COLS}) SELECT {_EVENT_COLS} FROM arrow")
        return int(self.con.execute("SELECT count(*) FROM events").fetchone()[0]) - before  # type: ignore[index]

    def _upsert(self, incidents: Iterable[Incident], now: dt.datetime) -> int:
        n = 0
        for inc in incidents:
            rc = inc.root_cause
            lg = inc.last_good_checkpoint or {}
            self.con.execute(
                """INSERT INTO incidents VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)
                   ON CONFLICT (id) DO UPDATE SET kind=excluded.kind, severity=excluded.severity,
                   status=excluded.status, job=excluded.job, step=excluded.step,
                   checkpoint_path=excluded.checkpoint_path, root_cause_class=excluded.root_cause_class,
                   root_rank=excluded.root_rank, root_host=excluded.root_host, root_pid=excluded.root_pid,
                   root_ts=excluded.root_ts, root_line=excluded.root_line, root_cause=excluded.root_cause,
                   collateral=excluded.collateral, checkpoint_state=excluded.checkpoint_state,
                   last_good_step=excluded.last_good_step, last_good_path=excluded.last_good_path,
                   remediation=excluded.remediation, first_ts=excluded.first_ts,
                   updated_ts=excluded.updated_ts""",
                [inc.id, inc.kind, inc.severity, inc.status, inc.job, inc.step, inc.checkpoint_path,
                 rc.cls if rc else None, rc.rank if rc else None, rc.host if rc else None,
                 rc.pid if rc else None, rc.ts if rc else None, rc.line if rc else None,
                 json.dumps(rc.to_dict()) if rc else None, inc.collateral,
                 json.dumps(inc.checkpoint_state), lg.get("step"), lg.get("path"), inc.remediation,
                 inc.first_ts, inc.detected_ts or now, now],
            )
            self.con.execute("DELETE FROM incident_evidence WHERE incident_id = ?", [inc.id])
            rows = [(inc.id, i, e.source_id, e.offset, e.role, e.ts, e.kind, e.rank, e.host, e.rule_id, e.line)
                    for i, e in enumerate(inc.evidence)]
            if rows:
                self.con.executemany("INSERT INTO incident_evidence VALUES (?,?,?,?,?,?,?,?,?,?,?)", rows)
            n += 1
        return n

    def open_incidents(self) -> list[Incident]:
        """The stored incidents whose status is ``open``, as last upserted (evidence
        included): what a detector rebuilt on start adopts
        (:meth:`~ckptwatch.detectors.Detector.adopt`), so that late lines can still withdraw
        or resolve them."""
        evidence: dict[str, list[EvidenceItem]] = {}
        for iid, *item in self.con.execute(
                'SELECT e.incident_id, e.source_id, e."offset", e.ts, e.kind, e.rank, e.host, e.rule_id, e.line, e.role '
                "FROM incident_evidence e JOIN incidents i ON i.id = e.incident_id WHERE i.status = 'open' "
                "ORDER BY e.incident_id, e.seq").fetchall():
            evidence.setdefault(iid, []).append(EvidenceItem(*item))
        out = []
        for (iid, kind, severity, status, job, step, path, rc, collateral, cs, lg_step, lg_path, remediation,
             first_ts, detected_ts) in self.con.execute(
                "SELECT id, kind, severity, status, job, step, checkpoint_path, root_cause, collateral, "
                "checkpoint_state, last_good_step, last_good_path, remediation, first_ts, detected_ts "
                "FROM incidents WHERE status = 'open' ORDER BY id").fetchall():
            inc = Incident.from_dict({
                "id": iid, "kind": kind, "severity": severity, "status": status, "job": job, "step": step,
                "checkpoint_path": path, "root_cause": json.loads(rc) if rc else None, "collateral": collateral or [],
                "checkpoint_state": json.loads(cs) if cs else {},
                "last_good_checkpoint": {"step": lg_step, "path": lg_path} if lg_step is not None else None,
                "remediation": remediation, "first_ts": first_ts.isoformat(),
                "detected_ts": detected_ts.isoformat() if detected_ts else None})
            inc.evidence = evidence.get(iid, [])
            out.append(inc)
        return out

    def kafka_offsets(self) -> dict[tuple[str, int], int]:
        """``(topic, partition)`` -> next offset to read, as stored with the data it covers."""
        rows = self.con.execute('SELECT topic, "partition", next_offset FROM kafka_offsets').fetchall()
        return {(t, p): o for t, p, o in rows}

    def commit_kafka_batch(self, events: pl.DataFrame, incidents: Iterable[Incident],
                           offsets: Mapping[tuple[str, int], int]) -> tuple[int, int]:
        """Events, incidents and the Kafka offsets ``(topic, partition) -> next offset`` they
        were read up to, in one transaction: the database says itself how far it is, so a
        new database file re-reads the topics from their start and a crash re-reads only
        what was not committed here. Returns (new events, incidents written)."""
        now = dt.datetime.now(dt.timezone.utc)
        with self.transaction():
            added = self._insert_events(events)
            n = self._upsert(incidents, now)
            rows = [(t, p, o, now) for (t, p), o in offsets.items()]
            if rows:
                self.con.executemany("INSERT OR REPLACE INTO kafka_offsets VALUES (?, ?, ?, ?)", rows)
        return added, n
