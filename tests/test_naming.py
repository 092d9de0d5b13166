"""Steps from checkpoint paths: only where a trainer's naming convention puts one."""

from __future__ import annotations

import pytest

from ckptwatch.detectors.checkpoints import checkpoint_key
from ckptwatch.naming import checkpoint_of, step_from_path


@pytest.mark.parametrize("path,step", [
    ("out/checkpoint-500", 500),                                   # HF Trainer
    ("out/checkpoint-20/pytorch_model_fsdp_0", 20),                # a shard folder inside it
    ("/out/checkpoint-60.missing-shard", 60),                      # a damaged copy keeps its number
    ("ckpt/global_step20/mp_rank_00_model_states.pt", 20),         # DeepSpeed tag
    ("/ckpt/iter_0000040", 40),                                    # Megatron-LM
    ("/ckpt/epoch=0-step=20.ckpt", 20),                            # Lightning
    ("/res/m--val_loss=0.00-step=999-consumed_samples=256000.0.ckpt", 999),  # NeMo
    ("./outputs/checkpoint/step-400", 400),                        # torchtitan
    ("/runs/r/checkpoints/ep0-ba500-rank0.pt", 500),               # Composer: batches
    ("/ckpt/step_10", 10), ("ckpt_step_30.pt", 30),                # plain loops
    ("/ckpt/run-17", None), ("/models/gpt-7b", None), ("/lustre/ckpt/gpt-1p3b", None),
    ("/mnt/exp/checkpoint_000003", None),                          # Ray v1: a report index
    ("checkpoints/checkpoint_1_1000.pt", 1000),                    # fairseq: epoch 1, 1000 updates
    ("checkpoints/big_wmt/checkpoint5.pt", None),                  # fairseq: epoch 5, no step
    ("/output/llama/epoch_0", None),                               # torchtune: a folder named by an epoch
    ("work_dirs/faster_rcnn/epoch_12.pth", 12),                     # mmengine CheckpointHook by epoch
    ("D:/workspace/save/run_2025-05-13_20-46-50-save-50-2-0.safetensors", 50),  # OneTrainer: step 50, epoch 2
    ("lightning_logs/version_0/checkpoints/epoch=3-step=500.ckpt", 500),  # the step wins
    ("bf16_zero_pp_rank_3_mp_rank_00_optim_states.pt", None),      # a rank, not a step
])
def test_step_from_path(path, step):
    assert step_from_path(path) == step


def test_checkpoint_keys_agree_across_trainer_forms_and_ignore_root_numbers():
    assert checkpoint_key("/ckpt/iter_0000040", None) == ("/ckpt", 40)
    assert checkpoint_key("/ckpt/run-17", None) == ("/ckpt/run-17", None)
    assert checkpoint_key("/ckpt/run-17/step_40", 40) == ("/ckpt/run-17", 40)


@pytest.mark.parametrize("token, checkpoint", [
    ("ckpt/global_step20/mp_rank_00_model_states.pt", "ckpt/global_step20"),
    ("/ckpt/run1/checkpoint-1500/trainer_state.json'", "/ckpt/run1/checkpoint-1500"),
    ("/data/ckpt/iter_0002000/__0_0.distcp,", "/data/ckpt/iter_0002000"),
    ("/home/user/.cache/wandb/run.log", None),
])
def test_checkpoint_of_a_path_is_its_last_component_naming_a_step(token, checkpoint):
    assert checkpoint_of(token) == checkpoint
