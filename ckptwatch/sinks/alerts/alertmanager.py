"""Alertmanager channel: incidents as alerts posted to Prometheus Alertmanager.

Format (Alertmanager API v2, ``POST /api/v2/alerts``, the ``postableAlerts`` body of its
OpenAPI spec ``api/v2/openapi.yaml``): a JSON list of alerts, each with ``labels`` and
``annotations`` (string maps), ``startsAt`` / ``endsAt`` (RFC 3339) and ``generatorURL``.
Alertmanager identifies an alert by its label set; grouping, inhibition, silences, routing,
templates and every receiver it has (Slack, PagerDuty, OpsGenie, email, webhooks ...) then
apply to ckptwatch's incidents as to any Prometheus alert.

Labels (:func:`labels`): ``alertname`` (the incident kind), ``incident_id``, ``kind``,
``severity``, ``job``, ``step``, ``checkpoint`` (the path, redacted), ``host`` and
``cause`` (of the root cause), ``storage_host`` for incidents whose root cause is a storage
error (the NFS server a kernel line names, else the bucket of a cloud path, else the first
two parts of the checkpoint path: a shared mount), plus the channel's static ``labels``
(``cluster = "a"``). Empty values are left out (Alertmanager treats a missing label and an
empty one alike). Annotations: ``summary`` (the headline), ``description`` (what broke),
``remediation``, ``last_good``, ``first_event`` (the event time of its first line),
``commands`` (one per line) and ``verify_command``, and ``runbook_url`` / ``incident_url`` when the channel
sets ``runbook_url`` (``{kind}`` is replaced) and ``console_url``.

Firing and resolving: a firing alert is posted with ``endsAt`` = now + 4 ×
``resend_interval``, and re-posted (all of the channel's firing alerts in one request)
every ``resend_interval`` seconds while it stays open, as Prometheus does: an Alertmanager
that restarted (alerts live in its memory) has them back within one interval, and alerts
of a ckptwatch that is gone end on their own. A resolve posts the alert with ``endsAt`` =
now. When a new version of an incident changes its labels (a root cause revised, a
severity raised), the old label set is posted as ended in the same request (known within
the process; after a restart it ends at its ``endsAt``).

Idempotent: Alertmanager merges alerts with the same labels, so a re-post adds no
notification.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import threading
from collections.abc import Iterable
from typing import Any

from ckptwatch.detectors.headline import headline, last_good, why
from ckptwatch.detectors.incident import Incident
from ckptwatch.sinks.alerts.http import Outcome, Request, Timeouts, post
from ckptwatch.sinks.alerts.notification_log import Notification
from ckptwatch.sinks.redact import Redactor
from ckptwatch.sinks.alerts.routing import labels as routing_labels

API_PATH = "/api/v2/alerts"
#: seconds between re-posts of firing alerts (Prometheus' default resend delay is 1 minute)
RESEND_INTERVAL = 60.0
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _rfc3339(t: dt.datetime) -> str:
    return t.astimezone(dt.timezone.utc).isoformat().replace("+00:00", "Z")


def labels(inc: Incident, static: dict[str, str] | None = None) -> dict[str, str]:
    """The alert's label set (see the module docstring): the routing labels
    (:func:`~.routing.labels`) plus ``alertname``, ``incident_id``, ``step``, ``checkpoint``;
    ``inc`` redacted already."""
    out = {"alertname": inc.kind, "incident_id": inc.id, **routing_labels(inc),
           "step": "" if inc.step is None else str(inc.step), "checkpoint": inc.checkpoint_path or ""}
    return {**(static or {}), **{k: v for k, v in out.items() if v}}


def annotations(inc: Incident, *, console_url: str = "", runbook_url: str = "") -> dict[str, str]:
    """``summary``, ``description``, ``remediation``, ``last_good``, ``first_event`` and, when configured,
    ``runbook_url`` and ``incident_url``; ``inc`` redacted already."""
    out = {"summary": headline(inc), "description": why(inc), "remediation": inc.remediation,
           "last_good": last_good(inc.last_good_checkpoint), "first_event": _rfc3339(inc.first_ts)}
    if inc.commands:
        out["commands"] = "\n".join(f"{c['command']}  # {c['purpose']}" for c in inc.commands)
        verify = next((c["command"] for c in inc.commands if c["purpose"] == "verify"), None)
        if verify:
            out["verify_command"] = verify
    if runbook_url:
        out["runbook_url"] = runbook_url.replace("{kind}", inc.kind)
    if console_url:
        out["incident_url"] = f"{console_url.rstrip('/')}/incidents/{inc.id}"
    return out


def alert(inc: Incident, *, firing: bool, now: dt.datetime, static: dict[str, str] | None = None,
          console_url: str = "", runbook_url: str = "", resend_interval: float = RESEND_INTERVAL) -> dict[str, Any]:
    """One ``postableAlert`` for ``inc`` (redacted already): firing until now + 4 ×
    ``resend_interval``, or ended now. ``startsAt`` is when ckptwatch detected the incident
    (``detected_ts``; ``now`` when unset), never after ``endsAt``: Alertmanager flushes a
    group at once, skipping ``group_wait``, for an alert that started longer than
    ``group_wait`` ago, so the event time of the first line (annotation ``first_event``)
    would defeat grouping of incidents detected together."""
    ends = now + dt.timedelta(seconds=4 * resend_interval) if firing else now
    starts = min(inc.detected_ts or now, ends)
    doc: dict[str, Any] = {"labels": labels(inc, static),
                           "annotations": annotations(inc, console_url=console_url, runbook_url=runbook_url),
                           "startsAt": _rfc3339(starts), "endsAt": _rfc3339(ends)}
    if console_url:
        doc["generatorURL"] = f"{console_url.rstrip('/')}/incidents/{inc.id}"
    return doc


def check_labels(static: Any, where: str) -> dict[str, str]:
    """A channel's static ``labels`` table, checked: label names as Prometheus allows
    (``[a-zA-Z_][a-zA-Z0-9_]*``), string values. Raises ValueError naming ``where``."""
    if not isinstance(static, dict):
        raise ValueError(f"{where}: must be a table of label = \"value\"")
    for k, v in static.items():
        if not _LABEL_NAME.match(str(k)) or not isinstance(v, str):
            raise ValueError(f"{where}.{k}: a label name is [a-zA-Z_][a-zA-Z0-9_]* and its value a string")
    return dict(static)


class AlertmanagerChannel:
    """Posts incidents to the Alertmanager at ``url`` (its base URL, e.g.
    ``http://127.0.0.1:9093``; a secret when it carries credentials). ``static_labels``
    are added to every alert; ``resend_interval`` (seconds) is how often the dispatcher
    re-posts firing alerts (:meth:`refresh`). Idempotent (see the module docstring)."""

    idempotent = True

    def __init__(self, name: str, url: str, *, redactor: Redactor, timeout: Timeouts,
                 static_labels: dict[str, str] | None = None, console_url: str = "", runbook_url: str = "",
                 resend_interval: float = RESEND_INTERVAL) -> None:
        self.name, self.redactor, self.timeout = name, redactor, timeout
        self._url = url.rstrip("/") + API_PATH
        self.static = dict(static_labels or {})
        self.console_url, self.runbook_url = console_url, runbook_url
        self.resend_interval = resend_interval
        self._sent: dict[str, dict[str, str]] = {}  # incident id -> label set last posted as firing
        self._lock = threading.Lock()

    def _alert(self, inc: Incident, firing: bool, now: dt.datetime) -> dict[str, Any]:
        return alert(inc, firing=firing, now=now, static=self.static, console_url=self.console_url,
                     runbook_url=self.runbook_url, resend_interval=self.resend_interval)

    def body(self, n: Notification, now: dt.datetime) -> list[dict[str, Any]]:
        """The alerts of one notification: the incident firing (or ended, for ``resolve``),
        preceded by its previous label set ended when that differs."""
        inc = self.redactor.incident(n.incident)
        firing = n.action != "resolve"
        doc = self._alert(inc, firing, now)
        out = []
        with self._lock:
            old = self._sent.get(inc.id)
            if old is not None and old != doc["labels"]:
                out.append({**doc, "labels": old, "endsAt": _rfc3339(now)})
            if firing:
                self._sent[inc.id] = doc["labels"]
            else:
                self._sent.pop(inc.id, None)
        return [*out, doc]

    def deliver(self, n: Notification) -> Outcome:
        """POST :meth:`body` of ``n`` to ``/api/v2/alerts``."""
        raw = json.dumps(self.body(n, _utcnow())).encode()
        return post(Request(self._url, raw), self.timeout.for_attempt(n.attempts))

    def refresh(self, incidents: Iterable[Incident]) -> Outcome:
        """Re-post every firing incident (redacted by the dispatcher) in one request; called
        every ``resend_interval``. An empty list sends nothing."""
        now = _utcnow()
        alerts = [self._alert(inc, True, now) for inc in incidents]
        with self._lock:
            self._sent.update({a["labels"]["incident_id"]: a["labels"] for a in alerts})
        if not alerts:
            return Outcome("sent")
        return post(Request(self._url, json.dumps(alerts).encode()), self.timeout.for_attempt(0))
