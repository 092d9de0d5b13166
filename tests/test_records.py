"""Records as real consoles and pastes break them: lone CR, terminal hard-wraps, two
processes in one console, several jobs in one file, compressed rotations, standard input,
files past any read chunk; and a future-dated line concludes nothing outside its job."""

from __future__ import annotations

import datetime as dt
import gzip
import subprocess
import sys
from pathlib import Path

import polars as pl

from ckptwatch.detectors import Detector
from ckptwatch.ingest.watcher import SourceWatcher
from ckptwatch.pipeline import diagnose
from ckptwatch.rules import RuleSet

UTC = dt.timezone.utc
ROOT = Path(__file__).resolve().parent.parent
WATCHDOG = ("[rank1]:[E1201 10:18:25.123456789 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) "
            "ran for 600023 milliseconds before timing out.")


def read(path) -> pl.DataFrame:
    w = SourceWatcher([str(path)])
    try:
        return w.poll(final=True)
    finally:
        w.close()


def cli(*args, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ckptwatch", *map(str, args)], capture_output=True, text=True,
                          input=stdin)


def test_lone_cr_separates_lines_each_at_its_own_offset(tmp_path):
    log = tmp_path / "train.log"
    log.write_bytes(b"epoch 1:  10%|#   | 1/10\repoch 1: 100%|####| 10/10\r"
                    b"2026-11-30 10:00:00,000 saving checkpoint step 10 to /ckpt/step_10\n")
    recs = read(log)
    assert recs.select("offset", "line").rows() == [
        (0, "epoch 1:  10%|#   | 1/10"), (25, "epoch 1: 100%|####| 10/10"),
        (51, "2026-11-30 10:00:00,000 saving checkpoint step 10 to /ckpt/step_10")]


def test_a_hard_wrapped_watchdog_line_is_read_whole(tmp_path):
    """Pasted from an 80-column terminal: the NCCL watchdog line is cut mid-word."""
    wrapped = "\n".join(WATCHDOG[i:i + 80] for i in range(0, len(WATCHDOG), 80))
    assert wrapped.count("\n") >= 3
    log = tmp_path / "paste.log"
    log.write_text("2026-12-01 10:18:00,000 INFO [rank1] step 40\n" + wrapped + "\n")
    recs = read(log)
    assert recs.height == 2 and recs["line"][1].endswith("milliseconds before timing out.")
    ev = RuleSet.load().apply(recs)
    assert ev.select("kind", "rank").rows() == [("collective_timeout", 1)]
    assert ev["ts"][0] == dt.datetime(2026, 12, 1, 10, 18, 25, 123456, UTC)


def test_records_that_happen_to_be_of_one_length_are_not_a_terminals_wrap(tmp_path):
    """Issue 36, item 1: four 'saving model to …' lines of exactly 201 characters, each
    followed by a dated line; the bash 'Killed' after the last one stayed glued to it, so the
    step-4000 save and its death were one record. Lines of the longest length that are each
    followed by a record of its own are records, not a wrap; the Killed line stands alone."""
    def save(step: int) -> str:
        head = f"2026-12-01 10:{step // 100:02d}:00,000 INFO saving model to /ckpt/run1/checkpoint-{step}/"
        return head + "x" * (201 - len(head) - len("model.safetensors")) + "model.safetensors"
    lines = []
    for step in (1000, 2000, 3000, 4000):
        lines += [f"2026-12-01 10:{step // 100 - 1:02d}:30,000 INFO step {step} loss 0.5", save(step)]
        if step < 4000:
            lines.append(f"2026-12-01 10:{step // 100:02d}:10,000 INFO saved checkpoint-{step}")
    lines.append("Killed")
    assert {len(x) for x in lines if "saving" in x} == {201}
    (tmp_path / "train.log").write_text("\n".join(lines) + "\n")
    recs = read(tmp_path / "train.log")["line"].to_list()
    assert recs[-1] == "Killed" and recs[-2].endswith("checkpoint-4000/" + "x" * (recs[-2].count("x")) + "model.safetensors")


def test_another_processes_line_inside_a_traceback_does_not_swallow_it(tmp_path):
    log = tmp_path / "console.log"
    log.write_text(
        "2026-11-30 10:00:00,000 A step 40\n"
        "Traceback (most recent call last):\n"
        '  File "train.py", line 88, in <module>\n'
        "    save(state)\n"
        "2026-11-30 10:00:01,000 INFO B: step 41 loss 0.5\n"
        '  File "/usr/lib/python3/site-packages/torch/serialization.py", line 967, in save\n'
        "    _save(obj, opened_zipfile, pickle_module, pickle_protocol, _disable_byteorder_record)\n"
        "OSError: [Errno 28] No space left on device\n")
    lines = read(log)["line"].to_list()
    assert lines[1].startswith("Traceback") and lines[1].endswith("OSError: [Errno 28] No space left on device")
    assert "torch/serialization.py" in lines[1]
    assert lines[2] == "2026-11-30 10:00:01,000 INFO B: step 41 loss 0.5"


def test_a_relaunch_in_the_same_console_is_another_job(tmp_path):
    agent = "I1130 10:{m}:00.000000 77 torch/distributed/launcher/api.py:254]   run_id                   : {job}"
    log = tmp_path / "console.log"
    log.write_text(agent.format(m="00", job="llama-a") + "\n[default0]:2026-11-30 10:01:00,000 step 1\n"
                   + agent.format(m="30", job="llama-b") + "\n[default0]:2026-11-30 10:31:00,000 step 1\n")
    assert read(log)["job"].to_list() == ["llama-a", "llama-a", "llama-b", "llama-b"]


def test_a_line_again_in_the_same_file_is_another_occurrence_not_a_copy(tmp_path):
    """Two Lightning fits appended to one log (``python train.py >> train.log``, real lines
    of tests/fixtures/realruns/lightning-ddp-probe-zeroed-resume): the second fit's undated
    "`Trainer.fit` stopped" line is its own, and ends its step-40 save; read as a copy of the
    first fit's line, the save was left "not seen to finish". A copy in another file (the
    same console read twice, as a console and a tee'd file are) is still one line."""
    runs = ROOT / "tests/fixtures/realruns/lightning-ddp-probe-zeroed-resume/logs"
    log = tmp_path / "one" / "train.log"
    log.parent.mkdir()
    log.write_text("".join((runs / f"attempt-{n}/console.log").read_text() for n in (1, 2, 3)))
    incidents, stats = diagnose([str(log)])
    assert [(i.kind, i.step) for i in incidents] == [("load_failure", 30)]
    assert stats.open_saves == [] and stats.duplicate_events == 0
    (tmp_path / "two").mkdir()
    (tmp_path / "two" / "copy.log").write_text(log.read_text())
    incidents, stats = diagnose([str(log), str(tmp_path / "two" / "copy.log")])
    assert [(i.kind, i.step) for i in incidents] == [("load_failure", 30)]
    assert stats.open_saves == []


def test_an_undated_line_of_no_rank_in_two_files_is_two_lines(tmp_path):
    """Three HF Trainer attempts in three files that name no job and no rank (a new user's
    trial): each ends its last save with the undated "Training completed." line. Keyed on
    its text alone, the second and third were taken for copies of the first, and their
    step-30 saves were left "not seen to finish"."""
    hf = "[INFO|trainer.py:4193] 2026-12-04 01:{m:02d}:{s:02d},772 >> Saving model checkpoint to out/checkpoint-{step}\n"
    done = "\nTraining completed. Do not forget to share your model on huggingface.co/models =)\n\n"
    for n, (m, first) in enumerate(((39, 10), (40, 30), (41, 20)), start=1):
        saves = "".join(hf.format(m=m, s=step, step=step) for step in range(first, 31, 10))
        (tmp_path / f"hf{n}.log").write_text(saves + done)
    incidents, stats = diagnose([str(tmp_path)])
    assert incidents == [] and stats.open_saves == [] and stats.duplicate_events == 0


def test_two_slurm_outputs_are_two_jobs_and_a_line_naming_the_job_wins(tmp_path):
    (tmp_path / "slurm-4242.out").write_text("0: step 1\n1: step 1\n")
    (tmp_path / "slurm-4243_7.out").write_text("0: step 1\n0: run_id : llama-9\n")
    recs = read(tmp_path)
    assert recs.select("job").to_series().to_list() == ["slurm-4242", "slurm-4242", "llama-9", "llama-9"]


def test_torchruns_default_run_id_none_names_no_job(tmp_path):
    for rand in ("h_tq81hv", "k2p0ab9z"):
        d = tmp_path / f"run-{rand}" / "torchrun_logs" / f"none_{rand}" / "attempt_0" / "0"
        d.mkdir(parents=True)
        (d / "stdout.log").write_text("step 1\n")
        (tmp_path / f"run-{rand}" / "console.log").write_text("[default0]:step 1\n")
    jobs = sorted(set(read(tmp_path)["job"].to_list()))
    assert jobs == ["none_h_tq81hv", "none_k2p0ab9z"]


def test_every_byte_of_a_large_file_is_read_and_the_incident_at_its_end_found(tmp_path):
    log = tmp_path / "train.log"
    filler = "".join(f"2026-11-30 10:00:{i % 60:02d},000 INFO [rank0] data loader worker {i} ready, "
                     f"prefetching the next shard of tokens\n" for i in range(110_000))
    log.write_text(filler
                   + "2026-11-30 10:05:00,000 INFO [rank1/2] train: saving checkpoint step 40 to /ckpt/step_40\n"
                   + "2026-11-30 10:05:00,100 INFO [rank0/2] train: saving checkpoint step 40 to /ckpt/step_40\n"
                   + "2026-11-30 10:05:00,300 INFO [rank0/2] train: saved checkpoint step 40\n"
                   + "E1130 10:05:01.000000 77 torch/distributed/elastic/multiprocessing/api.py:1002] failed "
                     "(exitcode: -9) local_rank: 1 (pid: 4312) of binary: python\n")
    assert log.stat().st_size > 10 << 20
    seen = []
    incidents, stats = diagnose([str(log)], progress=lambda s, n: seen.append(n))
    assert [(i.kind, i.step, i.root_cause.rank) for i in incidents] == [("interrupted_save", 40, 1)]
    assert stats.lines == 110_004 and len(seen) >= 2 and seen[-1] == log.stat().st_size


def test_gz_rotations_and_stdin_are_read(tmp_path):
    (tmp_path / "train.log").write_text("E1130 10:05:01.000000 77 torch/distributed/elastic/multiprocessing/api.py"
                                        ":1002] failed (exitcode: -9) local_rank: 1 (pid: 4312) of binary: python\n")
    with gzip.open(tmp_path / "train.log.1.gz", "wt") as f:
        f.write("2026-11-30 10:05:00,000 INFO [rank1/2] train: saving checkpoint step 40 to /ckpt/step_40\n")
    r = cli("diagnose", "--json", tmp_path)
    assert r.returncode == 1, r.stderr
    assert "interrupted_save" in r.stdout
    pasted = (tmp_path / "train.log").read_text() + gzip.open(tmp_path / "train.log.1.gz", "rt").read()
    r = cli("diagnose", "-", stdin=pasted)
    assert r.returncode == 1 and "interrupted_save" in r.stdout
    assert str(tmp_path) not in r.stdout  # the spool file is never named


def test_events_without_job_or_rank_are_reported_with_the_option_that_fixes_them(tmp_path):
    (tmp_path / "a.log").write_text("2026-11-30 10:05:00,000 INFO train: saving checkpoint step 40 to /ckpt/step_40\n")
    r = cli("diagnose", tmp_path)
    assert "carry no job" not in r.stdout  # one file is one job by necessity: nothing to say
    # the report's own section on a log that ends inside a save, what it means and what to do
    assert "The logs end inside a save" in r.stdout and f"step 40 of job {tmp_path.name}  /ckpt/step_40" in r.stdout
    assert "verify it (ckptwatch verify PATH) before resuming from it" in r.stdout
    (tmp_path / "b.log").write_text("2026-11-30 10:05:00,000 INFO train: saving checkpoint step 40 to /ckpt/step_40\n")
    r = cli("diagnose", tmp_path)
    assert "2 event(s) carry no job" in r.stdout and "--path-template" in r.stdout
    (tmp_path / "b.log").unlink()
    (tmp_path / "a.log").write_text("2026-11-30 10:05:00,000 INFO run_id : llama-3\n"
                                    "2026-11-30 10:05:00,000 INFO train: saving checkpoint step 40 to /ckpt/step_40\n")
    r = cli("diagnose", tmp_path)
    assert "job llama-3: 1 save/failure event(s) carry no rank" in r.stdout and "carry no job" not in r.stdout


def _ev(job: str, kind: str, ts: dt.datetime, *, rank: int = 0, step: int | None = 40, offset: int = 0) -> dict:
    return {"ts": ts, "ts_source": "line", "job": job, "host": "h", "rank": rank, "local_rank": rank, "pid": None,
            "kind": kind, "step": step, "path": f"/ckpt/{job}/step_40", "rule_id": "test", "attrs": "{}",
            "source_id": job, "source_kind": "log", "offset": offset, "line": kind, "dedup_key": f"{job}:{offset}"}


def test_a_clock_far_ahead_in_one_job_concludes_nothing_in_another():
    t0 = dt.datetime(2026, 11, 30, 10, tzinfo=UTC)
    det = Detector()
    det.process([_ev("a", "save_start", t0), _ev("a", "save_start", t0, rank=1, offset=1),
                 _ev("a", "save_end", t0 + dt.timedelta(seconds=2), offset=2)], now=t0)
    det.process([_ev("b", "metric", t0 + dt.timedelta(hours=20), step=1, offset=0)], now=t0)  # b's clock is 20 h ahead
    assert [i.kind for i in det.advance(now=t0 + dt.timedelta(seconds=10))] == []
    # a itself goes silent: its watermark moves on with wall time, and the save half done is stalled
    later = det.advance(now=t0 + dt.timedelta(minutes=31))
    assert [(i.kind, i.job) for i in later] == [("stalled_save", "a")]


def test_events_dated_past_tomorrow_move_no_watermark():
    t0 = dt.datetime(2026, 11, 30, 10, tzinfo=UTC)
    det = Detector()
    det.process([_ev("a", "save_start", t0), _ev("a", "metric", dt.datetime(2100, 1, 1, tzinfo=UTC), step=1, offset=5)],
                now=t0)
    assert det.jobs["a"].max_ts == t0 and det.max_ts == t0
