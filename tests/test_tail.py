"""Tailing: lines appended in pieces, a last line without its newline, restarts from the
committed offset, and the embedded runner turning a growing log into an incident."""

from __future__ import annotations

import datetime as dt

import duckdb

from ckptwatch.embedded import EmbeddedRunner
from ckptwatch.ingest.tail import FileTail
from conftest import CORPUS

SIGKILL_CONSOLE = CORPUS / "02-sigkill-mid-save/logs/attempt-1-train/console.log"


def test_partial_last_line_waits_for_its_newline(tmp_path):
    p = tmp_path / "r.log"
    p.write_text("2026-11-30 10:00:00,000 INFO a\n2026-11-30 10:00:01,000 INFO b")
    t = FileTail(str(p), flush_after=0)
    assert t.poll()["line"].to_list() == ["2026-11-30 10:00:00,000 INFO a"]
    with p.open("a") as f:
        f.write(" continued\n")
    assert t.poll()["line"].to_list() == ["2026-11-30 10:00:01,000 INFO b continued"]


def test_a_last_line_without_newline_is_read_once_the_writer_went_quiet(tmp_path):
    """A process killed mid-line never ends it: after ``flush_after`` seconds without a line
    and a poll without a byte, the tail reads it; a later rest is a line of its own."""
    p = tmp_path / "r.log"
    p.write_text("2026-11-30 10:00:00,000 INFO a\n2026-11-30 10:00:01,000 ERROR OSError: [Errno 28] No space")
    t0 = dt.datetime.now(dt.timezone.utc)
    t = FileTail(str(p), flush_after=2)
    lines = []
    for s in range(6):
        lines += t.poll(ingest_ts=t0 + dt.timedelta(seconds=s))["line"].to_list()
    assert lines == ["2026-11-30 10:00:00,000 INFO a", "2026-11-30 10:00:01,000 ERROR OSError: [Errno 28] No space"]
    assert t.committed_offset == p.stat().st_size
    with p.open("a") as f:
        f.write(" left on device\n")
    rest = [t.poll(ingest_ts=t0 + dt.timedelta(seconds=s))["line"].to_list() for s in (7, 10)]
    assert rest == [[], [" left on device"]]  # held as the last record, then idle


def test_restart_from_committed_offset_loses_and_repeats_nothing(tmp_path):
    src = SIGKILL_CONSOLE.read_bytes()
    p = tmp_path / "console.log"
    seen: list[int] = []
    t = FileTail(str(p), flush_after=3600)
    for i, cut in enumerate(range(0, len(src) + 1, 7001)):
        p.write_bytes(src[: min(cut + 7001, len(src))])
        if i == 3:  # "kill -9" the tail: a new one resumes from what was committed
            t = FileTail(str(p), offset=t.committed_offset, flush_after=3600)
            seen = [o for o in seen if o < t.offset]
        seen += t.poll()["offset"].to_list()
    seen += t.poll(final=True)["offset"].to_list()
    whole = FileTail(str(p)).poll(final=True)["offset"].to_list()
    assert sorted(seen) == whole and len(seen) == len(set(seen))


def test_embedded_runner_detects_as_the_log_grows_and_survives_restart(tmp_path, copy_scenario):
    src = copy_scenario("02-sigkill-mid-save", "attempt-1-train")
    logs = tmp_path / "live"
    (logs / "torchrun_logs").mkdir(parents=True)
    console = src / "console.log"
    data = console.read_bytes()
    cut = data.index(b"W1130 10:21:21.501000")
    (logs / "console.log").write_bytes(data[:cut])
    db = tmp_path / "live.duckdb"
    now = dt.datetime(2026, 11, 30, 10, 21, 22, tzinfo=dt.timezone.utc)
    r = EmbeddedRunner(str(logs), str(db))
    assert r.cycle(now=now) == []
    r.close()
    with (logs / "console.log").open("ab") as f:
        f.write(data[cut:])
    r = EmbeddedRunner(str(logs), str(db))  # restart: resumes at the committed offset
    changed = r.cycle(now=now + dt.timedelta(seconds=2))
    changed += r.cycle(now=now + dt.timedelta(seconds=120))  # idle: watermark moves with wall time
    r.close()
    assert [(i.kind, i.step, i.root_cause.rank) for i in changed] == [("interrupted_save", 40, 2)]
    con = duckdb.connect(str(db))
    n_events, n_unique = con.execute('SELECT count(*), count(DISTINCT (source_id, "offset")) FROM events').fetchone()
    assert n_events == n_unique
    whole = EmbeddedRunner(str(logs), str(tmp_path / "whole.duckdb"))  # the same bytes, read in one go
    whole.cycle(final=True)
    expected = whole.store.con.execute("SELECT count(*) FROM events").fetchone()[0]
    assert n_events == expected


def test_an_undated_line_after_held_lines_is_dated_as_one_read_of_the_file_dates_it(tmp_path):
    """An `srun --label` console: rank lines carry times, srun's own lines none, and each
    rank's last line is held back by a live poll (the next line might continue it). srun's
    'task 1: Killed' after them must take the file's previous time (18:22:09, a held line's),
    as `run --once` and `diagnose` date it, not the last time emitted (18:22:01): a new
    user's live run blamed an 'Aborted' rank over the OOM-killed one that way."""
    from ckptwatch.ingest.watcher import SourceWatcher

    p = tmp_path / "slurm-42.out"
    p.write_text("srun: job 42 has been allocated resources\n"
                 + "".join(f"{r}: [2026-12-03 18:20:0{r}.000] [rank{r}] step 100 loss 2.0\n" for r in range(2))
                 + "".join(f"{r}: [2026-12-03 18:22:01.00{r}] [rank{r}] saving checkpoint at iteration 200\n"
                           for r in range(2))
                 + "".join(f"{r}: [2026-12-03 18:22:09.00{r}] [rank{r}] successfully saved checkpoint\n"
                           for r in range(2))
                 + "srun: error: node-b: task 1: Killed\n"
                 + "srun: error: node-a: task 0: Aborted\n")
    live = SourceWatcher([str(tmp_path)]).poll()  # not final: each rank's last line is held
    assert not live.filter(live["line"].str.contains("successfully saved")).height  # held back
    killed = live.filter(live["line"].str.contains("Killed"))
    assert killed["ts"].to_list() == [dt.datetime(2026, 12, 3, 18, 22, 9, 1000, tzinfo=dt.timezone.utc)]
    assert killed["ts_source"].to_list() == ["inherited"]
    whole = SourceWatcher([str(tmp_path)]).poll(final=True)
    assert whole.filter(whole["line"].str.contains("Killed"))["ts"].to_list() == killed["ts"].to_list()
