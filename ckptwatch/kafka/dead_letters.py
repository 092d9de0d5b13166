"""The dead-letter topic: where the sink keeps the messages of the events and incidents
topics it could not take (:func:`~ckptwatch.kafka.admin.dead_letter_topic`,
``<events topic>.dlq``).

A dead letter is the original record, key, value (``None`` for a tombstone) and headers
as they were, plus headers saying where it came from and why it was left out:
:data:`TOPIC_HEADER`, :data:`PARTITION_HEADER` and :data:`OFFSET_HEADER` (decimal ASCII),
:data:`ERROR_HEADER` (the reason, naming the field, UTF-8) and :data:`GROUP_HEADER` (the
consumer group that left it out). A message of which only some events were left out is
kept whole: replaying it stores its good events once more, which the sink drops by
``(source_id, offset)``. It is published before the offsets past it are committed, so a
crash in between keeps it twice, never not at all. Read them with any Kafka client, e.g.
``kcat -C -t ckptwatch.events.dlq -f '%h %s\\n'``.
"""

from __future__ import annotations

from kafka.consumer.fetcher import ConsumerRecord

from ckptwatch.kafka.producer import Message

#: dead-letter record headers: where the record was, why it was left out, and by whom
TOPIC_HEADER = "ckptwatch-dlq-topic"
PARTITION_HEADER = "ckptwatch-dlq-partition"
OFFSET_HEADER = "ckptwatch-dlq-offset"
ERROR_HEADER = "ckptwatch-dlq-error"
GROUP_HEADER = "ckptwatch-dlq-group"
#: set on a dead letter kept without its value (too large with the headers added)
VALUE_DROPPED_HEADER = "ckptwatch-dlq-value-dropped"
#: the longest reason kept in :data:`ERROR_HEADER`, in bytes
ERROR_BYTES = 2048
#: the largest dead letter published: under kafka-python's default ``max_request_size`` (1 MiB)
#: with room for the record batch's own overhead
MAX_BYTES = 1_000_000


def dead_letter(record: ConsumerRecord, error: str, *, topic: str, group: str,
                max_bytes: int = MAX_BYTES) -> Message:
    """``record`` as a message of the dead-letter ``topic``, left out by consumer ``group``
    for ``error`` (see the module docstring; cut to :data:`ERROR_BYTES`). A record with
    neither key nor value gets an empty key (Kafka needs one of them). One that would be
    over ``max_bytes`` with these headers (the producer refuses it, and the sink could never
    get past its record) is kept without its value, :data:`VALUE_DROPPED_HEADER` saying so."""
    reason = error.encode("utf-8", "replace")[:ERROR_BYTES]
    headers = tuple((k, v) for k, v in (record.headers or ()))
    headers += ((TOPIC_HEADER, record.topic.encode()), (PARTITION_HEADER, str(record.partition).encode()),
                (OFFSET_HEADER, str(record.offset).encode()), (ERROR_HEADER, reason),
                (GROUP_HEADER, group.encode()))
    value = record.value
    size = len(record.key or b"") + len(value or b"") + sum(len(k) + len(v or b"") for k, v in headers)
    if value is not None and size > max_bytes:
        headers += ((VALUE_DROPPED_HEADER, f"{len(value)} bytes: over the {max_bytes} a dead letter may hold".encode()),)
        value = None
    key = record.key if record.key is not None or value is not None else b""
    return Message(topic, key, value, headers=headers)
