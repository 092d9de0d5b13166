"""docker-compose.yml cannot run here (no Docker engine); check it by reading: valid YAML,
the services the fleet needs, commands and flags the CLI really has, environment the config
loader accepts, files it mounts that exist."""

from __future__ import annotations

import typer.main
import yaml
from conftest import ROOT

from ckptwatch import config
from ckptwatch.cli import app

COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_services_of_the_fleet():
    assert set(COMPOSE["services"]) == {"kafka", "collector", "detector", "sink", "prometheus", "grafana",
                                        "alertmanager"}
    assert COMPOSE["services"]["alertmanager"]["image"] == "prom/alertmanager:v0.35.0"
    assert COMPOSE["services"]["kafka"]["image"].startswith("apache/kafka:4.")
    assert COMPOSE["services"]["detector"]["deploy"]["replicas"] == 2  # one consumer group, two members
    assert (ROOT / "Dockerfile").exists()


def test_commands_and_flags_exist_in_the_cli():
    group = typer.main.get_command(app)
    for name in ("collector", "detector", "sink"):
        svc = COMPOSE["services"][name]
        cmd, *args = svc["command"]
        assert cmd in group.commands, f"{name}: no such command {cmd!r}"
        opts = {o for p in group.commands[cmd].params for o in p.opts}
        for a in args:
            if a.startswith("--"):
                assert a in opts, f"{name}: {cmd} has no option {a}"
        assert svc["depends_on"]["kafka"]["condition"] == "service_healthy"


def test_environment_is_valid_config():
    for name in ("collector", "detector", "sink"):
        env = {k: str(v) for k, v in COMPOSE["services"][name]["environment"].items()}
        cfg = config.build([("compose", config.from_env(env))])
        assert cfg.kafka.bootstrap_servers == "kafka:9092"
        assert cfg.kafka.bootstrap_servers.split(":")[0] in COMPOSE["services"]


def test_mounted_files_exist():
    for svc in COMPOSE["services"].values():
        for vol in svc.get("volumes", []):
            src = vol.split(":")[0]
            if src.startswith("./") and not src.startswith("./data"):
                assert (ROOT / src).exists(), src


def test_the_grafana_dashboard_queries_metrics_ckptwatch_exports():
    """Every metric a panel's PromQL names is one the code exports (counters with their
    _total, as the exposition names them), through the datasource the provisioning defines; the stack mounts both."""
    import json
    import re

    from prometheus_client import generate_latest

    from ckptwatch.sinks.metrics import Metrics

    dashboard = json.loads((ROOT / "deploy" / "grafana" / "dashboards" / "ckptwatch.json").read_text())
    datasource = yaml.safe_load((ROOT / "deploy" / "grafana" / "provisioning" / "datasources" / "prometheus.yml")
                                .read_text())["datasources"][0]
    names = set(re.findall(r"^# TYPE (\S+) ", generate_latest(Metrics().registry).decode(), re.M))  # counters: *_total
    used = set()
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == datasource["uid"]
        for target in panel["targets"]:
            used |= set(re.findall(r"ckptwatch_[a-z_]+", target["expr"]))
    assert used and used <= names, used - names
    assert len(used) >= 10  # incidents, lines, events, skips, lags, open saves, alerts
    assert datasource["url"] == "http://prometheus:9090" and "prometheus" in COMPOSE["services"]
    mounts = COMPOSE["services"]["grafana"]["volumes"]
    assert "./deploy/grafana/dashboards:/var/lib/grafana/dashboards:ro" in mounts
    assert "./deploy/grafana/provisioning:/etc/grafana/provisioning:ro" in mounts
