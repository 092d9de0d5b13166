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
    assert set(COMPOSE["services"]) == {"kafka", "collector", "detector", "sink", "prometheus"}
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
