"""The ``[alerts]`` tables: channels (with their routes and secrets) and silences.

A channel table (``[alerts.channels.NAME]``)::

    type = "slack"               # slack | pagerduty | webhook | alertmanager | console
    url_env = "SLACK_WEBHOOK_URL"
    min_severity = "error"       # route: this severity or higher (default per type below)
    match = { job = ["llama-*"], kind = ["interrupted_save", "poisoned_resume"] }
    connect_timeout = 5          # seconds to connect (and TLS handshake); nothing is sent yet
    read_timeout = 30            # seconds to wait for the answer once the request is sent

An ``alertmanager`` channel posts to Alertmanager's API v2 (:mod:`.alertmanager`): ``url``
(its base URL), and optionally ``labels = { cluster = "a" }`` (added to every alert),
``console_url`` (the web console's base URL, for each alert's ``incident_url``),
``runbook_url`` (``{kind}`` is replaced) and ``resend_interval`` (seconds, default 60).

Secrets (``url`` of slack, webhook and alertmanager, ``routing_key`` of pagerduty, ``secret`` of webhook)
are given as ``KEY_env`` (an environment variable's name) or ``KEY_file`` (a file holding
the value; surrounding whitespace stripped); writing ``KEY`` itself works for non-secret
test endpoints. Values are read when the alerter starts, never printed, never stored.

``connect_timeout`` and ``read_timeout`` (seconds; 0 or absent: the default) default to
``[alerts] connect_timeout`` (5 s) and ``[alerts] timeout`` (the read timeout); a channel's
``timeout`` is its read timeout under the old name. A long read timeout keeps a slow
receiver that will answer 200 from being sent the notification again.

``group_by = ["storage_host"]`` (with ``group_window``, seconds, default 600) pages once
for incidents that share those labels: a trigger whose labels equal those of an incident
this channel paged less than ``group_window`` ago is recorded as ``grouped`` under it, not
sent (one page for one storage outage under many jobs), and stays so. Incidents with an
empty value for a ``group_by`` label are not grouped. Groups live in the process: after a
restart the next one pages anew.

``match`` maps a label (:data:`LABELS`) to glob patterns; an incident is routed to the
channel when its severity is at least ``min_severity`` and, for every label listed, its
value matches one of the patterns.

A silence (``[[alerts.silences]]`` or ``ckptwatch silence add``) holds label globs and a
required ``expires`` (ISO 8601, UTC when no zone is given), plus an optional ``comment``.
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass, field
from typing import Any

from ckptwatch.detectors.incident import SEVERITIES


class AlertConfigError(Exception):
    """An alert channel or silence table that cannot be used; names the table and key.
    Never contains a secret's value."""


#: Incident labels that routes and silences match on (see :func:`ckptwatch.sinks.alerts.routing.labels`).
LABELS = ("job", "kind", "severity", "host", "cause", "storage_host")
TYPES = ("slack", "pagerduty", "webhook", "alertmanager", "console")
#: Default route per channel type: pages only for critical incidents (interrupted saves,
#: poisoned resumes, storage failures during saves, partial and corrupt checkpoints).
#: Alertmanager takes every incident: its own routes decide who is paged.
DEFAULT_MIN_SEVERITY = {"console": "info", "slack": "warning", "webhook": "info", "pagerduty": "critical",
                        "alertmanager": "info"}
PAGERDUTY_URL = "https://events.pagerduty.com/v2/enqueue"
_SECRETS = {"slack": ("url",), "webhook": ("url", "secret"), "pagerduty": ("routing_key",), "alertmanager": ("url",),
            "console": ()}
_REQUIRED = {"slack": ("url",), "webhook": ("url",), "pagerduty": ("routing_key",), "alertmanager": ("url",),
             "console": ()}
_PLAIN = {"type", "min_severity", "match", "timeout", "connect_timeout", "read_timeout", "group_by", "group_window"}
#: seconds: a trigger whose group_by labels equal those of one paged this long ago or less is grouped
GROUP_WINDOW = 600.0
_PLAIN_BY_TYPE = {"pagerduty": {"url", "source"}, "slack": set(), "webhook": set(), "console": set(),
                  "alertmanager": {"labels", "console_url", "runbook_url", "resend_interval"}}


@dataclass(frozen=True)
class SecretRef:
    """Where a secret comes from: ``env`` (a variable name), ``file`` (a path) or a literal
    ``value``. :meth:`resolve` reads it."""

    where: str
    env: str = ""
    file: str = ""
    value: str = field(default="", repr=False)

    def resolve(self) -> str:
        """The secret. Raises AlertConfigError (naming the variable or file, not the value)."""
        if self.env:
            v = os.environ.get(self.env, "")
            if not v:
                raise AlertConfigError(f"{self.where}_env: environment variable {self.env} is not set")
            return v
        if self.file:
            try:
                with open(self.file) as f:
                    v = f.read().strip()
            except OSError as e:
                raise AlertConfigError(f"{self.where}_file: cannot read {self.file}: {e.strerror or e}") from None
            if not v:
                raise AlertConfigError(f"{self.where}_file: {self.file} is empty")
            return v
        return self.value


@dataclass(frozen=True)
class ChannelSpec:
    """One ``[alerts.channels.NAME]`` table, checked. ``secrets``: key -> :class:`SecretRef`;
    ``options``: the non-secret keys of the type (pagerduty ``url``, ``source``; alertmanager
    ``console_url``, ``runbook_url``, ``resend_interval``); ``labels``: an alertmanager
    channel's static labels;
    ``timeout``: the old name of ``read_timeout``; ``connect_timeout`` / ``read_timeout``:
    seconds (0: the ``[alerts]`` default, see :func:`ckptwatch.sinks.alerts.channels.timeouts`)."""

    name: str
    type: str
    min_severity: str
    match: dict[str, tuple[str, ...]]
    secrets: dict[str, SecretRef]
    options: dict[str, str]
    timeout: float = 0.0
    connect_timeout: float = 0.0
    read_timeout: float = 0.0
    labels: dict[str, str] = field(default_factory=dict)
    group_by: tuple[str, ...] = ()
    group_window: float = GROUP_WINDOW


def _severity(value: Any, where: str) -> str:
    if value not in SEVERITIES:
        raise AlertConfigError(f"{where}: {value!r} is not a severity ({', '.join(SEVERITIES)})")
    return value


def _match(value: Any, where: str) -> dict[str, tuple[str, ...]]:
    if not isinstance(value, dict):
        raise AlertConfigError(f"{where}: must be a table of label = [glob, ...]")
    out = {}
    for label, globs in value.items():
        if label not in LABELS:
            raise AlertConfigError(f"{where}: unknown label {label!r} (labels: {', '.join(LABELS)})")
        globs = [globs] if isinstance(globs, str) else globs
        if not isinstance(globs, list) or not globs or not all(isinstance(g, str) for g in globs):
            raise AlertConfigError(f"{where}.{label}: must be a glob or a list of globs")
        out[label] = tuple(globs)
    return out


def _a(word: str) -> str:
    return ("an " if word[:1] in "aeiou" else "a ") + word


def parse_channel(name: str, table: Any) -> ChannelSpec:
    """Check one channel table. Raises AlertConfigError naming ``[alerts.channels.NAME] key``."""
    where = f"[alerts.channels.{name}]"
    if not isinstance(table, dict):
        raise AlertConfigError(f"{where}: must be a table")
    typ = table.get("type")
    if typ not in TYPES:
        raise AlertConfigError(f"{where} type: must be one of {', '.join(TYPES)} (got {typ!r})")
    secret_keys = _SECRETS[typ]
    known = _PLAIN | _PLAIN_BY_TYPE[typ] | {s + suffix for s in secret_keys for suffix in ("", "_env", "_file")}
    for key in table:
        if key not in known:
            raise AlertConfigError(f"{where} {key}: unknown key for {_a(typ)} channel (known: {', '.join(sorted(known))})")
    secrets = {}
    for s in secret_keys:
        given = [k for k in (s, s + "_env", s + "_file") if k in table]
        if len(given) > 1:
            raise AlertConfigError(f"{where} {s}: give one of {', '.join(given)}, not several")
        for k in given:
            if not isinstance(table[k], str) or not table[k]:
                raise AlertConfigError(f"{where} {k}: must be a non-empty string")
        if given:
            key = given[0]
            kw = {"env": table[key]} if key.endswith("_env") else {"file": table[key]} if key.endswith("_file") \
                else {"value": table[key]}
            secrets[s] = SecretRef(where=f"{where} {s}", **kw)
        elif s in _REQUIRED[typ]:
            raise AlertConfigError(f"{where}: {_a(typ)} channel needs {s}_env, {s}_file or {s}")
    seconds = {}
    for key in ("timeout", "connect_timeout", "read_timeout"):
        v = table.get(key, 0.0)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            raise AlertConfigError(f"{where} {key}: must be a number of seconds (0: the default)")
        seconds[key] = float(v)
    static: dict[str, str] = {}
    if "labels" in table:
        from ckptwatch.sinks.alerts.alertmanager import check_labels

        try:
            static = check_labels(table["labels"], f"{where} labels")
        except ValueError as e:
            raise AlertConfigError(str(e)) from None
    if "resend_interval" in table:
        v = table["resend_interval"]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            raise AlertConfigError(f"{where} resend_interval: must be a positive number of seconds")
    group_by = table.get("group_by", [])
    if isinstance(group_by, str):
        group_by = [group_by]
    if not isinstance(group_by, list) or any(g not in LABELS for g in group_by):
        raise AlertConfigError(f"{where} group_by: a list of labels ({', '.join(LABELS)})")
    if group_by and typ in ("alertmanager", "console"):
        raise AlertConfigError(f"{where} group_by: {typ} channels do not group (Alertmanager groups by its own route)")
    window = table.get("group_window", GROUP_WINDOW)
    if isinstance(window, bool) or not isinstance(window, (int, float)) or window <= 0:
        raise AlertConfigError(f"{where} group_window: must be a positive number of seconds")
    options = {k: str(table[k]) for k in _PLAIN_BY_TYPE[typ] if k in table and k != "labels"}
    if typ == "pagerduty":
        options.setdefault("url", PAGERDUTY_URL)
        options.setdefault("source", "ckptwatch")
    return ChannelSpec(
        name=name, type=typ, min_severity=_severity(table.get("min_severity", DEFAULT_MIN_SEVERITY[typ]),
                                                    f"{where} min_severity"),
        match=_match(table.get("match", {}), f"{where} match"), secrets=secrets, options=options,
        labels=static, group_by=tuple(group_by), group_window=float(window), **seconds,
    )


def parse_channels(tables: Any) -> dict[str, ChannelSpec]:
    """Check every ``[alerts.channels.*]`` table; name -> spec."""
    if not isinstance(tables, dict):
        raise AlertConfigError("[alerts] channels: must be a table of channel tables")
    return {name: parse_channel(name, t) for name, t in tables.items()}


def parse_time(value: Any, where: str) -> dt.datetime:
    """An ISO 8601 time (TOML datetimes too) as an aware UTC datetime; naive means UTC."""
    if isinstance(value, str):
        try:
            value = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise AlertConfigError(f"{where}: {value!r} is not an ISO 8601 time") from None
    if not isinstance(value, dt.datetime):
        raise AlertConfigError(f"{where}: must be an ISO 8601 time such as 2026-12-01T00:00:00Z")
    return value.replace(tzinfo=dt.timezone.utc) if value.tzinfo is None else value.astimezone(dt.timezone.utc)


def parse_silences(tables: Any) -> list[Any]:
    """Check ``[[alerts.silences]]`` tables; returns
    :class:`ckptwatch.sinks.alerts.silences.Silence` objects with ids ``config-1``, ..."""
    from ckptwatch.sinks.alerts.silences import Silence

    if not isinstance(tables, list):
        raise AlertConfigError("[alerts] silences: must be an array of tables ([[alerts.silences]])")
    return [Silence.from_dict({"id": f"config-{i + 1}", **t}, f"[[alerts.silences]] #{i + 1}")
            for i, t in enumerate(tables)]
