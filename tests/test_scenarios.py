"""Hand-written scenarios of the resume-side incidents (tests/scenarios/*, see its
PROVENANCE.md): each one's scenario.json is met by ``diagnose`` (every expected incident
matched by a distinct one, none of the must_not kinds, nothing at all for a clean one),
and through the real Kafka broker the fleet gives the same incidents and evidence as the
embedded pipeline."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from conftest import unmatched
from kafka_support import fleet_equals_embedded

from ckptwatch.pipeline import diagnose

SCENARIO_DIR = Path(__file__).resolve().parent / "scenarios"
# A scenario marked "pending-rules" would be ground truth for rules not written yet (none today):
# benchmarks/accuracy.py measures it, these tests leave it out.
NAMES = sorted(p.name for p in SCENARIO_DIR.iterdir() if (p / "scenario.json").exists()
               and json.loads((p / "scenario.json").read_text()).get("status") != "pending-rules")


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


#: through the broker: the first scenarios and one faulty scenario per framework (each run takes
#: seconds of idle waiting; the rest go through the same stages on the same rules)
_ORIGINAL = {"hf-poisoned-resume", "lightning-clean-resume", "deepspeed-world-size", "megatron-regression",
             "safetensors-load-failure"}
KAFKA_NAMES = sorted(_ORIGINAL | {next(n for n in NAMES if n.split("-")[0] == fw and bool(spec(n)["incidents"]) == faulty)
                                  for fw in {n.split("-")[0] for n in NAMES} for faulty in (True,)
                                  if any(n.split("-")[0] == fw and bool(spec(n)["incidents"]) == faulty for n in NAMES)})


#: of those, what CI runs (`make test`); the rest run in `make test-slow` (about 7 s each,
#: mostly idle waits): the first scenarios, and host events (a kernel OOM kill), container
#: JSON logs and an async save in their own shapes
KAFKA_IN_CI = _ORIGINAL | {"deepspeed-launcher-kernel-oom", "k8s-json-logs-oomkilled", "dcp-async-timelimit-during-save"}


@pytest.mark.kafka
@pytest.mark.parametrize("name", [n if n in KAFKA_IN_CI else pytest.param(n, marks=pytest.mark.slow)
                                  for n in KAFKA_NAMES])
def test_each_scenario_same_incidents_through_kafka(name, kafka_bootstrap, tmp_path):
    files = [p for p in (SCENARIO_DIR / name / "logs").rglob("*") if p.is_file()]
    if all(p.suffix == ".gz" for p in files):
        pytest.skip(f"{name}: only .gz archives, which diagnose reads and the collector (a tail of live files) does not")
    logs = tmp_path / name
    shutil.copytree(SCENARIO_DIR / name / "logs", logs)
    want = spec(name)
    # Three partitions spread the jobs: in megatron-regression the saving and the resumed job
    # land in different ones (murmur2 of the job id: 1 and 2), so the saver's losses reach the
    # resume's detector only through the saves topic.
    rows = fleet_equals_embedded(kafka_bootstrap, logs, tmp_path, partitions=3)
    assert unmatched(want["incidents"], rows) == []
    assert not {r["kind"] for r in rows} & set(want["must_not"])
    if not want["incidents"]:
        assert rows == []


def _group_members(bootstrap: str, group: str) -> tuple[str, int]:
    """(state, number of members) of consumer ``group``."""
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="test-admin")
    try:
        d = admin.describe_groups([group])[group]
        return d.get("group_state", ""), len(d.get("members", []))
    except KafkaError:  # no coordinator yet: the group is still forming
        return "", 0
    finally:
        admin.close()


@pytest.mark.kafka
def test_regression_judged_across_detector_processes(kafka_bootstrap, tmp_path):
    """The saving job and the resumed job of megatron-regression in partitions owned by two
    different `ckptwatch detect` processes: the resume's owner learns the saver's losses
    from the saves topic, and the fleet finds the same regression as the embedded run."""
    from kafka.partitioner.default import murmur2
    from kafka_support import ckptwatch, cli_env, finish, fresh_config, run_embedded, snapshot, topic_messages

    logs = tmp_path / "megatron-regression"
    shutil.copytree(SCENARIO_DIR / "megatron-regression" / "logs", logs)
    jobs = sorted(p.name for p in logs.iterdir())
    assert sorted((murmur2(j.encode()) & 0x7FFFFFFF) % 2 for j in jobs) == [0, 1]  # one job per partition
    embedded = run_embedded(logs, tmp_path / "embedded.duckdb")
    cfg = fresh_config(kafka_bootstrap, tmp_path, partitions=2)
    env = cli_env(cfg)
    detectors = [ckptwatch(["detect"], env) for _ in range(2)]  # they create the topics
    try:
        deadline = time.monotonic() + 120
        while _group_members(kafka_bootstrap, cfg.detect.group) != ("Stable", 2):
            assert time.monotonic() < deadline and all(d.poll() is None for d in detectors), "group never settled"
            time.sleep(0.5)
        # one partition each from now on: each member reads one job's events
        finish(ckptwatch(["collect", "--once", str(logs)], env))
        while not any(json.loads(m.value)["kind"] == "post_resume_regression"
                      for m in topic_messages(kafka_bootstrap, cfg.kafka.incidents_topic)):
            assert time.monotonic() < deadline and all(d.poll() is None for d in detectors), "no regression found"
            time.sleep(1.0)
    finally:
        for d in detectors:
            d.terminate()
    for d in detectors:
        finish(d)
    saves = [json.loads(m.value) for m in topic_messages(kafka_bootstrap, cfg.kafka.saves_topic)]
    assert {(s["job"], s["step"], s["complete"], len(s["losses"])) for s in saves} >= {("gpt-0601-pretrain", 40, True, 5)}
    finish(ckptwatch(["sink", "--until-idle", "6"], env))
    assert snapshot(cfg.sink.db)["incidents"] == embedded["incidents"]
