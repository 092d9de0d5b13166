"""Channel types and how a :class:`~.settings.ChannelSpec` becomes a channel.

A channel is anything with a ``name`` and ``deliver(notification) -> Outcome`` (see
:class:`Channel`); it renders the notification in its API's format and sends it once.
Dedup, routing, silences, retries and the log are the dispatcher's, shared by all.
A new channel type is one new module plus one line in :func:`build`.
"""

from __future__ import annotations

from typing import Any, Protocol

from rich.console import Console

from ckptwatch.sinks.alerts.alertmanager import RESEND_INTERVAL, AlertmanagerChannel
from ckptwatch.sinks.alerts.console import ConsoleChannel
from ckptwatch.sinks.alerts.http import CONNECT_TIMEOUT, Outcome, Timeouts, check_url
from ckptwatch.sinks.alerts.notification_log import Notification
from ckptwatch.sinks.alerts.pagerduty import PagerDutyChannel
from ckptwatch.sinks.redact import Redactor
from ckptwatch.sinks.alerts.settings import AlertConfigError, ChannelSpec
from ckptwatch.sinks.alerts.slack import SlackChannel
from ckptwatch.sinks.alerts.webhook import WebhookChannel

#: The console channel ``run`` and ``sink`` add when the config names none.
DEFAULT_CONSOLE = ChannelSpec(name="console", type="console", min_severity="info", match={}, secrets={}, options={})


class Channel(Protocol):
    """A notification channel. ``deliver`` must not raise for network or HTTP errors.

    ``idempotent``: a second delivery of the same notification is harmless at the receiver
    (PagerDuty folds events by ``dedup_key``, webhook receivers by ``Idempotency-Key``);
    False for Slack, whose incoming webhooks have no idempotency key. The dispatcher
    re-sends either way (at least once) after an unknown outcome; a non-idempotent channel
    marks the re-send as a possible duplicate."""

    name: str
    idempotent: bool

    def deliver(self, n: Notification) -> Outcome: ...


def timeouts(spec: ChannelSpec, settings: Any = None) -> Timeouts:
    """The channel's :class:`~.http.Timeouts`: its ``connect_timeout`` / ``read_timeout``
    (or ``timeout``), else ``settings.connect_timeout`` / ``settings.timeout`` (the
    ``[alerts]`` table), else the defaults of :mod:`.http` (5 s / 30 s)."""
    connect = spec.connect_timeout or float(getattr(settings, "connect_timeout", 0) or CONNECT_TIMEOUT)
    read = spec.read_timeout or spec.timeout or float(getattr(settings, "timeout", 0) or Timeouts().read)
    return Timeouts(connect=connect, read=read)


def build(spec: ChannelSpec, *, redactor: Redactor, timeout: Timeouts, console: Console | None = None) -> Channel:
    """The channel of ``spec``, its secrets read now. ``timeout``: the :class:`~.http.Timeouts`
    of its requests (see :func:`timeouts`). Raises AlertConfigError for a secret that cannot
    be read or a URL that cannot be an endpoint (naming the key and variable, never the value)."""
    secret = {k: ref.resolve() for k, ref in spec.secrets.items()}
    url = secret.get("url") or spec.options.get("url")
    reason = check_url(url) if url else None
    if reason:
        ref = spec.secrets.get("url")
        how = f"url_env: {ref.env}" if ref and ref.env else f"url_file: {ref.file}" if ref and ref.file else "url"
        raise AlertConfigError(f"[alerts.channels.{spec.name}] {how}: the value {reason}")
    t = timeout
    if spec.type == "slack":
        return SlackChannel(spec.name, secret["url"], redactor=redactor, timeout=t)
    if spec.type == "pagerduty":
        return PagerDutyChannel(spec.name, secret["routing_key"], url=spec.options["url"],
                                source=spec.options["source"], redactor=redactor, timeout=t)
    if spec.type == "alertmanager":
        return AlertmanagerChannel(spec.name, secret["url"], redactor=redactor, timeout=t, static_labels=spec.labels,
                                   console_url=spec.options.get("console_url", ""),
                                   runbook_url=spec.options.get("runbook_url", ""),
                                   resend_interval=float(spec.options.get("resend_interval", RESEND_INTERVAL)))
    if spec.type == "webhook":
        return WebhookChannel(spec.name, secret["url"], secret=secret.get("secret", ""), redactor=redactor, timeout=t)
    return ConsoleChannel(spec.name, redactor=redactor, console=console)
