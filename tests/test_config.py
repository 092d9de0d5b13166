"""Configuration layers: TOML file < CKPTWATCH_* environment < flags; errors name the place."""

from __future__ import annotations

import pytest

from ckptwatch import config
from ckptwatch.pipeline import detector_config


def write(tmp_path, text: str) -> str:
    p = tmp_path / "ckptwatch.toml"
    p.write_text(text)
    return str(p)


def test_file_then_env_then_flags(tmp_path):
    path = write(tmp_path, """
[kafka]
bootstrap_servers = "10.0.0.1:9092"
partitions = 12
[kafka.client]
security_protocol = "SASL_SSL"
sasl_mechanism = "PLAIN"
[collect]
paths = ["/var/log/a/*.log", "/var/log/b"]
[detect]
group = "from-file"
allowed_lateness = 2.5
""")
    env = {"CKPTWATCH_DETECT_GROUP": "from-env", "CKPTWATCH_KAFKA_PARTITIONS": "3",
           "CKPTWATCH_KAFKA_CLIENT_SASL_PLAIN_PASSWORD": "s3cret", "UNRELATED": "x"}
    cfg = config.load(path, env=env, flags={"kafka": {"partitions": 4, "bootstrap_servers": None}})
    assert cfg.kafka.bootstrap_servers == "10.0.0.1:9092"  # a None flag does not override
    assert cfg.kafka.partitions == 4  # flag > env > file
    assert cfg.detect.group == "from-env"
    assert cfg.detect.allowed_lateness == 2.5
    assert cfg.collect.paths == ["/var/log/a/*.log", "/var/log/b"]
    # SASL settings pass through to kafka-python; the env adds to the file's table
    assert cfg.kafka.client == {"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN",
                                "sasl_plain_password": "s3cret"}
    assert cfg.kafka.enabled


def test_config_file_from_env_and_defaults(tmp_path):
    path = write(tmp_path, "[sink]\ndb = 'x.duckdb'\n")
    cfg = config.load(env={"CKPTWATCH_CONFIG": path, "CKPTWATCH_COLLECT_PATHS": "a.log, b/*.log"})
    assert cfg.sink.db == "x.duckdb"
    assert cfg.collect.paths == ["a.log", "b/*.log"]
    assert cfg.kafka.events_topic == "ckptwatch.events"
    assert not cfg.kafka.enabled  # no broker: embedded mode


@pytest.mark.parametrize("text, where", [
    ("[kafka]\npartitions = 'many'\n", "[kafka] partitions: expected int, got 'many'"),
    ("[kafka]\npartitons = 3\n", "[kafka] partitons: unknown key"),
    ("[kafak]\n", "unknown section [kafak]"),
    ("[kafka\n", "not valid TOML"),
])
def test_bad_file_names_file_and_key(tmp_path, text, where):
    path = write(tmp_path, text)
    with pytest.raises(config.ConfigError) as e:
        config.load(path, env={})
    assert str(e.value).startswith(path)
    assert where in str(e.value)


def test_bad_env_value_names_the_variable_layer():
    with pytest.raises(config.ConfigError, match=r"environment: \[detect\] allowed_lateness: expected float"):
        config.load(env={"CKPTWATCH_DETECT_ALLOWED_LATENESS": "soon"})


def test_missing_file():
    with pytest.raises(config.ConfigError, match="nope.toml: config file does not exist"):
        config.load("nope.toml", env={})


def test_example_config_file_loads():
    from conftest import ROOT

    cfg = config.load(str(ROOT / "examples" / "ckptwatch.toml"), env={})
    assert cfg.kafka.bootstrap_servers == "127.0.0.1:9092"
    assert cfg.collect.path_template == "{job}/rank{rank}.log"
    assert cfg.sink.group == "ckptwatch-sink"


@pytest.mark.parametrize("env, message", [
    ({"CKPTWATCH_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:notaport"}, "'127.0.0.1:notaport' is not HOST:PORT"),
    ({"CKPTWATCH_KAFKA_BOOTSTRAP_SERVERS": "9092"}, "'9092' is not HOST:PORT"),
    ({"CKPTWATCH_KAFKA_COMPRESSION": "zstd"}, "[kafka] compression: must be one of gzip, none"),
    ({"CKPTWATCH_KAFKA_EVENTS_FORMAT": "avro"}, "[kafka] events_format: must be one of arrow, ndjson"),
    ({"CKPTWATCH_KAFKA_PARTITIONS": "0"}, "[kafka] partitions: must be at least 1"),
    ({"CKPTWATCH_DETECT_ALLOWED_LATENESS": "-5"}, "[detect] allowed_lateness: must be 0 seconds or more"),
    ({"CKPTWATCH_DETCT_GROUP": "x"}, "CKPTWATCH_DETCT_GROUP: no config section 'detct'"),
])
def test_unusable_values_are_refused(env, message):
    with pytest.raises(config.ConfigError) as e:
        config.load(env=env)
    assert message in str(e.value)


def test_non_config_variables_are_ignored():
    cfg = config.load(env={"CKPTWATCH_FAILPOINTS": "x", "CKPTWATCH_KAFKA_CACHE": "/tmp/k",
                           "CKPTWATCH_KAFKA_BOOTSTRAP_SERVERS": "a:1,b:2"})
    assert cfg.kafka.bootstrap_servers == "a:1,b:2"


# -- issue 14: hostile files give a one-line ConfigError naming the file (and key), never a crash

@pytest.mark.parametrize("text, where", [
    ("[metrics]\nport = 1e400\n", "[metrics] port: expected int, got inf"),
    ("[metrics]\nport = 9464.5\n", "[metrics] port: expected int, got 9464.5"),
    ("[collect]\ninterval = inf\n", "[collect] interval: must be a finite number"),
    ("[collect]\ninterval = nan\n", "[collect] interval: must be a finite number"),
    ("[alerts]\ntimeout = -inf\n", "[alerts] timeout: must be a finite number"),
    ("[detect]\nallowed_lateness = 1e300\n", "[detect] allowed_lateness: must be at most"),
    ("[collect]\ninterval = 1e12\n", "[collect] interval: must be at most"),
    ("[kafka]\npartitions = 0x" + "f" * 5000 + "\n", "[kafka] partitions: must be at most"),
    ("[kafka]\nreplication_factor = 40000\n", "[kafka] replication_factor: must be at most"),
    ("[metrics]\nport = -1\n", "[metrics] port: must be a TCP port"),
    ("[sink]\ndb = 0x" + "f" * 5000 + "\n", "[sink] db: expected str"),
    ("[collect]\npaths = [[\"a\"], {x = 1}]\n", "[collect] paths: expected a list of strings"),
    ("[metrics]\njob_label = 1979-05-27\n", "[metrics] job_label: expected bool"),
])
def test_out_of_range_and_non_finite_numbers_are_refused(tmp_path, text, where):
    path = write(tmp_path, text)
    with pytest.raises(config.ConfigError) as e:
        config.load(path, env={})
    msg = str(e.value)
    assert msg.startswith(path) and where in msg, msg
    assert "\n" not in msg and len(msg) < 400  # one line, a huge value shown cut short


@pytest.mark.parametrize("variable, value, where", [
    ("CKPTWATCH_COLLECT_INTERVAL", "inf", "[collect] interval: must be a finite number"),
    ("CKPTWATCH_DETECT_ALLOWED_LATENESS", "nan", "[detect] allowed_lateness: must be a finite number"),
    ("CKPTWATCH_METRICS_PORT", "1e400", "[metrics] port: expected int"),
    ("CKPTWATCH_KAFKA_PARTITIONS", "9" * 5000, "[kafka] partitions: expected int"),
])
def test_hostile_environment_values_are_refused(variable, value, where):
    with pytest.raises(config.ConfigError) as e:
        config.load(env={variable: value})
    assert str(e.value).startswith("environment: ") and where in str(e.value)
    assert len(str(e.value)) < 400


def test_non_utf8_config_file_names_file_and_line(tmp_path):
    p = tmp_path / "latin1.toml"
    p.write_bytes(b"[detect]\n# caf\xe9\ngroup = 'x'\n")
    with pytest.raises(config.ConfigError) as e:
        config.load(str(p), env={})
    assert str(e.value) == f"{p}: not UTF-8 text (line 2, byte 0xe9): save the file as UTF-8"


def test_deeply_nested_config_is_refused_not_a_recursion_error(tmp_path):
    path = write(tmp_path, "[detect]\ngroup = " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(config.ConfigError) as e:
        config.load(path, env={})
    assert str(e.value).startswith(f"{path}: nested too deeply")


def test_broker_wait_settings(tmp_path):
    cfg = config.load(env={})
    assert (cfg.kafka.connect_hint_after, cfg.kafka.connect_timeout) == (15.0, 60.0)
    cfg = config.load(env={"CKPTWATCH_KAFKA_CONNECT_HINT_AFTER": "2", "CKPTWATCH_KAFKA_CONNECT_TIMEOUT": "5"})
    assert (cfg.kafka.connect_hint_after, cfg.kafka.connect_timeout) == (2.0, 5.0)
    with pytest.raises(config.ConfigError, match=r"\[kafka\] connect_timeout: must be more than 0 seconds"):
        config.load(env={"CKPTWATCH_KAFKA_CONNECT_TIMEOUT": "0"})


def test_the_save_windows_are_the_detect_tables(tmp_path):
    """``[detect] settle`` / ``confirm``: how long a save incident waits past its last failure
    before it is paged (``run`` and the fleet's detectors judge with them)."""
    path = write(tmp_path, "[detect]\nsettle = 12.5\nconfirm = 0\nsource_idle = 40\n")
    judged = detector_config(config.load(path, env={}).detect)
    assert (judged.windows.settle, judged.windows.confirm, judged.source_idle, judged.allowed_lateness) == \
        (12.5, 0.0, 40.0, 5.0)
    assert judged.windows.stall_after == 1800.0  # what the table does not name stays
    defaults = detector_config(config.load(env={}).detect)
    assert (defaults.windows.settle, defaults.windows.confirm) == (30.0, 5.0)
    with pytest.raises(config.ConfigError, match=r"\[detect\] settle: must be 0 seconds or more"):
        config.load(env={"CKPTWATCH_DETECT_SETTLE": "-1"})
