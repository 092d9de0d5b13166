"""Shared fixtures. The corpus scenarios are the verbatim copies bundled under
``examples/corpus`` (see examples/corpus/PROVENANCE.md)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

import kafka_support
from ckptwatch.groundtruth import SAVE_KINDS, restore_mtimes, unmatched  # noqa: F401  (used by the tests through conftest)


def pytest_sessionstart(session):
    """A checkout dates every file now; undated log lines are dated by their file's mtime, so
    the scenarios' recorded mtimes are put back first (ckptwatch.groundtruth.restore_mtimes)."""
    restore_mtimes(Path(__file__).resolve().parent.parent)

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "examples" / "corpus"
SCENARIOS = sorted(p.name for p in CORPUS.iterdir() if (p / "expected.json").exists())

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


@pytest.fixture
def own_broker(tmp_path):
    """``(kafka_local, state_dir, "host:port")`` of a broker of the test's own, for tests that
    stop, freeze or restart it (the session broker is shared). Stopped at teardown."""
    local = kafka_support.kafka_local()
    state = tmp_path / "broker"
    try:
        addr = local.start(state, None, 180.0)
    except SystemExit as e:
        pytest.fail(f"could not start the Kafka broker: {e}")
    yield local, state, addr
    local.stop(state, 5.0)
