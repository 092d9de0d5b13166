"""Mechanisms the third round of wild cases (scored before anyone read them) showed missing,
each on its real case (tests/wild/dev, the thread in each expected.json) and on a shape that
must stay quiet."""

from __future__ import annotations

from pathlib import Path

from ckptwatch.pipeline import diagnose

WILD = Path(__file__).resolve().parent / "wild" / "dev"


def found(path: Path | str) -> list[tuple]:
    incidents, _ = diagnose([str(path)])
    return [(i.kind, i.step, i.root_cause.cls if i.root_cause else None) for i in incidents]


def test_an_error_only_a_write_raises_on_a_checkpoints_path_is_its_failed_save(tmp_path):
    """mmdet's latest.pth symlink refused on Google Drive (EOPNOTSUPP, epoch_12.pth: an epoch
    counter's checkpoint, step 12); TF's SavedModel shard out of space, with no save line."""
    assert found(WILD / "vision-mmdetection-3302" / "logs") == [("storage_failure_during_save", 12, "storage_error")]
    assert found(WILD / "tf-keras-tuner-390" / "logs") == [("storage_failure_during_save", None, "storage_error")]
    # the same error on a logger's file, or a read-side error on a checkpoint, says nothing of a save
    (tmp_path / "a.log").write_text("OSError: [Errno 28] No space left on device: '/tmp/wandb/run-1/files/output.log'\n")
    (tmp_path / "b.log").write_text("FileNotFoundError: [Errno 2] No such file or directory: '/ckpt/run1/checkpoint-500/x'\n")
    assert [k for k, _, _ in found(tmp_path)] == ["load_failure"]


def test_a_save_line_naming_only_its_file_starts_a_save_with_the_step_of_the_name():
    """OneTrainer's 'Saving D:/workspace\\\\save\\\\…-save-50-2-0.safetensors' (global step 50,
    epoch 2) then MemoryError in safetensors' save_file; darknet's 'Saving weights to
    ….weights' then 'Couldn't open file: ….weights'."""
    assert found(WILD / "diffusion-onetrainer-835" / "logs") == [("interrupted_save", 50, "host_memory")]
    assert found(WILD / "vision-darknet-2272" / "logs") == [("storage_failure_during_save", None, "storage_error")]


def test_a_kill_on_a_round_step_is_a_presumed_save_only_where_steps_are_not_all_round(tmp_path):
    """YOLOX logs 'iter: 12700/14786' every few iterations and was killed mid-epoch: no save.
    A tqdm bar standing on 200/4443 when torchrun reports exitcode -9 is redrawn at every step:
    the round step is the save's (open-r1's GRPO save at step 200)."""
    assert found(WILD / "vision-yolox-114" / "logs") == []
    assert found(WILD / "hf-open-r1-675" / "logs") == [("interrupted_save", 200, "signal")]
    lines = [f"2024-01-01 10:00:{i:02d} | INFO | trainer - iter: {100 * i}/9000, loss: 1.0" for i in range(1, 6)]
    (tmp_path / "train.log").write_text("\n".join(lines + ["Killed"]) + "\n")
    assert found(tmp_path) == []
    lines[-1] = "2024-01-01 10:00:05 | INFO | trainer - iter: 510/9000, loss: 1.0"
    lines.append("2024-01-01 10:00:06 | INFO | trainer - iter: 600/9000, loss: 1.0")
    (tmp_path / "train.log").write_text("\n".join(lines + ["Killed"]) + "\n")
    assert found(tmp_path) == [("interrupted_save", 600, "signal")]


def test_an_outer_counter_that_is_full_is_no_completed_bar(tmp_path):
    """OpenRLHF's 'Episode [1/1]:  12%|█▏  | 37/312 [...]' stands on step 37 when Ray's memory
    monitor kills an actor: the episode counter 1/1 is full, the bar is not, and step 37 is
    no save point. A bar whose own count is full (tqdm's '500/500 [', Keras' '1563/1563 ━')
    is one."""
    from ckptwatch.detectors.save_points import _COMPLETE
    assert not _COMPLETE.search("Episode [1/1]:  12%|█▏        | 37/312 [7:54:11<58:40:03, 768.07s/it]")
    assert _COMPLETE.search("Training: 500/500 [02:00<00:00,  4.1it/s]")
    assert _COMPLETE.search("1563/1563 ━━━━━━━━━━━━━━━━━━━━ 48s 30ms/step - loss: 0.64")
    (tmp_path / "console.log").write_text(
        "Episode [1/1]:  12%|█▏        | 37/312 [7:54:11<58:40:03, 768.07s/it, policy_loss=-0.0118]\n"
        "(raylet, ip=10.20.4.10) [2024-11-18 04:07:41,882 E 48211 48211] (raylet) node_manager.cc:3219: 1 Workers "
        "(tasks / actors) killed due to memory pressure (OOM), 0 Workers crashed due to other reasons on node\n")
    assert found(tmp_path) == []
