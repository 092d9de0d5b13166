"""Hand-written scenarios of the resume-side incidents (tests/scenarios/*, see its
PROVENANCE.md): each one's scenario.json is met by ``diagnose`` (every expected incident
matched by a distinct one, none of the must_not kinds, nothing at all for a clean one),
and through the real Kafka broker the fleet gives the same incidents and evidence as the
embedded pipeline."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import unmatched
from kafka_support import fleet_equals_embedded

from ckptwatch.pipeline import diagnose

SCENARIO_DIR = Path(__file__).resolve().parent / "scenarios"
NAMES = sorted(p.name for p in SCENARIO_DIR.iterdir() if (p / "scenario.json").exists())


def spec(name: str) -> dict:
    return json.loads((SCENARIO_DIR / name / "scenario.json").read_text())


def test_every_resume_kind_and_a_clean_resume_have_a_scenario():
    kinds = {w["kind"] for n in NAMES for w in spec(n)["incidents"]}
    assert kinds >= {"poisoned_resume", "world_size_mismatch", "load_failure", "post_resume_regression"}
    assert any(not spec(n)["incidents"] for n in NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_diagnose_meets_the_scenario(name):
    want = spec(name)
    incidents, stats = diagnose([str(SCENARIO_DIR / name / "logs")])
    got = [i.to_dict() for i in incidents]
    summary = [(i["kind"], i["step"], (i["root_cause"] or {}).get("class"), (i["root_cause"] or {}).get("rank"))
               for i in got]
    assert stats.errors == []
    assert unmatched(want["incidents"], got) == [], f"{name}: got {summary}"
    assert not {i["kind"] for i in got} & set(want["must_not"]), f"{name}: got {summary}"
    if not want["incidents"]:
        assert got == []


@pytest.mark.kafka
@pytest.mark.parametrize("name", NAMES)
def test_each_scenario_same_incidents_through_kafka(name, kafka_bootstrap, tmp_path):
    logs = tmp_path / name
    shutil.copytree(SCENARIO_DIR / name / "logs", logs)
    want = spec(name)
    # A regression needs the saving job's losses in the detector that judges the resume:
    # fleet mode has them only when both jobs share a partition (regression.py docstring),
    # so that scenario runs on one partition; the others spread their jobs over three.
    regression = any(w["kind"] == "post_resume_regression" for w in want["incidents"])
    rows = fleet_equals_embedded(kafka_bootstrap, logs, tmp_path, partitions=1 if regression else 3)
    assert unmatched(want["incidents"], rows) == []
    assert not {r["kind"] for r in rows} & set(want["must_not"])
    if not want["incidents"]:
        assert rows == []
