"""Questions asked of the incident history: the incident list with filters, one incident
whole (with its evidence, each line's file and host), and exports.

Every function takes a read-only DuckDB connection from
:func:`~ckptwatch.history.read.open_history` (or any connection to a ckptwatch database
or snapshot, of any schema version) and returns polars frames or incidents; times are UTC.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Callable
from typing import Any

import duckdb
import polars as pl

from ckptwatch.detectors.incident import SEVERITIES, STATUSES, EvidenceItem, Incident
from ckptwatch.history.read import HistoryError, evidence_relation, has_column, has_table
from ckptwatch.private_files import FILE_MODE, private_umask

#: the columns of :func:`list_incidents`, in order
LIST_COLUMNS = ("id", "detected_ts", "severity", "status", "kind", "job", "step", "root_cause_class", "root_rank",
                "root_host", "last_good_step", "checkpoint_path", "paging")
#: ``paging`` of an incident: what its notifications say (see :func:`paging_sql`)
PAGING = ("alerted", "grouped", "silenced", "provisional", "queued", "not alerted")


def paging_sql(con: duckdb.DuckDBPyConnection) -> str:
    """SQL for the ``paging`` of each row of ``incidents``: ``provisional`` (its evidence is
    still settling: not sent yet), ``alerted`` (a channel accepted an alert of it),
    ``grouped`` (a channel's ``group_by`` put it under another incident's page),
    ``silenced`` (a silence muted it on some channel and no channel was alerted), ``queued`` (an
    alert waits for delivery), else ``not alerted`` (no route took it, or no alerter ran).
    Works on databases of every schema version."""
    provisional = "provisional" if has_column(con, "incidents", "provisional") else "false"
    if not has_table(con, "alerts"):
        return f"CASE WHEN {provisional} THEN 'provisional' ELSE 'not alerted' END"
    alerting = "a.action IN ('trigger', 'escalate', 'update', 'realert')"
    return (f"CASE WHEN {provisional} THEN 'provisional' "
            f"WHEN EXISTS (SELECT 1 FROM alerts a WHERE a.incident_id = incidents.id AND a.status = 'sent' "
            f"AND {alerting}) THEN 'alerted' "
            "WHEN EXISTS (SELECT 1 FROM alerts a WHERE a.incident_id = incidents.id AND a.status = 'grouped') "
            "THEN 'grouped' "
            "WHEN EXISTS (SELECT 1 FROM alerts a WHERE a.incident_id = incidents.id AND a.status = 'silenced') "
            "THEN 'silenced' "
            f"WHEN EXISTS (SELECT 1 FROM alerts a WHERE a.incident_id = incidents.id AND a.status = 'pending' "
            f"AND {alerting}) THEN 'queued' ELSE 'not alerted' END")
#: what ``incidents export`` can write
EXPORT_TABLES = ("incidents", "evidence", "alerts")


def _frame(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any]) -> pl.DataFrame:
    """The rows of ``sql`` (with ``?`` parameters) as a polars frame."""
    return con.sql(sql, params=params).pl()


def list_incidents(con: duckdb.DuckDBPyConnection, *, job: str | None = None, kind: str | None = None,
                   min_severity: str | None = None, status: str | None = None, since: dt.datetime | None = None,
                   limit: int | None = None) -> pl.DataFrame:
    """Incidents, newest detection first (then newest first event), columns :data:`LIST_COLUMNS`
    (``paging``: :func:`paging_sql`).

    ``job``, ``kind``: shell globs (``train-*``); ``min_severity``: that severity and above
    (``SEVERITIES``); ``status``: one of ``STATUSES``, or ``all``; by default every status
    but ``superseded`` (withdrawn incidents); ``since``: detected at or after (UTC).
    Raises ValueError for an unknown severity or status."""
    where, params = [], []
    if job:
        where.append("job GLOB ?")  # DuckDB's GLOB: the shell's *, ? and [...]
        params.append(job)
    if kind:
        where.append("kind GLOB ?")
        params.append(kind)
    if min_severity:
        if min_severity not in SEVERITIES:
            raise ValueError(f"severity {min_severity!r}: one of {', '.join(SEVERITIES)}")
        where.append("list_position(?, severity) >= ?")
        params += [list(SEVERITIES), SEVERITIES.index(min_severity) + 1]
    if status in (None, ""):
        where.append("status <> 'superseded'")
    elif status != "all":
        if status not in STATUSES:
            raise ValueError(f"status {status!r}: one of {', '.join(STATUSES)}, or all")
        where.append("status = ?")
        params.append(status)
    if since is not None:
        where.append("detected_ts >= ?")
        params.append(since)
    columns = [c if c != "paging" else f"{paging_sql(con)} AS paging" for c in LIST_COLUMNS]
    sql = (f"SELECT {', '.join(columns)} FROM incidents" + (" WHERE " + " AND ".join(where) if where else "")
           + " ORDER BY detected_ts DESC, first_ts DESC, id" + (f" LIMIT {int(limit)}" if limit else ""))
    return _frame(con, sql, params)


def paging_of(con: duckdb.DuckDBPyConnection, incident_id: str) -> str:
    """The ``paging`` (:func:`paging_sql`) of one incident; ``not alerted`` for an unknown id."""
    rows = con.execute(f"SELECT {paging_sql(con)} FROM incidents WHERE id = ?", [incident_id]).fetchall()
    return rows[0][0] if rows else "not alerted"


def find_incident(con: duckdb.DuckDBPyConnection, ref: str) -> str:
    """The id of the incident ``ref`` names: its id, or a prefix of one id (at least 4
    characters, as git takes commits). Raises HistoryError: none, or several."""
    ref = ref.strip().lower()  # ids are lower-case hex
    exact = con.execute("SELECT id FROM incidents WHERE id = ?", [ref]).fetchall()
    if exact:
        return exact[0][0]
    if len(ref) < 4:
        raise HistoryError(f"incident {ref}: no such id (give at least 4 characters of one)")
    rows = con.execute("SELECT id FROM incidents WHERE starts_with(id, ?) ORDER BY id LIMIT 6", [ref]).fetchall()
    if not rows:
        raise HistoryError(f"incident {ref}: no such id (ckptwatch incidents list shows them)")
    if len(rows) > 1:
        raise HistoryError(f"incident {ref}: several ids start so ({', '.join(r[0] for r in rows[:5])}"
                           f"{', ...' if len(rows) > 5 else ''}): give more of it")
    return rows[0][0]


def load_incident(con: duckdb.DuckDBPyConnection, incident_id: str) -> tuple[Incident, pl.DataFrame]:
    """The incident with id ``incident_id`` as last stored, evidence included (an
    :class:`Incident`, as ``diagnose`` reports it), and its evidence rows with ``file`` and
    ``read_on`` (columns of ``incident_evidence`` plus those two, in ``seq`` order). Raises
    HistoryError when there is no such incident."""
    v3 = has_column(con, "incidents", "commands")  # schema 3: provisional, commands
    rows = con.execute(
        "SELECT id, kind, severity, status, job, step, checkpoint_path, root_cause, collateral, checkpoint_state, "
        "last_good_step, last_good_path, remediation, first_ts, detected_ts, "
        f"{'provisional, commands' if v3 else 'false, NULL'} FROM incidents WHERE id = ?", [incident_id]).fetchall()
    if not rows:
        raise HistoryError(f"incident {incident_id}: no such id")
    (iid, kind, severity, status, job, step, path, rc, collateral, cs, lg_step, lg_path, remediation, first_ts,
     detected_ts, is_provisional, cmds) = rows[0]
    evidence = _frame(con, f"SELECT * FROM {evidence_relation(con)} WHERE incident_id = ? ORDER BY seq", [incident_id])
    inc = Incident.from_dict({
        "id": iid, "kind": kind, "severity": severity, "status": status, "job": job, "step": step,
        "checkpoint_path": path, "root_cause": json.loads(rc) if rc else None, "collateral": collateral or [],
        "checkpoint_state": json.loads(cs) if cs else {},
        "last_good_checkpoint": {"step": lg_step, "path": lg_path} if lg_step is not None else None,
        "remediation": remediation or "", "first_ts": first_ts.isoformat(),
        "detected_ts": detected_ts.isoformat() if detected_ts else None, "provisional": bool(is_provisional),
        "commands": json.loads(cmds) if cmds else []})
    inc.evidence = [EvidenceItem(r["source_id"], r["offset"], r["ts"], r["kind"], r["rank"], r["host"],
                                 r["rule_id"], r["line"], r["role"], r.get("ts_source") or "line")
                    for r in evidence.iter_rows(named=True)]
    return inc, evidence


def alerts_of(con: duckdb.DuckDBPyConnection, incident_id: str) -> pl.DataFrame:
    """The notifications about one incident (``alerts`` rows: channel, action, status,
    attempts, created and sent times), oldest first; empty when the database has no
    ``alerts`` table (no alerter ran on it)."""
    if not has_table(con, "alerts"):
        return pl.DataFrame()
    return _frame(con, "SELECT channel, action, severity, status, attempts, created_ts, sent_ts, last_error "
                  "FROM alerts WHERE incident_id = ? ORDER BY id", [incident_id])


def grouped_under(con: duckdb.DuckDBPyConnection, incident_id: str) -> pl.DataFrame:
    """The incidents a channel's ``group_by`` put under ``incident_id``'s page (their trigger
    recorded ``grouped``, not sent): ``incident_id``, ``job``, ``kind``, ``step``, ``channel``,
    oldest first; empty when there are none or no ``alerts`` table. The on-call's one page
    stands for these too."""
    if not has_table(con, "alerts"):
        return pl.DataFrame()
    return _frame(con, "SELECT a.incident_id, i.job, i.kind, i.step, a.channel FROM alerts a "
                  "JOIN incidents i ON i.id = a.incident_id WHERE a.status = 'grouped' "
                  "AND starts_with(a.last_error, ?) ORDER BY a.id", [f"grouped under incident {incident_id} "])


def export(con: duckdb.DuckDBPyConnection, out: str, *, fmt: str, table: str = "incidents",
           ids: list[str] | None = None, redact: Callable[[pl.DataFrame], pl.DataFrame] | None = None) -> int:
    """Write ``table`` (one of :data:`EXPORT_TABLES`; ``evidence`` with each row's file) to
    ``out`` as ``parquet`` or ``csv`` (with a header), ``0600`` (the rows hold log lines);
    only the rows of the incidents ``ids`` when given; every row through ``redact`` first
    when given (e.g. :meth:`ckptwatch.sinks.redact.Redactor.frame`). Returns the number of
    rows. Raises ValueError (format, table), HistoryError (no ``alerts`` table),
    duckdb.Error (the file cannot be written)."""
    if fmt not in ("parquet", "csv"):
        raise ValueError(f"format {fmt!r}: parquet or csv")
    if table not in EXPORT_TABLES:
        raise ValueError(f"table {table!r}: one of {', '.join(EXPORT_TABLES)}")
    if table == "alerts" and not has_table(con, "alerts"):
        raise HistoryError("the database has no alerts table: no alerter ran on it")
    relation = {"incidents": "incidents", "evidence": evidence_relation(con), "alerts": "alerts"}[table]
    key = "id" if table == "incidents" else "incident_id"
    params: list[Any] = []
    where = ""
    if ids is not None:
        where = f" WHERE list_contains(?, {key})"
        params.append(ids)
    order = {"incidents": "detected_ts, id", "evidence": "incident_id, seq", "alerts": "id"}[table]
    query = f"SELECT * FROM {relation}{where} ORDER BY {order}"
    if redact is not None:
        rows = redact(_frame(con, query, params))
        con.register("_ckptwatch_export", rows)  # written by DuckDB as before: same CSV / Parquet shapes
        query, params = "SELECT * FROM _ckptwatch_export", []
    n = con.execute(f"SELECT count(*) FROM ({query})", params).fetchall()[0][0]
    options = "FORMAT parquet" if fmt == "parquet" else "FORMAT csv, HEADER true"
    with private_umask():
        con.execute(f"COPY ({query}) TO '{out.replace(chr(39), chr(39) * 2)}' ({options})", params)
    os.chmod(out, FILE_MODE)  # a file that was there before keeps its mode otherwise
    if redact is not None:
        con.unregister("_ckptwatch_export")
    return int(n)
