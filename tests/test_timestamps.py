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
        ("11/29 10:10:00 - mmengine - INFO - Saving checkpoint at 4000 iterations",
         dt.datetime(2026, 11, 29, 10, 10, tzinfo=UTC)),
        ("[11/29 10:10:00 d2.engine.hooks]: Saving checkpoint to ./output/model_0004999.pth",
         dt.datetime(2026, 11, 29, 10, 10, tzinfo=UTC)),
        ("2024/06/01 10:12:01 - mmengine - INFO - Epoch(train)  [1][ 50/612]", dt.datetime(2024, 6, 1, 10, 12, 1, tzinfo=UTC)),
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


def test_inherit_then_the_next_time_then_mtime_then_carry():
    mtime = dt.datetime(2026, 12, 1, tzinfo=UTC)
    out = add_event_time(_frame(["Traceback (most recent call last):", "2026-11-30 10:00:00,000 x", "  frame"], mtime=mtime))
    assert out["ts_source"].to_list() == ["inherited", "line", "inherited"]  # before the first time: the next one
    assert out["ts"].to_list() == [dt.datetime(2026, 11, 30, 10, tzinfo=UTC)] * 3
    out = add_event_time(_frame(["no time", "none either"], mtime=mtime))
    assert out["ts_source"].to_list() == ["mtime", "mtime"] and out["ts"].to_list() == [mtime, mtime]
    carried = add_event_time(_frame(["  frame"], mtime=mtime), carry={"s": dt.datetime(2026, 11, 30, 9, tzinfo=UTC)})
    assert carried["ts_source"].to_list() == ["inherited"]
    assert carried["ts"][0] == dt.datetime(2026, 11, 30, 9, tzinfo=UTC)


def test_kernel_uptime_needs_a_boot_time():
    boot = dt.datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
    out = add_event_time(_frame(["[ 3600.500000] Out of memory: Killed process 1 (python3)"]), boot_time=boot)
    assert out["ts"][0] == dt.datetime(2026, 11, 30, 9, 0, 0, 500000, UTC) and out["ts_source"][0] == "line"
    out = add_event_time(_frame(["[ 3600.500000] Out of memory: Killed process 1 (python3)"]))
    assert out["ts_source"][0] == "mtime"


@pytest.mark.parametrize(
    ("text", "want"),
    [
        # c10d / NCCL glog after the [rank0]: prefix is removed: a bracket, 9 fraction digits
        ("[E1201 10:18:25.123456789 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective operation timeout",
         dt.datetime(2026, 12, 1, 10, 18, 25, 123456, UTC)),
        ("[E117 10:18:25.5 ProcessGroupNCCL.cpp:632] x", dt.datetime(2026, 1, 17, 10, 18, 25, 500000, UTC)),  # %m unpadded
        ("[INFO|trainer.py:3984] 2026-11-29 10:08:25,000 >> Saving model checkpoint to /out/checkpoint-500",
         dt.datetime(2026, 11, 29, 10, 8, 25, tzinfo=UTC)),  # HF Trainer's examples logging format
        ("[titan] 2026-11-29 10:08:25,123 - root - INFO - Saving the checkpoint (or staging if async is enabled).",
         dt.datetime(2026, 11, 29, 10, 8, 25, 123000, UTC)),
        ("[Wed Jun 18 15:56:56 2025] Out of memory: Killed process 4312 (python)",  # dmesg -T
         dt.datetime(2025, 6, 18, 15, 56, 56, tzinfo=UTC)),
        ("slurmstepd: error: *** JOB 4242 ON node-07 CANCELLED AT 2026-11-30T10:21:21 DUE TO TIME LIMIT ***",
         dt.datetime(2026, 11, 30, 10, 21, 21, tzinfo=UTC)),
        ("I1130 10:00:00.000000 1 f.py:1] started 2026-01-01 00:00:00", dt.datetime(2026, 11, 30, 10, tzinfo=UTC)),
    ],
)
def test_formats_real_tools_print(text, want):
    assert parse_one(text, context=CTX) == want


@pytest.mark.parametrize("text", ["2100-01-01 00:00:00,000 INFO x", "1600-01-01 00:00:00 x", "1969-12-31 23:59:59 x",
                                  "3000-06-01T00:00:00Z x"])
def test_stamps_out_of_the_sane_range_are_not_believed_and_never_wrap(text):
    out = add_event_time(_frame(["2026-11-30 10:00:00,000 before", text]), now=dt.datetime(2026, 12, 1, tzinfo=UTC))
    assert out["ts_source"].to_list() == ["line", "inherited"]
    assert out["ts"][1] == dt.datetime(2026, 11, 30, 10, tzinfo=UTC)
    assert out["ts_rejected"].to_list() == [False, True]


def test_a_stamp_within_a_day_ahead_of_the_wall_clock_is_believed():
    now = dt.datetime(2026, 12, 1, 10, tzinfo=UTC)
    out = add_event_time(_frame(["2026-12-01 20:00:00 x", "2026-12-02 11:00:00 y"]), now=now)
    assert out["ts_source"].to_list() == ["line", "inherited"]
    assert out["ts"].to_list() == [dt.datetime(2026, 12, 1, 20, tzinfo=UTC)] * 2


def test_year_less_stamps_take_the_year_of_a_dated_file_of_the_same_job(tmp_path):
    """A glog-only console read in 2026 of a 2025 run: its worker file (same job) is dated."""
    import os

    from ckptwatch.ingest.layout import compile_template
    from ckptwatch.ingest.watcher import SourceWatcher

    job = tmp_path / "job-7"
    job.mkdir()
    (job / "agent.log").write_text("E1130 10:21:21.702000 5872 api.py:1002] failed (exitcode: -9) local_rank: 2\n")
    (job / "rank2.log").write_text("2025-11-30 10:21:21,100 INFO saving checkpoint step 40 to /ckpt/step_40\n")
    (tmp_path / "lonely.log").write_text("E1130 10:21:21.702000 5872 api.py:1002] no dated neighbour\n")
    for f in (job / "agent.log", job / "rank2.log", tmp_path / "lonely.log"):
        os.utime(f, (dt.datetime(2026, 12, 1, tzinfo=UTC).timestamp(),) * 2)
    w = SourceWatcher([str(tmp_path)], template=compile_template("{job}/*.log"))
    recs = w.poll(final=True)
    years = {p.rsplit("/", 1)[1]: ts.year for p, ts in recs.select("file", "ts").iter_rows()}
    assert years == {"agent.log": 2025, "rank2.log": 2025, "lonely.log": 2026}
    assert w.stats.notes == {"year_from_mtime": 1}


def test_a_stream_without_times_moves_on_with_its_files_mtime_between_polls(tmp_path):
    import os

    from ckptwatch.ingest.watcher import SourceWatcher

    log = tmp_path / "train.log"
    log.write_text("step 1 | loss 0.5\n")
    t1 = dt.datetime(2026, 11, 30, 10, tzinfo=UTC)
    os.utime(log, (t1.timestamp(),) * 2)
    w = SourceWatcher([str(tmp_path)], flush_after=0)
    first = w.poll(now=t1)
    with log.open("a") as f:
        f.write("step 2 | loss 0.4\n")
    t2 = t1 + dt.timedelta(minutes=40)
    os.utime(log, (t2.timestamp(),) * 2)
    second = w.poll(now=t2)
    w.close()
    assert first["ts"].to_list() == [t1] and second["ts"].to_list() == [t2]
    assert second["ts_source"].to_list() == ["mtime"]


def test_a_time_captured_inside_a_line_beats_an_inherited_one(tmp_path):
    from ckptwatch.pipeline import PipelineOptions, diagnose

    pack = tmp_path / "pack.yaml"
    pack.write_text("""
family: test
rules:
  - id: test.scheduler_cancel
    event: job_failed
    prefilter: "CANCELLED AT"
    pattern: 'CANCELLED AT (?P<ts>\\S+)'
    examples:
      match: ["x CANCELLED AT 2026-11-30T10:21:21 y"]
""")
    logs = tmp_path / "logs"
    logs.mkdir()
    padding = "x" * 120  # the stamp is past where record times are looked for
    (logs / "slurm-1.out").write_text(f"2026-11-30 10:00:00,000 INFO step 1\n  {padding} CANCELLED AT 2026-11-30T10:21:21\n")
    from ckptwatch.ingest.watcher import SourceWatcher
    from ckptwatch.pipeline import extract_events
    from ckptwatch.rules import RuleSet

    w = SourceWatcher([str(logs)])
    recs = w.poll(final=True)
    assert recs["ts_source"].to_list() == ["line"]  # the indented line joined the first record
    rules = RuleSet.load([str(pack)])
    ev = extract_events(rules, recs, w.stats)
    assert ev["ts"].to_list() == [dt.datetime(2026, 11, 30, 10, tzinfo=UTC)]  # own time of the record wins
    (logs / "slurm-1.out").write_text(f"2026-11-30 10:00:00,000 INFO step 1\n{padding} CANCELLED AT 2026-11-30T10:21:21\n")
    w2 = SourceWatcher([str(logs)])
    ev = extract_events(rules, w2.poll(final=True), w2.stats)
    assert ev["ts"].to_list() == [dt.datetime(2026, 11, 30, 10, 21, 21, tzinfo=UTC)]
    assert ev["ts_source"].to_list() == ["rule"]
    assert diagnose([str(logs)], PipelineOptions(rule_files=(str(pack),)))[1].events == 1
