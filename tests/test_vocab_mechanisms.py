"""Mechanisms the vocabulary corpus (tests/vocab) led to, each on the shape it stands for:
a saver's own failure report is the save's cause, a rank's lone timeout blames no rank the
logs do not show, a save announced as asynchronous is not ended by the next progress line,
a failed load names its first rank, and a TF CheckpointManager's ``ckpt-N`` counts saves."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptwatch.naming import step_from_path
from ckptwatch.pipeline import diagnose


def _diagnose(tmp_path: Path, text: str) -> list:
    (tmp_path / "train.log").write_text(text)
    return diagnose([str(tmp_path)])[0]


CASES = {
    # a saver's ERROR line with no process death: the save is partial, its cause the saver's error
    "a saver's own failure report is its cause, not an unknown": (
        "2024-05-01 10:00:00,000 INFO step 100 loss 0.5\n"
        "2024-05-01 10:00:01,000 INFO Saving checkpoint at step 100 to /ckpt/step_100\n"
        "2024-05-01 10:00:05,000 ERROR Failed to save checkpoint at step 100: CheckpointException\n",
        [("partial_checkpoint", 100, "exception", 0)]),
    # TF saver.py's ValueError for a missing parent directory: the traceback rules place it in
    # save code (it is not read as a bare save_error), and the step is the stream's last
    "a traceback through save code that refuses to save is an interrupted save": (
        "Step 1900: loss=0.51\nINFO:tensorflow:Step 2000 loss 0.50\n"
        "Traceback (most recent call last):\n"
        '  File "train.py", line 88, in <module>\n'
        '    saver.save(sess, "/mnt/ckpt/run1/model.ckpt", global_step=2000)\n'
        '  File "/usr/lib/python3/site-packages/tensorflow/python/training/saver.py", line 1300, in save\n'
        "    raise ValueError(\n"
        "ValueError: Parent directory of /mnt/ckpt/run1/model.ckpt-2000 doesn't exist, can't save.\n",
        [("interrupted_save", 2000, "exception", 0)]),
    # a rank-less save line taken as rank 0's does not show that rank 0 was there to be waited for
    "a lone rank's barrier timeout blames that rank": (
        "I0502 10:15:00.000000 140317 checkpoint_manager.py:1400] Saving checkpoint for step 1000 to gs://b/run/1000\n"
        "[rank2]: jax.experimental.array_serialization.serialization.BarrierTimeoutError: "
        "DEADLINE_EXCEEDED: Barrier timed out. Id: CheckpointManager:save:1000.\n",
        [("interrupted_save", 1000, "collective_timeout", 2)]),
    "a save announced as asynchronous is not ended by the next progress line": (
        "2024-05-02 10:15:00,000 INFO step 1000 loss 2.1 lr 3e-4\n"
        "2024-05-02 10:15:01,000 INFO Started an asynchronous checkpoint save for step 1000\n"
        "2024-05-02 10:15:05,000 INFO step 1001 loss 2.1 lr 3e-4\n"
        "2024-05-02 10:15:09,000 INFO step 1002 loss 2.1 lr 3e-4\nKilled\n",
        [("interrupted_save", 1000, "signal", 0)]),
    "the background part of a save whose blocking part ended keeps it open": (
        "I0920 17:05:44.120381 139802 checkpoint_manager.py:1526] [process=0] Saving checkpoint at step 4000\n"
        "I0920 17:05:46.891803 139802 checkpoint_manager.py:1600] [process=0][thread=MainThread][step=4000] "
        "Finished synchronous save.\n"
        "I0920 17:05:46.891900 139802 checkpointing.py:100] Started an asynchronous checkpoint save for step 4000\n"
        "I0920 17:05:50.000000 139802 train.py:500] completed step: 4001, seconds: 1.2, loss: 2.1\nKilled\n",
        [("interrupted_save", 4000, "signal", 0)]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_save_incidents_of_the_vocabularys_mechanisms(tmp_path, name):
    text, want = CASES[name]
    incs = _diagnose(tmp_path, text)
    assert [(i.kind, i.step, i.root_cause.cls, i.root_cause.rank) for i in incs] == want
    if "lone rank" in name:
        assert "only this rank's timeout" in incs[0].root_cause.note


def test_a_failed_load_names_the_rank_that_failed_first(tmp_path):
    incs = _diagnose(tmp_path, "[rank4]: ValueError: Size mismatch between saved torch.Size([2322]) and current: "
                               "torch.Size([4]) for model.layers.0.attn._extra_state\n"
                               "[rank1]: ValueError: Size mismatch between saved torch.Size([2322]) and current: "
                               "torch.Size([4]) for model.layers.0.attn._extra_state\n")
    assert [(i.kind, i.root_cause.cls, i.root_cause.rank) for i in incs] == [("load_failure", "load_error", 4)]


def test_a_tf_checkpoint_managers_save_counter_is_no_step():
    assert step_from_path("/mnt/efs/ckpts/ckpt-12_temp/part-00000-of-00001.index") is None
    assert step_from_path("/ckpt/ckpt-12.data-00000-of-00001") is None
    assert step_from_path("/tmp/model_dir/model.ckpt-1000") == 1000  # Estimator's: the global step
