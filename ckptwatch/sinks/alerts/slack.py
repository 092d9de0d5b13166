"""Slack channel: incoming-webhook messages in Block Kit.

Limits (Slack Block Kit reference): a ``header`` block's plain text at most 150 characters,
a ``section`` block's text at most 3000, a section's ``fields`` at most 10 of at most 2000
characters each, at most 50 blocks per message; the top-level ``text`` is the notification
fallback. Longer text is cut with a note saying so: a message is never refused for its
size. The whole incident passes through the redactor first (before anything is cut).

Duplicates: incoming webhooks (and ``chat.postMessage``) take no idempotency key, so Slack
cannot fold a re-sent message into the first. ckptwatch re-sends after an unknown outcome
(at least once: a lost page is worse than a repeated one) and such a re-send carries a
context line saying it may be a duplicate.
"""

from __future__ import annotations

import json
from typing import Any

from ckptwatch.detectors.headline import last_good, where, why
from ckptwatch.detectors.incident import Incident
from ckptwatch.sinks.alerts.http import Outcome, Request, Timeouts, post
from ckptwatch.sinks.alerts.notification_log import Notification
from ckptwatch.sinks.alerts.pagerduty import summary
from ckptwatch.sinks.redact import Redactor
from ckptwatch.sinks.report import timeline

HEADER_MAX = 150
SECTION_MAX = 3000
FIELD_MAX = 2000
_CUT = "\n… (cut to fit Slack; full evidence in DuckDB: incident_evidence)"


def _fit(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - len(_CUT)] + _CUT


def _short(text: str, limit: int = HEADER_MAX) -> str:
    """A header's plain text: cut with an ellipsis (the full line is the next section)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": _fit(text, SECTION_MAX)}}


_PREFIX = {"escalate": "ESCALATED ", "realert": "STILL OPEN ", "update": "UPDATED "}


def _prefix(inc: Incident, action: str) -> str:
    """The header's first word: the action's, or RESOLVED for an incident first alerted
    when it had already resolved (its resolve follows: see :data:`~.dedup.NOTICE`)."""
    return "RESOLVED " if action == "trigger" and inc.status == "resolved" else _PREFIX.get(action, "")
#: The context line of a message that may repeat one already posted.
DUPLICATE_NOTE = (":warning: possible duplicate: an earlier post of this notification may have reached Slack "
                  "(no answer came, or ckptwatch restarted mid-send; Slack webhooks cannot deduplicate)")


def _context(inc: Incident, maybe_duplicate: bool) -> dict[str, Any]:
    elements = [{"type": "mrkdwn", "text": f"ckptwatch incident `{inc.id}`"}]
    if maybe_duplicate:
        elements.append({"type": "mrkdwn", "text": DUPLICATE_NOTE})
    return {"type": "context", "elements": elements}


def _why_field(inc: Incident) -> str:
    """The root cause with rank, host, pid and time when there is one; else what else
    explains the incident (:func:`~ckptwatch.detectors.headline.why`)."""
    rc = inc.root_cause
    if rc and rc.cls == "load_error":  # a failed load: what the loader said, and where it first failed
        return f"*Why*\n{why(inc)}" + (f", first on rank {rc.rank}" if rc.rank is not None else "")
    if rc and rc.ts:
        facts = [f"{k} {v}" for k, v in (("rank", rc.rank), ("host", rc.host), ("pid", rc.pid)) if v is not None]
        return (f"*Root cause*\n{rc.cls}" + (f" ({rc.signal})" if rc.signal else "") + "".join(f", {f}" for f in facts)
                + f", {rc.ts:%Y-%m-%d %H:%M:%S} UTC")
    return f"*Why*\n{why(inc)}"


def message(inc: Incident, *, redactor: Redactor, action: str = "trigger", maybe_duplicate: bool = False) -> dict[str, Any]:
    """The webhook body for ``inc`` (Slack Block Kit: ``text`` + ``blocks``): header, the
    headline, facts as fields, root cause line, last good checkpoint, remediation, and the per-rank timeline
    as a code block, built from ``inc`` with every string redacted. ``text`` and the section
    under the header are the incident's :func:`~ckptwatch.detectors.headline.headline`. ``action`` ``escalate``
    / ``realert`` / ``update`` prefix the header; ``resolve`` gives :func:`resolved`.
    ``maybe_duplicate`` adds :data:`DUPLICATE_NOTE` to the closing context block. A trigger
    of an incident already resolved says RESOLVED in the header."""
    inc = redactor.incident(inc)
    if action == "resolve":
        return resolved(inc, maybe_duplicate=maybe_duplicate)
    rc = inc.root_cause
    fields = [
        f"*Job*\n{inc.job or 'not named in the logs'}",
        f"*Step*\n{'not logged' if inc.step is None else inc.step}",
        f"*Checkpoint*\n`{inc.checkpoint_path}`" if inc.checkpoint_path else "*Checkpoint*\npath not logged",
        f"*Severity*\n{inc.severity}",
        _why_field(inc),
        "*Collateral ranks*\n" + (", ".join(map(str, inc.collateral)) or "none"),
        "*Last good checkpoint*\n" + last_good(inc.last_good_checkpoint).removeprefix("last good: "),
    ]
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": _short(f"{_prefix(inc, action)}{inc.severity.upper()} "
                                                                          f"{inc.kind}: job {inc.job} {where(inc)}")}},
        _section(summary(inc)),
        {"type": "section", "fields": [{"type": "mrkdwn", "text": _fit(f, FIELD_MAX)} for f in fields[:10]]},
    ]
    if rc and rc.line:
        blocks.append(_section("*Initiating line*\n```" + rc.line + "```"))
    blocks.append(_section("*Do this*\n" + inc.remediation))
    if inc.commands:
        blocks.append(_section("*Commands*\n```" + "\n".join(f"{c['command']}  # {c['purpose']}" for c in inc.commands)
                               + "```"))
    lines = "\n".join(timeline(inc))
    blocks.append(_section("*Timeline*\n```" + _fit(lines, SECTION_MAX - 40) + "```"))
    blocks.append(_context(inc, maybe_duplicate))
    return {"text": summary(inc), "blocks": blocks[:50]}


def resolved(inc: Incident, *, maybe_duplicate: bool = False) -> dict[str, Any]:
    """A short message closing an incident: resolved (a later save completed on every rank),
    withdrawn (later lines showed it never held: :attr:`Incident.withdrawn` says why) or
    superseded (its save was re-classified as another incident). ``inc`` must be redacted
    already (:func:`message` does it)."""
    if inc.withdrawn:
        word, reason = "Withdrawn", inc.withdrawn
    else:
        word = "Superseded" if inc.status == "superseded" else "Resolved"
        reason = ("the save was re-classified; see the new incident" if inc.status == "superseded"
                  else "a later save of the job completed on every rank")
    text = f"{word}: {inc.kind} job {inc.job} {where(inc)} ({reason})"
    return {"text": text, "blocks": [
        _section(f":white_check_mark: *{word}* {inc.kind}: job {inc.job} {where(inc)}\n{reason}"),
        _context(inc, maybe_duplicate),
    ]}


class SlackChannel:
    """Posts :func:`message` to an incoming webhook ``url`` (a secret), with ``timeout``
    (:class:`~.http.Timeouts`, the read timeout growing per attempt). Not idempotent: see
    the module docstring."""

    idempotent = False

    def __init__(self, name: str, url: str, *, redactor: Redactor, timeout: Timeouts) -> None:
        self.name, self._url, self.redactor, self.timeout = name, url, redactor, timeout

    def deliver(self, n: Notification) -> Outcome:
        """POST :func:`message` of ``n`` (a possible-duplicate note when ``n.maybe_sent``)."""
        body = json.dumps(message(n.incident, redactor=self.redactor, action=n.action,
                                  maybe_duplicate=n.maybe_sent)).encode()
        return post(Request(self._url, body), self.timeout.for_attempt(n.attempts))
