"""kafka-python settings derived from :class:`ckptwatch.config.KafkaSettings`.

``KafkaSettings.client`` is passed verbatim to every client, so SASL / SSL settings
(``security_protocol``, ``sasl_mechanism``, ``sasl_plain_username``, ``sasl_plain_password``,
``ssl_cafile``, ...) need no code here; names are kafka-python's (see its KafkaProducer docs).
"""

from __future__ import annotations

import logging
from typing import Any

from ckptwatch.config import KafkaSettings

#: kafka-python logs every failed connection attempt; the services report outages themselves.
logging.getLogger("kafka").setLevel(logging.CRITICAL)


def common(settings: KafkaSettings, client_id: str) -> dict[str, Any]:
    """Settings every client takes: bootstrap servers, client id, and the pass-through ones
    (which win over anything set here). Reconnect backoff is capped at 2 s (kafka-python's
    default, 30 s, would keep a collector idle long after a restarted broker is back)."""
    return {"bootstrap_servers": settings.bootstrap_servers.split(","), "client_id": client_id,
            "bootstrap_timeout_ms": 5_000, "reconnect_backoff_max_ms": 2_000, **settings.client}


def producer(settings: KafkaSettings, client_id: str) -> dict[str, Any]:
    """Durable publishing: ``acks=all`` and an idempotent producer (no duplicates from its own
    retries); up to 5 minutes of retries before a record is given up (``delivery_timeout_ms``)."""
    return {
        **common(settings, client_id),
        "acks": "all",
        "enable_idempotence": True,
        "compression_type": None if settings.compression == "none" else settings.compression,
        "linger_ms": 5,
        "retry_backoff_ms": 200,
        "delivery_timeout_ms": 300_000,
        "request_timeout_ms": 10_000,
        **settings.client,
    }


def consumer(settings: KafkaSettings, client_id: str, group: str | None) -> dict[str, Any]:
    """A consumer that commits explicitly, starts at the earliest offset, and reads only
    committed records (``isolation_level=read_committed``)."""
    return {
        **common(settings, client_id),
        "group_id": group,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "isolation_level": "read_committed",
        "max_poll_records": 5000,
        "session_timeout_ms": 10_000,
        "heartbeat_interval_ms": 1_000,
        **settings.client,
    }
