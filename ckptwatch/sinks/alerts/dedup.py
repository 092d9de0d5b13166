"""Dedup: what (if anything) to tell one channel about one version of an incident.

One alert per incident per channel. Later versions of an incident (more evidence, a
better root cause) say nothing new to whoever was paged, so they are not sent, unless
the severity rose (``escalate``) or the root cause changed (``update``: late evidence
named another rank or class than the page did). An incident that resolves (the job later completed a
save on every rank) or is superseded (its save was re-classified under another id) is
``resolve``-d on every channel that was alerted. Re-alerts after an interval are decided
by the dispatcher's periodic scan, not here.

A **provisional** incident (concluded before its evidence window closed:
:attr:`~ckptwatch.detectors.incident.Incident.provisional`) is not sent: the settled
version that follows is, so that the first page names the root cause the evidence settles
on rather than one a later line revises.

An incident first seen already **resolved** (the evidence that it happened and the
evidence that it ended arrived together: a backlog read after a restart or an outage,
``run --once``, a detector that concluded it only once the job had saved again) still
happened: its checkpoint is partial or corrupt on disk, and someone may resume from it.
Each channel that would have been alerted and was not is told once (:data:`NOTICE`: a
``trigger`` of the resolved version, then its ``resolve``, so that PagerDuty records an
alert and closes it at once). Not so for a ``superseded`` one (withdrawn: it never held,
or re-classified under another id), nor for a ``stalled_save`` that resolved (the save
or a later one completed: a stall is a condition that only matters while it lasts), nor
under a silence.
"""

from __future__ import annotations

from ckptwatch.detectors.incident import Incident
from ckptwatch.sinks.alerts.notification_log import History
from ckptwatch.sinks.alerts.routing import severity_rank

CLOSED = ("resolved", "superseded")
#: :func:`decide`'s answer for an incident first seen resolved: queue a trigger, then a resolve
NOTICE = "notice"
#: kinds whose resolution means nothing is left to do (see the module docstring): no notice
TRANSIENT_KINDS = ("stalled_save",)


def decide(inc: Incident, hist: History | None, *, routed: bool, silenced: bool) -> str | None:
    """``trigger`` | ``escalate`` | ``update`` | ``resolve`` | :data:`NOTICE` (first seen
    resolved: trigger, then resolve) | ``silenced`` (record the mute once) | None.

    ``hist``: what the channel was told so far (None: nothing); ``routed``: the channel's
    route takes this incident; ``silenced``: an active silence matches it. Resolves are
    sent even under a silence, so that nothing stays paged."""
    hist = hist or History()
    if inc.status in CLOSED:
        if hist.alerted:
            return None if hist.resolved else "resolve"
        if hist.grouped:
            return None  # told as part of its group's page; the group's own incident resolves it
        if inc.status == "resolved" and inc.kind not in TRANSIENT_KINDS and routed and not silenced:
            return NOTICE
        return None
    if not routed:
        return None
    if inc.provisional and not hist.alerted:
        return None  # its evidence window is still open: page the settled version, once
    if silenced:
        return None if hist.silenced else "silenced"
    if hist.grouped and not hist.alerted:
        return None  # under its group's page (the channel's group_by): told once, with the group
    if not hist.alerted or hist.resolved:
        return "trigger"
    if severity_rank(inc.severity) > hist.max_severity:
        return "escalate"
    rc = inc.root_cause
    if hist.cause is not None and hist.cause != ((rc.cls, rc.rank) if rc else (None, None)):
        return "update"
    return None
