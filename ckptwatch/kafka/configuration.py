"""kafka-python settings derived from :class:`ckptwatch.config.KafkaSettings`.

``KafkaSettings.client`` is passed through to kafka-python, each key to the clients that
accept it (security settings to all, ``linger_ms`` only to producers, ...), so SASL / SSL
(``security_protocol``, ``sasl_mechanism``, ``sasl_plain_username``, ``sasl_plain_password``,
``ssl_cafile``, ...) need no code here; names are kafka-python's (its ``DEFAULT_CONFIG``).
Pass-through values win over the defaults set here.
"""

from __future__ import annotations

from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer

from ckptwatch.config import ConfigError, KafkaSettings

_CLIENTS = (KafkaProducer, KafkaConsumer, KafkaAdminClient)


def check_client_keys(settings: KafkaSettings) -> None:
    """Raises ConfigError naming every ``[kafka.client]`` key no kafka-python client knows."""
    unknown = sorted(k for k in settings.client if not any(k in c.DEFAULT_CONFIG for c in _CLIENTS))
    if unknown:
        raise ConfigError(f"[kafka.client] {', '.join(unknown)}: not a kafka-python client setting")


def _base(settings: KafkaSettings, client_id: str) -> dict[str, Any]:
    check_client_keys(settings)
    # Reconnect backoff capped at 2 s: kafka-python's default (30 s) would leave a collector
    # idle long after a restarted broker is back.
    return {"bootstrap_servers": settings.bootstrap_servers.split(","), "client_id": client_id,
            "bootstrap_timeout_ms": 5_000, "reconnect_backoff_max_ms": 2_000}


def _passthrough(settings: KafkaSettings, cls: type) -> dict[str, Any]:
    return {k: v for k, v in settings.client.items() if k in cls.DEFAULT_CONFIG}  # type: ignore[attr-defined]


def admin(settings: KafkaSettings, client_id: str) -> dict[str, Any]:
    """Settings of an admin client (topic creation)."""
    return {**_base(settings, client_id), **_passthrough(settings, KafkaAdminClient)}


def producer(settings: KafkaSettings, client_id: str, *, compress: bool = True) -> dict[str, Any]:
    """Durable publishing: ``acks=all`` and an idempotent producer (no duplicates from its own
    retries); up to 5 minutes of retries before a record is given up (``delivery_timeout_ms``);
    ``send`` blocks at most 5 s for metadata or buffer space (``max_block_ms``).
    ``compress=False``: no Kafka compression, whatever ``settings.compression`` says (values
    compressed already, as Arrow events batches are)."""
    return {
        **_base(settings, client_id),
        "acks": "all",
        "enable_idempotence": True,
        "compression_type": None if settings.compression == "none" or not compress else settings.compression,
        "linger_ms": 5,
        "retry_backoff_ms": 200,
        "delivery_timeout_ms": 300_000,
        "request_timeout_ms": 10_000,
        # send() blocks for metadata (or buffer) at most this long, then Publisher.publish says
        # it is waiting and tries again (kafka-python's default, 60 s, was a silent stall)
        "max_block_ms": 5_000,
        **_passthrough(settings, KafkaProducer),
    }


def consumer(settings: KafkaSettings, client_id: str, group: str | None) -> dict[str, Any]:
    """A consumer that commits explicitly, starts at the earliest offset, and reads only
    committed records (``isolation_level=read_committed``)."""
    return {
        **_base(settings, client_id),
        "group_id": group,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "isolation_level": "read_committed",
        "max_poll_records": 5000,
        "session_timeout_ms": 10_000,
        "heartbeat_interval_ms": 1_000,
        **_passthrough(settings, KafkaConsumer),
    }
