"""Publishing with the guarantee the collector and detector need: :meth:`Publisher.publish`
returns only once every message is acknowledged by all in-sync replicas, so the caller may
then commit its own progress (a source offset, a consumer offset)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kafka import KafkaProducer
from kafka.errors import KafkaError, KafkaTimeoutError

from ckptwatch.config import KafkaSettings
from ckptwatch.kafka import configuration


@dataclass(frozen=True)
class Message:
    """One record to publish; ``partition`` None lets the key choose (murmur2, as Java does)."""

    topic: str
    key: bytes | None
    value: bytes | None  # None: a tombstone (a dead letter of one)
    partition: int | None = None
    #: Kafka record headers ``(name, value)``, e.g. :data:`~ckptwatch.kafka.codec.FLOORS_HEADER`
    headers: tuple[tuple[str, bytes], ...] = ()


class Publisher:
    """An idempotent, ``acks=all`` producer that waits out broker outages instead of failing.

    ``on_wait(message)`` is called (at most every ``report_every`` seconds) while the broker
    cannot be reached, with a sentence saying what is waiting; the default prints nothing.
    ``compress=False``: values are compressed already; Kafka does not compress them again.
    """

    def __init__(self, settings: KafkaSettings, *, client_id: str = "ckptwatch",
                 on_wait: Callable[[str], None] | None = None, report_every: float = 5.0,
                 compress: bool = True) -> None:
        self.settings = settings
        self.on_wait = on_wait or (lambda msg: None)
        self.report_every = report_every
        self._last_report = 0.0
        self.waits = 0
        while True:
            try:
                self._producer = KafkaProducer(**configuration.producer(settings, client_id, compress=compress))
                break
            except KafkaError as e:  # "Unable to bootstrap", ECONNREFUSED: no broker answers
                if not getattr(e, "retriable", False):
                    raise
                self._waiting(f"waiting for Kafka at {settings.bootstrap_servers} (no broker answers)")
                time.sleep(1.0)

    def _waiting(self, msg: str) -> None:
        self.waits += 1
        now = time.monotonic()
        if now - self._last_report >= self.report_every:
            self._last_report = now
            self.on_wait(msg)

    def partitions(self, topic: str) -> list[int]:
        """The topic's partition ids (waits for metadata while the broker is away)."""
        while True:
            try:
                found = self._producer.partitions_for(topic)
            except KafkaTimeoutError:
                found = None
            if found:
                return sorted(found)
            self._waiting(f"waiting for Kafka at {self.settings.bootstrap_servers} (no metadata for {topic})")
            time.sleep(0.5)

    def publish(self, messages: Sequence[Message]) -> None:
        """Send ``messages`` and block until each is acknowledged. A message whose delivery
        failed is sent again, so a broker outage delays but loses nothing; a resend after a
        lost acknowledgement may duplicate a message, which consumers absorb by key
        (events by ``(source_id, offset)``, incidents by id)."""
        pending = list(messages)
        while pending:
            futures = []
            unsent: list[Message] = []
            for i, m in enumerate(pending):
                try:
                    futures.append((m, self._producer.send(m.topic, value=m.value, key=m.key, partition=m.partition,
                                                           headers=list(m.headers) or None)))
                except KafkaTimeoutError:  # no metadata, or no buffer, within max_block_ms: the broker is away
                    unsent = pending[i:]  # sent after the rest is acknowledged: each partition's order kept
                    self._waiting(f"waiting for Kafka at {self.settings.bootstrap_servers}: "
                                  f"{len(unsent)} message(s) not sent yet")
                    break
            while True:
                try:
                    self._producer.flush(timeout=self.report_every)
                    break
                except KafkaTimeoutError:
                    self._waiting(f"waiting for Kafka at {self.settings.bootstrap_servers}: "
                                  f"{len(pending)} message(s) not yet acknowledged")
            failed = []
            for m, fut in futures:
                try:
                    fut.get(timeout=0)
                except KafkaError:
                    failed.append(m)
            if failed:
                self._waiting(f"waiting for Kafka at {self.settings.bootstrap_servers}: "
                              f"resending {len(failed)} message(s)")
                time.sleep(0.5)
            pending = failed + unsent

    def close(self, timeout: float = 5.0) -> None:
        """Flush for up to ``timeout`` seconds and close. What is still unacknowledged is
        dropped here, never lost: the caller has not recorded it as done."""
        producer = self._producer
        flush = producer.flush

        def flush_or_give_up(timeout: float | None = None) -> None:
            # kafka-python 3.0's close() raises when its flush times out and leaves the
            # producer open (its __del__ then prints a traceback); give up the flush instead
            try:
                flush(timeout)
            except KafkaTimeoutError:
                pass

        producer.flush = flush_or_give_up  # type: ignore[method-assign]
        producer.close(timeout=timeout)
