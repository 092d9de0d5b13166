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


# -- issue 14: stopping while the broker is unreachable, and the hint for a wrong address

def unused_port() -> int:
    """A loopback TCP port nothing listens on (bound once, then released)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args, env_extra, tmp_path):
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTWATCH_")}
    env.update(env_extra)
    return subprocess.Popen([sys.executable, "-m", "ckptwatch", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)


def wait_for_stderr(p, text: str, timeout: float = 90.0) -> list[str]:
    """Read ``p``'s stderr line by line until a line holds ``text``; returns the lines read."""
    import threading

    lines: list[str] = []
    found = threading.Event()

    def reader():
        for line in p.stderr:
            lines.append(line)
            if text in line:
                found.set()
                return

    threading.Thread(target=reader, daemon=True).start()
    assert found.wait(timeout) or p.poll() is not None, f"no {text!r} on stderr in {timeout} s: {''.join(lines)}"
    assert found.is_set(), f"exited {p.returncode} before {text!r}: {''.join(lines)}"
    return lines


def fleet_command(cmd, tmp_path, port):
    logs = tmp_path / "logs"
    logs.mkdir(exist_ok=True)
    return {
        "sink": ["sink", "--kafka", f"127.0.0.1:{port}", "--db", str(tmp_path / "s.duckdb")],
        "run": ["run", "--kafka", f"127.0.0.1:{port}", "--logs", str(logs), "--db", str(tmp_path / "r.duckdb")],
        "detect": ["detect", "--kafka", f"127.0.0.1:{port}"],
        "collect": ["collect", "--kafka", f"127.0.0.1:{port}", str(logs)],
    }[cmd]


@pytest.mark.parametrize("cmd, sig", [("sink", "SIGTERM"), ("sink", "SIGINT"), ("run", "SIGTERM"), ("run", "SIGINT"),
                                      ("detect", "SIGTERM"), ("collect", "SIGTERM")])
def test_stopping_while_waiting_for_an_unreachable_broker_exits_0_without_traceback(tmp_path, cmd, sig):
    import signal

    port = unused_port()
    p = start(fleet_command(cmd, tmp_path, port), {}, tmp_path)
    try:
        seen = wait_for_stderr(p, f"waiting for Kafka at 127.0.0.1:{port}")
        p.send_signal(getattr(signal, sig))
        rest = p.communicate(timeout=60)[1]
    finally:
        p.kill()
    err = "".join(seen) + rest
    assert p.returncode == 0, err
    assert "Traceback" not in err and "Error" not in err, err


def test_a_wrong_broker_address_gets_a_hint_then_exit_2(tmp_path):
    import time

    port = unused_port()
    t0 = time.monotonic()
    p = start(fleet_command("sink", tmp_path, port),
              {"CKPTWATCH_KAFKA_CONNECT_HINT_AFTER": "1", "CKPTWATCH_KAFKA_CONNECT_TIMEOUT": "4"}, tmp_path)
    _, err = p.communicate(timeout=90)
    took = time.monotonic() - t0
    assert p.returncode == 2, err
    assert "Traceback" not in err
    hints = [line for line in err.splitlines() if line.startswith("hint: ")]
    assert len(hints) == 1, err
    assert f"no Kafka broker has answered at 127.0.0.1:{port} for 1 s" in hints[0]
    assert "CKPTWATCH_KAFKA_BOOTSTRAP_SERVERS" in hints[0] and f"nc -vz 127.0.0.1 {port}" in hints[0]
    assert f"error: no Kafka broker at 127.0.0.1:{port} after 4 s" in err
    assert took < 40, took  # 4 s of waiting plus the start of a Python process, not a minute


@pytest.mark.parametrize("cmd", ["collect", "run"])
def test_once_gives_up_at_the_hint_with_exit_2(tmp_path, cmd):
    port = unused_port()
    p = start([*fleet_command(cmd, tmp_path, port), "--once"], {"CKPTWATCH_KAFKA_CONNECT_HINT_AFTER": "2"}, tmp_path)
    _, err = p.communicate(timeout=90)
    assert p.returncode == 2, err
    assert "Traceback" not in err
    line = next(line for line in err.splitlines() if line.startswith("error: "))
    assert line.startswith(f"error: no Kafka broker at 127.0.0.1:{port} after 2 s: check the address"), err


def test_ensure_topics_is_bounded_and_hints_once(tmp_path):
    import time

    from ckptwatch.config import KafkaSettings
    from ckptwatch.kafka.admin import BrokerUnavailable, ensure_topics

    addr = f"127.0.0.1:{unused_port()}"
    said: list[str] = []
    t0 = time.monotonic()
    with pytest.raises(BrokerUnavailable) as e:
        ensure_topics(KafkaSettings(bootstrap_servers=addr, connect_hint_after=1.0, connect_timeout=3.0),
                      on_wait=said.append)
    took = time.monotonic() - t0
    assert 3.0 <= took < 4.5, took  # not held up by one connection attempt (5 s)
    assert str(e.value).startswith(f"no Kafka broker at {addr} after 3 s: check the address")
    assert sum(m.startswith("hint: ") for m in said) == 1 and said[0] == f"waiting for Kafka at {addr} (no broker answers)"


def test_a_stop_that_lands_inside_a_duckdb_query_is_a_clean_stop():
    """DuckDB turns the KeyboardInterrupt of a SIGTERM / Ctrl-C that arrives while a query runs
    into ``RuntimeError: Query interrupted``; that used to escape as a traceback (exit 1) from
    run and sink when the stop came during a database write."""
    import os
    import signal
    import threading

    import duckdb

    from ckptwatch import cli

    old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    # one thread: the calling thread runs the query's tasks and checks for signals between
    # them. With worker threads it may wait on them without checking (PENDING_RESULT_BLOCKED),
    # and the stop is seen only when the query ends: minutes for this one, under load
    con = duckdb.connect(config={"threads": 1})
    timer = threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGTERM))
    try:
        timer.start()
        got = cli._serve(lambda: con.execute("SELECT count(*) FROM range(100000000000) t(x) WHERE x % 7 = 3")
                         .fetchall())
        assert got is None
        with pytest.raises(RuntimeError, match="not a stop"):  # without a stop, errors are errors
            cli._serve(lambda: (_ for _ in ()).throw(RuntimeError("not a stop")))
    finally:
        timer.cancel()
        con.close()
        for s, handler in old.items():
            signal.signal(s, handler)
