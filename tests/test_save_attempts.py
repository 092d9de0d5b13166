"""The same step saved by several runs of one job (``python train.py >> train.log`` again
and again, or attempts in files that name no job). Found by a new user's trial:

* a run killed in the middle of the save of step 40 logs nothing more; the next run fails
  to load checkpoint-40; a third run resumes from checkpoint-30 and saves step 40 again.
  The poisoned resume of the second run was withdrawn ("finished after all") once the
  third run's save arrived, and the third run's progress had ended the first run's save;
* a run resumed from checkpoint-20 that saves into another folder (ckpt3/checkpoint-30)
  took the place of the first run's ckpt/checkpoint-30, so the last good checkpoint of a
  later incident went back to step 10.

A save is ended only by what its own process logs (a load or resume after it began cuts
it off), and a load is judged by the attempt written before it
(:meth:`~ckptwatch.detectors.checkpoints.CheckpointRegistry.fact_at`)."""

from __future__ import annotations

import datetime as dt

import duckdb

from ckptwatch.embedded import EmbeddedRunner
from ckptwatch.pipeline import PipelineOptions, diagnose

T0 = dt.datetime(2026, 12, 4, 1, 47, 54, tzinfo=dt.timezone.utc)


def _log(sec: float, msg: str) -> str:
    t = T0 + dt.timedelta(seconds=sec)
    return f"{t:%Y-%m-%d %H:%M:%S},{t.microsecond // 1000:03d} INFO  [mytrain] {msg}\n"


def _train(sec: float, first: int, last: int, root: str = "ckpt", *, killed_at: int | None = None) -> str:
    out = [_log(sec, f"Training from step {first} to {last}")]
    for step in range(first + 1, last + 1):
        sec += 0.05
        out.append(_log(sec, f"step {step} loss {1.0 / step:.4f}"))
        if step % 10 == 0:
            out.append(_log(sec, f"Saving checkpoint to {root}/checkpoint-{step}"))
            if step == killed_at:
                return "".join(out)  # SIGKILL inside torch.save: nothing more
            out.append(_log(sec + 0.01, f"Saved checkpoint {root}/checkpoint-{step}"))
    return "".join(out) + _log(sec + 0.1, "done")


ZIP = ("Traceback (most recent call last):\n  File \"train.py\", line 20, in <module>\n"
       "    sd = torch.load(os.path.join(a.resume, \"model.pt\"))\n"
       "RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central directory\n")

KILLED = _train(0, 0, 40, killed_at=40)
FAILED = _log(10, "Resuming from checkpoint ckpt/checkpoint-40") + ZIP
AGAIN = _log(20, "Resuming from checkpoint ckpt/checkpoint-30") + _train(20.01, 30, 60)


def test_a_later_run_saving_the_step_again_does_not_make_the_torn_one_whole(tmp_path):
    (tmp_path / "train.log").write_text(KILLED + FAILED + AGAIN)
    incidents, _ = diagnose([str(tmp_path)])
    got = {(i.kind, i.step): i for i in incidents}
    assert sorted(got) == [("load_failure", 40), ("poisoned_resume", 40)]
    poisoned = got[("poisoned_resume", 40)]
    assert poisoned.status == "open" and poisoned.checkpoint_state["reason"] == "never_finished"
    assert poisoned.last_good_checkpoint == {"step": 30, "path": "ckpt/checkpoint-30"}
    # the same attempts in three files that name no job: one job, judged the same
    for n, text in enumerate((KILLED, FAILED, AGAIN)):
        (tmp_path / "sep").mkdir(exist_ok=True)
        (tmp_path / "sep" / f"attempt{n + 1}.log").write_text(text)
    incidents, _ = diagnose([str(tmp_path / "sep")])
    assert sorted((i.kind, i.step, i.status) for i in incidents) == [("load_failure", 40, "open"),
                                                                    ("poisoned_resume", 40, "open")]


def test_a_poisoned_resume_paged_live_stays_when_the_step_is_saved_again(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "train.log").write_text(KILLED + FAILED)
    db = str(tmp_path / "inc.duckdb")
    runner = EmbeddedRunner(str(logs), db, PipelineOptions())
    now = T0 + dt.timedelta(seconds=15)
    try:
        first = set()
        for k in range(4):  # the watermark passes the resume: the save never seen to finish is judged
            first |= {(i.kind, i.step, i.status) for i in runner.cycle(now=now + dt.timedelta(seconds=10 * k))}
        assert ("poisoned_resume", 40, "open") in first
        with open(logs / "train.log", "a") as f:
            f.write(AGAIN)
        for k in range(4, 8):
            runner.cycle(now=now + dt.timedelta(seconds=10 * k))
    finally:
        runner.close()
    con = duckdb.connect(db, read_only=True)
    rows = con.execute("SELECT kind, step, status FROM incidents ORDER BY kind").fetchall()
    con.close()
    assert rows == [("load_failure", 40, "open"), ("poisoned_resume", 40, "open")]


def test_a_save_into_another_folder_does_not_take_the_place_of_the_first_run_s(tmp_path):
    first = _train(0, 0, 40)
    again = _log(15, "Resuming from checkpoint ckpt/checkpoint-20") + _train(15.01, 20, 30, root="ckpt3")
    nan = (_log(30, "Resuming from checkpoint ckpt/checkpoint-40")
           + "2026-12-04T01:48:24.332671Z ckptwatch event=probe step=40 verdict=degenerate reason=not_finite "
             "values=64 rows=16 distinct_rows=16 finite=0.75 std=1.734 path=ckpt/checkpoint-40\n")
    (tmp_path / "train.log").write_text(first + again + nan)
    (inc,) = diagnose([str(tmp_path)])[0]
    assert (inc.kind, inc.step) == ("load_failure", 40)
    assert inc.last_good_checkpoint == {"step": 30, "path": "ckpt/checkpoint-30"}  # not ckpt3's, not step 10


def _files(tmp_path, name: str, **files: str):
    folder = tmp_path / name
    folder.mkdir()
    for fname, text in files.items():
        (folder / f"{fname}.log").write_text(text)
    return sorted((i.kind, i.step, i.status) for i in diagnose([str(folder)])[0])


KILL = "/var/spool/slurmd/job4242/slurm_script: line 9: 31337 Killed                  python train.py\n"


def test_what_a_break_it_trial_tried_against_the_attempts(tmp_path):
    """A second helper tried to make the attempt logic give false pages, or miss real ones."""
    # a torn save, re-saved whole by the restarted run, then resumed: nothing poisoned, and
    # the interrupted save is resolved (the job has that checkpoint whole again)
    assert _files(tmp_path, "resaved", run1=_train(0, 0, 40, killed_at=40) + KILL,
                  run2=_log(600, "Resuming from checkpoint ckpt/checkpoint-30") + _train(600.01, 30, 45),
                  run3=_log(1200, "Resuming from checkpoint ckpt/checkpoint-40") + _train(1200.01, 40, 50)) == [
        ("interrupted_save", 40, "resolved")]
    # the process reads back what it just saved (an evaluation): it went on, the save returned
    evaluated = _train(0, 0, 40).replace("Saved checkpoint ckpt/checkpoint-40\n", "Loading checkpoint from "
                                         "ckpt/checkpoint-40 for evaluation\n")
    assert "Saved checkpoint ckpt/checkpoint-40" not in evaluated
    assert _files(tmp_path, "evaluated", train=evaluated + _log(50, "Resuming from checkpoint ckpt/checkpoint-40")
                  + _train(50.01, 40, 45)) == []
    # the same resume ten minutes later, in the same log: a new run loaded a save never seen to finish
    assert _files(tmp_path, "appended", train=_train(0, 0, 40, killed_at=40) + _log(600, "Resuming from "
                  "checkpoint ckpt/checkpoint-40") + _train(600.01, 40, 45)) == [("poisoned_resume", 40, "open")]
    # two runs of a sweep in two files naming no job: one's resume does not cut the other's save off
    sweep_a = _train(0, 0, 60, root="sweep/a")
    sweep_b = _log(0.5, "Resuming from checkpoint sweep/b/checkpoint-20") + _train(0.51, 20, 30, root="sweep/b")
    assert _files(tmp_path, "sweep", a=sweep_a, b=sweep_b,
                  a2=_log(900, "Resuming from checkpoint sweep/a/checkpoint-40") + _train(900.01, 40, 45,
                                                                                         root="sweep/a")) == []


def test_lightning_early_stopping_then_test_on_the_best_checkpoint_is_quiet(tmp_path):
    """ModelCheckpoint(verbose=True) prints nothing after a save; with EarlyStopping no
    "`Trainer.fit` stopped" follows either, so the last save was never ended and
    ``trainer.test(ckpt_path="best")`` paged as a poisoned resume (the break-it trial). Its
    "was not in top K" lines are progress past the save."""
    at = "2026-12-04 01:0{m}:00,000 INFO "
    (tmp_path / "fit.log").write_text(
        at.format(m=1) + "Epoch 0, global step 100: 'val_loss' reached 0.91000 (best 0.91000), saving model to "
        "'/ckpt/lit/epoch=0-step=100.ckpt' as top 1\n"
        + at.format(m=2) + "Epoch 1, global step 200: 'val_loss' reached 0.62000 (best 0.62000), saving model to "
        "'/ckpt/lit/epoch=1-step=200.ckpt' as top 1\n"
        + at.format(m=3) + "Epoch 2, global step 300: 'val_loss' was not in top 1\n"
        + at.format(m=4) + "Epoch 3, global step 400: 'val_loss' was not in top 1\n"
        + at.format(m=4) + "Monitored metric val_loss did not improve in the last 2 records. Best score: 0.620. "
        "Signaling Trainer to stop.\n"
        + at.format(m=5) + "Restoring states from the checkpoint path at /ckpt/lit/epoch=1-step=200.ckpt\n"
        + at.format(m=5) + "Loaded model weights from the checkpoint at /ckpt/lit/epoch=1-step=200.ckpt\n")
    incidents, stats = diagnose([str(tmp_path)])
    assert incidents == [] and stats.open_saves == []
