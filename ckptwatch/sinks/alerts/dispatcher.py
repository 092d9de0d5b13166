"""The dispatcher: incidents in, notifications out, through the shared stages.

:meth:`Alerter.notify` (called with each new or changed incident, inside the same DuckDB
transaction that stores it) decides per channel with routing, silences and the log's
history (:func:`~.dedup.decide`) and queues notifications in the log. :meth:`Alerter.step`
(called every cycle of ``run`` / ``sink``) hands due notifications to a small thread pool
that only redacts and does HTTP, records the outcomes on the caller's thread (the database
is never touched from another thread), retries failures with exponential backoff
(``Retry-After`` wins, and pauses that channel), and every few seconds scans for re-alerts
and for muted incidents whose silence has ended.

Redaction is here, once for every channel: a channel is handed the incident with every
string redacted and cut (:meth:`~.redact.Redactor.incident`), never the raw one, so no field
of an incident, old or added later, can carry a secret out.

Delivery is at least once, duplicates are rare and marked:

* the read timeout is long (30 s by default; connect 5 s), so a slow receiver that will say
  200 is waited for rather than sent the notification again; a 2xx status counts as sent
  even if the response body never comes;
* an attempt whose outcome is unknown (the request was written, no status came) is
  retried, with a read timeout doubled per attempt (at most 4x), and recorded as
  ``maybe_sent``;
* before each send its start is committed to the log (``sending_ts``); a process killed
  between a send and its outcome finds it at restart and re-sends it as ``maybe_sent``;
* re-sends are harmless where the API has idempotency: PagerDuty folds events with the same
  ``dedup_key`` (the incident id) into one alert, webhook requests carry an
  ``Idempotency-Key`` header (same on every attempt of a notification). Slack incoming
  webhooks have none: a re-sent Slack message after an unknown outcome says it may be a
  duplicate (we prefer a possible duplicate to a lost page).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import duckdb

from ckptwatch.config import AlertSettings
from ckptwatch.detectors.incident import Incident
from ckptwatch.sinks.alerts.channels import Channel
from ckptwatch.sinks.alerts.dedup import CLOSED, NOTICE, decide
from ckptwatch.sinks.alerts.http import Outcome
from ckptwatch.sinks.alerts.notification_log import Notification, NotificationLog
from ckptwatch.sinks.redact import Redactor
from ckptwatch.sinks.alerts.routing import labels, routed
from ckptwatch.sinks.alerts.settings import ChannelSpec
from ckptwatch.sinks.alerts.silences import Silence

SCAN_EVERY = 5.0  # seconds between re-alert / silence-expiry scans


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


@dataclass
class AlertStats:
    """Counts of this process: notifications queued, sent, retried, rejected, expired, muted,
    grouped under another incident's page."""

    queued: int = 0
    sent: int = 0
    retried: int = 0
    rejected: int = 0
    expired: int = 0
    silenced: int = 0
    grouped: int = 0


class Alerter:
    """Routes incidents to ``channels`` (spec, channel) through ``log``.

    ``silences``: returns the silences in force (config + file; re-read as they change);
    ``statuses``: incident ids -> current status from the database (for the scans);
    ``metrics``: an object with ``alert_sent(channel, action)``, ``alert_failed(channel,
    reason)``, ``alert_retried(channel)`` and ``set_alerts_pending(channel, n)`` (the
    Prometheus metrics), or None; ``say``: one-line messages for the operator (failures);
    ``redactor``: applied to every incident before any channel sees it (default: the
    packaged patterns)."""

    def __init__(self, log: NotificationLog, channels: Sequence[tuple[ChannelSpec, Channel]], *,
                 settings: AlertSettings, silences: Callable[[], list[Silence]] = list,
                 statuses: Callable[[list[str]], dict[str, str]] | None = None, metrics: Any = None,
                 say: Callable[[str], None] | None = None, workers: int = 4,
                 redactor: Redactor | None = None) -> None:
        self.log = log
        self.redactor = redactor or Redactor.load()
        self.channels = {spec.name: (spec, ch) for spec, ch in channels}
        self.settings = settings
        self.silences = silences
        self.statuses = statuses or (lambda ids: {})
        self.metrics = metrics
        self.say = say or (lambda msg: None)
        self.stats = AlertStats()
        self._latest: dict[str, Incident] = {}
        self._inflight: dict[int, tuple[Notification, Future[Outcome]]] = {}
        self._paused: dict[str, dt.datetime] = {}  # channel -> no sends before (Retry-After)
        self._next_scan: dt.datetime | None = None
        self._refreshed: dict[str, dt.datetime] = {}  # channel -> when its firing alerts were last re-posted
        self._refreshing: dict[str, Future[Outcome]] = {}
        #: (channel, group_by label values) -> (incident paged, when): see ChannelSpec.group_by
        self._groups: dict[tuple[str, tuple[str, ...]], tuple[str, dt.datetime]] = {}
        self.pending_at_close: int | None = None  # set by close()
        #: called with each notification a channel accepted, once recorded (the fleet sink
        #: mirrors it to the notifications topic: :mod:`ckptwatch.services.notification_mirror`)
        self.on_sent: Callable[[Notification], None] | None = None
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ckptwatch-alert")
        self.log.reset_pending(_utcnow())
        if self.metrics is not None:
            for name in self.channels:
                self.metrics.declare_channel(name)

    @property
    def in_flight(self) -> int:
        """Sends started and not yet recorded."""
        return len(self._inflight)

    # -- deciding --------------------------------------------------------------------

    def notify(self, incidents: Iterable[Incident], now: dt.datetime | None = None) -> int:
        """Queue what each channel must be told about these incident versions; returns how
        many notifications were queued. Runs on the store's connection: call it inside
        the transaction that stores the incidents, so that both or neither happen."""
        now = now or _utcnow()
        incs = list(incidents)
        for inc in incs:
            self._latest[inc.id] = inc
        active = [s for s in self.silences() if s.active(now)]
        queued = 0
        for name, (spec, _) in self.channels.items():
            history = self.log.history(name, [i.id for i in incs])
            for inc in incs:
                lbls = labels(inc)
                action = decide(inc, history.get(inc.id), routed=routed(spec, inc),
                                silenced=any(s.mutes(lbls, now) for s in active))
                if action == "silenced":
                    self.log.enqueue(name, inc, "trigger", now, status="silenced")
                    self.stats.silenced += 1
                    if self.metrics is not None:
                        self.metrics.alert_silenced(name)
                    note = getattr(self.channels[name][1], "silenced", None)
                    if note is not None:  # the console shows what was muted, and by what
                        muting = next(s for s in active if s.mutes(lbls, now))
                        note(self.redactor.incident(inc), muting)
                elif action == NOTICE:  # resolved before any alert: told once, opened and closed
                    self.log.enqueue(name, inc, "trigger", now)
                    self.log.enqueue(name, inc, "resolve", now)
                    queued += 2
                elif action == "trigger" and (under := self._group_of(spec, inc, lbls, now)) is not None:
                    self.log.enqueue(name, inc, "trigger", now, status="grouped",
                                     note=f"grouped under incident {under} ({self._group_text(spec, lbls)})")
                    self.stats.grouped += 1
                elif action:
                    self.log.enqueue(name, inc, action, now)
                    queued += 1
        self.stats.queued += queued
        return queued

    def _group_of(self, spec: ChannelSpec, inc: Incident, lbls: dict[str, str], now: dt.datetime) -> str | None:
        """The incident that ``inc``'s trigger is grouped under on ``spec``'s channel (same
        ``group_by`` labels, paged less than ``group_window`` ago), or None: then ``inc``
        pages and opens the group."""
        if not spec.group_by:
            return None
        key = tuple(lbls.get(label, "") for label in spec.group_by)
        if not all(key):
            return None
        first = self._groups.get((spec.name, key))
        if first is not None and first[0] != inc.id and (now - first[1]).total_seconds() <= spec.group_window:
            return first[0]
        self._groups[(spec.name, key)] = (inc.id, now)
        return None

    @staticmethod
    def _group_text(spec: ChannelSpec, lbls: dict[str, str]) -> str:
        return ", ".join(f"{label}={lbls.get(label, '')}" for label in spec.group_by)

    def _refresh(self, now: dt.datetime) -> None:
        """Re-post the firing alerts of channels that keep alerts alive by re-sending them
        (a ``refresh(incidents)`` method and a ``resend_interval``: Alertmanager), once per
        interval, on the pool; a failed re-post is said once and tried at the next interval."""
        for name, (_, ch) in self.channels.items():
            every = float(getattr(ch, "resend_interval", 0) or 0)
            if not every or not hasattr(ch, "refresh"):
                continue
            fut = self._refreshing.get(name)
            if fut is not None:
                if not fut.done():
                    continue
                del self._refreshing[name]
                out = fut.result() if fut.exception() is None else Outcome("retry", error=str(fut.exception()))
                if out.status != "sent":
                    self.say(f"alerts to {name}: re-posting the firing alerts failed ({out.error}); "
                             f"next try in {every:g} s")
            last = self._refreshed.get(name)
            if last is not None and (now - last).total_seconds() < every:
                continue
            firing = self.log.firing(name)
            statuses = self.statuses([inc.id for inc in firing]) if firing else {}
            incs = [self.redactor.incident(self._latest.get(inc.id, inc)) for inc in firing
                    if statuses.get(inc.id, self._latest.get(inc.id, inc).status) not in CLOSED]
            self._refreshed[name] = now
            if incs:
                self._refreshing[name] = self._pool.submit(ch.refresh, incs)

    def _scan(self, now: dt.datetime) -> None:
        """Re-alerts (``realert_interval``), incidents whose silence has ended, and the
        re-posts of channels that need them (:meth:`_refresh`)."""
        self._refresh(now)
        candidates: list[tuple[str, Incident, str]] = []
        if self.settings.realert_interval > 0:
            before = now - dt.timedelta(seconds=self.settings.realert_interval)
            candidates += [(ch, inc, "realert") for ch, inc in self.log.stale_alerts(before)]
        candidates += [(ch, inc, "trigger") for ch, inc in self.log.only_silenced()]
        if not candidates:
            return
        statuses = self.statuses(sorted({inc.id for _, inc, _ in candidates}))
        active = [s for s in self.silences() if s.active(now)]
        for name, snap, action in candidates:
            inc = self._latest.get(snap.id, snap)
            if name not in self.channels or statuses.get(inc.id, inc.status) in CLOSED:
                continue
            spec, _ = self.channels[name]
            if routed(spec, inc) and not any(s.mutes(labels(inc), now) for s in active):
                self.log.enqueue(name, inc, action, now)
                self.stats.queued += 1

    # -- delivering ------------------------------------------------------------------

    def step(self, now: dt.datetime | None = None) -> int:
        """Record finished sends, scan when due, start due sends. Returns the work done and
        in progress (outcomes recorded + sends in flight): 0 means nothing to wait for
        now (retries scheduled later do not count)."""
        now = now or _utcnow()
        work = self._collect(now)
        if self._next_scan is None or now >= self._next_scan:
            self._scan(now)
            self._next_scan = now + dt.timedelta(seconds=SCAN_EVERY)
        paused = [ch for ch, until in self._paused.items() if until > now]
        for n in self.log.due(now, skip=self._inflight, paused=paused):
            entry = self.channels.get(n.channel)
            if entry is None:
                self.log.mark_failed(n.id, "rejected", f"channel {n.channel!r} is no longer configured")
                self._failed(n, "rejected")
                continue
            self.log.mark_sending(n.id, now)  # committed before any byte leaves: see the module docstring
            self._inflight[n.id] = (n, self._pool.submit(self._deliver, entry[1], n))
        if self.metrics is not None:
            pending = self.log.pending_counts()
            for name in self.channels:
                self.metrics.set_alerts_pending(name, pending.get(name, 0))
        return work + len(self._inflight)

    def _deliver(self, channel: Channel, n: Notification) -> Outcome:
        """On a worker thread: redact the whole incident, then let the channel send it."""
        return channel.deliver(dataclasses.replace(n, incident=self.redactor.incident(n.incident)))

    def _collect(self, now: dt.datetime) -> int:
        done = [nid for nid, (_, fut) in self._inflight.items() if fut.done()]
        for nid in done:
            n, fut = self._inflight.pop(nid)
            try:
                out = fut.result()
            except Exception as e:  # a bug rendering this notification: do not retry forever
                out = Outcome("rejected", f"internal error: {type(e).__name__}: {e}")
            self._record(n, out, now)
        return len(done)

    def _record(self, n: Notification, out: Outcome, now: dt.datetime) -> None:
        where = f"alert {n.action} of incident {n.incident.id} to {n.channel}"
        if out.status == "sent":
            self.log.mark_sent(n.id, now)
            self.stats.sent += 1
            if self.on_sent is not None:
                self.on_sent(n)
            if self.metrics is not None:
                self.metrics.alert_sent(n.channel, n.action)
            return
        if out.status == "rejected":
            self.log.mark_failed(n.id, "rejected", out.error)
            self.say(f"{where}: rejected ({out.error}); recorded, not retried")
            self._failed(n, "rejected")
            return
        age = (now - n.created_ts).total_seconds()
        if age >= self.settings.give_up_after:
            self.log.mark_failed(n.id, "expired", out.error)
            self.say(f"{where}: still failing after {age:.0f} s ({out.error}); gave up")
            self._failed(n, "expired")
            return
        backoff = min(self.settings.retry_max, self.settings.retry_initial * 2 ** n.attempts)
        wait = backoff if out.retry_after is None else max(out.retry_after, backoff)  # a past date is no licence
        if out.retry_after is not None:
            self._paused[n.channel] = now + dt.timedelta(seconds=wait)
        self.log.mark_retry(n.id, now + dt.timedelta(seconds=wait), out.error, maybe_sent=out.maybe_delivered)
        self.stats.retried += 1
        if self.metrics is not None:
            self.metrics.alert_retried(n.channel)
        if n.attempts == 0:
            self.say(f"{where}: {out.error}; retrying (next in {wait:g} s)")
        if out.maybe_delivered and not getattr(self.channels.get(n.channel, (None, None))[1], "idempotent", True):
            self.say(f"{where}: the receiver may have it already and cannot deduplicate: the retry is marked "
                     "as a possible duplicate")

    def _failed(self, n: Notification, reason: str) -> None:
        if reason == "rejected":
            self.stats.rejected += 1
        else:
            self.stats.expired += 1
        if self.metrics is not None:
            self.metrics.alert_failed(n.channel, reason)

    def drain(self, timeout: float) -> int:
        """Deliver until nothing is due now or in flight, for at most ``timeout`` seconds;
        returns how many notifications are still pending (they stay in the outbox for the
        next run)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            now = _utcnow()
            self.step(now)
            nxt = self.log.next_attempt()
            left = dt.timedelta(seconds=deadline - time.monotonic())
            if not self._inflight and (nxt is None or nxt > now + left):
                break
            time.sleep(0.05)
        return sum(self.log.pending_counts().values())

    def close(self) -> None:
        """Wait for sends in flight (each bounded by its timeout) and record them; then
        :attr:`pending_at_close` says how many notifications stay queued for the next run."""
        self._pool.shutdown(wait=True)
        try:
            self._collect(_utcnow())
        except duckdb.Error as e:  # e.g. a full disk at shutdown: the sends stay marked as started
            self.say(f"alerts: the outcome of sends in flight could not be recorded ({str(e).splitlines()[0]}); "
                     "they are sent again at the next start, marked as possible duplicates")
        self.pending_at_close = sum(self.log.pending_counts().values())

    def summary(self) -> str:
        """One line for the operator: what this process sent, gave up on, left queued, and
        the notifications silences muted (one per channel and incident)."""
        s = self.stats
        pending = self.pending_at_close
        if pending is None:
            pending = sum(self.log.pending_counts().values())
        text = (f"alerts: {s.sent} sent, {s.rejected} rejected, {s.expired} expired, {pending} pending, "
                f"{s.silenced} silenced" + (f", {s.grouped} grouped" if s.grouped else ""))
        return text + (" (retried on the next run)" if pending else "")

    @property
    def undelivered(self) -> bool:
        """Something this process queued or tried was not delivered (rejected, expired, or
        still pending)."""
        return bool(self.stats.rejected or self.stats.expired or self.pending_at_close)
