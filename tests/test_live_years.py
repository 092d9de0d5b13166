"""Year-less stamps (glog ``I1207 …``, syslog ``Dec  7 …``) read by a live ``ckptwatch run``
take the year of their job's dated lines, not the year of the files' mtime (issue 36,
item 7). Found by the trial's case c04: a 2025 torchrun console (one dated launcher line,
then glog) and a kernel log, read live on a machine whose clock says 2026-12-07. The
kernel's first line was re-dated to 2025, but its file carried the guessed 2026 into its
next read as a known time: the OOM lines appended while ``run`` watched were stored in
2026, so the save incident's last failure stood a year past the job's watermark and it
stayed provisional (never paged), while ``run --once`` paged it. Now a guessed time is
never carried as a known one, and a file whose year is still a guess is held back
(committed offset included) until a dated line of its job comes, for a bounded time."""

from __future__ import annotations

import datetime as dt
import io
import os

import duckdb
import polars as pl
from rich.console import Console

from ckptwatch.config import AlertSettings
from ckptwatch.embedded import EmbeddedRunner
from ckptwatch.ingest.timestamps import add_event_time
from ckptwatch.ingest.watcher import SourceWatcher
from ckptwatch.pipeline import PipelineOptions
from ckptwatch.schema import TS
from ckptwatch.sinks.alerts.setup import alerter_from_config

UTC = dt.timezone.utc
NOW = dt.datetime(2026, 12, 7, 20, 50, tzinfo=UTC)  # the machine's clock: a year after the logs
LAUNCH = "[2025-12-07 11:58:01] launch.sh: starting torchrun --nproc_per_node 4 --tee 3 train.py on trn-node3"
KERN_BOOT = "Dec  7 11:40:12 trn-node3 kernel: [84922.551200] IPv6: ADDRCONF(NETDEV_CHANGE): ib0: link becomes ready"
KERN_OOM = [
    "Dec  7 12:05:01 trn-node3 kernel: [86011.123456] python3 invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE"
    "|__GFP_COMP), order=0, oom_score_adj=0",
    "Dec  7 12:05:01 trn-node3 kernel: [86011.124950] oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,"
    "mems_allowed=0-1,global_oom,task_memcg=/user.slice,task=python3,pid=5879,uid=1000",
    "Dec  7 12:05:01 trn-node3 kernel: [86011.125012] Out of memory: Killed process 5879 (python3) total-vm:412331208kB, "
    "anon-rss:398871232kB, file-rss:70212kB, shmem-rss:4096kB, UID:1000 pgtables:790312kB oom_score_adj:0",
    "Dec  7 12:05:02 trn-node3 kernel: [86012.002311] oom_reaper: reaped process 5879 (python3), now anon-rss:0kB",
]
PIDS = [5876, 5877, 5879, 5880]


def _glog(rank: int, hms: str, src: str, msg: str) -> str:
    return f"[default{rank}]:I1207 {hms} {140011 + rank} {src}] {msg}"


def _console_start() -> list[str]:
    out = [LAUNCH, "W1207 11:58:02.000000 5860 torch/distributed/run.py:793] *****************************************"]
    out += [_glog(r, "11:58:20.000000", "train.py:88", f"rank {r}/4 on trn-node3 pid {PIDS[r]} cuda:{r}")
            for r in range(4)]
    return out + [_glog(r, f"12:03:00.12{r}000", "train.py:212", "step 2900 loss 2.1100") for r in range(4)]


def _console_failure() -> list[str]:
    """Step 3000's save; rank 2 OOM-killed before writing its shard; torchrun SIGTERMs the rest."""
    out = []
    for r in range(4):
        out.append(_glog(r, f"12:04:58.10{r}234", "checkpointing.py:88", "Saving checkpoint at step 3000 to /ckpt/run7/step_3000"))
        out.append(_glog(r, f"12:04:58.14{r}234", "checkpointing.py:97",
                         f"writing shard {r}/4 to /ckpt/run7/step_3000/shard_{r}.pt"))
    out += [_glog(r, f"12:05:00.41{r}000", "checkpointing.py:104",
                  f"shard {r}/4 written (11.8 GB) in 2.3s; waiting for peers at barrier") for r in (0, 1, 3)]
    api = "torch/distributed/elastic/multiprocessing/api.py"
    out += [f"W1207 12:05:02.904000 5860 {api}:897] Sending process {p} closing signal SIGTERM" for p in (5876, 5877, 5880)]
    out.append(f"E1207 12:05:03.215000 5860 {api}:869] failed (exitcode: -9) local_rank: 2 (pid: 5879) of binary: "
               "/usr/bin/python3")
    return out + [
        "Traceback (most recent call last):",
        '  File "/usr/local/bin/torchrun", line 8, in <module>',
        "    sys.exit(main())",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "============================================================",
        "train.py FAILED",
        "------------------------------------------------------------",
        "Root Cause (first observed failure):",
        "[0]:",
        "  time      : 2025-12-07_12:05:03",
        "  host      : trn-node3",
        "  rank      : 2 (local_rank: 2)",
        "  exitcode  : -9 (pid: 5879)",
        "  error_file: <N/A>",
        "  traceback : Signal 9 (SIGKILL) received by PID 5879",
        "============================================================",
    ]


def _append(path, lines: list[str], at: dt.datetime = NOW) -> None:
    """Append ``lines``; the file's mtime is ``at`` (the machine's clock, a year after the logs)."""
    with open(path, "a") as f:
        f.write("\n".join(lines) + "\n")
    os.utime(path, (at.timestamp(), at.timestamp()))


def _polls(w: SourceWatcher, start: dt.datetime, n: int) -> list[tuple]:
    """``n`` live polls a second apart: (file name, ts, line) of the records returned."""
    out = []
    for i in range(n):
        recs = w.poll(now=start + dt.timedelta(seconds=i))
        out += [(os.path.basename(f), ts, line) for f, ts, line in recs.select("file", "ts", "line").iter_rows()]
    return out


def test_a_kernel_log_appended_to_after_its_first_read_keeps_the_jobs_year(tmp_path):
    """The defect itself: the first kernel line is re-dated to 2025; the OOM lines appended
    later were dated from the 2026 carried from it."""
    logs = tmp_path / "logs"
    logs.mkdir()
    _append(logs / "console.log", _console_start())
    _append(logs / "kern.log", [KERN_BOOT])
    w = SourceWatcher([str(logs)], job="run7", watch_changes=False)
    try:
        seen = _polls(w, NOW, 3)
        _append(logs / "kern.log", KERN_OOM, NOW + dt.timedelta(seconds=5))
        seen += _polls(w, NOW + dt.timedelta(seconds=5), 4)
    finally:
        w.close()
    kern = [(ts, line[:15]) for f, ts, line in seen if f == "kern.log"]
    assert [ts for ts, _ in kern] == [dt.datetime(2025, 12, 7, 11, 40, 12, tzinfo=UTC)] + [
        dt.datetime(2025, 12, 7, 12, 5, s, tzinfo=UTC) for s in (1, 1, 1, 2)]
    assert {ts.year for f, ts, _ in seen} == {2025}
    assert "year_from_mtime" not in w.stats.notes


def test_a_year_less_file_read_before_its_jobs_dated_line_waits_for_it(tmp_path):
    """The kernel log is read two polls before the launcher writes its dated line: its
    records are held back (and its committed offset with them, so a restart reads them
    again), then dated in 2025 once the dated line comes."""
    logs = tmp_path / "logs"
    logs.mkdir()
    _append(logs / "kern.log", [KERN_BOOT, *KERN_OOM])
    size = os.path.getsize(logs / "kern.log")
    w = SourceWatcher([str(logs)], job="run7", watch_changes=False)
    try:
        early = _polls(w, NOW, 3)
        held_at = [c.offset for c in w.checkpoints()]
        restarted = SourceWatcher([str(logs)], job="run7", watch_changes=False,
                                  committed={c.source_id: c for c in w.checkpoints()})
        try:  # a restart now resumes before the held records: none is lost
            again = _polls(restarted, NOW, 1)
            assert again == [] and [c.offset for c in restarted.checkpoints()] == [0]
        finally:
            restarted.close()
        _append(logs / "console.log", _console_start(), NOW + dt.timedelta(seconds=3))
        late = _polls(w, NOW + dt.timedelta(seconds=3), 3)
        done_at = {c.path.rsplit("/", 1)[1]: c.offset for c in w.checkpoints()}
    finally:
        w.close()
    assert early == [] and held_at == [0]
    kern = [ts for f, ts, _ in late if f == "kern.log"]
    assert kern == [dt.datetime(2025, 12, 7, 11, 40, 12, tzinfo=UTC)] + [
        dt.datetime(2025, 12, 7, 12, 5, s, tzinfo=UTC) for s in (1, 1, 1, 2)]
    assert done_at["kern.log"] == size
    assert "year_from_mtime" not in w.stats.notes


def test_without_any_dated_line_the_hold_is_bounded_and_then_the_mtime_year_stands(tmp_path):
    """A job that never prints a full date: after ``year_hold`` seconds its records go on
    with the year of their file's mtime (counted), and the file's later ones are not held."""
    logs = tmp_path / "logs"
    logs.mkdir()
    _append(logs / "kern.log", [KERN_BOOT])
    w = SourceWatcher([str(logs)], job="run7", watch_changes=False, year_hold=5.0)
    try:
        polls = [_polls(w, NOW + dt.timedelta(seconds=i), 1) for i in range(10)]
        freed_at = next(i for i, got in enumerate(polls) if got)
        t = NOW + dt.timedelta(seconds=10)
        _append(logs / "kern.log", KERN_OOM[:1], t)
        later = [_polls(w, t + dt.timedelta(seconds=i), 1) for i in range(3)]
    finally:
        w.close()
    # the tail emits the line a poll or two after reading it (it may go on); then 5 s held
    assert 6 <= freed_at <= 7
    assert [ts for _, ts, _ in polls[freed_at]] == [dt.datetime(2026, 12, 7, 11, 40, 12, tzinfo=UTC)]
    assert sum(polls, []) == polls[freed_at]
    first_out = next(i for i, got in enumerate(later) if got)  # as soon as the tail emits it
    assert first_out <= 2 and [ts for _, ts, _ in later[first_out]] == [dt.datetime(2026, 12, 7, 12, 5, 1, tzinfo=UTC)]
    assert w.stats.notes["year_from_mtime"] == 2


def test_a_record_that_inherits_a_guessed_time_in_file_order_is_guessed_too():
    """A stream with no time of its own (a worker's ``print``) takes, in file order, the
    time of another stream's year-less line, or the next one's: that time's year is the
    mtime's guess as much as the line's, so it is re-dated with it."""
    glog = "I1207 12:05:00.100000 140011 checkpointing.py:104] shard 0/4 written"
    frame = pl.DataFrame({"line": ["a print before any time", glog, "a print after it"],
                          "stream_key": ["s:1", "s:0", "s:1"], "mtime": [NOW] * 3},
                         schema={"line": pl.Utf8, "stream_key": pl.Utf8, "mtime": TS})
    out = add_event_time(frame, now=NOW)
    assert out["ts_source"].to_list() == ["inherited", "line", "inherited"]
    assert out["ts"].to_list() == [dt.datetime(2026, 12, 7, 12, 5, 0, 100000, tzinfo=UTC)] * 3
    assert out["ts_year_guessed"].to_list() == [True, True, True]
    carried = add_event_time(frame, now=NOW, carry={"s:1": dt.datetime(2025, 12, 7, 12, tzinfo=UTC)})
    assert carried["ts_year_guessed"].to_list() == [False, True, False]  # a carried time is known


def test_a_worker_print_beside_year_less_lines_is_re_dated_with_them(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    _append(logs / "console.log", [LAUNCH])
    _append(logs / "worker.log", ["I1207 12:05:00.100000 140011 checkpointing.py:104] shard 0/4 written",
                                  "[default1]:shard 1/4 written"])
    w = SourceWatcher([str(logs)], job="run7", watch_changes=False)
    try:
        seen = _polls(w, NOW, 4)
    finally:
        w.close()
    assert sorted((f, ts.year) for f, ts, _ in seen) == [("console.log", 2025), ("worker.log", 2025),
                                                        ("worker.log", 2025)]


def test_the_c04_case_read_live_is_stored_in_2025_and_pages(tmp_path):
    """Trial case c04 in-process: part A exists when ``run`` starts, the save, the OOM kill
    and torchrun's failure are appended while it runs. Every event is stored in 2025 and
    the incident settles (not provisional) and is sent, as ``run --once`` does."""
    logs = tmp_path / "logs"
    logs.mkdir()
    _append(logs / "console.log", _console_start())
    _append(logs / "kern.log", [KERN_BOOT])
    db = str(tmp_path / "live.duckdb")
    out = io.StringIO()
    runner = EmbeddedRunner(str(logs), db, PipelineOptions(job="run7"),
                            alerter=lambda store, metrics: alerter_from_config(
                                AlertSettings(), store, db_path=db, console=Console(file=out, width=200)))
    try:
        runner.cycle(now=NOW)
        t = NOW + dt.timedelta(seconds=1)
        _append(logs / "console.log", _console_failure()[:11], t)
        _append(logs / "kern.log", KERN_OOM, t)
        _append(logs / "console.log", _console_failure()[11:], t)
        settled = None
        for i in range(1, 40):  # a live run, a poll a second; the job is silent after its failure
            for inc in runner.cycle(now=t + dt.timedelta(seconds=i)):
                if not inc.provisional:
                    settled = i
            if settled:
                break
        assert runner.alerter is not None
        runner.alerter.drain(10)
    finally:
        runner.close()
    assert settled is not None and settled < 20
    con = duckdb.connect(db, read_only=True)
    try:
        years = con.execute("SELECT DISTINCT year(ts) FROM events").fetchall()
        oom = con.execute("SELECT min(ts), max(ts) FROM events WHERE kind = 'oom_kill'").fetchone()
        incs = con.execute("SELECT kind, step, status, provisional, first_ts FROM incidents").fetchall()
        cause = con.execute("SELECT root_cause FROM incidents").fetchone()[0]
        alerts = con.execute("SELECT channel, action, status FROM alerts").fetchall()
    finally:
        con.close()
    assert years == [(2025,)]
    assert oom == (dt.datetime(2025, 12, 7, 12, 5, 1, tzinfo=UTC), dt.datetime(2025, 12, 7, 12, 5, 2, tzinfo=UTC))
    assert incs == [("interrupted_save", 3000, "open", False,
                     dt.datetime(2025, 12, 7, 12, 4, 58, 100234, tzinfo=UTC))]
    assert '"class": "oom_kill"' in cause and '"rank": 2' in cause
    assert alerts == [("console", "trigger", "sent")]
    assert "interrupted_save" in out.getvalue()
