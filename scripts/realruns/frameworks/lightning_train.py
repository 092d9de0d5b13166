#!/usr/bin/env python3
"""Tiny PyTorch Lightning run: an MLP on random data, Trainer(accelerator="cpu", devices=2,
strategy="ddp"), ModelCheckpoint(every_n_train_steps=N, monitor="train_loss", save_top_k=-1,
verbose=True). Started as `python lightning_train.py ...`: Lightning's subprocess launcher
re-runs the script for rank 1.

Logging: Python logging at INFO with timestamps (root handler), so Lightning's rank-zero info
lines and the per-step loss line of rank 0 carry a timestamp.

--save-sleep S --save-sleep-step N : fault-injection helper. At the checkpoint save of global step
  N, the checkpoint IO writes the file in 8 KiB chunks and sleeps S seconds after the first
  chunk, directly into the final path (like a plain, non-atomic torch.save to a file). Prints nothing.
--probe : after a resume, run ckptwatch's output probe (ckptwatch.probe.lightning.probe_callback) on a
  fixed batch of 16 inputs; it prints one `ckptwatch event=probe ...` line (rank 0).
--atomic-io : keep Lightning's own TorchCheckpointIO (fsspec transaction: temp file, then move).
"""
import argparse
import io
import logging
import os
import sys
import time
from datetime import timedelta

import torch
import torch.nn as nn

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.strategies import DDPStrategy

log = logging.getLogger("train")


class RandomData(torch.utils.data.Dataset):
    def __init__(self, n=2048, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 32, generator=g)
        w = torch.randn(32, 4, generator=g)
        self.y = (self.x @ w) * 0.25

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class Model(L.LightningModule):
    def __init__(self, step_sleep=0.0):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
        self.step_sleep = step_sleep

    def training_step(self, batch, _):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, on_step=True, prog_bar=False)
        if self.global_rank == 0:
            log.info(f"step {self.global_step + 1} train_loss {loss.item():.4f}")
        if self.step_sleep:
            time.sleep(self.step_sleep)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


class SlowIO(TorchCheckpointIO):
    """Non-atomic torch.save into the final path, written in chunks; sleeps at one step's save."""

    def __init__(self, sleep, at_step):
        super().__init__()
        self.sleep, self.at_step = sleep, at_step

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        os.makedirs(os.path.dirname(str(path)), exist_ok=True)
        buf = io.BytesIO()
        torch.save(checkpoint, buf)
        data = buf.getvalue()
        with open(path, "wb") as f:
            for i in range(0, len(data), 8192):
                f.write(data[i:i + 8192])
                f.flush()
                if i == 0 and checkpoint.get("global_step") == self.at_step:
                    time.sleep(self.sleep)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt-dir", default="ckpt")
    ap.add_argument("--max-steps", type=int, default=30)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--resume", default=None)
    ap.add_argument("--save-sleep", type=float, default=0.0)
    ap.add_argument("--save-sleep-step", type=int, default=-1)
    ap.add_argument("--step-sleep", type=float, default=0.0)
    ap.add_argument("--atomic-io", action="store_true")
    ap.add_argument("--probe", action="store_true", help="ckptwatch's output probe after a resume")
    ap.add_argument("--pg-timeout", type=float, default=None, help="DDPStrategy(timeout=...) in seconds")
    a = ap.parse_args()

    logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    L.seed_everything(0, workers=True)
    ckpt = ModelCheckpoint(dirpath=a.ckpt_dir, every_n_train_steps=a.every, monitor="train_loss", mode="min",
                           save_top_k=-1, verbose=True)
    callbacks = [ckpt]
    if a.probe:
        from ckptwatch.probe.lightning import probe_callback

        fixed = RandomData(n=16, seed=1).x

        def outputs(module):  # the callback runs it in eval mode, without autograd
            return module.net(fixed.to(module.device)).float().cpu().numpy()
        callbacks.append(probe_callback(outputs))
    plugins = [] if a.atomic_io else [SlowIO(a.save_sleep, a.save_sleep_step)]
    strategy = "ddp" if a.pg_timeout is None else DDPStrategy(timeout=timedelta(seconds=a.pg_timeout))
    trainer = L.Trainer(accelerator="cpu", devices=a.devices, strategy=strategy, max_steps=a.max_steps,
                        callbacks=callbacks, plugins=plugins, log_every_n_steps=1, enable_progress_bar=False,
                        logger=False, enable_model_summary=True)
    dl = torch.utils.data.DataLoader(RandomData(), batch_size=16, shuffle=True, num_workers=0)
    trainer.fit(Model(a.step_sleep), dl, ckpt_path=a.resume)
    if trainer.is_global_zero:
        log.info(f"fit finished at global step {trainer.global_step}")


if __name__ == "__main__":
    main()
