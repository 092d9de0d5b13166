"""The Prometheus ``/metrics`` endpoint: served over real HTTP on 127.0.0.1, scraped with
urllib and parsed with prometheus-client's own text parser; the values are checked against
the pipeline's Stats, the DuckDB tables and the detector."""

from __future__ import annotations

import dataclasses
import datetime as dt
import errno
import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import duckdb
import pytest
import yaml
from conftest import ROOT
from prometheus_client.parser import text_string_to_metric_families

from ckptwatch import config
from ckptwatch.detectors.incident import Incident
from ckptwatch.embedded import EmbeddedRunner
from ckptwatch.sinks.metrics import SOURCE_KINDS, Metrics, MetricsServer

SIGKILL = "02-sigkill-mid-save"
T0 = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.timezone.utc)


def parse(text: str) -> dict[str, dict[tuple, float]]:
    """Sample name -> {sorted label pairs: value}, from the Prometheus text format."""
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def scrape(url: str) -> dict[str, dict[tuple, float]]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        return parse(resp.read().decode())


def by(samples: dict[tuple, float], label: str) -> dict[str, float]:
    """The samples of a metric with one label, keyed by that label's value."""
    return {dict(k)[label]: v for k, v in samples.items()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_embedded_run_served_metrics_match_stats_and_database(copy_scenario, tmp_path):
    logs, db = copy_scenario(SIGKILL, "attempt-1-train"), str(tmp_path / "x.duckdb")
    metrics = Metrics()
    runner = EmbeddedRunner(str(logs), db, metrics=metrics)
    with MetricsServer(metrics, 0, "127.0.0.1") as server:
        assert server.port > 0 and server.url == f"http://127.0.0.1:{server.port}/metrics"
        try:
            runner.run(once=True)
        finally:
            stats = runner.stats
            runner.close()
        m = scrape(server.url)

    lines = by(m["ckptwatch_lines_ingested_total"], "source_kind")
    assert lines == {k: float(stats.lines_by_kind.get(k, 0)) for k in SOURCE_KINDS}
    assert sum(lines.values()) == stats.lines == 456
    assert lines["console"] > 0 and lines["worker"] > 0

    con = duckdb.connect(db, read_only=True)
    stored = con.execute("SELECT source_kind, kind, count(*) FROM events GROUP BY ALL").fetchall()
    con.close()
    events = {(dict(k)["source_kind"], dict(k)["kind"]): v for k, v in m["ckptwatch_events_total"].items()}
    assert events == {(sk, kind): float(n) for sk, kind, n in stored}
    assert sum(events.values()) == stats.events

    assert by(m["ckptwatch_records_skipped_total"], "reason") == {r: float(n) for r, n in stats.skipped.items()}
    assert m["ckptwatch_incidents_total"] == {(("kind", "interrupted_save"), ("severity", "critical")): 1.0}
    lag = m["ckptwatch_detector_lag_seconds"][()]
    assert math.isfinite(lag)
    assert m["ckptwatch_open_saves"][()] == 0.0
    # no job id in any label by default
    assert not any("job" in dict(k) for samples in m.values() for k in samples)


def test_tailing_cycles_count_each_line_and_incident_once_and_lag_follows_the_watermark(copy_scenario, tmp_path):
    logs, db = copy_scenario(SIGKILL, "attempt-1-train"), str(tmp_path / "x.duckdb")
    metrics = Metrics()
    runner = EmbeddedRunner(str(logs), db, metrics=metrics)
    with MetricsServer(metrics) as server:
        try:
            for i in range(4):  # held-back last records are flushed after 2 s idle; the incident settles
                now = T0 + dt.timedelta(seconds=10 * i)
                runner.cycle(now=now)
                m = scrape(server.url)
                wm = runner.detector.watermark(now)
                assert m["ckptwatch_detector_lag_seconds"][()] == pytest.approx((now - wm).total_seconds())
            runner.cycle(final=True, now=T0 + dt.timedelta(seconds=60))
            incidents = runner.detector.incidents()
        finally:
            runner.close()
        m = scrape(server.url)
    assert sum(m["ckptwatch_lines_ingested_total"].values()) == runner.stats.lines == 456
    assert sum(m["ckptwatch_events_total"].values()) == runner.stats.events
    assert [i.kind for i in incidents] == ["interrupted_save"]
    assert m["ckptwatch_incidents_total"] == {(("kind", "interrupted_save"), ("severity", "critical")): 1.0}
    assert m["ckptwatch_open_saves"][()] == 0.0


def test_restart_reads_no_line_again_and_counts_known_incidents_again(copy_scenario, tmp_path):
    """Documented: the restarted detector emits every stored incident again, and they count."""
    logs, db = copy_scenario(SIGKILL, "attempt-1-train"), str(tmp_path / "x.duckdb")
    first = EmbeddedRunner(str(logs), db)
    first.run(once=True)
    first.close()
    metrics = Metrics()
    again = EmbeddedRunner(str(logs), db, metrics=metrics)
    again.run(once=True)
    again.close()
    m = parse(metrics.exposition())
    assert set(m["ckptwatch_lines_ingested_total"].values()) == {0.0}
    assert "ckptwatch_events_total" not in m
    assert m["ckptwatch_incidents_total"] == {(("kind", "interrupted_save"), ("severity", "critical")): 1.0}


def test_skipped_input_is_counted_by_reason_once_over_many_polls(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    log = logs / "train.log"
    log.write_text("2026-11-30 10:00:00,000 INFO nothing to see\n" + "x" * ((1 << 20) + 10) + "\n")
    metrics = Metrics()
    runner = EmbeddedRunner(str(logs), str(tmp_path / "x.duckdb"), metrics=metrics)
    try:
        runner.cycle(now=T0)
        with log.open("a") as f:
            f.write("2026-11-30 10:00:01,000 INFO still nothing\n" * 3)
        runner.cycle(now=T0 + dt.timedelta(seconds=5))
        runner.cycle(final=True, now=T0 + dt.timedelta(seconds=10))
    finally:
        runner.close()
    m = parse(metrics.exposition())
    skipped = by(m["ckptwatch_records_skipped_total"], "reason")
    assert skipped == {"line_too_long": 1.0, "no_rule_matched": 4.0}
    assert skipped == {r: float(n) for r, n in runner.stats.skipped.items()}
    assert by(m["ckptwatch_lines_ingested_total"], "source_kind")["log"] == runner.stats.lines == 4


def _incident(iid: str, *, job: str = "job-a", status: str = "open") -> Incident:
    from ckptwatch.detectors.incident import RootCause

    return Incident(id=iid, kind="interrupted_save", severity="critical", status=status, job=job, step=40,
                    checkpoint_path=None, root_cause=RootCause(cls="signal"), collateral=[], checkpoint_state={},
                    last_good_checkpoint=None, remediation="", first_ts=T0, detected_ts=T0, evidence=[])


def test_an_incident_counts_once_per_id_and_the_job_label_only_when_configured():
    metrics = Metrics()
    assert metrics.observe_incidents([_incident("a")]) == 1
    assert metrics.observe_incidents([_incident("a", status="superseded"), _incident("b", job="job-b")]) == 1
    m = parse(metrics.exposition())
    assert m["ckptwatch_incidents_total"] == {(("kind", "interrupted_save"), ("severity", "critical")): 2.0}

    labelled = Metrics(job_label=True)
    labelled.observe_incidents([_incident("a"), _incident("b", job="job-b"), _incident("a")])
    m = parse(labelled.exposition())
    assert by(m["ckptwatch_incidents_total"], "job") == {"job-a": 1.0, "job-b": 1.0}


def test_alert_counters_and_gauges():
    metrics = Metrics()
    metrics.alert_sent("oncall", "trigger")
    metrics.alert_sent("oncall", "trigger")
    metrics.alert_sent("oncall", "resolve")
    metrics.alert_failed("team", "rejected")
    metrics.alert_retried("team")
    metrics.set_alerts_pending("team", 3)
    metrics.set_consumer_lag("ckptwatch-sink", {"ckptwatch.events": 7, "ckptwatch.incidents": 0})
    m = parse(metrics.exposition())
    assert m["ckptwatch_alerts_sent_total"] == {(("action", "trigger"), ("channel", "oncall")): 2.0,
                                                (("action", "resolve"), ("channel", "oncall")): 1.0}
    assert m["ckptwatch_alerts_failed_total"] == {(("channel", "team"), ("reason", "rejected")): 1.0}
    assert m["ckptwatch_alert_retries_total"] == {(("channel", "team"),): 1.0}
    assert m["ckptwatch_alerts_pending"] == {(("channel", "team"),): 3.0}
    assert by(m["ckptwatch_kafka_consumer_lag_records"], "topic") == {"ckptwatch.events": 7.0,
                                                                     "ckptwatch.incidents": 0.0}
    assert math.isnan(m["ckptwatch_detector_lag_seconds"][()])  # no event seen yet


def test_two_registries_do_not_share_values():
    a, b = Metrics(), Metrics()
    a.alert_retried("x")
    assert "ckptwatch_alert_retries_total" in parse(a.exposition())
    assert "ckptwatch_alert_retries_total" not in parse(b.exposition())


def test_cli_run_serves_metrics_while_it_runs(copy_scenario, tmp_path):
    logs, port = copy_scenario(SIGKILL, "attempt-1-train"), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTWATCH_")}
    p = subprocess.Popen([sys.executable, "-m", "ckptwatch", "run", "--logs", str(logs), "--db", str(tmp_path / "x.duckdb"),
                          "--metrics-port", str(port), "--metrics-address", "127.0.0.1", "--until-idle", "60",
                          "--interval", "0.2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        deadline, m = time.monotonic() + 60, {}
        while time.monotonic() < deadline:  # until every line is read and the incident is out
            try:
                m = scrape(url)
            except (urllib.error.URLError, ConnectionError):
                m = {}
            if m.get("ckptwatch_incidents_total"):
                break
            assert p.poll() is None, p.communicate()[1]
            time.sleep(0.2)
        assert by(m["ckptwatch_lines_ingested_total"], "source_kind") == {"console": 278.0, "worker": 178.0,
                                                                           "kernel": 0.0, "log": 0.0}
        assert m["ckptwatch_incidents_total"] == {(("kind", "interrupted_save"), ("severity", "critical")): 1.0}
        assert math.isfinite(m["ckptwatch_detector_lag_seconds"][()])
    finally:
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert f"metrics: {url}" in err
    with pytest.raises(urllib.error.URLError):  # stopped with the command
        urllib.request.urlopen(url, timeout=5)


def test_port_in_use_is_a_one_line_error(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(OSError) as e:
            MetricsServer(Metrics(), port)
        assert e.value.errno == errno.EADDRINUSE
        env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTWATCH_")}
        env["CKPTWATCH_METRICS_PORT"] = str(port)  # from the environment, as from the flag
        r = subprocess.run([sys.executable, "-m", "ckptwatch", "run", "--logs", str(logs), "--db",
                            str(tmp_path / "x.duckdb"), "--once"], capture_output=True, text=True, env=env,
                           timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [f"error: metrics: cannot listen on 127.0.0.1:{port}: Address already "
                                             "in use (choose another --metrics-port)"]
    assert not (tmp_path / "x.duckdb").exists()


def test_compose_services_serve_metrics_where_prometheus_scrapes():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    prom = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    job = next(j for j in prom["scrape_configs"] if j["job_name"] == "ckptwatch")
    targets = {name for sd in job["dns_sd_configs"] for name in sd["names"]}
    ports = {sd["port"] for sd in job["dns_sd_configs"]}
    assert targets == {"collector", "detector", "sink"}
    for name in targets:
        env = {k: str(v) for k, v in compose["services"][name]["environment"].items()}
        cfg = config.build([("compose", config.from_env(env))])
        assert {cfg.metrics.port} == ports and cfg.metrics.address == "0.0.0.0", name


def test_metrics_port_zero_means_no_endpoint(tmp_path):
    assert config.load(env={}).metrics.port == 0
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "rank0.log").write_text("step 1\n")  # run --once over nothing to read exits 2 (issue 35)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTWATCH_")}
    r = subprocess.run([sys.executable, "-m", "ckptwatch", "run", "--logs", str(logs), "--db", str(tmp_path / "x.duckdb"),
                        "--once", "--metrics-port", "0"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "metrics:" not in r.stderr


@pytest.mark.kafka
def test_fleet_services_report_consumer_lag_incidents_and_ingest(copy_scenario, kafka_bootstrap, tmp_path):
    """Real broker: the sink's consumer lag is exactly the records left after its first
    record (one per poll); then the three services in one process, sharing one Metrics."""
    from kafka_support import fresh_config, topic_messages

    from ckptwatch.pipeline import PipelineOptions
    from ckptwatch.services import launch
    from ckptwatch.services.sink import SinkMember
    from ckptwatch.sinks.duckdb_store import Store

    logs = copy_scenario(SIGKILL, "attempt-1-train")
    cfg = fresh_config(kafka_bootstrap, tmp_path)  # one partition
    cfg = dataclasses.replace(cfg, collect=dataclasses.replace(cfg.collect, paths=[str(logs)]),
                              kafka=dataclasses.replace(cfg.kafka, client={"max_poll_records": 1}))
    k = cfg.kafka
    collected = Metrics()
    published = launch.collect(cfg, PipelineOptions(), once=True, until_idle=None, say=print,
                               metrics=collected).published
    m = parse(collected.exposition())
    assert sum(m["ckptwatch_events_total"].values()) == published > 0
    assert sum(m["ckptwatch_lines_ingested_total"].values()) == 456

    metrics, store = Metrics(), Store(str(tmp_path / "lag.duckdb"))
    sink = SinkMember(cfg, store, metrics=metrics)
    try:
        deadline = time.monotonic() + 60
        while sink.stats.events_received == 0 and time.monotonic() < deadline:
            sink.step()
        lag = parse(metrics.exposition())["ckptwatch_kafka_consumer_lag_records"]
        messages = len(topic_messages(kafka_bootstrap, k.events_topic))  # each a batch of events
        assert 0 < messages < published
        assert lag == {(("group", cfg.sink.group), ("topic", k.events_topic)): float(messages - 1),
                       (("group", cfg.sink.group), ("topic", k.incidents_topic)): 0.0}
    finally:
        sink.close()
        store.close()

    cfg = dataclasses.replace(cfg, kafka=dataclasses.replace(k, client={}))
    shared, store = Metrics(), Store(cfg.sink.db)
    try:
        launch.run_all(cfg, PipelineOptions(), store, once=True, until_idle=2.0, say=print, metrics=shared)
    finally:
        store.close()
    m = parse(shared.exposition())
    assert m["ckptwatch_incidents_total"] == {(("kind", "interrupted_save"), ("severity", "critical")): 1.0}
    assert {dict(key)["group"] for key in m["ckptwatch_kafka_consumer_lag_records"]} == {cfg.detect.group,
                                                                                       cfg.sink.group}
    assert set(m["ckptwatch_kafka_consumer_lag_records"].values()) == {0.0}
    assert math.isfinite(m["ckptwatch_detector_lag_seconds"][()])
    assert set(m["ckptwatch_lines_ingested_total"].values()) == {0.0}  # resumed at the first collect's offsets
