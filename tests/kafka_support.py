"""Helpers for the tests that use the real Kafka broker (see the ``kafka_bootstrap`` fixture).

The broker is Apache Kafka itself: started from its Maven Central artifacts by
``scripts/kafka-local`` (KRaft, one node, 127.0.0.1), or by testcontainers where a Docker
engine answers, or an existing one named by ``CKPTWATCH_TEST_KAFKA=host:port``.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import uuid
from pathlib import Path

from kafka import KafkaConsumer, TopicPartition

from ckptwatch.config import CollectSettings, Config, DetectSettings, KafkaSettings, SinkSettings

ROOT = Path(__file__).resolve().parent.parent


def kafka_local():
    """The ``scripts/kafka_local.py`` module (not a package: loaded from its path)."""
    spec = importlib.util.spec_from_file_location("kafka_local", ROOT / "scripts" / "kafka_local.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def docker_engine() -> bool:
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def fresh_config(bootstrap: str, tmp: Path, *, partitions: int = 1) -> Config:
    """A config with topics and groups of its own, so tests sharing a broker never meet."""
    tag = uuid.uuid4().hex[:8]
    return Config(
        kafka=KafkaSettings(bootstrap_servers=bootstrap, events_topic=f"t{tag}.events",
                            incidents_topic=f"t{tag}.incidents", partitions=partitions),
        collect=CollectSettings(checkpoint=str(tmp / f"collect-{tag}.json"), interval=0.1),
        detect=DetectSettings(group=f"detect-{tag}", interval=0.1),
        sink=SinkSettings(db=str(tmp / f"sink-{tag}.duckdb"), group=f"sink-{tag}"),
    )


def cli_env(cfg: Config, **extra: str) -> dict[str, str]:
    """Environment that points a ``ckptwatch`` subprocess at ``cfg``'s broker, topics and groups."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTWATCH_")}
    env.update({
        "CKPTWATCH_KAFKA_BOOTSTRAP_SERVERS": cfg.kafka.bootstrap_servers,
        "CKPTWATCH_KAFKA_EVENTS_TOPIC": cfg.kafka.events_topic,
        "CKPTWATCH_KAFKA_INCIDENTS_TOPIC": cfg.kafka.incidents_topic,
        "CKPTWATCH_KAFKA_PARTITIONS": str(cfg.kafka.partitions),
        "CKPTWATCH_COLLECT_CHECKPOINT": cfg.collect.checkpoint,
        "CKPTWATCH_COLLECT_INTERVAL": str(cfg.collect.interval),
        "CKPTWATCH_DETECT_GROUP": cfg.detect.group,
        "CKPTWATCH_DETECT_INTERVAL": str(cfg.detect.interval),
        "CKPTWATCH_SINK_GROUP": cfg.sink.group,
        "CKPTWATCH_SINK_DB": cfg.sink.db,
    })
    env.update(extra)
    return env


def ckptwatch(args: list[str], env: dict[str, str], **kw) -> subprocess.Popen:
    """Start ``python -m ckptwatch ARGS`` (stdout/stderr captured as text)."""
    return subprocess.Popen([sys.executable, "-m", "ckptwatch", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def topic_messages(bootstrap: str, topic: str) -> list:
    """Every message now in ``topic`` (all partitions), read without a group."""
    from ckptwatch.config import KafkaSettings
    from ckptwatch.kafka.consumer import read_to_end

    return read_to_end(KafkaSettings(bootstrap_servers=bootstrap), topic, client_id="test-reader")
