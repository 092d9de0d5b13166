"""Fuzzing the input boundaries (issue 14) with hypothesis.

What the outside world hands ckptwatch: log bytes and lines (reader, prefixes, timestamps,
multiline grouping), rule packs (YAML) and config files (TOML) and variables. The property
everywhere: a value comes back, or the module's documented error (``LinePrefixError``,
``RuleError``, ``ConfigError``), never another exception. Timestamps also round-trip:
a time written in each supported format is read back as the same UTC instant.

``CKPTWATCH_FUZZ_EXAMPLES`` is the number of examples of the whole file (default 2500,
under a minute), shared by the tests by weight; a soak::

    CKPTWATCH_FUZZ_EXAMPLES=100000 .venv/bin/python -m pytest -q tests/test_fuzz_inputs.py

A crash found in ``ckptwatch/ingest`` is kept below as a test of its minimal example.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import math
import os
import re

import polars as pl
import pytest
import yaml
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from ckptwatch import config
from ckptwatch.ingest import multiline, prefix, reader, timestamps
from ckptwatch.rules import RuleError, RuleSet
from ckptwatch.rules.engine import _example_records, check_examples, load_pack
from ckptwatch.schema import EVENT_KINDS, TS

TOTAL = int(os.environ.get("CKPTWATCH_FUZZ_EXAMPLES", "2500"))
#: share of the examples per test (their cost differs: rules and config touch files)
WEIGHTS = {"reader": 16, "prefix": 10, "line_prefix": 5, "timestamps": 4, "round_trip": 8, "kernel": 3,
           "multiline": 10, "rules": 12, "rules_text": 5, "config": 14, "config_bytes": 5, "config_env": 8}
UTC = dt.timezone.utc
NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def budget(name: str) -> settings:
    """Settings of one fuzz test: its share of ``CKPTWATCH_FUZZ_EXAMPLES``, no deadline (the
    first polars call of a process is slow)."""
    n = max(20, round(TOTAL * WEIGHTS[name] / sum(WEIGHTS.values())))
    return settings(max_examples=n, deadline=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


# -- log lines ------------------------------------------------------------------------------

PREFIXES = ["[rank3]:", "[rank0]:[rank7]:", "[default2]:", "[trainer1|5]:", "[3]: ", "[3]:", " 12: ", "3: ",
            "node-a: ", "node-a:3: ", "[node-b:12]: ", "[1,3]<stdout>: ", "[0,1]<stderr>:",
            "(RayTrainWorker pid=4321, ip=10.0.0.2) ", "(Actor pid=9) ", "gpu-01.cluster:0: ", "localhost: ",
            "[rank999999999999]:", "[99999999999]: ", "[rank: 0] ", "[Rank 1] ", "rank=3 ", "global_rank=2 ",
            "[rank2/4] "]
STAMPS = ["2026-11-30 10:22:47,875 ", "2026-11-30T10:21:21.415Z ", "2026-11-30T10:21:21+02:00 ",
          "2026-11-30_10:21:21.123456789-0530 ", "[INFO|trainer.py:3984] 2026-12-01 10:08:25,000 ",
          "11/30/2026 10:20:43 ", "[Wed Jun 18 15:56:56 2025] ", "I1130 10:12:27.123456 ", "[E117 10:18:25.123 ",
          "E0229 00:00:00.0 ", "Nov 30 10:12:27 ", "Feb 29 23:59:59.999 ", "[ 1234.567890] ", "[99999999999.9] ",
          "9999-99-99 99:99:99 ", "0000-01-01T00:00:00Z ", "2100-01-01 00:00:00 ", "1969-12-31 23:59:59 ",
          "2026-02-30 10:00:00 ", "2026-11-30 24:00:60 ", "I1399 99:99:99.9 ", "Jan  1 00:00:00 "]
MESSAGES = ["Traceback (most recent call last):", '  File "/x/train.py", line 12, in save',
            "    torch.save(state, path)", "RuntimeError: CUDA error", "torch.distributed.DistBackendError: x",
            "During handling of the above exception, another exception occurred:", "Failures:",
            "Root Cause (first observed failure):", "[0]:", "  time      : 2026-11-30_10:21:21",
            "saving checkpoint at iteration 40 to /ckpt", "  successfully saved checkpoint from iteration 40",
            "Saving model checkpoint to /out/checkpoint-500", "\t", " ", "", "\x00", "\ufffd\ufffd", "é中🙂",
            "a" * 300, "x" * 97]
JSON_KEYS = sorted({k for keys in prefix.JSON_KEYS.values() for k in keys} | {"stream", "time", "other"})



json_value = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10 ** 30), max_value=10 ** 30),
                       st.floats(), st.text(max_size=30), st.sampled_from(STAMPS + MESSAGES),
                       st.lists(st.integers(), max_size=3))
json_line = st.dictionaries(st.sampled_from(JSON_KEYS), json_value, max_size=6).map(
    lambda d: json.dumps(d, ensure_ascii=False))
# kernel "[seconds since boot]" stamps of every size, past Int64 microseconds (9.2e12 s) too
kernel_stamp = st.floats(min_value=0, max_value=1e16).map(lambda x: f"[{x:12.6f}] ")
fragment = st.one_of(st.sampled_from(PREFIXES), st.sampled_from(STAMPS), st.sampled_from(MESSAGES), kernel_stamp,
                     st.text(max_size=40))
log_line = st.one_of(st.lists(fragment, max_size=5).map("".join), json_line).map(
    lambda s: s.replace("\n", " ").replace("\r", " "))
lines_batch = st.lists(log_line, min_size=1, max_size=25)


@budget("reader")
@given(data=st.one_of(st.binary(max_size=3000),
                      st.lists(st.one_of(log_line.map(str.encode), st.binary(max_size=60),
                                         st.sampled_from([b"\r", b"\r\n", b"\n", b"\xff\xfe", b'{"log": "a\\rb\\r"}',
                                                          b'{"msg": "\\r\\r", "x": 1}', b"\x00"])),
                             max_size=40).map(lambda parts: b"\n".join(parts))),
       start=st.integers(min_value=0, max_value=3100), final=st.booleans(),
       max_line=st.integers(min_value=1, max_value=600), chunk=st.integers(min_value=1, max_value=4096))
def test_reader_returns_lines_or_raises_oserror(data, start, final, max_line, chunk):
    start = min(start, len(data))
    res = reader.read_lines(io.BytesIO(data), start, final=final, max_line_bytes=max_line, chunk_bytes=chunk)
    offsets = [o for o, _ in res.lines]
    assert offsets == sorted(set(offsets))  # each line once, in file order
    assert all(start <= o < len(data) for o in offsets)
    assert all("\n" not in text for _, text in res.lines)
    assert start <= res.next_offset <= len(data)
    assert all(start <= o < len(data) and n > max_line for _, o, n in res.skipped)
    reader.looks_binary(io.BytesIO(data))


layouts = st.builds(prefix.PrefixLayout, host_prefix=st.booleans(), task_prefix=st.booleans(),
                    host_rank_prefix=st.booleans(), task_is_launcher=st.booleans(), template=st.none())
macro_template = st.lists(st.sampled_from(["${rank}", "${local_rank}", "${hostname}", "${role_name}", "${bogus}",
                                           "${", "}", "$", ":", "[", "]", " ", "|", ".*", "(", "\\"]) | st.text(max_size=4),
                          max_size=6).map("".join)


@budget("line_prefix")
@given(template=macro_template, lines=lines_batch)
def test_line_prefix_template_compiles_or_is_refused(template, lines):
    try:
        rx = prefix.compile_line_prefix(template)
    except prefix.LinePrefixError as e:
        assert str(e).startswith("line prefix template ")
        return
    re.compile(rx)
    out = prefix.split_prefixes(pl.DataFrame({"line": lines}, schema={"line": pl.Utf8}),
                                layout=prefix.PrefixLayout(template=template))
    assert out.height == len(lines)


@budget("prefix")
@given(lines=lines_batch, layout=layouts, local=st.booleans())
def test_prefixes_are_read_or_left(lines, layout, local):
    df = pl.DataFrame({"line": lines}, schema={"line": pl.Utf8})
    out = prefix.split_prefixes(df, layout=layout, rank_prefix_is_local=local)
    assert out.height == len(lines)
    assert out.schema["prefix_rank"] == pl.Int32 and out.schema["prefix_local_rank"] == pl.Int32
    assert out.schema["prefix_pid"] == pl.Int64 and out["line"].null_count() == 0
    assert prefix.sniff(lines) is not None
    ranks = df.select(prefix.inline_rank(pl.col("line")).alias("r"))
    assert ranks.height == len(lines)


@budget("timestamps")
@given(lines=lines_batch, streams=st.lists(st.sampled_from("abc"), min_size=25, max_size=25),
       boot=st.none() | st.datetimes(min_value=dt.datetime(1971, 1, 1), max_value=dt.datetime(2026, 11, 30),
                                     timezones=st.just(UTC)),
       offset=st.integers(min_value=-14 * 60, max_value=14 * 60), carried=st.booleans())
def test_event_times_are_utc_and_sane(lines, streams, boot, offset, carried):
    n = len(lines)
    mtime = dt.datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    df = pl.DataFrame({"line": lines, "stream_key": streams[:n], "mtime": [mtime] * n},
                      schema={"line": pl.Utf8, "stream_key": pl.Utf8, "mtime": TS})
    out = timestamps.add_event_time(df, boot_time=boot, assume_utc_offset_minutes=offset, now=NOW,
                                    carry={"a": mtime} if carried else None, file_carry=mtime if carried else None)
    assert out.height == n and out["ts"].null_count() == 0
    assert isinstance(out.schema["ts"], pl.Datetime) and out.schema["ts"].time_zone == "UTC"
    assert set(out["ts_source"]) <= {"line", "inherited", "mtime"}
    own = out.filter(pl.col("ts_source") == "line")["ts"]
    assert own.is_empty() or own.max() <= NOW + timestamps.MAX_AHEAD
    got = timestamps.parse_one(lines[0], context=mtime)
    assert got is None or got.utcoffset() == dt.timedelta(0)


# the formats of the timestamps module's table, written from a known UTC instant: each must
# read back as that instant (to the precision the format carries)
def _render(when: dt.datetime, fmt: str, off: int) -> tuple[str, dt.datetime]:
    local = when + dt.timedelta(minutes=off)
    sign, hh, mm = ("-" if off < 0 else "+"), abs(off) // 60, abs(off) % 60
    ms = when.replace(microsecond=when.microsecond // 1000 * 1000)
    s = when.replace(microsecond=0)
    return {
        "iso_z": (f"{when:%Y-%m-%dT%H:%M:%S}.{when.microsecond:06d}Z INFO saving", when),
        "iso_offset": (f"{local:%Y-%m-%d %H:%M:%S},{when.microsecond // 1000:03d}{sign}{hh:02d}:{mm:02d} x",
                       ms),
        "iso_naive_tagged": (f"[titan] {when:%Y-%m-%d %H:%M:%S},{when.microsecond // 1000:03d} - root - x", ms),
        "mdy": (f"{when:%m/%d/%Y %H:%M:%S} - INFO - x", s),
        "ctime": (f"[{when:%a %b} {when.day:2d} {when:%H:%M:%S} {when.year}] oom-kill", s),
        "glog": (f"I{when:%m%d %H:%M:%S}.{when.microsecond:06d} 5872 torch/x.py:12] y", when),
        "glog_unpadded": (f"[E{when.month}{when:%d %H:%M:%S}.{when.microsecond:06d} PGNCCL.cpp:632] y", when),
        "syslog": (f"{when:%b} {when.day:2d} {when:%H:%M:%S} node-a kernel: x", s),
    }[fmt]


@budget("round_trip")
@given(when=st.datetimes(min_value=dt.datetime(1971, 1, 1), max_value=dt.datetime(2026, 11, 30, 23, 59),
                         timezones=st.just(UTC)),
       fmt=st.sampled_from(["iso_z", "iso_offset", "iso_naive_tagged", "mdy", "ctime", "glog", "glog_unpadded",
                            "syslog"]),
       off=st.integers(min_value=-14 * 60, max_value=14 * 60), drift=st.integers(min_value=-150, max_value=150))
def test_each_format_round_trips_to_the_same_utc_instant(when, fmt, off, drift):
    text, want = _render(when, fmt, off)
    context = when + dt.timedelta(days=drift)  # year-less formats: a context within five months
    got = timestamps.parse_one(text, context=context)
    assert got is not None, text
    assert got.utcoffset() == dt.timedelta(0)
    assert got == want, (text, got, want)


@budget("kernel")
@given(boot=st.datetimes(min_value=dt.datetime(1971, 1, 1), max_value=dt.datetime(2026, 1, 1),
                         timezones=st.just(UTC)),
       up=st.integers(min_value=0, max_value=10 ** 8 * 10 ** 6))
def test_kernel_seconds_since_boot_round_trip(boot, up):
    line = f"[{up // 10 ** 6:5d}.{up % 10 ** 6:06d}] Out of memory: Killed process 5879 (python)"
    df = pl.DataFrame({"line": [line], "stream_key": ["k"], "mtime": [NOW]},
                      schema={"line": pl.Utf8, "stream_key": pl.Utf8, "mtime": TS})
    out = timestamps.add_event_time(df, boot_time=boot, now=NOW)
    want = boot + dt.timedelta(microseconds=up)
    if want > NOW + timestamps.MAX_AHEAD:
        assert out["ts_source"][0] != "line"
        return
    assert out["ts_source"][0] == "line"
    assert abs(out["ts"][0] - want) <= dt.timedelta(microseconds=1)  # seconds as a float: 1 us of rounding


@budget("multiline")
@given(rows=st.lists(st.tuples(st.sampled_from("ab"), log_line), min_size=1, max_size=40), final=st.booleans())
def test_grouping_keeps_every_line_once(rows, final):
    df = pl.DataFrame({"stream_key": [s for s, _ in rows], "offset": list(range(len(rows))),
                       "line": [t for _, t in rows]},
                      schema={"stream_key": pl.Utf8, "offset": pl.Int64, "line": pl.Utf8})
    records, held = multiline.group_lines(df, final=final)
    non_blank = df.filter(pl.col("line").str.strip_chars() != "")
    grouped = sum(text.count("\n") + 1 for text in records["line"]) + held.height
    assert grouped == non_blank.height
    assert records["offset"].to_list() == sorted(records["offset"].to_list())
    if final:
        assert held.is_empty()
    unwrapped = multiline.unwrap(df.select("offset", "line"))
    assert "".join(unwrapped["line"]) == "".join(df["line"])


# -- rule packs -----------------------------------------------------------------------------

PATTERNS = [r"saving step (?P<step>\d+) to (?P<path>\S+)", r"(?P<rank>\d+) (?P<ts>\S+ \S+)", r"(a+)+", r"(.*)*",
            r"(\w+\s?)*", r"x{5000}", r"(?:x{2,900}){1,900}", r"(?<=x)y", r"(", r"(?P<job>[^ ]+) (?P<n>\d+)",
            r"(?P<attempt>\d+)", r"(?s)a.*?(?P<pid>\d+)", r"\p{L}+", r"[[:alpha:]]+", "a" * 2100,
            r"(?:, \w+=[^,)\n]*)*?, end", r"(?P<x>\d+)(?P<x__2>\d+)"]
FORMATS = ["{path}/iter_{step:07d}", "{step:300000000d}", "{path.__class__}", "{step[0]}", "{0}", "{}", "{path",
           "{step:{path}}", "{path!r}", "{step:c}", "{step:,.2f}", "{path:>64}", "{{}}", "{step:s}", "x" * 600]
scalar = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10 ** 30), max_value=10 ** 30), st.floats(),
                   st.text(max_size=20), st.dates(), st.datetimes())
# nested lists and mappings of anything (st.deferred: hypothesis keeps the nesting small)
yaml_value = st.deferred(lambda: scalar | st.lists(yaml_value, max_size=3)
                         | st.dictionaries(st.text(max_size=8) | st.integers(), yaml_value, max_size=3))
example_line = st.sampled_from(["saving step 5 to /ckpt", "3 2026-11-30 10:00:00", "aaaa", "job-1 7", "x y",
                                "a 5", "xy"]) | st.text(max_size=30)


def mostly(valid: st.SearchStrategy, hostile: st.SearchStrategy) -> st.SearchStrategy:
    """``valid`` three times in four, else ``hostile``."""
    return st.one_of(valid, valid, valid, hostile)


def one_fault(valid: st.SearchStrategy, faults: dict[str, st.SearchStrategy]) -> st.SearchStrategy:
    """A valid mapping, or (one time in three) the same with one field replaced by a hostile
    value (or removed: ``DROP``): most examples pass the first checks, so every later check,
    and the matching of a loaded pack, is reached too."""
    faulted = st.tuples(valid, st.sampled_from(sorted(faults)).flatmap(
        lambda f: st.tuples(st.just(f), faults[f] | st.just(DROP))))
    return st.one_of(valid, valid, faulted.map(
        lambda t: {k: v for k, v in {**t[0], t[1][0]: t[1][1]}.items() if v is not DROP}))


DROP = object()
GOOD_PATTERNS = [r"saving step (?P<step>\d+) to (?P<path>\S+)", r"(?P<rank>\d+) (?P<ts>\S+ \S+)",
                 r"(?P<job>[^ ]+) (?P<n>\d+)", r"(?s)a.*?(?P<pid>\d+)", r"(?:, \w+=[^,)\n]*)*?, end",
                 r"x(?P<x>\d+)?(?P<x__2>y)?", r"(?P<step>\d+)(?P<step__2>\d)?", r"a(?P<path>.*)"]
GOOD_FORMATS = ["{path}/iter_{step:07d}", "{path}/global_step{step}", "{step:>8}", "{{x}}/{path}", "{path:<20}",
                "{step:x}", "{step:,}", "{step:.3e}"]
attr_value = st.one_of(st.text(max_size=10), st.integers(min_value=-(2 ** 63), max_value=2 ** 63 - 1),
                       st.floats(allow_nan=False, allow_infinity=False), st.booleans())
valid_rule = st.fixed_dictionaries(
    {"id": st.sampled_from(["fz.a", "fz.b"]), "event": st.sampled_from(sorted(EVENT_KINDS)),
     "prefilter": st.sampled_from(["saving", "a", "x", " ", "y"]), "pattern": st.sampled_from(GOOD_PATTERNS),
     "examples": st.fixed_dictionaries(
         {"match": st.lists(example_line | st.fixed_dictionaries(
             {"line": example_line}, optional={"expect": st.dictionaries(
                 st.sampled_from(["step", "path", "x", "ts", "rank"]), attr_value | st.none(), max_size=2)}),
             min_size=1, max_size=3)},
         optional={"no_match": st.lists(example_line, max_size=2)})},
    optional={"attrs": st.dictionaries(st.text(min_size=1, max_size=8), attr_value, max_size=3),
              "path_format": st.sampled_from(GOOD_FORMATS),
              "sources": st.lists(st.sampled_from(["console", "worker", "log"]), max_size=2, unique=True),
              "during": st.sampled_from(["save", "load"]), "source": st.text(max_size=20),
              "description": st.text(max_size=20)})
rule = one_fault(valid_rule, {
    "id": st.text(max_size=10) | scalar, "event": st.just("not_a_kind") | scalar,
    "prefilter": st.text(max_size=5) | scalar,
    "pattern": st.sampled_from(PATTERNS) | scalar | st.text(alphabet="ab()[]{}*+?.|\\^$,:0-9dwsP<>", max_size=25),
    "examples": yaml_value | st.fixed_dictionaries({"match": yaml_value}, optional={"no_match": yaml_value})
                | st.fixed_dictionaries({"match": st.lists(st.fixed_dictionaries(
                    {"line": example_line, "expect": yaml_value}), min_size=1, max_size=2)}),
    "attrs": st.dictionaries(st.text(max_size=8) | scalar, scalar, max_size=3) | yaml_value,
    "path_format": st.sampled_from(FORMATS) | st.text(alphabet="{}:.!0-9dpathsx[]_>", max_size=15) | scalar,
    "sources": st.lists(st.sampled_from(["kernel"]) | yaml_value, max_size=2) | yaml_value,
    "during": st.just("never") | scalar, "source": scalar, "description": scalar,
    "disable": st.just(True) | scalar, "extra": scalar})
frame = one_fault(st.fixed_dictionaries({"during": st.sampled_from(["save", "load"]),
                                         "prefilter": st.sampled_from(["File", "save", "a"]),
                                         "pattern": st.sampled_from(GOOD_PATTERNS)},
                                        optional={"source": st.text(max_size=10)}),
                  {"during": scalar, "prefilter": scalar, "pattern": st.sampled_from(PATTERNS) | scalar,
                   "source": scalar, "other": scalar})
pack = st.one_of(
    st.fixed_dictionaries({"family": st.text(max_size=10), "rules": st.lists(rule, min_size=1, max_size=3)},
                          optional={"frames": st.lists(frame, max_size=2)}),
    st.fixed_dictionaries({"family": st.text(max_size=10), "rules": st.lists(rule, min_size=1, max_size=3)},
                          optional={"frames": st.lists(frame, max_size=2)}),
    st.fixed_dictionaries({"rules": yaml_value}, optional={"frames": yaml_value}),
    yaml_value)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """A directory for the files the examples write (hypothesis runs many examples per test)."""
    return tmp_path_factory.mktemp("fuzz")


def _loaded_rules_never_fail_at_match_time(rules, frames, lines):
    try:
        ruleset = RuleSet(rules, frames)
    except RuleError:
        event("refused when compiled")
        return  # a pattern the regex engine refuses: named at load
    ex_lines = [text for r in ruleset.rules for text, _ in r.match_examples] + list(lines)
    for kind in ("log", "console"):
        events = ruleset.apply(_example_records(ex_lines, kind))
        assert set(events["rule_id"]) <= {r.id for r in ruleset.rules}
        for attrs in events["attrs"]:
            assert isinstance(json.loads(attrs), dict)
    assert all(isinstance(e, RuleError) for e in check_examples(ruleset))


@budget("rules")
@given(doc=pack, lines=st.lists(example_line, max_size=4))
@example(doc={"rules": [{"id": "fz.date", "event": "save_start", "prefilter": "saving", "attrs": {dt.date(2024, 1, 1): "x"},
                         "pattern": r"saving step (?P<step>\d+) to (?P<path>\S+)",
                         "examples": {"match": ["saving step 5 to /ckpt"]}}]}, lines=[])
@example(doc={"rules": [{"id": "fz.fmt", "event": "save_start", "prefilter": "saving", "path_format": "{step:c}",
                         "pattern": r"saving step (?P<step>\d+) to (?P<path>\S+)",
                         "examples": {"match": ["saving step 99999999999 to /ckpt"]}}]}, lines=[])
def test_rule_packs_load_or_are_refused_and_never_fail_at_match_time(scratch, doc, lines):
    path = scratch / "pack.yaml"
    path.write_text(yaml.safe_dump(doc, allow_unicode=True), encoding="utf-8")
    try:
        rules, frames = load_pack(str(path))
    except RuleError as e:
        assert str(e).startswith(str(path)) and "\n" not in str(e)
        event("refused at load")
        return
    event(f"loaded {min(len(rules), 2)}+ rules")
    _loaded_rules_never_fail_at_match_time([r for r in rules if not r.disable], frames, lines)


@budget("rules_text")
@given(text=st.one_of(st.text(max_size=300), st.lists(st.sampled_from(
    ["rules:", "\n", "  - ", "id: a", "event: save_start", "pattern: '(a+)+'", "prefilter: a", "{", "}", "[", "]",
     "&x ", "*x", "!!python/object:os.system", "!!binary", "? ", ": ", "'", '"', "|", ">", "%YAML 1.1", "---",
     "\t", "- ", "examples: {match: [a]}", "attrs: {since: 2024-01-01}"]), max_size=30).map("".join)))
def test_rule_pack_text_loads_or_is_refused(scratch, text):
    path = scratch / "text.yaml"
    path.write_text(text, encoding="utf-8")
    try:
        load_pack(str(path))
    except RuleError as e:
        assert str(e).startswith(str(path)) and "\n" not in str(e)


# -- config ---------------------------------------------------------------------------------

KEYS = sorted({k for cls in (config.KafkaSettings, config.CollectSettings, config.DetectSettings,
                             config.SinkSettings, config.AlertSettings, config.MetricsSettings)
               for k in cls.__dataclass_fields__})
SECTIONS = ["kafka", "collect", "detect", "sink", "alerts", "metrics", "kafka.client", "alerts.channels.oncall",
            "alerts.channels", "nope", "metrics.port"]
bare_key = st.sampled_from(KEYS) | st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,8}", fullmatch=True)


def _toml_string(s: str) -> str:
    return json.dumps(s)  # a TOML basic string: the same escapes, \uXXXX included


toml_scalar = st.one_of(
    st.integers(min_value=-(10 ** 25), max_value=10 ** 25).map(str),
    st.integers(min_value=0, max_value=16 ** 40).map(hex),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.sampled_from(["inf", "-inf", "nan", "+nan", "1e400", "-1e400", "1e-400", "0.0", "-0.0", "9464.5", "1_000",
                     "0x" + "f" * 5000, "0o777", "0b101", "true", "false", "1979-05-27", "1979-05-27T07:32:00Z",
                     "07:32:00", "1979-05-27 07:32:00.999999-07:00", '"127.0.0.1:9092"', '"gzip"', '"zstd"',
                     "'literal'", '"""multi\nline"""', '"a:1,b:99999"', '"1e400"', '""']),
    st.text(max_size=20).map(_toml_string))
toml_value = st.deferred(lambda: toml_scalar | toml_scalar | st.one_of(
    st.lists(toml_value, max_size=3).map(lambda xs: "[" + ", ".join(xs) + "]"),
    st.lists(st.tuples(bare_key, toml_value), max_size=3).map(
        lambda kvs: "{" + ", ".join(f"{k} = {v}" for k, v in dict(kvs).items()) + "}")))
#: a usable TOML value per key (the hostile ones come from ``toml_value``)
VALID = {
    "bootstrap_servers": st.sampled_from(['"127.0.0.1:9092"', '"a:1,b:2"', '""']),
    "events_topic": st.just('"e"'), "incidents_topic": st.just('"i"'), "saves_topic": st.just('"s"'),
    "partitions": st.integers(1, 64).map(str), "replication_factor": st.integers(1, 3).map(str),
    "compression": st.sampled_from(['"gzip"', '"none"']),
    "connect_hint_after": st.floats(0.1, 100).map(repr), "connect_timeout": st.floats(0.1, 600).map(repr),
    "paths": st.sampled_from(['["a.log", "b/*.log"]', "[]"]), "path_template": st.just('"{job}/rank{rank}.log"'),
    "line_prefix": st.just('"${hostname}:${rank}: "'), "boot_time": st.just('"2026-11-30T08:00:00Z"'),
    "checkpoint": st.just('"c.json"'), "interval": st.floats(0.01, 60).map(repr),
    "checkpoint_roots": st.just('["/ckpt"]'), "verify_log": st.just('"v.log"'),
    "verify_settle": st.floats(0, 600).map(repr), "group": st.just('"g"'),
    "allowed_lateness": st.floats(0, 3600).map(repr), "db": st.just('"x.duckdb"'),
    "silences_file": st.just('"s.json"'), "realert_interval": st.floats(0, 3600).map(repr),
    "timeout": st.floats(0.1, 60).map(repr), "retry_initial": st.floats(0.1, 60).map(repr),
    "retry_max": st.floats(0.1, 3600).map(repr), "give_up_after": st.floats(1, 86400).map(repr),
    "redaction_files": st.just("[]"), "port": st.integers(0, 65535).map(str),
    "address": st.just('"127.0.0.1"'), "job_label": st.sampled_from(["true", "false"]),
    "type": st.sampled_from(['"console"', '"slack"', '"webhook"', '"pagerduty"', '"sms"']),
    "min_severity": st.sampled_from(['"info"', '"warning"', '"error"', '"critical"', '"loud"']),
    "url": st.just('"http://127.0.0.1:1/hook"'), "url_env": st.just('"HOOK_URL"'),
    "job": st.just('"debug-*"'), "expires": st.sampled_from(['"2026-12-31T00:00:00Z"', "2026-12-31T00:00:00Z",
                                                             '"soon"']),
}
SECTION_KEYS = {"kafka": [k for k in config.KafkaSettings.__dataclass_fields__ if k != "client"],
                "collect": list(config.CollectSettings.__dataclass_fields__),
                "detect": list(config.DetectSettings.__dataclass_fields__),
                "sink": list(config.SinkSettings.__dataclass_fields__),
                "alerts": [k for k in config.AlertSettings.__dataclass_fields__ if k not in ("channels", "silences")],
                "metrics": list(config.MetricsSettings.__dataclass_fields__),
                "kafka.client": ["linger_ms", "security_protocol", "sasl_pasword"],
                "alerts.channels.oncall": ["type", "min_severity", "url", "url_env", "match", "timeout"],
                "[alerts.silences]": ["job", "expires", "comment"]}
#: hostile table names next to the real ones


FIXED = {"alerts.channels.oncall": st.sampled_from([{"type": '"console"', "min_severity": '"error"'},
                                                    {"type": '"webhook"', "url": '"http://127.0.0.1:1/hook"'}]),
         "[alerts.silences]": st.just({"job": '"debug-*"', "expires": '"2026-12-31T00:00:00Z"'})}


def section(name: str) -> st.SearchStrategy:
    """One table with its own keys and usable values."""
    if name in FIXED:
        return FIXED[name].map(lambda kvs: (name, kvs))
    pair = st.sampled_from(SECTION_KEYS[name]).flatmap(lambda k: st.tuples(st.just(k), VALID.get(k, toml_scalar)))
    return st.lists(pair, max_size=5).map(lambda kvs: (name, dict(kvs)))


def render(tables: list[tuple[str, dict[str, str]]]) -> str:
    """TOML text of ``(table, {key: value text})`` pairs."""
    return "".join(f"[{name}]\n" + "".join(f"{k} = {v}\n" for k, v in kvs.items()) for name, kvs in tables)


valid_doc = st.lists(st.sampled_from(sorted(SECTION_KEYS)), min_size=1, max_size=4, unique=True).flatmap(
    lambda names: st.tuples(*(section(n) for n in names))).map(list)
# one hostile line in a usable file: a known or unknown key of a known or unknown table
fault = st.tuples(st.sampled_from(sorted(SECTION_KEYS) + SECTIONS), mostly(st.sampled_from(KEYS), bare_key),
                  toml_value)
toml_doc = st.one_of(
    valid_doc.map(render),
    st.tuples(valid_doc, fault).map(lambda t: render([*t[0], (t[1][0], {t[1][1]: t[1][2]})])),
    st.tuples(valid_doc, fault).map(lambda t: render(t[0]) + f"{t[1][1]} = {t[1][2]}\n"),
    st.lists(st.tuples(st.sampled_from(SECTIONS) | st.just(""), st.dictionaries(bare_key, toml_value, max_size=4)),
             max_size=4).map(lambda tables: "".join((f"[{n}]\n" if n else "")
                                                    + "".join(f"{k} = {v}\n" for k, v in kvs.items())
                                                    for n, kvs in tables)))


def _load_or_config_error(path: str | None = None, env: dict[str, str] | None = None) -> None:
    try:
        cfg = config.load(path, env=env or {})
    except config.ConfigError as e:
        event("refused")
        msg = str(e)
        assert "\n" not in msg and len(msg) < 2000, msg[:300]
        assert msg.startswith(path if path else "environment: "), msg[:300]
        return
    event("loaded")
    assert isinstance(cfg, config.Config)
    for value in (cfg.collect.interval, cfg.detect.interval, cfg.detect.allowed_lateness, cfg.alerts.timeout,
                  cfg.kafka.connect_timeout):
        assert math.isfinite(value) and value >= 0
    assert 0 <= cfg.metrics.port < 65536 and cfg.kafka.partitions >= 1


@budget("config")
@given(text=toml_doc)
@example(text="[metrics]\nport = 1e400\n")
@example(text="[detect]\ngroup = " + "[" * 5000 + "]" * 5000 + "\n")
def test_config_files_load_or_are_refused(scratch, text):
    path = scratch / "c.toml"
    path.write_text(text, encoding="utf-8")
    _load_or_config_error(str(path))


@budget("config_bytes")
@given(raw=st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
@example(raw=b"[detect]\ngroup = '\xff\xfe'\n")
def test_config_bytes_load_or_are_refused(scratch, raw):
    path = scratch / "b.toml"
    path.write_bytes(raw)
    _load_or_config_error(str(path))


env_name = st.sampled_from([f"CKPTWATCH_{s.upper()}_{k.upper()}" for s in ("kafka", "collect", "detect", "sink",
                                                                           "alerts", "metrics") for k in KEYS]
                           + ["CKPTWATCH_KAFKA_CLIENT_LINGER_MS", "CKPTWATCH_NOPE", "CKPTWATCH_", "CKPTWATCH_CONFIG"])
env_value = st.sampled_from(["inf", "nan", "-1", "0", "1e400", "9" * 5000, "true", "yes", "a,b", "", " ",
                             "127.0.0.1:1", "x:99999999999"]) | st.text(max_size=20)


@budget("config_env")
@given(env=st.dictionaries(env_name.filter(lambda n: n != "CKPTWATCH_CONFIG"), env_value.map(
    lambda v: v.replace("\x00", "")), max_size=4))
def test_config_variables_load_or_are_refused(env):
    _load_or_config_error(env=env)


# -- crashes the fuzzing found in ckptwatch/ingest, each with its minimal example

def test_json_time_beyond_the_calendar_is_not_a_crash():
    # a JSON log line whose time field is 9e15 (read as ms: 9e12 s, year ~287,000);
    # `ckptwatch diagnose` on a file holding just this line dies with a PanicException
    df = pl.DataFrame({"line": ['{"time": 9e15, "msg": "x"}']}, schema={"line": pl.Utf8})
    out = prefix.split_prefixes(df)
    assert out["line"].to_list() == ["x"]


def test_kernel_stamp_beyond_int64_microseconds_is_not_a_crash():
    # `ckptwatch diagnose --boot-time 2026-11-30T08:00:00Z kern.log` with this one line fails the same way
    df = pl.DataFrame({"line": ["[9999999999999.0] Out of memory: Killed process 5879 (python)"],
                       "stream_key": ["k"], "mtime": [NOW]},
                      schema={"line": pl.Utf8, "stream_key": pl.Utf8, "mtime": TS})
    out = timestamps.add_event_time(df, boot_time=dt.datetime(2026, 11, 30, 8, tzinfo=UTC), now=NOW)
    assert out["ts_source"][0] != "line"  # not believable: the record inherits or takes the mtime
