"""Fleet mode against the real broker: the same incidents as the embedded pipeline, with
one detector in-process and with two detector processes in one consumer group."""

from __future__ import annotations

import re
import socket
import time

import duckdb
import pytest
from conftest import SCENARIOS, expected, unmatched
from kafka_support import (assert_no_version_twice, ckptwatch, cli_env, fleet_equals_embedded, fresh_config,
                           owned_partitions, published_per_id, run_embedded, snapshot, topic_events,
                           topic_messages, wait_for_members)


pytestmark = pytest.mark.kafka


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_each_scenario_same_incidents_through_kafka(scenario, copy_scenario, kafka_bootstrap, tmp_path):
    got = fleet_equals_embedded(kafka_bootstrap, copy_scenario(scenario), tmp_path, partitions=3)
    assert unmatched(expected(scenario)["incidents"], got) == []


def test_whole_corpus_two_detector_processes(copy_scenario, kafka_bootstrap, tmp_path):
    """Five jobs over four partitions, two `ckptwatch detect` processes sharing them."""
    for s in SCENARIOS:
        copy_scenario(s)
    logs = tmp_path  # every scenario's copy lies under tmp_path/<scenario>
    embedded = run_embedded(logs, tmp_path.parent / f"{tmp_path.name}-embedded.duckdb",
                            named=False)  # `ckptwatch detect` services: job-less lines are unknown

    cfg = fresh_config(kafka_bootstrap, tmp_path.parent, partitions=4)
    env = cli_env(cfg)
    # both members hold partitions before any event is published: a member alone reads a
    # job's batches in one fetch, before the other one has joined
    detectors = [ckptwatch(["detect", "--until-idle", "15"], env) for _ in range(2)]
    wait_for_members(kafka_bootstrap, cfg.detect.group, 2)
    collect = ckptwatch(["collect", str(logs), "--once"], env)
    out, err = collect.communicate(timeout=120)
    assert collect.returncode == 0, err
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
    assert {r[4] for r in fleet["incidents"] if r[1] == "interrupted_save"} == {"job-0201-sigkill", "job-0301-timeout"}
    # every fleet evidence row names the file and collector host it was read from, as embedded
    files = {}
    for db in (cfg.sink.db, tmp_path.parent / f"{tmp_path.name}-embedded.duckdb"):
        con = duckdb.connect(str(db), read_only=True)
        files[str(db)] = con.execute("SELECT incident_id, seq, file, read_on FROM evidence ORDER BY ALL").fetchall()
        con.close()
    fleet_files, embedded_files = files.values()
    assert fleet_files == embedded_files and len(fleet_files) == len(fleet["evidence"])
    assert {(f is not None and f.startswith(str(tmp_path)), h) for _, _, f, h in fleet_files} == {(True, socket.gethostname())}
    # a backlog is read to its end before incidents are asked for: no version published twice
    assert_no_version_twice(kafka_bootstrap, cfg.kafka.incidents_topic)
    assert set(published_per_id(kafka_bootstrap, cfg.kafka.incidents_topic)) >= {r[0] for r in fleet["incidents"]}


def test_rebalance_moves_partitions_without_changing_incidents(copy_scenario, kafka_bootstrap, tmp_path):
    """Member A owns every partition and publishes; B joins (partitions move to B), then A
    leaves (the rest move to B, which replays them). Same incidents, none published twice."""
    for s in SCENARIOS:
        copy_scenario(s)
    embedded = run_embedded(tmp_path, tmp_path.parent / f"{tmp_path.name}-embedded.duckdb",
                            named=False)  # `ckptwatch detect` services: job-less lines are unknown
    cfg = fresh_config(kafka_bootstrap, tmp_path.parent, partitions=4)
    env = cli_env(cfg)
    # deadlines, not durations: generous, so that a loaded machine is slow, not failing
    out, err = ckptwatch(["collect", str(tmp_path), "--once"], env).communicate(timeout=600)

    def owned() -> list[int]:
        return owned_partitions(kafka_bootstrap, cfg.detect.group)

    def wait_until(condition, what: str, alive, timeout: float = 600.0) -> None:
        """Poll ``condition`` (not a fixed sleep: a loaded machine starts processes slowly)
        while every process of ``alive`` runs."""
        deadline = time.monotonic() + timeout
        while not condition():
            for p in alive:
                assert p.poll() is None, f"{what}: a member exited first: {p.communicate()[1][-3000:]}"
            assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
            time.sleep(0.5)

    def fed(port: int) -> bool:
        """The member serving metrics on ``port`` has events from its partitions in its
        detectors (its detector lag is a number, not NaN): it received an assignment, which
        the broker's view of the group alone does not tell (a slow member may still be
        waiting for it)."""
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return False
        lag = re.search(r"^ckptwatch_detector_lag_seconds (\S+)$", text, re.M)
        return lag is not None and lag.group(1).lower() != "nan"

    a = ckptwatch(["detect"], env)
    wait_until(lambda: len(topic_messages(kafka_bootstrap, cfg.kafka.incidents_topic)) >= 2,
               "member A published nothing", [a])
    with socket.socket() as probe:  # a free port for B's metrics
        probe.bind(("127.0.0.1", 0))
        b_port = probe.getsockname()[1]
    # B's idle timeout only has to outlast A's leaving and B's rejoin (seconds), not B's start
    b = ckptwatch(["detect", "--until-idle", "20", "--metrics-port", str(b_port)], env)
    wait_until(lambda: owned() == [2, 2] and fed(b_port), "B did not take partitions from A", [a, b])
    a.terminate()  # SIGTERM: leaves the group cleanly
    _, a_err = a.communicate(timeout=300)
    assert a.returncode == 0, a_err
    wait_until(lambda: owned() == [4], "A's partitions did not move to B", [b])
    _, b_err = b.communicate(timeout=600)
    assert b.returncode == 0, b_err
    m = re.search(r"(\d+) events \((\d+) replayed\) in (\d+) assignment", b_err)
    assert m and int(m.group(2)) > 0 and int(m.group(3)) >= 2, b_err  # B re-read A's partitions
    _, serr = ckptwatch(["sink", "--until-idle", "10"], env).communicate(timeout=600)

    fleet = snapshot(cfg.sink.db)
    assert fleet["incidents"] == embedded["incidents"]
    assert fleet["evidence"] == embedded["evidence"]
    per_id = published_per_id(kafka_bootstrap, cfg.kafka.incidents_topic)
    assert set(per_id) >= {r[0] for r in embedded["incidents"]}
    assert_no_version_twice(kafka_bootstrap, cfg.kafka.incidents_topic)


def test_run_with_kafka_flag_goes_through_the_broker(copy_scenario, kafka_bootstrap, tmp_path):
    logs = copy_scenario("03-collective-timeout")
    embedded = run_embedded(logs, tmp_path / "embedded.duckdb")
    cfg = fresh_config(kafka_bootstrap, tmp_path, partitions=2)
    env = {k: v for k, v in cli_env(cfg).items() if k != "CKPTWATCH_KAFKA_BOOTSTRAP_SERVERS"}
    db = tmp_path / "run.duckdb"
    p = ckptwatch(["run", "--kafka", kafka_bootstrap, "--logs", str(logs), "--db", str(db), "--once"], env)
    out, err = p.communicate(timeout=180)
    assert p.returncode == 0, err
    assert "interrupted_save" in out and "job-0301-timeout" in out
    assert snapshot(db) == embedded
    assert len(topic_events(kafka_bootstrap, cfg.kafka.events_topic)) == len(embedded["event_keys"])
