"""Generic webhook channel: the incident as JSON, optionally signed, with an idempotency key.

Body (``Content-Type: application/json``)::

    {"version": 1, "notification_id": 17, "idempotency_key": "ckptwatch-<incident id>-17",
     "action": "trigger|escalate|update|realert|resolve", "channel": "NAME",
     "summary": "<kind>: job <job>: <the checkpoint and what broke it>", "incident": {...}}

``summary`` is the incident's :func:`~ckptwatch.detectors.headline.headline` (redacted).

``incident`` is the ``diagnose --json`` shape with every string redacted (paths, root cause,
evidence, checkpoint state, remediation) and cut to
:data:`~ckptwatch.sinks.redact.MAX_FIELD_CHARS` characters; its ``id`` is the raw
incident's. The body is the same bytes on every attempt of one notification.

Idempotency (draft-ietf-httpapi-idempotency-key-header): every request carries
``Idempotency-Key: "ckptwatch-<incident id>-<notification_id>"`` (a structured-field
string, so quoted), the same on every retry and after a restart, different for every
notification; ``idempotency_key`` in the body is the same key unquoted. The incident id makes
it unique across ckptwatch databases posting to one receiver (notification ids are a
per-database sequence). A receiver that stores keys it has processed can drop re-sends.

With a shared ``secret`` the request carries ``X-Ckptwatch-Signature-256: sha256=<hex
HMAC-SHA256 of the raw body>`` (the scheme of GitHub's ``X-Hub-Signature-256``): compute it
over the bytes received, compare in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

from ckptwatch.detectors.headline import headline
from ckptwatch.detectors.incident import Incident
from ckptwatch.sinks.alerts.http import Outcome, Request, Timeouts, post
from ckptwatch.sinks.alerts.notification_log import Notification
from ckptwatch.sinks.redact import Redactor

SIGNATURE_HEADER = "X-Ckptwatch-Signature-256"
IDEMPOTENCY_HEADER = "Idempotency-Key"


def redacted(inc: Incident, redactor: Redactor) -> dict[str, Any]:
    """``inc.to_dict()`` with every string redacted and cut (the id kept)."""
    return redactor.incident(inc).to_dict()


def idempotency_key(n: Notification) -> str:
    """``ckptwatch-<incident id>-<notification id>``: stable across retries of ``n``."""
    return f"ckptwatch-{n.incident.id}-{n.id}"


def body(n: Notification, channel: str, redactor: Redactor) -> bytes:
    """The request body of notification ``n`` (see the module docstring)."""
    doc = {"version": 1, "notification_id": n.id, "idempotency_key": idempotency_key(n), "action": n.action,
           "channel": channel, "summary": headline(redactor.incident(n.incident)),
           "incident": redacted(n.incident, redactor)}
    return json.dumps(doc, sort_keys=True).encode()


def signature(secret: str, raw: bytes) -> str:
    """``sha256=`` + hex HMAC-SHA256 of ``raw`` under ``secret``."""
    return "sha256=" + hmac.new(secret.encode(), raw, hashlib.sha256).hexdigest()


class WebhookChannel:
    """POSTs :func:`body` to ``url`` with the ``Idempotency-Key`` header; signs it when
    ``secret`` is set (both secrets). ``timeout``: :class:`~.http.Timeouts` (the read
    timeout growing per attempt). Idempotent for receivers that honour the key."""

    idempotent = True

    def __init__(self, name: str, url: str, *, secret: str = "", redactor: Redactor, timeout: Timeouts) -> None:
        self.name, self._url, self._secret, self.redactor, self.timeout = name, url, secret, redactor, timeout

    def deliver(self, n: Notification) -> Outcome:
        """POST :func:`body` of ``n`` with its idempotency key (and signature)."""
        raw = body(n, self.name, self.redactor)
        headers = {IDEMPOTENCY_HEADER: f'"{idempotency_key(n)}"'}
        if self._secret:
            headers[SIGNATURE_HEADER] = signature(self._secret, raw)
        return post(Request(self._url, raw, headers), self.timeout.for_attempt(n.attempts))
