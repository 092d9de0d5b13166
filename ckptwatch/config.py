"""Configuration: a TOML file, overridden by ``CKPTWATCH_*`` environment variables, overridden
by command-line flags (highest wins).

File layout (every key optional; see ``examples/ckptwatch.toml``)::

    [kafka]
    bootstrap_servers = "127.0.0.1:9092"  # empty: embedded mode, no broker
    events_topic = "ckptwatch.events"
    incidents_topic = "ckptwatch.incidents"
    saves_topic = "ckptwatch.saves"        # save facts shared by the detectors (compacted)
    partitions = 6                         # used when a topic is created
    replication_factor = 1
    compression = "gzip"                   # gzip | none (lz4/snappy/zstd need their python codecs)
    [kafka.client]                         # passed verbatim to kafka-python: security_protocol,
    security_protocol = "SASL_SSL"         # sasl_mechanism, sasl_plain_username, ssl_cafile, ...

    [collect]
    paths = ["/var/log/train/**/*.log"]    # files, directories or glob patterns
    path_template = "{job}/rank{rank}.log"
    line_prefix = "${hostname}:${rank}: "   # torchrun --log-line-prefix-template, if the consoles use one
    checkpoint = "ckptwatch-collect.json"  # durable source offsets (default: that, in the cwd)
    interval = 0.5                         # seconds between polls
    checkpoint_roots = ["/ckpt/run-7"]     # verify each new checkpoint under these (integrity events)
    verify_log = "ckptwatch-verify.log"    # its integrity lines, tailed with the logs
    verify_settle = 30.0                   # seconds without a change before a checkpoint is verified

    [detect]
    group = "ckptwatch-detect"             # Kafka consumer group of the detectors
    allowed_lateness = 5.0                 # seconds behind the newest event time

    [sink]
    db = "incidents.duckdb"
    group = "ckptwatch-sink"

    [alerts]                               # see ckptwatch.sinks.alerts and the README
    realert_interval = 0                   # seconds; 0: re-alert only when severity rises
    [alerts.channels.oncall]               # one table per channel: slack | pagerduty | webhook | console
    type = "slack"
    url_env = "SLACK_WEBHOOK_URL"          # secrets: KEY_env (a variable) or KEY_file (a file)
    min_severity = "error"
    [[alerts.silences]]
    job = "debug-*"
    expires = "2026-12-31T00:00:00Z"

    [metrics]
    port = 9464                            # Prometheus /metrics; 0 (default): off
    address = "127.0.0.1"

Environment: ``CKPTWATCH_<SECTION>_<KEY>`` (``CKPTWATCH_KAFKA_BOOTSTRAP_SERVERS``,
``CKPTWATCH_DETECT_GROUP``, ``CKPTWATCH_KAFKA_CLIENT_SASL_PLAIN_PASSWORD`` ...), and
``CKPTWATCH_CONFIG`` for the file's path. Values are parsed to the key's type; a list is
comma-separated.
"""

from __future__ import annotations

import os
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class ConfigError(Exception):
    """A config file, variable or flag that cannot be used; the message names where and why."""


@dataclass(frozen=True)
class KafkaSettings:
    """Where the broker is and how the topics look. ``client``: extra kafka-python settings."""

    bootstrap_servers: str = ""
    events_topic: str = "ckptwatch.events"
    incidents_topic: str = "ckptwatch.incidents"
    saves_topic: str = "ckptwatch.saves"
    partitions: int = 6
    replication_factor: int = 1
    compression: str = "gzip"
    client: dict[str, Any] = field(default_factory=dict)

    @property
    def enabled(self) -> bool:
        return bool(self.bootstrap_servers)


@dataclass(frozen=True)
class CollectSettings:
    """Sources of one collector; ``interval`` in seconds."""

    paths: list[str] = field(default_factory=list)
    path_template: str = ""
    line_prefix: str = ""  # the torchrun --log-line-prefix-template of the consoles
    boot_time: str = ""
    checkpoint: str = ""  # empty: ckptwatch-collect.json (collect), <db>.collect.json (run --kafka)
    interval: float = 0.5
    checkpoint_roots: list[str] = field(default_factory=list)  # verify new checkpoints under these
    verify_log: str = "ckptwatch-verify.log"  # where their integrity lines go (tailed too)
    verify_settle: float = 30.0  # seconds without a change before a checkpoint is verified


@dataclass(frozen=True)
class DetectSettings:
    """The detector consumer group; ``allowed_lateness`` and ``interval`` in seconds."""

    group: str = "ckptwatch-detect"
    allowed_lateness: float = 5.0
    interval: float = 0.5


@dataclass(frozen=True)
class SinkSettings:
    """The DuckDB sink service."""

    db: str = "incidents.duckdb"
    group: str = "ckptwatch-sink"


@dataclass(frozen=True)
class AlertSettings:
    """Alert channels and the shared delivery stages (:mod:`ckptwatch.sinks.alerts`).

    Seconds: ``realert_interval`` (0: never re-alert an unchanged incident), ``timeout`` of
    one HTTP request, ``retry_initial`` / ``retry_max`` (exponential backoff bounds),
    ``give_up_after`` (a notification still failing this long after it was queued is
    recorded as failed). ``channels``: name -> channel table (checked by
    :func:`ckptwatch.sinks.alerts.settings.parse_channels`); ``silences``: silence tables;
    ``silences_file``: where ``ckptwatch silence`` keeps silences (default
    ``<db>.silences.json``); ``redaction_files``: extra redaction pattern files."""

    channels: dict[str, Any] = field(default_factory=dict)
    silences: list[dict[str, Any]] = field(default_factory=list)
    silences_file: str = ""
    realert_interval: float = 0.0
    timeout: float = 10.0
    retry_initial: float = 1.0
    retry_max: float = 300.0
    give_up_after: float = 86400.0
    redaction_files: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class MetricsSettings:
    """The Prometheus ``/metrics`` endpoint: ``port`` 0 means off. ``job_label`` adds the
    job as a label to the per-incident counters (off: job ids are unbounded)."""

    port: int = 0
    address: str = "127.0.0.1"
    job_label: bool = False


@dataclass(frozen=True)
class Config:
    """The whole configuration, one dataclass per section."""

    kafka: KafkaSettings = field(default_factory=KafkaSettings)
    collect: CollectSettings = field(default_factory=CollectSettings)
    detect: DetectSettings = field(default_factory=DetectSettings)
    sink: SinkSettings = field(default_factory=SinkSettings)
    alerts: AlertSettings = field(default_factory=AlertSettings)
    metrics: MetricsSettings = field(default_factory=MetricsSettings)


_SECTIONS: dict[str, type] = typing.get_type_hints(Config)

#: ``CKPTWATCH_*`` variables that are not config keys: the config file's path, test
#: failpoints (:mod:`ckptwatch.failpoints`), the test broker, scripts/kafka-local's cache.
NOT_CONFIG_VARIABLES = frozenset({"CKPTWATCH_CONFIG", "CKPTWATCH_FAILPOINTS", "CKPTWATCH_TEST_KAFKA",
                                  "CKPTWATCH_KAFKA_CACHE"})

_COMPRESSION = ("gzip", "none")


def _check_bootstrap(value: str) -> str | None:
    for server in filter(None, (v.strip() for v in value.split(","))):
        host, sep, port = server.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            return f"{server!r} is not HOST:PORT"
    return None


#: (section, key) -> check returning a reason when the (coerced) value is not usable
_CHECKS: dict[tuple[str, str], Any] = {
    ("kafka", "bootstrap_servers"): _check_bootstrap,
    ("kafka", "partitions"): lambda v: None if v >= 1 else "must be at least 1",
    ("kafka", "replication_factor"): lambda v: None if v >= 1 else "must be at least 1",
    ("kafka", "compression"): lambda v: None if v in _COMPRESSION else f"must be one of {', '.join(_COMPRESSION)}",
    ("collect", "interval"): lambda v: None if v > 0 else "must be more than 0 seconds",
    ("detect", "interval"): lambda v: None if v > 0 else "must be more than 0 seconds",
    ("detect", "allowed_lateness"): lambda v: None if v >= 0 else "must be 0 seconds or more",
    ("alerts", "channels"): lambda v: _check_alerts("channels", v),
    ("alerts", "silences"): lambda v: _check_alerts("silences", v),
    ("alerts", "realert_interval"): lambda v: None if v >= 0 else "must be 0 seconds or more",
    ("alerts", "timeout"): lambda v: None if v > 0 else "must be more than 0 seconds",
    ("alerts", "retry_initial"): lambda v: None if v > 0 else "must be more than 0 seconds",
    ("alerts", "retry_max"): lambda v: None if v > 0 else "must be more than 0 seconds",
    ("alerts", "give_up_after"): lambda v: None if v > 0 else "must be more than 0 seconds",
    ("metrics", "port"): lambda v: None if 0 <= v < 65536 else "must be a TCP port (0: off)",
}


def _check_alerts(key: str, value: Any) -> str | None:
    # the alert tables have their own schema, kept beside the channels that read it
    from ckptwatch.sinks.alerts import settings

    try:
        settings.parse_channels(value) if key == "channels" else settings.parse_silences(value)
    except settings.AlertConfigError as e:
        return str(e)
    return None


def _coerce(value: Any, typ: Any, where: str) -> Any:
    origin = typing.get_origin(typ)
    try:
        if typ is bool:
            if isinstance(value, str):
                if value.lower() in ("1", "true", "yes", "on"):
                    return True
                if value.lower() in ("0", "false", "no", "off"):
                    return False
                raise ValueError
            return bool(value)
        if typ is int:
            if isinstance(value, bool):
                raise ValueError
            return int(value)
        if typ is float:
            return float(value)
        if typ is str:
            if not isinstance(value, (str, int, float)):
                raise ValueError
            return str(value)
        if origin is list and typing.get_origin(typing.get_args(typ)[0]) is dict:
            if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
                raise ValueError
            return [dict(v) for v in value]
        if origin is list:
            if isinstance(value, str):
                return [v.strip() for v in value.split(",") if v.strip()]
            if not isinstance(value, list):
                raise ValueError
            return [str(v) for v in value]
        if origin is dict:
            if not isinstance(value, dict):
                raise ValueError
            return dict(value)
    except (TypeError, ValueError):
        pass
    else:
        return value
    name = getattr(typ, "__name__", str(typ))
    raise ConfigError(f"{where}: expected {name}, got {value!r}")


def _merge(base: dict[str, dict[str, Any]], layer: Mapping[str, Mapping[str, Any]]) -> None:
    for section, values in layer.items():
        dest = base.setdefault(section, {})
        for k, v in values.items():
            if isinstance(v, Mapping) and isinstance(dest.get(k), dict):
                dest[k] = {**dest[k], **v}
            else:
                dest[k] = v


def read_file(path: str) -> dict[str, dict[str, Any]]:
    """Parse a TOML config file. Raises ConfigError naming the file (and line) on any problem."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file does not exist") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    for section, values in data.items():
        if section not in _SECTIONS:
            raise ConfigError(f"{path}: unknown section [{section}] (known: {', '.join(_SECTIONS)})")
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: {section} must be a table")
    return data


def from_env(env: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """The ``CKPTWATCH_<SECTION>_<KEY>`` variables as a config layer (strings, coerced later)."""
    out: dict[str, dict[str, Any]] = {}
    for name, value in env.items():
        if not name.startswith("CKPTWATCH_") or name in NOT_CONFIG_VARIABLES:
            continue
        rest = name[len("CKPTWATCH_"):].lower()
        section, _, key = rest.partition("_")
        if section not in _SECTIONS or not key:
            raise ConfigError(f"environment: {name}: no config section {section!r} "
                              f"(CKPTWATCH_<SECTION>_<KEY>, sections: {', '.join(_SECTIONS)})")
        if section == "kafka" and key.startswith("client_"):
            out.setdefault("kafka", {}).setdefault("client", {})[key[len("client_"):]] = value
        else:
            out.setdefault(section, {})[key] = value
    return out


def build(layers: list[tuple[str, Mapping[str, Mapping[str, Any]]]]) -> Config:
    """Merge layers (lowest first; each named for error messages) into a :class:`Config`.

    Raises ConfigError for an unknown key or a value of the wrong type, naming the layer,
    section and key.
    """
    merged: dict[str, dict[str, Any]] = {}
    origin: dict[tuple[str, str], str] = {}
    for layer_name, layer in layers:
        _merge(merged, layer)
        for section, values in layer.items():
            for k in values:
                origin[(section, k)] = layer_name
    sections = {}
    for section, values in merged.items():
        cls = _SECTIONS[section]
        hints = typing.get_type_hints(cls)
        kwargs = {}
        for k, v in values.items():
            where = f"{origin.get((section, k), '?')}: [{section}] {k}"
            if k not in hints:
                raise ConfigError(f"{where}: unknown key (known: {', '.join(hints)})")
            kwargs[k] = _coerce(v, hints[k], where)
            check = _CHECKS.get((section, k))
            reason = check(kwargs[k]) if check else None
            if reason:  # alert tables may hold secrets: never echoed
                shown = "" if section == "alerts" and isinstance(v, (dict, list)) else f" (got {v!r})"
                raise ConfigError(f"{where}: {reason}{shown}")
        sections[section] = cls(**kwargs)
    return Config(**sections)


def load(path: str | None = None, *, env: Mapping[str, str] | None = None,
         flags: Mapping[str, Mapping[str, Any]] | None = None) -> Config:
    """File (``path`` or ``$CKPTWATCH_CONFIG``, if any) < environment < ``flags`` (None values
    in ``flags`` are ignored, so unset command-line options do not override)."""
    env = os.environ if env is None else env
    layers: list[tuple[str, Mapping[str, Mapping[str, Any]]]] = []
    path = path or env.get("CKPTWATCH_CONFIG")
    if path:
        layers.append((path, read_file(path)))
    layers.append(("environment", from_env(env)))
    if flags:
        layers.append(("flags", {s: {k: v for k, v in vals.items() if v is not None} for s, vals in flags.items()}))
    return build(layers)
