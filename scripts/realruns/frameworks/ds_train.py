#!/usr/bin/env python3
"""Tiny DeepSpeed run on CPU (DS_ACCELERATOR=cpu, gloo): MLP, ZeRO stage --zero, engine.save_checkpoint
every --every steps into --ckpt-dir (tag global_step<N>), engine.load_checkpoint on --resume.
Started by torchrun (or the deepspeed launcher). Python logging INFO with timestamps for the script's
own lines (per-step loss on rank 0); DeepSpeed prints its own [INFO] lines.

--save-sleep S --save-sleep-step N (or env FAULT_SAVE_SLEEP / FAULT_SAVE_SLEEP_STEP): fault-injection helper: inside the step-N save, every rank sleeps
  S seconds after the model states file is written and before the ZeRO optimizer shards are written
  (wraps engine._save_zero_checkpoint). Prints nothing.
"""
import argparse
import logging
import os
import sys
import time

import torch
import torch.nn as nn

import deepspeed

log = logging.getLogger("train")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt-dir", default="ckpt")
    ap.add_argument("--max-steps", type=int, default=30)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--zero", type=int, default=1)
    ap.add_argument("--resume", action="store_true", help="engine.load_checkpoint(ckpt_dir) (tag from 'latest')")
    ap.add_argument("--resume-tag", default=None)
    # defaults from the environment so that launchers which echo the command line (the deepspeed launcher does)
    # do not show the injection helper in the training log
    ap.add_argument("--save-sleep", type=float, default=float(os.environ.get("FAULT_SAVE_SLEEP", "0")))
    ap.add_argument("--save-sleep-step", type=int, default=int(os.environ.get("FAULT_SAVE_SLEEP_STEP", "-1")))
    ap.add_argument("--ds-log-level", default="info", help="deepspeed.utils.logging.set_log_level_from_string (DeepSpeed 0.19 defaults to warning)")
    ap.add_argument("--local_rank", type=int, default=-1)  # deepspeed launcher passes it
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                        format="%(asctime)s.%(msecs)03d %(levelname)s %(name)s: %(message)s",
                        datefmt="%Y-%m-%d %H:%M:%S")
    from deepspeed.utils.logging import logger as ds_logger, set_log_level_from_string
    set_log_level_from_string(a.ds_log_level, ds_logger)
    deepspeed.init_distributed(dist_backend="gloo")
    rank = int(os.environ.get("RANK", "0"))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    cfg = {
        "train_micro_batch_size_per_gpu": 16,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}},
        "zero_optimization": {"stage": a.zero},
        "steps_per_print": 10,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    if a.save_sleep > 0:
        orig = engine._save_zero_checkpoint

        def slow(*args, **kw):
            if engine.global_steps == a.save_sleep_step:
                time.sleep(a.save_sleep)
            return orig(*args, **kw)
        engine._save_zero_checkpoint = slow
    if a.resume:
        path, client = engine.load_checkpoint(a.ckpt_dir, tag=a.resume_tag)
        if rank == 0:
            log.info(f"load_checkpoint returned path={path} global_steps={engine.global_steps}")
    g = torch.Generator().manual_seed(1 + rank)
    w = torch.randn(32, 4, generator=torch.Generator().manual_seed(123)) * 0.25
    while engine.global_steps < a.max_steps:
        x = torch.randn(16, 32, generator=g)
        loss = nn.functional.mse_loss(engine(x), x @ w)
        engine.backward(loss)
        engine.step()
        if rank == 0:
            log.info(f"step {engine.global_steps} loss {loss.item():.5f}")
        if engine.global_steps % a.every == 0:
            engine.save_checkpoint(a.ckpt_dir)
    if rank == 0:
        log.info(f"training finished at step {engine.global_steps}")


if __name__ == "__main__":
    main()
