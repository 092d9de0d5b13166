"""Generic webhook channel: the incident as JSON, optionally signed.

Body (``Content-Type: application/json``)::

    {"version": 1, "notification_id": 17, "action": "trigger|escalate|update|realert|resolve",
     "channel": "NAME", "incident": {...}}

``incident`` is the ``diagnose --json`` shape with every log line and the remediation
redacted. ``notification_id`` is the same on every retry of one notification: receivers
can deduplicate on it. With a shared ``secret`` the request carries
``X-Ckptwatch-Signature-256: sha256=<hex HMAC-SHA256 of the raw body>`` (the scheme of
GitHub's ``X-Hub-Signature-256``): compute it over the bytes received, compare in
constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

from ckptwatch.detectors.incident import Incident
from ckptwatch.sinks.alerts.http import Outcome, Request, post
from ckptwatch.sinks.alerts.notification_log import Notification
from ckptwatch.sinks.alerts.redact import Redactor

SIGNATURE_HEADER = "X-Ckptwatch-Signature-256"


def redacted(inc: Incident, redactor: Redactor) -> dict[str, Any]:
    """``inc.to_dict()`` with the root cause line, evidence lines and remediation redacted."""
    d = inc.to_dict()
    if d["root_cause"] and d["root_cause"].get("line"):
        d["root_cause"]["line"] = redactor.redact(d["root_cause"]["line"])
    for e in d["evidence"]:
        e["line"] = redactor.redact(e["line"])
    d["remediation"] = redactor.redact(d["remediation"])
    return d


def body(n: Notification, channel: str, redactor: Redactor) -> bytes:
    """The request body of notification ``n`` (see the module docstring)."""
    doc = {"version": 1, "notification_id": n.id, "action": n.action, "channel": channel,
           "incident": redacted(n.incident, redactor)}
    return json.dumps(doc, sort_keys=True).encode()


def signature(secret: str, raw: bytes) -> str:
    """``sha256=`` + hex HMAC-SHA256 of ``raw`` under ``secret``."""
    return "sha256=" + hmac.new(secret.encode(), raw, hashlib.sha256).hexdigest()


class WebhookChannel:
    """POSTs :func:`body` to ``url``; signs it when ``secret`` is set (both secrets)."""

    def __init__(self, name: str, url: str, *, secret: str = "", redactor: Redactor, timeout: float) -> None:
        self.name, self._url, self._secret, self.redactor, self.timeout = name, url, secret, redactor, timeout

    def deliver(self, n: Notification) -> Outcome:
        raw = body(n, self.name, self.redactor)
        headers = {SIGNATURE_HEADER: signature(self._secret, raw)} if self._secret else {}
        return post(Request(self._url, raw, headers), self.timeout)
