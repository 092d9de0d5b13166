"""Labels from lines inside the files (no --path-template): a launcher's log beside the rank
files names no job. ``diagnose`` folds its events into the one job it read; ``ckptwatch run``
(and the fleet detector, which shares :class:`Detector`) did not, so run missed the incident
(new-user case c22) or blamed a collective timeout where diagnose said SIGKILL (c17)."""

from __future__ import annotations

import datetime as dt
import os

from ckptwatch.embedded import EmbeddedRunner
from ckptwatch.pipeline import diagnose

STAMP = dt.datetime(2024, 6, 1, 10, 1, tzinfo=dt.timezone.utc).timestamp()


def _rank(job: str, rank: int, *, finish_20: bool, timeout: bool = False) -> str:
    lines = [
        f"[2024-06-01 10:00:00.000] [INFO] [rank{rank}] job_id={job} rank={rank} local_rank={rank} world_size=2 "
        f"pid={5000 + rank} host=vm1 torch=2.5.0 backend=gloo",
        f"2024-06-01 10:00:10,000 INFO [rank{rank}] train: step 10/60 loss=1.90000 lr=1.0e-03",
        f"2024-06-01 10:00:10,100 INFO [rank{rank}] train: Saving checkpoint at step 10 to /ckpt/{job}/step_10",
        f"2024-06-01 10:00:10,900 INFO [rank{rank}] train: Checkpoint saved to /ckpt/{job}/step_10 (0.80s)",
        f"2024-06-01 10:00:20,000 INFO [rank{rank}] train: step 20/60 loss=1.80000 lr=1.0e-03",
        f"2024-06-01 10:00:20,100 INFO [rank{rank}] train: Saving checkpoint at step 20 to /ckpt/{job}/step_20",
    ]
    if finish_20:
        lines.append(f"2024-06-01 10:00:20,900 INFO [rank{rank}] train: Checkpoint saved to /ckpt/{job}/step_20 (0.80s)")
    if timeout:
        lines += [f"[rank{rank}]: Traceback (most recent call last):",
                  f'[rank{rank}]:   File "/w/train.py", line 120, in <module>',
                  f"[rank{rank}]:     dist.barrier()",
                  f"[rank{rank}]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] "
                  "Timed out waiting 30000ms for recv operation to complete"]
    return "\n".join(lines) + "\n"


def _write(tmp_path, case: str):
    logs = tmp_path / case
    d = logs / "jobY"
    d.mkdir(parents=True)
    if case == "c22":  # rank 1 killed during the step-20 save
        (d / "rank0.log").write_text(_rank("jobY", 0, finish_20=True))
        (d / "rank1.log").write_text(_rank("jobY", 1, finish_20=False))
        victim = 1
    else:  # c17: rank 0 killed, rank 1 then times out in a barrier
        (d / "rank0.log").write_text(_rank("jobY", 0, finish_20=False))
        (d / "rank1.log").write_text(_rank("jobY", 1, finish_20=False, timeout=True))
        victim = 0
    (d / "torchrun.log").write_text(
        "E0601 10:00:20.500000 4999 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -9) "
        f"local_rank: {victim} (pid: {5000 + victim}) of binary: /usr/bin/python\n")
    for f in d.iterdir():
        os.utime(f, (STAMP, STAMP))  # glog stamps take their year from the file
    return logs, victim


def _summary(incs):
    return sorted((i.kind, i.step, i.root_cause.cls, i.root_cause.rank, i.root_cause.signal)
                  for i in incs if i.status != "superseded")


def _run(logs, db, **kw):
    runner = EmbeddedRunner(str(logs), str(db))
    try:
        runner.run(once=True, **kw)
        return runner.detector.incidents()
    finally:
        runner.close()


def test_run_once_matches_diagnose_kill_during_save(tmp_path):
    logs, victim = _write(tmp_path, "c22")
    want, _ = diagnose([str(logs)])
    assert _summary(want) == [("interrupted_save", 20, "signal", victim, "SIGKILL")]
    assert _summary(_run(logs, tmp_path / "x.duckdb")) == _summary(want)


def test_run_once_matches_diagnose_no_timeout_misblame(tmp_path):
    logs, victim = _write(tmp_path, "c17")
    want, _ = diagnose([str(logs)])
    assert _summary(want) == [("interrupted_save", 20, "signal", victim, "SIGKILL")]
    assert _summary(_run(logs, tmp_path / "x.duckdb")) == _summary(want)


def test_run_restart_keeps_one_incident(tmp_path):
    """Re-running over the same database replays the stored events (unlabelled ones among
    them): folded again, they count once, and the incident is the same one."""
    logs, _ = _write(tmp_path, "c22")
    first = _summary(_run(logs, tmp_path / "x.duckdb"))
    again = _run(logs, tmp_path / "x.duckdb")
    assert _summary(again) == first
    assert len([i for i in again if i.status != "superseded"]) == 1


def test_live_detector_folds_unlabelled_events_as_they_come(tmp_path):
    """Live: once one job is known, the launcher's line is the job's before the save is judged."""
    logs, victim = _write(tmp_path, "c22")
    want, _ = diagnose([str(logs)])
    runner = EmbeddedRunner(str(logs), str(tmp_path / "x.duckdb"))
    try:
        now = dt.datetime(2024, 6, 1, 10, 0, 21, tzinfo=dt.timezone.utc)
        for later in (0, 60, 120, 300):  # last lines are held a while; then the watermark moves on
            runner.cycle(now=now + dt.timedelta(seconds=later))
        incs = runner.detector.incidents()
    finally:
        runner.close()
    assert "unknown" not in runner.detector.jobs
    assert _summary(incs) == _summary(want)
    assert len([i for i in incs if i.status == "superseded"]) == 0  # found right the first time



def test_fleet_matches_run_across_partitions(tmp_path, kafka_bootstrap):
    """The collector keys the launcher's events ``unknown``: with three partitions they may
    sit apart from the job's; one member reading every partition folds them all the same."""
    from kafka_support import fleet_equals_embedded

    logs, victim = _write(tmp_path, "c17")
    got = fleet_equals_embedded(kafka_bootstrap, logs, tmp_path, partitions=3)
    assert [(i["kind"], i["step"], i["root_cause"]["class"], i["root_cause"]["rank"]) for i in got] == [
        ("interrupted_save", 20, "signal", victim)]
