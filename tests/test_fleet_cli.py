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


def test_unknown_kafka_client_setting_is_named():
    r = run(["detect", "--kafka", "127.0.0.1:1"], {"CKPTWATCH_KAFKA_CLIENT_SASL_PASWORD": "x"})
    assert r.returncode == 2
    assert "[kafka.client] sasl_pasword: not a kafka-python client setting" in r.stderr


def test_client_settings_reach_only_the_clients_that_take_them():
    from ckptwatch.config import KafkaSettings
    from ckptwatch.kafka import configuration

    s = KafkaSettings(bootstrap_servers="h:1", client={"linger_ms": 50, "security_protocol": "SSL",
                                                       "max_poll_records": 10})
    assert configuration.producer(s, "p")["linger_ms"] == 50
    assert "linger_ms" not in configuration.admin(s, "a")
    assert configuration.consumer(s, "c", "g")["max_poll_records"] == 10
    assert "max_poll_records" not in configuration.producer(s, "p")
    assert {configuration.admin(s, "a")["security_protocol"], configuration.producer(s, "p")["security_protocol"],
            configuration.consumer(s, "c", None)["security_protocol"]} == {"SSL"}
