#!/usr/bin/env python3
"""Plain single-process PyTorch loop that checkpoints with safetensors.torch.save_file.

Every --every steps it writes ckpt/step_<N:06d>/{model.safetensors, optimizer.safetensors, meta.json}
(optimizer state flattened to tensors; meta.json last). It logs (timestamps, INFO):
  saving checkpoint step N to DIR
  saved checkpoint step N to DIR (B bytes)
--resume DIR | latest : load DIR, or the highest-numbered step_* directory (no completeness check,
  as many hand-written loops do), logging `resuming from checkpoint DIR (step N)`.
"""
import argparse
import json
import logging
import os
import re
import sys

import torch
import torch.nn as nn
from safetensors.torch import load_file, save, save_file

log = logging.getLogger("train")


def model_fn():
    return nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 8))


def opt_to_tensors(opt):
    out = {}
    for pid, st in opt.state_dict()["state"].items():
        for k, v in st.items():
            out[f"state.{pid}.{k}"] = v if torch.is_tensor(v) else torch.tensor(v)
    return out


def tensors_to_opt(opt, t):
    sd = opt.state_dict()
    state = {}
    for key, v in t.items():
        _, pid, k = key.split(".", 2)
        state.setdefault(int(pid), {})[k] = v
    sd["state"] = state
    opt.load_state_dict(sd)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt-dir", default="ckpt")
    ap.add_argument("--max-steps", type=int, default=40)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--resume", default=None)
    ap.add_argument("--writer", choices=["save_file", "bytes"], default="save_file",
                    help="save_file(): safetensors writes the file; bytes: open(path,'wb').write(save(sd))")
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                        format="%(asctime)s.%(msecs)03d %(levelname)s %(name)s: %(message)s",
                        datefmt="%Y-%m-%d %H:%M:%S")
    torch.manual_seed(0)
    model = model_fn()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    w = torch.randn(32, 8, generator=g) * 0.25
    step = 0
    if a.resume:
        d = a.resume
        if d == "latest":
            steps = sorted(x for x in os.listdir(a.ckpt_dir) if re.fullmatch(r"step_\d+", x))
            d = os.path.join(a.ckpt_dir, steps[-1])
        step = int(re.search(r"step_(\d+)", d).group(1))
        log.info(f"resuming from checkpoint {d} (step {step})")
        model.load_state_dict(load_file(os.path.join(d, "model.safetensors")))
        tensors_to_opt(opt, load_file(os.path.join(d, "optimizer.safetensors")))
        log.info(f"loaded checkpoint {d}: model and optimizer restored, continuing at step {step + 1}")
    while step < a.max_steps:
        step += 1
        x = torch.randn(64, 32, generator=g)
        loss = nn.functional.mse_loss(model(x), x @ w)
        opt.zero_grad()
        loss.backward()
        opt.step()
        log.info(f"step {step} loss {loss.item():.5f}")
        if step % a.every == 0:
            d = os.path.join(a.ckpt_dir, f"step_{step:06d}")
            log.info(f"saving checkpoint step {step} to {d}")
            os.makedirs(d, exist_ok=True)
            for name, sd in (("model.safetensors", model.state_dict()), ("optimizer.safetensors", opt_to_tensors(opt))):
                if a.writer == "save_file":
                    save_file(sd, os.path.join(d, name))
                else:
                    with open(os.path.join(d, name), "wb") as f:
                        f.write(save(sd))
            with open(os.path.join(d, "meta.json"), "w") as f:
                json.dump({"step": step}, f)
            size = sum(os.path.getsize(os.path.join(d, n)) for n in os.listdir(d))
            log.info(f"saved checkpoint step {step} to {d} ({size} bytes)")
    log.info(f"training finished at step {step}")


if __name__ == "__main__":
    main()
