"""Topic creation: the events, incidents and saves topics, created if missing."""

from __future__ import annotations

import time
from collections.abc import Callable

from kafka import KafkaAdminClient
from kafka.admin import NewTopic
from kafka.errors import KafkaTimeoutError, TopicAlreadyExistsError

from ckptwatch.config import KafkaSettings
from ckptwatch.kafka import configuration


class BrokerUnavailable(Exception):
    """The broker did not answer within the time given; the message names the address."""


def ensure_topics(settings: KafkaSettings, *, timeout: float = 60.0,
                  on_wait: Callable[[str], None] | None = None) -> None:
    """Create ``settings.events_topic``, ``settings.incidents_topic`` and
    ``settings.saves_topic`` with ``settings.partitions`` partitions if they do not exist (an
    existing topic is left as it is). The saves topic is compacted: only the latest fact of
    each checkpoint matters. Retries while the broker is unreachable, for up to ``timeout`` seconds, telling
    ``on_wait`` so.

    Raises BrokerUnavailable after ``timeout``; KafkaError for a refusal (e.g. ACLs)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            admin = KafkaAdminClient(**configuration.admin(settings, "ckptwatch-admin"))
            break
        except KafkaTimeoutError:  # "Unable to bootstrap": no broker answers
            if on_wait:
                on_wait(f"waiting for Kafka at {settings.bootstrap_servers} (no broker answers)")
            if time.monotonic() > deadline:
                raise BrokerUnavailable(f"no Kafka broker at {settings.bootstrap_servers} after {timeout:.0f} s") from None
            time.sleep(1.0)
    try:
        existing = set(admin.list_topics())
        compacted = {"cleanup.policy": "compact"}
        wanted = [
            NewTopic(name, settings.partitions, settings.replication_factor,
                     topic_configs=compacted if name == settings.saves_topic else {})
            for name in (settings.events_topic, settings.incidents_topic, settings.saves_topic)
            if name not in existing
        ]
        if wanted:
            try:
                admin.create_topics(wanted)
            except TopicAlreadyExistsError:
                pass  # another process created it first
    finally:
        admin.close()
