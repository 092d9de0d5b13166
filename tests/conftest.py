"""Shared fixtures. The corpus scenarios are the verbatim copies bundled under
``examples/corpus`` (see examples/corpus/PROVENANCE.md)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

import kafka_support

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "examples" / "corpus"
SCENARIOS = sorted(p.name for p in CORPUS.iterdir() if (p / "expected.json").exists())
#: Incidents about saves (counted exactly); resume-side kinds may come more than once per scenario.
SAVE_KINDS = {"interrupted_save", "partial_checkpoint", "storage_failure_during_save", "stalled_save"}


def _matches(inc: dict, want: dict) -> bool:
    rc = inc.get("root_cause") or {}
    return (inc["kind"] == want["kind"] and (want["step"] is None or inc["step"] == want["step"])
            and (want["root_cause_class"] is None or rc.get("class") == want["root_cause_class"])
            and (want["root_rank"] is None or rc.get("rank") == want["root_rank"]))


def unmatched(wanted: list[dict], got: list[dict]) -> list[dict]:
    """The expected incidents (expected.json shape; None = any) left over after each took a
    distinct matching incident (``diagnose --json`` shape), most specific first."""
    free = list(got)
    left = []
    for want in sorted(wanted, key=lambda w: sum(v is None for v in w.values())):
        hit = next((i for i in free if _matches(i, want)), None)
        if hit is None:
            left.append(want)
        else:
            free.remove(hit)
    return left


def expected(scenario: str) -> dict:
    return json.loads((CORPUS / scenario / "expected.json").read_text())


@pytest.fixture
def copy_scenario(tmp_path):
    """Copy a scenario's logs into a writable temp dir and return the copy's path."""

    def _copy(scenario: str, sub: str = "") -> Path:
        src = CORPUS / scenario / "logs" / sub
        dst = tmp_path / scenario / sub
        shutil.copytree(src, dst)
        for p in dst.rglob("*"):
            p.chmod(0o755 if p.is_dir() else 0o644)
        return dst

    return _copy


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory):
    """``host:port`` of a real Apache Kafka broker for the whole session.

    ``CKPTWATCH_TEST_KAFKA`` names an existing one; else testcontainers starts the
    apache/kafka image where a Docker engine answers; else ``scripts/kafka-local`` starts
    Kafka from its Maven Central artifacts (Java + Maven; this is what CI uses)."""
    external = os.environ.get("CKPTWATCH_TEST_KAFKA")
    if external:
        yield external
        return
    if kafka_support.docker_engine():
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer("apache/kafka:4.1.1").with_kraft() as kc:
            yield kc.get_bootstrap_server()
        return
    local = kafka_support.kafka_local()
    state = tmp_path_factory.mktemp("kafka")
    try:
        addr = local.start(state, None, 180.0)
    except SystemExit as e:
        pytest.fail(f"could not start the Kafka broker: {e}")
    yield addr
    local.stop(state, 10.0)
