"""The rule engine's per-batch attribute JSON and dedup keys equal the per-row code they
replaced (kept here as the reference): same parsed attributes, same keys, on random rows."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math

import polars as pl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptwatch.rules.engine import _dedup_keys, attrs_json_of
from ckptwatch.schema import TS

UTC = dt.timezone.utc


def reference_attrs(rows: list[dict], static: dict, during: list, at_line: list) -> list[str]:
    """The per-row loop of the engine before attributes were built per batch."""
    out = []
    for row, code, n in zip(rows, during, at_line, strict=True):
        d = {k: v for k, v in row.items() if v is not None}
        d.update(static)
        if code is not None and "during" not in d:
            d["during"] = code
        if n:
            d["at_line"] = n
        out.append(json.dumps(d, sort_keys=True))
    return out


def reference_keys(df: pl.DataFrame) -> list[str]:
    keys = []
    for job, host, lr, rank, line, ts, src, sid in df.select(
            "job", "host", "local_rank", "rank", "line", "ts", "ts_source", "source_id").iter_rows():
        who = f"l{lr}" if lr is not None else (f"r{rank}" if rank is not None else (f"h{host}" if host else "-"))
        when = (ts.isoformat() if src == "line" and ts is not None
                else f"@{sid}" if src == "mtime" or who == "-" else "")
        keys.append(hashlib.sha256(f"{job}\x1f{who}\x1f{when}\x1f{line}".encode()).hexdigest()[:20])
    return keys


def parsed(texts: list[str]) -> list[str]:
    # NaN != NaN: compare the parsed values re-encoded
    return [json.dumps(json.loads(t), sort_keys=True) for t in texts]


def test_attrs_keep_types_drop_nulls_and_let_static_win():
    captured = pl.DataFrame({"loss": [1.5, None, math.nan], "step": [3, 4, None], "path": ['a"b', None, "é"],
                             "_during": [None, "save", None], "_at_line": [0, 2, 0]},
                            schema={"loss": pl.Float64, "step": pl.Int64, "path": pl.Utf8, "_during": pl.Utf8,
                                    "_at_line": pl.Int64})
    got = [json.loads(t) for t in attrs_json_of(captured, {"reporter": "agent", "step": 9}).to_list()]
    assert got[0] == {"loss": 1.5, "path": 'a"b', "reporter": "agent", "step": 9}
    assert got[1] == {"during": "save", "at_line": 2, "reporter": "agent", "step": 9}
    assert math.isnan(got[2]["loss"]) and got[2]["path"] == "é"
    only_static = attrs_json_of(pl.DataFrame({"_row": [0, 1]}), {"reporter": "agent"})
    assert only_static.to_list() == ['{"reporter": "agent"}'] * 2
    assert attrs_json_of(pl.DataFrame({"_row": [0]}), {}).to_list() == ["{}"]
    # a save line that says it is asynchronous: async true, unless the row captured its own
    said = pl.DataFrame({"async": [None, "no", None], "_async": [True, True, False]})
    assert [json.loads(t) for t in attrs_json_of(said, {}).to_list()] == [{"async": True}, {"async": "no"}, {}]


values = {
    pl.Int64: st.one_of(st.none(), st.integers(-(2 ** 63), 2 ** 63 - 1)),
    pl.Float64: st.one_of(st.none(), st.floats()),
    pl.Utf8: st.one_of(st.none(), st.text(max_size=12), st.sampled_from(['","x":null', "{", "\\", "\x00\x1f"])),
}


@st.composite
def captured_rows(draw):
    n = draw(st.integers(1, 6))
    names = draw(st.lists(st.sampled_from(["loss", "path", "during", "at_line", "code", "x"]), unique=True,
                          max_size=4))
    schema = {name: draw(st.sampled_from(list(values))) for name in names}
    cols = {name: draw(st.lists(values[t], min_size=n, max_size=n)) for name, t in schema.items()}
    during = draw(st.lists(st.one_of(st.none(), st.sampled_from(["save", "load"])), min_size=n, max_size=n))
    at_line = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    static = draw(st.dictionaries(st.sampled_from(["reporter", "code", "during", "x"]),
                                  st.one_of(st.text(max_size=5), st.integers(), st.booleans()), max_size=2))
    traceback = draw(st.booleans())
    return n, schema, cols, during if traceback else [None] * n, at_line if traceback else [0] * n, static, traceback


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=captured_rows())
def test_attrs_equal_the_per_row_json(case):
    n, schema, cols, during, at_line, static, traceback = case
    frame = pl.DataFrame(cols, schema=schema) if cols else pl.DataFrame({"_row": list(range(n))})
    if traceback:
        frame = frame.with_columns(pl.Series("_during", during, dtype=pl.Utf8),
                                   pl.Series("_at_line", at_line, dtype=pl.Int64))
    rows = [dict(zip(cols, vals, strict=True)) for vals in zip(*cols.values(), strict=True)] if cols else [{}] * n
    assert parsed(attrs_json_of(frame, static).to_list()) == parsed(reference_attrs(rows, static, during, at_line))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(st.tuples(
    st.one_of(st.none(), st.sampled_from(["job-1", "é"])), st.one_of(st.none(), st.sampled_from(["", "node1"])),
    st.one_of(st.none(), st.integers(0, 7)), st.one_of(st.none(), st.integers(0, 4095)), st.text(max_size=20),
    st.one_of(st.none(), st.datetimes(min_value=dt.datetime(1970, 1, 2), max_value=dt.datetime(2100, 1, 1))),
    st.sampled_from(["line", "mtime", "inherited", "rule"]), st.sampled_from(["s1", "s2"])), min_size=1, max_size=8))
def test_dedup_keys_equal_the_per_row_hash(rows):
    df = pl.DataFrame([(j, h, lr, r, line, ts.replace(tzinfo=UTC) if ts else None, src, sid)
                       for j, h, lr, r, line, ts, src, sid in rows],
                      schema={"job": pl.Utf8, "host": pl.Utf8, "local_rank": pl.Int32, "rank": pl.Int32,
                              "line": pl.Utf8, "ts": TS, "ts_source": pl.Utf8, "source_id": pl.Utf8}, orient="row")
    assert _dedup_keys(df).to_list() == reference_keys(df)
