"""PagerDuty channel: Events API v2.

Format (PagerDuty Events API v2, ``POST /v2/enqueue``): ``routing_key``, ``event_action``
(``trigger`` | ``resolve``), ``dedup_key`` (at most 255 characters; here the incident id,
so one incident is one PagerDuty alert however often it is sent), and for a trigger a
``payload`` with ``summary`` (at most 1024 characters), ``source``, ``severity`` (one of
critical, error, warning, info), ``timestamp`` (ISO 8601), ``component``, ``group``,
``class`` and ``custom_details``. A resolve carries only the routing key, action and
dedup key. The whole incident passes through the redactor first (summary, checkpoint
paths and details included).

Idempotency: PagerDuty folds every event with the same ``dedup_key`` into one open alert, so
a re-sent trigger (after a timeout, or a restart mid-send) adds no page.
"""

from __future__ import annotations

import json
from typing import Any

from ckptwatch.detectors.headline import headline
from ckptwatch.detectors.incident import Incident
from ckptwatch.sinks.alerts.http import Outcome, Request, Timeouts, post
from ckptwatch.sinks.alerts.notification_log import Notification
from ckptwatch.sinks.redact import Redactor
from ckptwatch.sinks.report import timeline

SUMMARY_MAX = 1024
DEDUP_KEY_MAX = 255
SEVERITIES = ("critical", "error", "warning", "info")
#: Opens the summary of an incident that had already resolved when it was first alerted
RESOLVED_PREFIX = "[resolved before it was alerted] "


def summary(inc: Incident) -> str:
    """One line: the incident's :func:`~ckptwatch.detectors.headline.headline` (kind, job, the
    checkpoint and what broke it), after :data:`RESOLVED_PREFIX` for an incident already
    resolved; at most :data:`SUMMARY_MAX` characters. Give it a redacted incident
    (:meth:`~.redact.Redactor.incident`): paths and lines are copied as they are."""
    text = headline(inc)
    if inc.status == "resolved":  # first seen resolved: told once all the same (see dedup.NOTICE)
        text = f"{RESOLVED_PREFIX}{text}"
    return text if len(text) <= SUMMARY_MAX else text[: SUMMARY_MAX - 1] + "…"


def trigger(inc: Incident, *, routing_key: str, redactor: Redactor, source: str = "ckptwatch") -> dict[str, Any]:
    """The ``trigger`` event for ``inc``, built from ``inc`` with every string redacted;
    ``dedup_key`` is the incident id (a hash of the raw facts: stable across versions,
    retries and restarts). Severity is the incident's (already one of PagerDuty's four
    values); anything else maps to ``error``."""
    inc = redactor.incident(inc)
    rc = inc.root_cause
    lg = inc.last_good_checkpoint or {}
    details = {
        "incident_id": inc.id,
        "kind": inc.kind,
        "job": inc.job,
        "step": inc.step,
        "checkpoint_path": inc.checkpoint_path,
        "root_cause": None if rc is None else {
            "class": rc.cls, "rank": rc.rank, "host": rc.host, "pid": rc.pid,
            "time": rc.ts.isoformat() if rc.ts else None, "signal": rc.signal,
            "line": rc.line or None,
        },
        "collateral_ranks": inc.collateral,
        "checkpoint_state": inc.checkpoint_state,
        "last_good_checkpoint": {"step": lg.get("step"), "path": lg.get("path")} if lg else None,
        "remediation": inc.remediation,
        "commands": [f"{c['command']}  # {c['purpose']}" for c in inc.commands],
        "timeline": timeline(inc),
    }
    return {
        "routing_key": routing_key,
        "event_action": "trigger",
        "dedup_key": inc.id[:DEDUP_KEY_MAX],
        "payload": {
            "summary": summary(inc),
            "source": (rc.host if rc and rc.host else source),
            "severity": inc.severity if inc.severity in SEVERITIES else "error",
            "timestamp": inc.first_ts.isoformat(),
            "component": inc.job or "unknown",
            "group": "checkpoints",
            "class": inc.kind,
            "custom_details": details,
        },
    }


def resolve(inc: Incident, *, routing_key: str) -> dict[str, Any]:
    """The ``resolve`` event: same dedup key as the trigger, nothing else."""
    return {"routing_key": routing_key, "event_action": "resolve", "dedup_key": inc.id[:DEDUP_KEY_MAX]}


class PagerDutyChannel:
    """Sends ``trigger`` (for trigger, escalate, update and realert: same dedup key, so
    PagerDuty adds them to one alert) and ``resolve`` events to ``url`` with the ``routing_key`` (a secret)
    of an Events API v2 integration; ``timeout``: :class:`~.http.Timeouts` (the read
    timeout growing per attempt). Idempotent by ``dedup_key``."""

    idempotent = True

    def __init__(self, name: str, routing_key: str, *, url: str, source: str, redactor: Redactor,
                 timeout: Timeouts) -> None:
        self.name, self._key, self.url, self.source = name, routing_key, url, source
        self.redactor, self.timeout = redactor, timeout

    def deliver(self, n: Notification) -> Outcome:
        """POST the ``resolve`` or ``trigger`` event of ``n`` to the Events API."""
        if n.action == "resolve":
            event = resolve(n.incident, routing_key=self._key)
        else:
            event = trigger(n.incident, routing_key=self._key, redactor=self.redactor, source=self.source)
        return post(Request(self.url, json.dumps(event).encode()), self.timeout.for_attempt(n.attempts))
