"""Dedup: what (if anything) to tell one channel about one version of an incident.

One alert per incident per channel. Later versions of an incident (more evidence, a
better root cause) say nothing new to whoever was paged, so they are not sent, unless
the severity rose (``escalate``) or the root cause changed (``update``: late evidence
named another rank or class than the page did). An incident that resolves (the job later completed a
save on every rank) or is superseded (its save was re-classified under another id) is
``resolve``-d on every channel that was alerted. Re-alerts after an interval are decided
by the dispatcher's periodic scan, not here.
"""

from __future__ import annotations

from ckptwatch.detectors.incident import Incident
from ckptwatch.sinks.alerts.notification_log import History
from ckptwatch.sinks.alerts.routing import severity_rank

CLOSED = ("resolved", "superseded")


def decide(inc: Incident, hist: History | None, *, routed: bool, silenced: bool) -> str | None:
    """``trigger`` | ``escalate`` | ``update`` | ``resolve`` | ``silenced`` (record the mute
    once) | None.

    ``hist``: what the channel was told so far (None: nothing); ``routed``: the channel's
    route takes this incident; ``silenced``: an active silence matches it. Resolves are
    sent even under a silence, so that nothing stays paged."""
    hist = hist or History()
    if inc.status in CLOSED:
        return "resolve" if hist.alerted and not hist.resolved else None
    if not routed:
        return None
    if silenced:
        return None if hist.silenced else "silenced"
    if not hist.alerted or hist.resolved:
        return "trigger"
    if severity_rank(inc.severity) > hist.max_severity:
        return "escalate"
    rc = inc.root_cause
    if hist.cause is not None and hist.cause != ((rc.cls, rc.rank) if rc else (None, None)):
        return "update"
    return None
