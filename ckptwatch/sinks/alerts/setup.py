"""Building the :class:`~.dispatcher.Alerter` of ``run`` and ``sink`` from ``[alerts]``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Console

from ckptwatch.config import AlertSettings
from ckptwatch.sinks.alerts import channels as channel_types
from ckptwatch.sinks.alerts.dispatcher import Alerter
from ckptwatch.sinks.alerts.notification_log import NotificationLog
from ckptwatch.sinks.redact import Redactor
from ckptwatch.sinks.alerts.settings import parse_channels, parse_silences
from ckptwatch.sinks.alerts.silences import SilenceFile
from ckptwatch.sinks.duckdb_store import Store


def silences_path(settings: AlertSettings, db_path: str) -> str:
    """Where ``ckptwatch silence`` keeps silences for the database at ``db_path``."""
    return settings.silences_file or f"{db_path}.silences.json"


def alerter_from_config(settings: AlertSettings, store: Store, *, db_path: str, metrics: Any = None,
                        say: Callable[[str], None] | None = None, console: Console | None = None) -> Alerter:
    """The channels of ``settings`` (plus the default console channel when none is of type
    console), their secrets read now, the notification log in ``store`` and the silences
    of the config and of the silence file.

    Raises AlertConfigError (a channel, secret or silence) or RedactionError (a pattern file)."""
    say = say or (lambda msg: None)
    specs = list(parse_channels(settings.channels).values())
    if not any(s.type == "console" for s in specs):
        specs.append(channel_types.DEFAULT_CONSOLE)
    for spec in specs:
        for key, ref in spec.secrets.items():
            if ref.value:
                say(f"[alerts.channels.{spec.name}] {key} is written in the config file: "
                    f"prefer {key}_env or {key}_file, and keep the file private")
    redactor = Redactor.load(settings.redaction_files)
    built = [(s, channel_types.build(s, redactor=redactor, timeout=channel_types.timeouts(s, settings),
                                     console=console)) for s in specs]
    configured = parse_silences(settings.silences)
    silence_file = SilenceFile(silences_path(settings, db_path), on_error=say)
    silence_file.current()  # read now: a file broken later keeps these
    return Alerter(NotificationLog(store.con), built, settings=settings, redactor=redactor,
                   silences=lambda: configured + silence_file.current(), statuses=store.incident_statuses,
                   metrics=metrics, say=say)
