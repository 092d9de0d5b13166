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


def dead_letter(record: ConsumerRecord, error: str, *, topic: str, group: str) -> Message:
    """``record`` as a message of the dead-letter ``topic``, left out by consumer ``group``
    for ``error`` (see the module docstring). A record with neither key nor value gets an
    empty key (Kafka needs one of them)."""
    headers = tuple((k, v) for k, v in (record.headers or ()))
    headers += ((TOPIC_HEADER, record.topic.encode()), (PARTITION_HEADER, str(record.partition).encode()),
                (OFFSET_HEADER, str(record.offset).encode()), (ERROR_HEADER, error.encode()),
                (GROUP_HEADER, group.encode()))
    key = record.key if record.key is not None or record.value is not None else b""
    return Message(topic, key, record.value, headers=headers)
