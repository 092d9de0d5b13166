"""``--job NAME`` (issue 36, item 4): one job's logs or paste named by the user. Without a
job label, every run's lines were job ``unknown``, so two runs read one after the other into
one database were one job: the second run's finished save of step 200 withdrew the first
run's interrupted one (item 3, reproduced here without ``--job``)."""

from __future__ import annotations

import subprocess
import sys

import duckdb
from log_support import two_saves

from ckptwatch.pipeline import PipelineOptions, diagnose

RUN_A = two_saves("2026-11-30", "runA", second_saved=False,
                  tail="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
RUN_B = two_saves("2026-12-01", "runB", second_saved=True, hour=9)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ckptwatch", *args], capture_output=True, text=True, timeout=120)


def test_the_job_named_on_the_command_line_is_every_unlabelled_lines_job(tmp_path):
    (tmp_path / "train.log").write_text("torchrun run_id : 7f3a\n" + RUN_A)  # a run id of its own: --job wins
    incidents, stats = diagnose([str(tmp_path)], PipelineOptions(job="llama-7b-run3"))
    assert [(i.job, i.kind, i.step) for i in incidents] == [("llama-7b-run3", "interrupted_save", 200)]
    assert stats.no_job == 0  # no "judged together as job 'unknown'" warning


def test_two_runs_into_one_database_keep_their_own_incidents_with_job(tmp_path):
    for name, text in (("a", RUN_A), ("b", RUN_B)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "train.log").write_text(text)
    db = str(tmp_path / "x.duckdb")
    assert cli("run", "--logs", str(tmp_path / "a"), "--db", db, "--once", "--job", "runA").returncode == 0
    second = cli("run", "--logs", str(tmp_path / "b"), "--db", db, "--once", "--job", "runB")
    assert second.returncode == 0, second.stderr
    assert "superseded" not in second.stdout
    with duckdb.connect(db, read_only=True) as con:
        rows = con.execute("SELECT job, kind, step, status FROM incidents ORDER BY job").fetchall()
    assert rows == [("runA", "interrupted_save", 200, "open")]


def test_an_empty_job_name_is_refused(tmp_path):
    (tmp_path / "train.log").write_text(RUN_A)
    out = cli("diagnose", str(tmp_path), "--job", " ")
    assert out.returncode == 2 and "--job: empty" in out.stderr
