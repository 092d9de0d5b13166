"""The notification log mirrored to a compacted topic, so a sink on a new database does not
page again what was paged.

The sink's notification log (table ``alerts``, :mod:`ckptwatch.sinks.alerts.notification_log`)
lives in its DuckDB file. A sink started on a new file, or after losing it, reads the
incidents topic from its beginning (up to its retention, 7 days by default) and would page
every incident in it again. So every notification a channel accepts is also published to
``[kafka] notifications_topic`` (compacted; key ``<channel>|<incident id>``; value: what
that channel was told of that incident, :meth:`NotificationLog.state
<ckptwatch.sinks.alerts.notification_log.NotificationLog.state>`), and a sink whose log is
empty reads the topic to its end before it consumes anything and records those states as
sent (:meth:`NotificationLog.restore
<ckptwatch.sinks.alerts.notification_log.NotificationLog.restore>`). Incidents told before
are then updated, escalated or resolved as usual, never triggered again.

A notification sent and not yet mirrored when the database is lost may be sent again (at
least once). Value (JSON)::

    {"channel": "pager", "incident_id": "8ea36dbeed8d58eb", "max_severity": "critical",
     "resolved": false, "silenced": false, "sent_ts": "2026-12-01T10:21:51+00:00",
     "incident": {... the version last told, without evidence ...}}
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable

from ckptwatch.config import KafkaSettings
from ckptwatch.kafka.codec import DecodeError
from ckptwatch.kafka.consumer import read_to_end
from ckptwatch.kafka.producer import Message, Publisher
from ckptwatch.sinks.alerts.notification_log import Notification, NotificationLog

_KEYS = ("channel", "incident_id", "max_severity", "resolved", "incident")


def key(channel: str, incident_id: str) -> bytes:
    """The record key of one channel's notifications about one incident."""
    return f"{channel}|{incident_id}".encode()


def encode_state(state: dict) -> bytes:
    """One notifications-topic value (see the module docstring)."""
    return json.dumps(state, sort_keys=True, default=str).encode()


def decode_state(value: bytes) -> dict:
    """Inverse of :func:`encode_state`. Raises DecodeError when ``value`` is not one."""
    try:
        d = json.loads(value)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise DecodeError(f"not a notification state: {e}") from None
    if not isinstance(d, dict) or any(k not in d for k in _KEYS) or not isinstance(d["incident"], dict):
        raise DecodeError(f"not a notification state: needs {', '.join(_KEYS)}")
    return d


def restore(settings: KafkaSettings, log: NotificationLog, *, now: dt.datetime | None = None,
            say: Callable[[str], None] | None = None) -> int:
    """When ``log`` is empty, read ``settings.notifications_topic`` to its end and record the
    latest state of each ``(channel, incident)`` in it; returns how many were restored (0
    when the log was not empty). Bad records are told to ``say`` and skipped.

    Raises KafkaError when the topic cannot be read (the sink must not start paging then)."""
    if not log.is_empty():
        return 0
    say = say or (lambda msg: None)
    latest: dict[bytes, dict] = {}
    for r in read_to_end(settings, settings.notifications_topic, client_id="ckptwatch-sink-restore"):
        if r.value is None:
            latest.pop(r.key, None)  # a tombstone
            continue
        try:
            latest[r.key] = decode_state(r.value)
        except DecodeError as e:
            say(f"{r.topic} partition {r.partition} offset {r.offset}: skipped: {e}")
    return log.restore(latest.values(), now or dt.datetime.now(dt.timezone.utc))


class Mirror:
    """Publishes the state of each notification a channel accepted (call :meth:`sent` from
    the alerter, :meth:`flush` after each step) with ``publisher`` (blocks until the broker
    acknowledges, waiting out outages)."""

    def __init__(self, settings: KafkaSettings, publisher: Publisher, log: NotificationLog) -> None:
        self.topic, self.publisher, self.log = settings.notifications_topic, publisher, log
        self._pending: dict[tuple[str, str], None] = {}
        self.published = 0

    def sent(self, n: Notification) -> None:
        """``n`` was accepted by its channel (recorded in the log)."""
        self._pending[(n.channel, n.incident.id)] = None

    def flush(self) -> int:
        """Publish the pending states; returns how many."""
        if not self._pending:
            return 0
        msgs = []
        for channel, iid in self._pending:
            state = self.log.state(channel, iid)
            if state is not None:
                msgs.append(Message(self.topic, key(channel, iid), encode_state(state)))
        self.publisher.publish(msgs)
        self._pending.clear()
        self.published += len(msgs)
        return len(msgs)
