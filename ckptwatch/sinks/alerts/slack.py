"""Slack channel: incoming-webhook messages in Block Kit (the sender comes with the rest of
issue 4).

Limits (Slack Block Kit reference): a ``header`` block's plain text at most 150 characters,
a ``section`` block's text at most 3000, a section's ``fields`` at most 10 of at most 2000
characters each, at most 50 blocks per message; the top-level ``text`` is the notification
fallback. Longer text is cut with a note saying so: a message is never refused for its
size. Every log line passes through the redactor first.
"""

from __future__ import annotations

from typing import Any

from ckptwatch.detectors.incident import Incident
from ckptwatch.sinks.alerts.pagerduty import summary
from ckptwatch.sinks.alerts.redact import Redactor
from ckptwatch.sinks.report import timeline

HEADER_MAX = 150
SECTION_MAX = 3000
FIELD_MAX = 2000
_CUT = "\n… (cut to fit Slack; full evidence in DuckDB: incident_evidence)"


def _fit(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - len(_CUT)] + _CUT


def _section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": _fit(text, SECTION_MAX)}}


def message(inc: Incident, *, redactor: Redactor) -> dict[str, Any]:
    """The webhook body for ``inc``: header, facts as fields, root cause line, last good
    checkpoint, remediation, and the per-rank timeline as a code block."""
    rc = inc.root_cause
    lg = inc.last_good_checkpoint
    fields = [
        f"*Job*\n{inc.job}", f"*Step*\n{inc.step}", f"*Checkpoint*\n`{inc.checkpoint_path}`",
        f"*Severity*\n{inc.severity}",
        "*Root cause*\n" + (f"{rc.cls}" + (f" ({rc.signal})" if rc.signal else "") + f", rank {rc.rank}, "
                            f"host {rc.host}, pid {rc.pid}, {rc.ts:%Y-%m-%d %H:%M:%S} UTC" if rc and rc.ts else "unknown"),
        "*Collateral ranks*\n" + (", ".join(map(str, inc.collateral)) or "none"),
        "*Last good checkpoint*\n" + (f"step {lg.get('step')} `{lg.get('path')}`" if lg else "none seen"),
    ]
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": _fit(f"{inc.severity.upper()} {inc.kind}: "
                                                                        f"job {inc.job} step {inc.step}", HEADER_MAX)}},
        {"type": "section", "fields": [{"type": "mrkdwn", "text": _fit(f, FIELD_MAX)} for f in fields[:10]]},
    ]
    if rc and rc.line:
        blocks.append(_section("*Initiating line*\n```" + redactor.redact(rc.line) + "```"))
    blocks.append(_section("*Do this*\n" + redactor.redact(inc.remediation)))
    lines = "\n".join(redactor.redact(line) for line in timeline(inc))
    blocks.append(_section("*Timeline*\n```" + _fit(lines, SECTION_MAX - 40) + "```"))
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": f"ckptwatch incident `{inc.id}`"}]})
    return {"text": summary(inc), "blocks": blocks[:50]}
