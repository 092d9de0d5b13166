"""A job's clock comes from its dated lines (issue 36, item 8). A file whose lines carry no
time of their own is dated by its mtime; copied today beside week-old dated logs, that mtime
moved the job's event time a week on, and a clean job's last save, still in flight where the
logs end, became a ``stalled_save``. A time given only by a file's mtime now counts for the
job only while none of its events is dated by a line."""

from __future__ import annotations

import os
import time

from log_support import two_saves

from ckptwatch.pipeline import diagnose

TRAIN = two_saves("2026-11-30", "runC", second_saved=False)


def test_a_time_less_file_copied_today_does_not_age_the_jobs_saves(tmp_path):
    (tmp_path / "train.log").write_text(TRAIN)
    extra = tmp_path / "launcher.log"
    extra.write_text("world_size: 8\n")  # a matched line without a time of its own
    week_later = time.mktime((2026, 12, 7, 12, 0, 0, 0, 0, 0))
    os.utime(extra, (week_later, week_later))
    incidents, stats = diagnose([str(tmp_path)])
    assert [(i.kind, i.step) for i in incidents] == []  # before: [("stalled_save", 200)]
    assert [(step, path) for _, step, path in stats.open_saves] == [(200, "/ckpt/runC/checkpoint-200")]


def test_a_job_dated_only_by_mtimes_keeps_that_clock(tmp_path):
    """Without any dated line, the mtime is all the job has: a save started in a file last
    written an hour before another of the job's files is judged by it, as before."""
    (tmp_path / "train.log").write_text("Saving checkpoint to /ckpt/runD/checkpoint-100\n")
    (tmp_path / "later.log").write_text("world_size: 8\n")
    t0 = time.mktime((2026, 11, 30, 10, 0, 0, 0, 0, 0))
    os.utime(tmp_path / "train.log", (t0, t0))
    os.utime(tmp_path / "later.log", (t0 + 3600, t0 + 3600))
    incidents, _ = diagnose([str(tmp_path)])
    assert [(i.kind, i.step) for i in incidents] == [("stalled_save", 100)]


def test_a_line_dated_2100_in_an_unrelated_file_does_not_age_the_jobs_saves(tmp_path):
    (tmp_path / "train.log").write_text(TRAIN)
    other = tmp_path / "other.log"
    other.write_text("2100-01-01 00:00:00 world_size: 8\n")  # not believed: no time of its own
    week_later = time.mktime((2026, 12, 7, 12, 0, 0, 0, 0, 0))
    os.utime(other, (week_later, week_later))
    incidents, stats = diagnose([str(tmp_path)])
    assert [(i.kind, i.step) for i in incidents] == []
    assert [step for _, step, _ in stats.open_saves] == [200]
