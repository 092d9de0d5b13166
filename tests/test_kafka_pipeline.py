"""Fleet mode against the real broker: the same incidents as the embedded pipeline, with
one detector in-process and with two detector processes in one consumer group."""

from __future__ import annotations

import dataclasses
import re

import pytest
from conftest import SCENARIOS
from kafka_support import ckptwatch, cli_env, fresh_config, run_embedded, snapshot

from ckptwatch.pipeline import PipelineOptions
from ckptwatch.services import launch
from ckptwatch.sinks.duckdb_store import Store

pytestmark = pytest.mark.kafka


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_each_scenario_same_incidents_through_kafka(scenario, copy_scenario, kafka_bootstrap, tmp_path):
    logs = copy_scenario(scenario)
    embedded = run_embedded(logs, tmp_path / "embedded.duckdb")

    cfg = fresh_config(kafka_bootstrap, tmp_path, partitions=3)
    cfg = dataclasses.replace(cfg, collect=dataclasses.replace(cfg.collect, paths=[str(logs)]))
    store = Store(cfg.sink.db)
    try:
        collector, detector, sink = launch.run_all(cfg, PipelineOptions(), store, once=True, until_idle=2.0,
                                                   say=print)
    finally:
        store.close()
    fleet = snapshot(cfg.sink.db)

    assert fleet["incidents"] == embedded["incidents"]
    assert fleet["evidence"] == embedded["evidence"]
    assert fleet["event_keys"] == embedded["event_keys"]
    assert len(fleet["event_keys"]) == collector.published > 0
    assert detector.stats.bad_messages == sink.stats.bad_messages == 0
    expected_kinds = {"02-sigkill-mid-save": ["interrupted_save"], "03-collective-timeout": ["interrupted_save"]}
    assert sorted(r[1] for r in fleet["incidents"]) == expected_kinds.get(scenario, [])


def test_whole_corpus_two_detector_processes(copy_scenario, kafka_bootstrap, tmp_path):
    """Five jobs over four partitions, two `ckptwatch detect` processes sharing them."""
    for s in SCENARIOS:
        copy_scenario(s)
    logs = tmp_path  # every scenario's copy lies under tmp_path/<scenario>
    embedded = run_embedded(logs, tmp_path.parent / f"{tmp_path.name}-embedded.duckdb")

    cfg = fresh_config(kafka_bootstrap, tmp_path.parent, partitions=4)
    env = cli_env(cfg)
    collect = ckptwatch(["collect", str(logs), "--once"], env)
    out, err = collect.communicate(timeout=120)
    assert collect.returncode == 0, err
    detectors = [ckptwatch(["detect", "--until-idle", "6"], env) for _ in range(2)]
    sink = ckptwatch(["sink", "--until-idle", "8"], env)
    results = [p.communicate(timeout=180) for p in (*detectors, sink)]
    for p, (out, err) in zip((*detectors, sink), results, strict=True):
        assert p.returncode == 0, err
    # both members took part: each one consumed events
    consumed = [int(re.search(r"(\d+) events \(\d+ replayed\)", err).group(1)) for _, err in results[:2]]
    assert all(n > 0 for n in consumed), results

    fleet = snapshot(cfg.sink.db)
    assert fleet["incidents"] == embedded["incidents"]
    assert fleet["evidence"] == embedded["evidence"]
    assert fleet["event_keys"] == embedded["event_keys"]
    assert {r[4] for r in fleet["incidents"]} == {"job-0201-sigkill", "job-0301-timeout"}
