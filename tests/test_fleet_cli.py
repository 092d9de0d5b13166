"""Fleet commands refuse bad configuration with one line naming the problem, exit code 2,
before touching any broker."""

from __future__ import annotations

import subprocess
import sys

import pytest


def run(args, env_extra=None, tmp_path=None):
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTWATCH_")}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "ckptwatch", *args], capture_output=True, text=True, env=env,
                          timeout=60)


@pytest.mark.parametrize("cmd", [["detect"], ["sink"], ["collect", "x.log"]])
def test_no_broker_configured(cmd):
    r = run(cmd)
    assert r.returncode == 2
    assert "no Kafka broker configured" in r.stderr and "[kafka] section" in r.stderr
    assert "Traceback" not in r.stderr


def test_bad_environment_value_is_named():
    r = run(["sink", "--kafka", "127.0.0.1:1"], {"CKPTWATCH_KAFKA_PARTITIONS": "x"})
    assert r.returncode == 2
    assert "environment: [kafka] partitions: expected int, got 'x'" in r.stderr


def test_corrupt_collector_checkpoint_is_named(tmp_path):
    ck = tmp_path / "collect.json"
    ck.write_text("{bad")
    r = run(["collect", "--kafka", "127.0.0.1:1", "--checkpoint", str(ck), str(tmp_path), "--once"])
    assert r.returncode == 2
    assert f"checkpoint file {ck}: not valid JSON" in r.stderr
    assert "Traceback" not in r.stderr
    assert ck.read_text() == "{bad"  # left for the user to inspect, not overwritten


def test_bad_config_file_is_named(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("[detect]\ngroop = 'x'\n")
    r = run(["detect", "--config", str(cfg)])
    assert r.returncode == 2
    assert f"{cfg}: [detect] groop: unknown key" in r.stderr
