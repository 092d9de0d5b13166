"""Timestamps: every corpus format and the well-known ones parse to UTC; year-less ones
take their year from context; records without a time inherit, then fall back to mtime."""

from __future__ import annotations

import datetime as dt

import polars as pl
import pytest

from ckptwatch.ingest.timestamps import add_event_time, parse_one
from ckptwatch.schema import TS

UTC = dt.timezone.utc
CTX = dt.datetime(2026, 11, 30, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("2026-11-30 10:22:47,875 INFO [rank3/4] train: x", dt.datetime(2026, 11, 30, 10, 22, 47, 875000, UTC)),
        ("[2026-11-30 10:21:09.728] [INFO] [rank2] x", dt.datetime(2026, 11, 30, 10, 21, 9, 728000, UTC)),
        ("11/30/2026 10:20:43 - INFO - transformers.trainer - x", dt.datetime(2026, 11, 30, 10, 20, 43, tzinfo=UTC)),
        ("I1130 10:21:03.995000 5872 torch/distributed/run.py:747] x", dt.datetime(2026, 11, 30, 10, 21, 3, 995000, UTC)),
        ("2026-11-30T10:21:21.415Z x", dt.datetime(2026, 11, 30, 10, 21, 21, 415000, UTC)),
        ("2026-11-30T12:21:21.5+02:00 x", dt.datetime(2026, 11, 30, 10, 21, 21, 500000, UTC)),
        ("2026-11-30T05:21:21-0500 x", dt.datetime(2026, 11, 30, 10, 21, 21, tzinfo=UTC)),
        ("Nov 30 10:12:27 gpu-node-07 kernel: x", dt.datetime(2026, 11, 30, 10, 12, 27, tzinfo=UTC)),
        ("2026-11-30_10:21:21", dt.datetime(2026, 11, 30, 10, 21, 21, tzinfo=UTC)),
        ("no time here", None),
    ],
)
def test_formats_parse_to_utc(text, want):
    assert parse_one(text, context=CTX) == want


def test_year_less_stamps_take_the_year_closest_to_context_not_today():
    jan = dt.datetime(2027, 1, 2, tzinfo=UTC)
    assert parse_one("Dec 31 23:59:58 host kernel: x", context=jan) == dt.datetime(2026, 12, 31, 23, 59, 58, tzinfo=UTC)
    assert parse_one("I0101 00:00:01.000000 1 f.py:1] x", context=dt.datetime(2019, 12, 31, tzinfo=UTC)) == \
        dt.datetime(2020, 1, 1, 0, 0, 1, tzinfo=UTC)


def _frame(lines, stream="s", mtime=CTX):
    return pl.DataFrame({"line": lines, "stream_key": [stream] * len(lines), "mtime": [mtime] * len(lines)},
                        schema={"line": pl.Utf8, "stream_key": pl.Utf8, "mtime": TS})


def test_year_from_a_full_timestamp_in_the_same_stream_beats_mtime():
    mtime = dt.datetime(2031, 6, 1, tzinfo=UTC)  # the file was copied years later
    out = add_event_time(_frame(["I1130 10:00:00.000000 1 a.py:1] agent", "2026-11-30 10:00:01,000 INFO x"], mtime=mtime))
    assert out["ts"][0] == dt.datetime(2026, 11, 30, 10, 0, tzinfo=UTC)


def test_inherit_then_mtime_then_carry():
    mtime = dt.datetime(2026, 12, 1, tzinfo=UTC)
    out = add_event_time(_frame(["Traceback (most recent call last):", "2026-11-30 10:00:00,000 x", "  frame"], mtime=mtime))
    assert out["ts_source"].to_list() == ["mtime", "line", "inherited"]
    assert out["ts"].to_list() == [mtime, dt.datetime(2026, 11, 30, 10, tzinfo=UTC), dt.datetime(2026, 11, 30, 10, tzinfo=UTC)]
    carried = add_event_time(_frame(["  frame"], mtime=mtime), carry={"s": dt.datetime(2026, 11, 30, 9, tzinfo=UTC)})
    assert carried["ts_source"].to_list() == ["inherited"]
    assert carried["ts"][0] == dt.datetime(2026, 11, 30, 9, tzinfo=UTC)


def test_kernel_uptime_needs_a_boot_time():
    boot = dt.datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
    out = add_event_time(_frame(["[ 3600.500000] Out of memory: Killed process 1 (python3)"]), boot_time=boot)
    assert out["ts"][0] == dt.datetime(2026, 11, 30, 9, 0, 0, 500000, UTC) and out["ts_source"][0] == "line"
    out = add_event_time(_frame(["[ 3600.500000] Out of memory: Killed process 1 (python3)"]))
    assert out["ts_source"][0] == "mtime"
