"""``ckptwatch simulate --kafka``: a simulated fleet's events published straight to the
events topic, as its collectors would publish them, then found by a real detector and
sink through a real broker."""

from __future__ import annotations

import json
import os

import duckdb
import pytest
from kafka_support import ckptwatch, cli_env, fresh_config

from ckptwatch.simulate import score
from ckptwatch.sinks.duckdb_store import read_incidents

pytestmark = pytest.mark.kafka


def test_simulated_fleet_straight_to_kafka_is_found_whole(kafka_bootstrap, tmp_path):
    cfg = fresh_config(kafka_bootstrap, tmp_path, partitions=2)
    env = cli_env(cfg)
    out = tmp_path / "fleet"
    sim = ckptwatch(["simulate", str(out), "--jobs", "6", "--nodes", "2", "--ranks", "4", "--failures", "0.5",
                     "--seed", "3", "--rate", "20000", "--kafka", kafka_bootstrap], env)
    said, err = sim.communicate(timeout=180)
    assert sim.returncode == 0, err
    figures = json.loads((out / "kafka.json").read_text())
    truth = json.loads((out / "truth.json").read_text())
    failing = {job for job, j in truth["jobs"].items() if j["failure"]}
    assert len(failing) == 3 and set(figures["initiated"]) == failing
    assert f"published {figures['events']:,} events in {figures['messages']:,} messages" in said

    detect = ckptwatch(["detect", "--until-idle", "6"], env)
    sink = ckptwatch(["sink", "--until-idle", "8"], env)
    for p in (detect, sink):
        _, perr = p.communicate(timeout=180)
        assert p.returncode == 0, perr

    result = score(truth, read_incidents(cfg.sink.db))
    assert (result["injected"], result["exact"], result["false"], result["clean_with_incident"]) == (3, 3, 0, 0), result
    con = duckdb.connect(cfg.sink.db, read_only=True)
    try:
        stored, pairs = con.execute('SELECT count(*), count(DISTINCT (source_id, "offset")) FROM events').fetchone()
    finally:
        con.close()
    assert stored == pairs == figures["events"] > 0  # every event once (host events: one copy of each)


def test_simulate_without_a_broker_says_so_and_writes_nothing(tmp_path):
    sim = ckptwatch(["simulate", str(tmp_path / "fleet"), "--jobs", "2", "--kafka", "127.0.0.1:9"],
                    {**{k: v for k, v in os.environ.items() if not k.startswith("CKPTWATCH_")},
                     "CKPTWATCH_KAFKA_CONNECT_TIMEOUT": "1"})
    _, err = sim.communicate(timeout=60)
    assert sim.returncode == 2
    assert "no Kafka broker at 127.0.0.1:9" in err and "Traceback" not in err
    assert not (tmp_path / "fleet" / "logs").exists()


def test_a_failures_first_event_is_found_by_its_row_in_the_whole_send_order():
    """Rows of other jobs come before it: its index counts them (it once indexed only the
    failing jobs' rows, so the acknowledgement of an earlier batch was taken for its own)."""
    import datetime as dt

    import polars as pl

    from ckptwatch.simulate_kafka import initiating_rows

    t = [dt.datetime(2026, 11, 30, 10, 0, s, tzinfo=dt.timezone.utc) for s in range(6)]
    events = pl.DataFrame({"job": ["clean", "clean", "bad", "clean", "bad", "bad"], "ts": t})
    assert initiating_rows(events, {"bad": t[3]}) == {4: "bad"}
    assert initiating_rows(events, {}) == {}


def test_bad_options_are_refused_before_a_broker_is_waited_for(tmp_path):
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("CKPTWATCH_")},
           "CKPTWATCH_KAFKA_CONNECT_TIMEOUT": "30"}
    (tmp_path / "fleet" / "logs").mkdir(parents=True)
    (tmp_path / "fleet" / "logs" / "old.log").write_text("x\n")
    used = ckptwatch(["simulate", str(tmp_path / "fleet"), "--kafka", "127.0.0.1:9"], env)
    out, err = used.communicate(timeout=20)  # at once, not after the 30 s connect timeout
    assert used.returncode == 2 and "already holds logs" in err and "Kafka" not in out + err
    zero = ckptwatch(["simulate", str(tmp_path / "other"), "--rate", "0", "--kafka", "127.0.0.1:9"], env)
    out, err = zero.communicate(timeout=20)
    assert zero.returncode == 2 and "--rate must be more than 0, not 0" in err and "publishing" not in out
