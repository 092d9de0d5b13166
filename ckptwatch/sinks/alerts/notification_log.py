"""The notification log: every notification, queued, sent or failed, in DuckDB.

It is at once the durable outbox (rows with ``status = 'pending'`` are delivered, retried
and survive restarts) and the alert log that deduplicates (what each channel was already
told about each incident). Table ``alerts``:

* ``id`` (sequence: delivery order), ``channel``, ``incident_id``, ``action``
  (``trigger`` | ``escalate`` | ``update`` | ``realert`` | ``resolve``), ``severity`` at queueing;
* ``status``: ``pending`` (to deliver at ``next_attempt_ts``), ``sent``, ``rejected`` (a 4xx
  that will never succeed), ``expired`` (still failing ``give_up_after`` seconds after
  ``created_ts``), ``silenced`` (muted: recorded, not sent) or ``grouped`` (the channel's
  ``group_by`` put it under an incident paged just before: recorded, not sent;
  ``last_error`` names that incident);
* ``attempts``, ``last_error``, ``created_ts``, ``sent_ts`` (UTC);
* ``sending_ts``: set (and committed) just before a send starts, cleared when its outcome is
  recorded. Still set at startup means the process died in between: the send may have
  reached the receiver. :meth:`NotificationLog.reset_pending` then counts it as an attempt
  and sets ``maybe_sent``;
* ``maybe_sent``: an earlier attempt may have been delivered (that restart, or a timeout
  after the request was written in full). Channels without idempotency (Slack) say so in
  the re-sent message;
* ``incident``: the incident as queued (JSON, the ``diagnose --json`` shape), so a
  notification is delivered as it was decided even after a restart. No secret is stored:
  channels add URLs and keys when they send.

Every method runs on the caller's DuckDB connection (the :class:`~ckptwatch.sinks.duckdb_store.Store`'s),
inside the caller's transaction when there is one.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Iterable
from dataclasses import dataclass

import duckdb

from ckptwatch.detectors.incident import Incident
from ckptwatch.sinks.alerts.routing import severity_rank

_DDL = """
CREATE SEQUENCE IF NOT EXISTS alerts_seq;
CREATE TABLE IF NOT EXISTS alerts (
    id BIGINT PRIMARY KEY DEFAULT nextval('alerts_seq'), channel VARCHAR NOT NULL, incident_id VARCHAR NOT NULL,
    action VARCHAR NOT NULL, severity VARCHAR, status VARCHAR NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_ts TIMESTAMPTZ, last_error VARCHAR, created_ts TIMESTAMPTZ NOT NULL, sent_ts TIMESTAMPTZ,
    incident JSON);
ALTER TABLE alerts ADD COLUMN IF NOT EXISTS sending_ts TIMESTAMPTZ;
ALTER TABLE alerts ADD COLUMN IF NOT EXISTS maybe_sent BOOLEAN DEFAULT false;
"""

ALERTING = ("trigger", "escalate", "realert", "update")


@dataclass(frozen=True)
class History:
    """What one channel was told about one incident. ``max_severity``: highest severity
    alerted (rank, see :func:`~ckptwatch.sinks.alerts.routing.severity_rank`; -1: never
    alerted); ``last_alert_ts``: queueing time of the newest alert; ``resolved``: a resolve
    was queued after it; ``silenced``: muted at least once; ``cause``: the root cause
    (class, rank) the newest alert named."""

    max_severity: int = -1
    last_alert_ts: dt.datetime | None = None
    resolved: bool = False
    silenced: bool = False
    cause: tuple[str | None, int | None] | None = None
    grouped: bool = False

    @property
    def alerted(self) -> bool:
        return self.max_severity >= 0


@dataclass(frozen=True)
class Notification:
    """One row of the log, to deliver: ``incident`` is the incident as queued (raw: the
    dispatcher redacts it before a channel sees it); ``maybe_sent``: an earlier attempt may
    have been delivered (see the module docstring)."""

    id: int
    channel: str
    action: str
    attempts: int
    created_ts: dt.datetime
    incident: Incident
    maybe_sent: bool = False


class NotificationLog:
    """The ``alerts`` table on ``con`` (created if missing)."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.con = con
        self.con.execute(_DDL)

    def history(self, channel: str, incident_ids: Iterable[str]) -> dict[str, History]:
        """incident id -> :class:`History` for ``channel`` (ids never notified are absent)."""
        ids = list(incident_ids)
        if not ids:
            return {}
        rows = self.con.execute(
            "SELECT incident_id, action, severity, status, created_ts, incident->'root_cause' FROM alerts "
            "WHERE channel = ? AND list_contains(?, incident_id) ORDER BY id", [channel, ids]).fetchall()
        out: dict[str, History] = {}
        for iid, action, severity, status, created, rc in rows:
            h = out.get(iid, History())
            if status == "silenced":
                h = dataclasses.replace(h, silenced=True)
            elif status == "grouped":
                h = dataclasses.replace(h, grouped=True)
            elif action in ALERTING:
                rc = json.loads(rc) if rc else None
                h = dataclasses.replace(h, max_severity=max(h.max_severity, severity_rank(severity)),
                                        last_alert_ts=created, resolved=False,
                                        cause=(rc.get("class"), rc.get("rank")) if rc else (None, None))
            elif action == "resolve":
                h = dataclasses.replace(h, resolved=True)
            out[iid] = h
        return out

    def reset_pending(self, now: dt.datetime) -> int:
        """At startup: a send that was started and never recorded (the process died) counts
        as an attempt that may have been delivered (``maybe_sent``); then every pending
        notification is due ``now`` (a restart is a fresh chance, whatever backoff or
        ``Retry-After`` was stored). Returns how many were made due."""
        self.con.execute("UPDATE alerts SET maybe_sent = true, attempts = attempts + 1, sending_ts = NULL, "
                         "last_error = 'interrupted: the process stopped before the answer was recorded' "
                         "WHERE sending_ts IS NOT NULL AND status = 'pending'")
        row = self.con.execute("UPDATE alerts SET next_attempt_ts = ? WHERE status = 'pending' AND next_attempt_ts > ? "
                               "RETURNING id", [now, now]).fetchall()
        return len(row)

    def enqueue(self, channel: str, inc: Incident, action: str, now: dt.datetime, *, status: str = "pending",
                note: str | None = None) -> int:
        """Queue one notification (or record a silenced or grouped one, ``note`` saying why);
        returns its id."""
        row = self.con.execute(
            "INSERT INTO alerts (channel, incident_id, action, severity, status, next_attempt_ts, created_ts, incident, "
            "last_error) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
            [channel, inc.id, action, inc.severity, status, now, now, json.dumps(inc.to_dict()), note]).fetchone()
        assert row is not None
        return int(row[0])

    def due(self, now: dt.datetime, *, skip: Iterable[int] = (), paused: Iterable[str] = ()) -> list[Notification]:
        """Pending notifications whose time has come, oldest first; per (channel, incident)
        only the oldest pending one, so a resolve never overtakes its trigger. ``skip``:
        ids in flight; ``paused``: channels waiting out a rate limit."""
        rows = self.con.execute(
            "SELECT id, channel, action, attempts, created_ts, next_attempt_ts, incident, coalesce(maybe_sent, false) "
            "FROM alerts WHERE status = 'pending' "
            "QUALIFY row_number() OVER (PARTITION BY channel, incident_id ORDER BY id) = 1 ORDER BY id").fetchall()
        skip, paused = set(skip), set(paused)
        return [Notification(i, ch, act, att, created, Incident.from_dict(json.loads(inc)), bool(maybe))
                for i, ch, act, att, created, nxt, inc, maybe in rows
                if i not in skip and ch not in paused and nxt <= now]

    def mark_sending(self, nid: int, now: dt.datetime) -> None:
        """Record that a send of ``nid`` starts now (call before sending, outside a
        transaction, so it is durable before any byte leaves)."""
        self.con.execute("UPDATE alerts SET sending_ts = ? WHERE id = ?", [now, nid])

    def mark_sent(self, nid: int, now: dt.datetime) -> None:
        """The receiver accepted ``nid`` (2xx)."""
        self.con.execute("UPDATE alerts SET status = 'sent', attempts = attempts + 1, sent_ts = ?, last_error = NULL, "
                         "sending_ts = NULL WHERE id = ?", [now, nid])

    def mark_retry(self, nid: int, next_ts: dt.datetime, error: str, *, maybe_sent: bool = False) -> None:
        """``nid`` failed and is retried at ``next_ts``; ``maybe_sent``: this attempt may
        have been delivered (the answer did not come after the request was written)."""
        self.con.execute("UPDATE alerts SET attempts = attempts + 1, next_attempt_ts = ?, last_error = ?, "
                         "sending_ts = NULL, maybe_sent = coalesce(maybe_sent, false) OR ? WHERE id = ?",
                         [next_ts, error, maybe_sent, nid])

    def mark_failed(self, nid: int, status: str, error: str) -> None:
        """``status``: ``rejected`` or ``expired``."""
        self.con.execute("UPDATE alerts SET status = ?, attempts = attempts + 1, last_error = ?, sending_ts = NULL "
                         "WHERE id = ?", [status, error, nid])

    def pending_counts(self) -> dict[str, int]:
        """channel -> notifications still to deliver."""
        rows = self.con.execute("SELECT channel, count(*) FROM alerts WHERE status = 'pending' GROUP BY channel")
        return dict(rows.fetchall())

    def next_attempt(self) -> dt.datetime | None:
        """When the earliest pending notification is due (None: nothing pending)."""
        row = self.con.execute("SELECT min(next_attempt_ts) FROM alerts WHERE status = 'pending'").fetchone()
        return row[0] if row else None

    def stale_alerts(self, before: dt.datetime) -> list[tuple[str, Incident]]:
        """(channel, incident as last queued) whose newest alert was queued before ``before``
        and not resolved since: candidates for a re-alert."""
        rows = self.con.execute(
            "SELECT channel, arg_max(incident, id) FROM alerts WHERE status NOT IN ('silenced', 'grouped') "
            "GROUP BY channel, incident_id "
            "HAVING max(CASE WHEN action IN ('trigger','escalate','realert','update') THEN created_ts END) < ? "
            "AND max(CASE WHEN action IN ('trigger','escalate','realert','update') THEN id END) "
            "  > coalesce(max(CASE WHEN action = 'resolve' THEN id END), -1)", [before]).fetchall()
        return [(ch, Incident.from_dict(json.loads(inc))) for ch, inc in rows]

    def firing(self, channel: str) -> list[Incident]:
        """Incidents (as last queued) that ``channel`` was told of (an alert delivered) and
        not yet resolved: what an Alertmanager channel re-posts."""
        rows = self.con.execute(
            "SELECT arg_max(incident, id) FROM alerts WHERE channel = ? AND status = 'sent' GROUP BY incident_id "
            "HAVING max(CASE WHEN action IN ('trigger','escalate','realert','update') THEN id END) "
            "  > coalesce(max(CASE WHEN action = 'resolve' THEN id END), -1)", [channel]).fetchall()
        return [Incident.from_dict(json.loads(inc)) for (inc,) in rows]

    def is_empty(self) -> bool:
        """No notification was ever recorded here (a new database, or one that lost its log)."""
        return not self.con.execute("SELECT count(*) FROM alerts").fetchall()[0][0]

    def state(self, channel: str, incident_id: str) -> dict | None:
        """What ``channel`` was told of the incident, as a JSON-ready dict (the value the sink
        mirrors to the notifications topic, :mod:`ckptwatch.kafka.notifications`):
        ``channel``, ``incident_id``, ``max_severity`` (name), ``resolved``, ``silenced``, and
        ``incident``: the version last told (without its evidence). None when nothing was
        sent."""
        h = self.history(channel, [incident_id]).get(incident_id)
        rows = self.con.execute(
            "SELECT incident, sent_ts FROM alerts WHERE channel = ? AND incident_id = ? AND status = 'sent' "
            "ORDER BY id DESC LIMIT 1", [channel, incident_id]).fetchall()
        if h is None or not rows:
            return None
        inc = json.loads(rows[0][0])
        inc["evidence"] = []
        from ckptwatch.detectors.incident import SEVERITIES

        return {"channel": channel, "incident_id": incident_id,
                "max_severity": SEVERITIES[h.max_severity] if h.alerted else None, "resolved": h.resolved,
                "silenced": h.silenced, "sent_ts": rows[0][1].isoformat() if rows[0][1] else None, "incident": inc}

    def restore(self, states: Iterable[dict], now: dt.datetime) -> int:
        """Record what other databases' logs said was sent (:meth:`state` dicts, from the
        notifications topic) in this empty log, as ``sent`` rows marked ``restored``: an
        alert (at the highest severity told) and, when it was resolved, its resolve. Dedup
        then treats them as told (:func:`~.dedup.decide`). Returns how many states."""
        n = 0
        for st in states:
            inc = json.dumps(st["incident"])
            sent = dt.datetime.fromisoformat(st["sent_ts"]) if st.get("sent_ts") else now
            rows = []
            if st.get("max_severity"):
                rows.append(("trigger", st["max_severity"]))
            if st.get("resolved"):
                rows.append(("resolve", st.get("max_severity")))
            if st.get("silenced") and not rows:
                rows.append(("trigger", None))
            for action, severity in rows:
                status = "silenced" if severity is None else "sent"
                self.con.execute(
                    "INSERT INTO alerts (channel, incident_id, action, severity, status, attempts, last_error, "
                    "created_ts, sent_ts, incident) VALUES (?, ?, ?, ?, ?, 0, 'restored from the notifications topic', "
                    "?, ?, ?)", [st["channel"], st["incident_id"], action, severity, status, sent, sent, inc])
            n += 1
        return n

    def only_silenced(self) -> list[tuple[str, Incident]]:
        """(channel, incident as last recorded) that were muted and never alerted."""
        rows = self.con.execute(
            "SELECT channel, arg_max(incident, id) FROM alerts GROUP BY channel, incident_id "
            "HAVING bool_and(status = 'silenced')").fetchall()
        return [(ch, Incident.from_dict(json.loads(inc))) for ch, inc in rows]
