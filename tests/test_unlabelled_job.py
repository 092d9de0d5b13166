"""Lines that name no job are the job named after the directory read (issue 36, items 3
and 4). They were all job ``unknown``: two directories read by ``run --once`` one after
the other into one database were one job, so the second run's lines were judged with the
first run's, stored incidents of the first changed (withdrawn by the second's finished
save, or a second failure of the same step not reported at all)."""

from __future__ import annotations

import subprocess
import sys

import duckdb
from log_support import two_saves

from ckptwatch.pipeline import diagnose, unlabelled_job

OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
ENOSPC = ("Traceback (most recent call last):\n"
          "OSError: [Errno 28] No space left on device: '/ckpt/runB/checkpoint-200/model.safetensors'\n")


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ckptwatch", *args], capture_output=True, text=True, timeout=120,
                          input=stdin)


def incidents(db: str) -> list[tuple]:
    with duckdb.connect(db, read_only=True) as con:
        return con.execute("SELECT id, job, kind, step, status, detected_ts FROM incidents ORDER BY job").fetchall()


def test_two_directories_read_into_one_database_are_two_jobs(tmp_path):
    for name, text in (("llama-a", two_saves("2026-11-30", "runA", second_saved=False, tail=OOM)),
                       ("llama-b", two_saves("2026-12-01", "runB", second_saved=True, hour=9)),
                       ("llama-c", two_saves("2026-12-02", "runC", second_saved=False, tail=ENOSPC.replace("B", "C")))):
        (tmp_path / name).mkdir()
        (tmp_path / name / "train.log").write_text(text)
    db = str(tmp_path / "fleet.duckdb")
    first = cli("run", "--logs", str(tmp_path / "llama-a"), "--db", db, "--once")
    assert first.returncode == 0 and "alerts: 1 sent" in first.stderr, first.stderr
    stored = incidents(db)
    assert [r[1:5] for r in stored] == [("llama-a", "interrupted_save", 200, "open")]
    for name in ("llama-b", "llama-c"):  # a clean run, then a run failing in the same step
        out = cli("run", "--logs", str(tmp_path / name), "--db", db, "--once")
        assert out.returncode == 0, out.stderr
    # before: one job 'unknown'; llama-b's finished save of step 200 withdrew llama-a's
    # incident, and llama-c's ENOSPC in step 200 was not reported
    assert [r[1:5] for r in incidents(db)] == [("llama-a", "interrupted_save", 200, "open"),
                                               ("llama-c", "storage_failure_during_save", 200, "open")]
    assert incidents(db)[0] == stored[0]  # the first job's incident as it was stored: same id, same time
    again = cli("run", "--logs", str(tmp_path / "llama-a"), "--db", db, "--once")
    assert "alerts: 0 sent" in again.stderr  # read again: nothing new, nothing paged twice
    assert incidents(db)[0] == stored[0]


def test_a_directory_read_again_as_it_grows_is_still_one_job(tmp_path):
    """cron-style ``run --once`` over a log that grows: the lines stored by the first run
    are judged with the second run's, as one job."""
    log = tmp_path / "job7" / "train.log"
    log.parent.mkdir()
    log.write_text(two_saves("2026-11-30", "run7", second_saved=False))
    db = str(tmp_path / "x.duckdb")
    assert cli("run", "--logs", str(log.parent), "--db", db, "--once").returncode == 0
    assert incidents(db) == []  # a save still in flight
    with log.open("a") as f:
        f.write(OOM)
    assert cli("run", "--logs", str(log.parent), "--db", db, "--once").returncode == 0
    assert [r[1:5] for r in incidents(db)] == [("job7", "interrupted_save", 200, "open")]


def test_the_name_of_the_lines_that_name_no_job(tmp_path):
    (tmp_path / "run3").mkdir()
    (tmp_path / "run3" / "rank0.log").write_text("")
    (tmp_path / "run3" / "rank1.log").write_text("")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "rank0.log").write_text("")
    assert unlabelled_job([str(tmp_path / "run3")]) == "run3"
    assert unlabelled_job([str(tmp_path / "run3") + "/"]) == "run3"
    assert unlabelled_job([str(tmp_path / "run3" / "rank0.log")]) == "rank0"  # one file: its name
    assert unlabelled_job([str(tmp_path / "run3" / f"rank{r}.log") for r in (0, 1)]) == "run3"
    assert unlabelled_job([str(tmp_path / "run3"), str(tmp_path / "other")]) == "unknown"
    assert unlabelled_job(["/"]) == "unknown"
    (tmp_path / "run3" / "logs").mkdir()  # a name that says what the directory holds: with its parent
    assert unlabelled_job([str(tmp_path / "run3" / "logs")]) == "run3/logs"


def test_a_paste_on_standard_input_is_job_unknown_and_a_file_its_own(tmp_path):
    text = two_saves("2026-11-30", "runA", second_saved=False, tail=OOM)
    out = cli("diagnose", "-", "--json", stdin=text)
    assert out.returncode == 1 and '"job": "unknown"' in out.stdout
    (tmp_path / "job-42.log").write_text(text)
    found, _ = diagnose([str(tmp_path / "job-42.log")])
    assert [(i.job, i.kind, i.step) for i in found] == [("job-42", "interrupted_save", 200)]
