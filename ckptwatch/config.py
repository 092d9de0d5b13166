"""Configuration: a TOML file, overridden by ``CKPTWATCH_*`` environment variables, overridden
by command-line flags (highest wins).

File layout (every key optional; see ``examples/ckptwatch.toml``)::

    [kafka]
    bootstrap_servers = "127.0.0.1:9092"  # empty: embedded mode, no broker
    events_topic = "ckptwatch.events"
    incidents_topic = "ckptwatch.incidents"
    saves_topic = "ckptwatch.saves"        # save facts shared by the detectors (compacted)
    notifications_topic = "ckptwatch.notifications"  # what the sink paged (compacted): a new sink
                                           # database does not page again what was paged
    partitions = 6                         # used when a topic is created
    replication_factor = 1
    compression = "gzip"                   # gzip | none (lz4/snappy/zstd need their python codecs)
    events_format = "arrow"                # arrow (LZ4 / zstd Arrow IPC batches) | ndjson (kcat-readable)
    connect_hint_after = 15.0              # s without a broker at start before a hint on checking the address
    connect_timeout = 60.0                 # s without a broker at start before giving up (exit 2);
                                           # --once gives up at connect_hint_after
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
    verify_limits = ["max_tensors=500000"]  # bounds of verify, as its --limit NAME=VALUE

    [detect]
    group = "ckptwatch-detect"             # Kafka consumer group of the detectors
    allowed_lateness = 5.0                 # seconds behind the newest event time
    source_idle = 30.0                     # s a silent source (rank file) holds its job's watermark back
    settle = 30.0                          # s past a save's last failure before it is paged (late evidence)
    confirm = 5.0                          # the same once the launcher said the job failed

    [sink]
    db = "incidents.duckdb"
    group = "ckptwatch-sink"
    retention_days = 30                    # raw events older than this are deleted; 0 (default): kept
    snapshot_every = 2.0                   # s between read snapshots (DB.snapshot.duckdb) while written; 0: none

    [alerts]                               # see ckptwatch.sinks.alerts and the README
    realert_interval = 0                   # seconds; 0: re-alert only when severity rises
    timeout = 30                           # seconds to wait for a receiver's answer
    connect_timeout = 5                    # seconds to connect to a receiver
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

Every value is checked where it is read: numbers must be finite and in range (seconds at
most :data:`MAX_SECONDS`), a file must be UTF-8 TOML nested at most :data:`MAX_DEPTH`
deep; anything else is a :class:`ConfigError` naming the file or variable, the key and the
reason, in one line.
"""

from __future__ import annotations

import math
import os
import tomllib
import typing
from collections.abc import Callable, Mapping
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
    notifications_topic: str = "ckptwatch.notifications"
    partitions: int = 6
    replication_factor: int = 1
    compression: str = "gzip"
    #: how events messages are encoded (ckptwatch.kafka.codec): "arrow" batches are compressed
    #: by Arrow itself, so the collector's producer sends them without Kafka compression
    events_format: str = "arrow"
    client: dict[str, Any] = field(default_factory=dict)
    connect_hint_after: float = 15.0  # seconds without a broker at start before a hint is printed
    connect_timeout: float = 60.0  # seconds without a broker at start before giving up

    @property
    def enabled(self) -> bool:
        """True when a broker is configured (fleet mode)."""
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
    verify_limits: list[str] = field(default_factory=list)  # NAME=VALUE bounds of verify (--limit)


@dataclass(frozen=True)
class DetectSettings:
    """The detector consumer group; ``allowed_lateness``, ``interval``, ``source_idle`` (see
    :data:`ckptwatch.services.detect.SOURCE_IDLE`), ``settle`` and ``confirm``, in seconds."""

    group: str = "ckptwatch-detect"
    allowed_lateness: float = 5.0
    interval: float = 0.5
    source_idle: float = 30.0  # a source silent this long no longer holds its job's watermark back
    #: a save incident is paged once the job's watermark is this far past its last failure
    #: (:class:`ckptwatch.detectors.save_incidents.SaveWindows`); ``confirm`` once the
    #: launcher reported the job failed. Before that it is stored, provisional.
    settle: float = 30.0
    confirm: float = 5.0


@dataclass(frozen=True)
class SinkSettings:
    """The DuckDB sink service."""

    db: str = "incidents.duckdb"
    group: str = "ckptwatch-sink"
    retention_days: float = 0.0  # days of raw events kept in the database; 0: all (incidents are kept)
    snapshot_every: float = 2.0  # seconds between read snapshots (:mod:`ckptwatch.sinks.snapshot`); 0: none


@dataclass(frozen=True)
class AlertSettings:
    """Alert channels and the shared delivery stages (:mod:`ckptwatch.sinks.alerts`).

    Seconds: ``realert_interval`` (0: never re-alert an unchanged incident), ``timeout``
    (read) and ``connect_timeout`` of one HTTP request, ``retry_initial`` / ``retry_max`` (exponential backoff bounds),
    ``give_up_after`` (a notification still failing this long after it was queued is
    recorded as failed). ``channels``: name -> channel table (checked by
    :func:`ckptwatch.sinks.alerts.settings.parse_channels`); ``silences``: silence tables;
    ``silences_file``: where ``ckptwatch silence`` keeps silences (default
    ``<db>.silences.json``); ``redaction_files``: extra redaction pattern files."""

    channels: dict[str, Any] = field(default_factory=dict)
    silences: list[dict[str, Any]] = field(default_factory=list)
    silences_file: str = ""
    realert_interval: float = 0.0
    timeout: float = 30.0  # read timeout of one HTTP request
    connect_timeout: float = 5.0
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
                                  "CKPTWATCH_KAFKA_CACHE", "CKPTWATCH_CACHE",
                                  "CKPTWATCH_UI_TOKEN"})  # ckptwatch.ui.cli.TOKEN_ENV (config imports no UI code)

_COMPRESSION = ("gzip", "none")
_EVENT_FORMATS = ("arrow", "ndjson")  # ckptwatch.kafka.codec.EVENT_FORMATS (config imports no Kafka code)

#: the longest duration any setting may hold (10 years): more would overflow a sleep or a timedelta
MAX_SECONDS = 10 * 365 * 86400.0
#: how deep tables and arrays of a config file may nest (the schema needs 4)
MAX_DEPTH = 32
#: the largest config file read (a config is a few KB)
MAX_FILE_BYTES = 16 << 20
#: a value shown in an error message is cut to this many characters
_SHOWN = 80


def _check_bootstrap(value: str) -> str | None:
    for server in filter(None, (v.strip() for v in value.split(","))):
        host, sep, port = server.rpartition(":")
        if not sep or not host or not port.isdigit() or len(port) > 5 or not 0 < int(port) < 65536:
            return f"{_shown(server)} is not HOST:PORT"
    return None


def _seconds(*, zero_ok: bool, high: float = MAX_SECONDS) -> Callable[[float], str | None]:
    """A check of a duration: more than 0 (or 0 too, ``zero_ok``), at most ``high`` seconds."""
    def check(v: float) -> str | None:
        if v < 0 or (v == 0 and not zero_ok):
            return "must be 0 seconds or more" if zero_ok else "must be more than 0 seconds"
        if v > high:
            return f"must be at most {high:g} seconds"
        return None
    return check


def _count(low: int, high: int) -> Callable[[int], str | None]:
    """A check of a count: from ``low`` to ``high``."""
    def check(v: int) -> str | None:
        if v < low:
            return f"must be at least {low}"
        if v > high:
            return f"must be at most {high}"
        return None
    return check


def _check_limits(value: list[str]) -> str | None:
    # the names and units of verify's limits live beside the checks that enforce them
    from ckptwatch.integrity.limits import Limits

    try:
        Limits().replace(list(value))
    except ValueError as e:
        return str(e)
    return None


#: (section, key) -> check returning a reason when the (coerced) value is not usable
_CHECKS: dict[tuple[str, str], Callable[[Any], str | None]] = {
    ("kafka", "bootstrap_servers"): _check_bootstrap,
    ("kafka", "partitions"): _count(1, 100_000),
    ("kafka", "replication_factor"): _count(1, 32_767),  # an int16 on the wire
    ("kafka", "compression"): lambda v: None if v in _COMPRESSION else f"must be one of {', '.join(_COMPRESSION)}",
    ("kafka", "events_format"): lambda v: None if v in _EVENT_FORMATS else f"must be one of {', '.join(_EVENT_FORMATS)}",
    ("kafka", "connect_hint_after"): _seconds(zero_ok=False, high=86400.0),
    ("kafka", "connect_timeout"): _seconds(zero_ok=False, high=86400.0),
    ("collect", "interval"): _seconds(zero_ok=False, high=86400.0),
    ("collect", "verify_settle"): _seconds(zero_ok=True),
    ("detect", "interval"): _seconds(zero_ok=False, high=86400.0),
    ("detect", "allowed_lateness"): _seconds(zero_ok=True),
    ("detect", "source_idle"): _seconds(zero_ok=False),
    ("detect", "settle"): _seconds(zero_ok=True, high=86400.0),
    ("detect", "confirm"): _seconds(zero_ok=True, high=86400.0),
    ("alerts", "channels"): lambda v: _check_alerts("channels", v),
    ("alerts", "silences"): lambda v: _check_alerts("silences", v),
    ("alerts", "realert_interval"): _seconds(zero_ok=True),
    ("alerts", "timeout"): _seconds(zero_ok=False),
    ("alerts", "connect_timeout"): _seconds(zero_ok=False),
    ("sink", "retention_days"): lambda v: None if 0 <= v <= 3650 else "must be from 0 (keep all) to 3650 days",
    ("sink", "snapshot_every"): _seconds(zero_ok=True),
    ("collect", "verify_limits"): _check_limits,
    ("alerts", "retry_initial"): _seconds(zero_ok=False),
    ("alerts", "retry_max"): _seconds(zero_ok=False),
    ("alerts", "give_up_after"): _seconds(zero_ok=False),
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


def _shown(value: Any) -> str:
    """``repr(value)`` for an error message: one line, at most about 80 characters (a
    5,000-digit integer has no repr at all: Python refuses to print it)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"an integer of {value.bit_length()} bits"
    if isinstance(value, (dict, list)):
        return f"a {'table' if isinstance(value, dict) else 'list'} of {len(value)} item(s)"
    try:
        text = repr(value)
    except (ValueError, RecursionError):
        return f"a {type(value).__name__}"
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "..."


def _coerce(value: Any, typ: Any, where: str) -> Any:
    origin = typing.get_origin(typ)
    expected = getattr(typ, "__name__", str(typ))
    try:
        if typ is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str):
                if value.lower() in ("1", "true", "yes", "on"):
                    return True
                if value.lower() in ("0", "false", "no", "off"):
                    return False
            raise ValueError
        if typ is int:
            if isinstance(value, (bool, float)):
                raise ValueError  # 9464.5 or 1e400 (inf) is not a port or a count
            if isinstance(value, str) and len(value.strip()) > 20:
                raise ValueError  # more digits than any 64-bit number
            return int(value)
        if typ is float:
            if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                raise ValueError
            if isinstance(value, str) and len(value.strip()) > 40:
                raise ValueError
            number = float(value)  # OverflowError for an int too big for a float
            if not math.isfinite(number):
                raise ConfigError(f"{where}: must be a finite number (got {_shown(value)})")
            return number
        if typ is str:
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                raise ValueError
            if isinstance(value, int) and value.bit_length() > 64:
                raise ValueError
            return str(value)
        if origin is list and typing.get_origin(typing.get_args(typ)[0]) is dict:
            expected = "a list of tables"
            if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
                raise ValueError
            return [dict(v) for v in value]
        if origin is list:
            expected = "a list of strings"
            if isinstance(value, str):
                return [v.strip() for v in value.split(",") if v.strip()]
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValueError
            return list(value)
        if origin is dict:
            expected = "a table"
            if not isinstance(value, dict):
                raise ValueError
            return dict(value)
    except (TypeError, ValueError, OverflowError):
        pass
    else:
        return value
    raise ConfigError(f"{where}: expected {expected}, got {_shown(value)}")


def _merge(base: dict[str, dict[str, Any]], layer: Mapping[str, Mapping[str, Any]]) -> None:
    for section, values in layer.items():
        dest = base.setdefault(section, {})
        for k, v in values.items():
            if isinstance(v, Mapping) and isinstance(dest.get(k), dict):
                dest[k] = {**dest[k], **v}
            else:
                dest[k] = v


def _depth(value: Any, limit: int) -> int:
    """How deep ``value`` nests (a scalar is 0), counted without recursion and only up to
    ``limit + 1``."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            d += 1
            deepest = max(deepest, d)
            if d > limit:
                return d
            stack += [(x, d) for x in (v.values() if isinstance(v, dict) else v)]
    return deepest


_TRIPLE_QUOTES = (b'"' * 3, b"'" * 3)


def _bracket_depth(raw: bytes) -> int:
    """The deepest nesting of ``[`` / ``{`` outside strings and comments: a bound on how
    deep the TOML parser would recurse, found without parsing (it recurses per level and
    fails with a RecursionError some thousand levels down)."""
    depth = deepest = 0
    i, n = 0, len(raw)
    while i < n:
        c = raw[i:i + 1]
        if c in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
        elif c in (b"]", b"}"):
            depth = max(0, depth - 1)
        elif c == b"#":  # a comment, to the end of the line
            j = raw.find(b"\n", i)
            i = n if j < 0 else j
            continue
        elif c in (b'"', b"'"):
            quote = raw[i:i + 3] if raw[i:i + 3] in _TRIPLE_QUOTES else c
            j = i + len(quote)
            while j < n and raw[j:j + len(quote)] != quote:
                j += 2 if raw[j:j + 1] == b"\\" and c == b'"' else 1
            i = j + len(quote)
            continue
        i += 1
    return deepest


def read_file(path: str) -> dict[str, dict[str, Any]]:
    """Parse a TOML config file. Raises ConfigError naming the file (and line) on any
    problem: unreadable, not UTF-8, not TOML, nested deeper than :data:`MAX_DEPTH`, an
    unknown section."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file does not exist") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, not a config file") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror or e}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_FILE_BYTES >> 20} MiB: not a config file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise ConfigError(f"{path}: not UTF-8 text (line {line}, byte 0x{raw[e.start]:02x}): "
                          "save the file as UTF-8") from None
    too_deep = f"{path}: nested too deeply (arrays or tables more than {MAX_DEPTH} levels deep)"
    if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH and _bracket_depth(raw) > MAX_DEPTH:
        raise ConfigError(too_deep)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    except RecursionError:
        raise ConfigError(too_deep) from None
    except ValueError as e:  # beyond tomllib's own limits, e.g. a decimal integer of 4,300+ digits
        raise ConfigError(f"{path}: not usable TOML: {str(e)[:120]}") from None
    if _depth(data, MAX_DEPTH) > MAX_DEPTH:  # dotted keys (a.b.c = 1) nest without brackets
        raise ConfigError(too_deep)
    for section, values in data.items():
        if section not in _SECTIONS:
            raise ConfigError(f"{path}: unknown section [{section[:_SHOWN]}] (known: {', '.join(_SECTIONS)})")
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: {section[:_SHOWN]} must be a table")
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
            where = f"{origin.get((section, k), '?')}: [{section}] {str(k)[:_SHOWN]}"
            if k not in hints:
                raise ConfigError(f"{where}: unknown key (known: {', '.join(hints)})")
            kwargs[k] = _coerce(v, hints[k], where)
            check = _CHECKS.get((section, k))
            reason = check(kwargs[k]) if check else None
            if reason:  # alert tables may hold secrets: never echoed
                shown = "" if section == "alerts" and isinstance(v, (dict, list)) else f" (got {_shown(v)})"
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
