"""Topic creation: the events, incidents, saves, notifications and dead-letter topics,
created if missing.

Every fleet service starts here, so this is where a wrong or unreachable broker address
shows: :func:`ensure_topics` says it is waiting, prints a hint on how to check the address
after ``[kafka] connect_hint_after`` seconds, and gives up after ``connect_timeout``
seconds (:class:`BrokerUnavailable`; the CLI exits 2). The whole exchange is bounded, also
when a broker that answered stops answering half-way (a frozen host, a partition): the
admin requests run on a helper thread that is abandoned at the deadline.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from kafka import KafkaAdminClient
from kafka.admin import NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError

from ckptwatch.config import KafkaSettings
from ckptwatch.kafka import configuration

#: seconds between two "waiting for Kafka" lines while nothing changes
REPORT_EVERY = 5.0


class BrokerUnavailable(Exception):
    """The broker did not answer within the time given; the message names the address."""


def check_hint(settings: KafkaSettings) -> str:
    """How to check the broker address of ``settings``: where it is configured and a command
    that tells whether anything listens there."""
    first = settings.bootstrap_servers.split(",")[0].strip()
    host, _, port = first.rpartition(":")
    return ("check the address (--kafka, CKPTWATCH_KAFKA_BOOTSTRAP_SERVERS or [kafka] bootstrap_servers in the "
            f"config) and that a broker listens there, e.g. nc -vz {host} {port}")


def _is_retriable(e: BaseException) -> bool:
    """A failure that a broker coming (back) up would cure: no connection, a timeout, no
    controller yet. Refusals (authorization, a bad topic setting) are not."""
    return isinstance(e, KafkaError) and bool(getattr(e, "retriable", False))


class _Attempt:
    """One connect-list-create exchange on a daemon thread, so the caller can stop
    waiting for it at a deadline (kafka-python bounds each request, not the exchange)."""

    def __init__(self, settings: KafkaSettings) -> None:
        self.settings = settings
        self.connected = False  # the bootstrap succeeded: a broker answered
        self.error: BaseException | None = None
        self.done = threading.Event()
        threading.Thread(target=self._run, name="ckptwatch-ensure-topics", daemon=True).start()

    def _run(self) -> None:
        try:
            admin = KafkaAdminClient(**configuration.admin(self.settings, "ckptwatch-admin"))
            self.connected = True
            try:
                _create_missing(admin, self.settings)
            finally:
                admin.close()
        except BaseException as e:  # handed to the waiting thread
            self.error = e
        finally:
            self.done.set()


def dead_letter_topic(settings: KafkaSettings) -> str:
    """Where the sink keeps the messages it could not take, of the events and incidents
    topics alike (:mod:`ckptwatch.kafka.dead_letters`): ``<events topic>.dlq``."""
    return f"{settings.events_topic}.dlq"


def _create_missing(admin: Any, settings: KafkaSettings) -> None:
    existing = set(admin.list_topics())
    compacted = {"cleanup.policy": "compact"}
    wanted = [
        NewTopic(name, settings.partitions, settings.replication_factor,
                 topic_configs=compacted if name in (settings.saves_topic, settings.notifications_topic) else {})
        for name in (settings.events_topic, settings.incidents_topic, settings.saves_topic,
                     settings.notifications_topic, dead_letter_topic(settings))
        if name not in existing
    ]
    if wanted:
        try:
            admin.create_topics(wanted)
        except TopicAlreadyExistsError:
            pass  # another process created it first


def ensure_topics(settings: KafkaSettings, *, timeout: float | None = None,
                  on_wait: Callable[[str], None] | None = None, hint_after: float | None = None) -> None:
    """Create ``settings.events_topic``, ``settings.incidents_topic``, ``settings.saves_topic``,
    ``settings.notifications_topic`` and the dead-letter topic (:func:`dead_letter_topic`)
    with ``settings.partitions`` partitions if they do not exist (an existing topic is left
    as it is). The saves and notifications topics are compacted: only the latest fact of
    each checkpoint, and of each channel and incident, matters.

    Retries while the broker is unreachable or stops answering, for up to ``timeout``
    seconds (default ``settings.connect_timeout``), telling ``on_wait`` so every few
    seconds, and once, after ``hint_after`` seconds (default
    ``settings.connect_hint_after``; not when ``timeout`` comes first), a ``hint:`` line on
    how to check the address.

    Raises BrokerUnavailable at ``timeout`` (the message names the address and how to
    check it); KafkaError for a refusal (e.g. ACLs)."""
    timeout = settings.connect_timeout if timeout is None else timeout
    hint_after = settings.connect_hint_after if hint_after is None else hint_after
    say = on_wait or (lambda msg: None)
    addr = settings.bootstrap_servers
    start = time.monotonic()
    deadline = start + timeout
    state = {"said": float("-inf"), "hinted": False, "answered": False}  # answered: a broker did, once

    def report(now: float) -> None:
        if now - start >= 1.0 and now - state["said"] >= REPORT_EVERY:
            state["said"] = now
            say(f"waiting for Kafka at {addr}: the broker stopped answering while the topics were checked"
                if state["answered"] else f"waiting for Kafka at {addr} (no broker answers)")
        if not state["hinted"] and now - start >= hint_after and deadline - now > 0.5:
            state["hinted"] = True
            say(f"hint: no Kafka broker has answered at {addr} for {hint_after:g} s: {check_hint(settings)}; "
                f"still waiting, giving up after {timeout:g} s")

    while True:
        attempt = _Attempt(settings)
        while not attempt.done.wait(max(0.0, min(0.25, deadline - time.monotonic()))):
            state["answered"] |= attempt.connected
            now = time.monotonic()
            if now >= deadline:
                break
            report(now)
        state["answered"] |= attempt.connected
        if attempt.done.is_set():
            if attempt.error is None:
                return
            if not _is_retriable(attempt.error):
                raise attempt.error
        if time.monotonic() >= deadline:
            if state["answered"]:
                raise BrokerUnavailable(f"Kafka at {addr} stopped answering while the topics were checked or "
                                        f"created: gave up after {timeout:g} s: {check_hint(settings)}")
            raise BrokerUnavailable(f"no Kafka broker at {addr} after {timeout:g} s: {check_hint(settings)}")
        pause = min(deadline, time.monotonic() + 1.0)  # before the next attempt, still reporting
        while (now := time.monotonic()) < pause:
            report(now)
            time.sleep(min(0.25, pause - now))
