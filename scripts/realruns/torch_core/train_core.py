#!/usr/bin/env python3
"""Tiny plain-PyTorch training loop (CPU, gloo) used to produce REAL checkpoint logs.

Runs under torchrun (RANK/WORLD_SIZE in the environment: FSDP2 over gloo) or as a bare
single process (no process group, plain nn.Module).

--log-style logging : Python logging with timestamps, every rank logs
--log-style print   : print(..., flush=True) without timestamps, steps/saves from rank 0 only
                      (DCP saves: every rank prints its own save lines)
--ckpt torch        : rank 0 torch.save()s a full (unsharded) state dict to <out>/ckpt_step_N.pt
--ckpt dcp          : torch.distributed.checkpoint.save to <out>/step_N/ (every rank writes a shard)
--ckpt rankfiles    : every rank torch.save()s its own sharded state dict to <out>/step_N/rank{R}.pt

Fault helpers (every injection is written to the side-car --fault-log, never to the training log):
--slow-storage-bps B : every checkpoint write sleeps len(bytes)/B seconds (slow storage)
--oom-rank R --oom-step S --oom-cgroup DIR : inside the save at step S, rank R writes its own pid to
                      DIR/cgroup.procs (a memory cgroup with a small limit prepared by the run script)
                      and then allocates a large host staging buffer in chunks, so the kernel OOM
                      killer kills it.
"""
import argparse
import contextlib
import json
import logging
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem

ARGS = None
RANK = 0
WORLD = 1
DIST = False
CUR_STEP = 0
LOG = None


def fault_log(event, **kw):
    if not ARGS.fault_log:
        return
    rec = {"event": event, "rank": RANK, "pid": os.getpid(), "step": CUR_STEP, "wall_time": time.time(),
           "wall_time_iso": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + f".{int(time.time() % 1 * 1000):03d}Z"}
    rec.update(kw)
    with open(ARGS.fault_log, "a") as f:
        f.write(json.dumps(rec) + "\n")


# ----------------------------------------------------------------------------- logging
def out(msg, all_ranks=False, level="info"):
    if ARGS.log_style == "logging":
        getattr(LOG, level)(msg)
    else:
        if RANK == 0 or all_ranks:
            print(msg, flush=True)


def setup_logging():
    global LOG
    if ARGS.log_style == "logging":
        h = logging.StreamHandler(sys.stderr if ARGS.log_stream == "stderr" else sys.stdout)
        h.setFormatter(logging.Formatter(
            f"%(asctime)s %(levelname)s [rank{RANK}] %(name)s: %(message)s"))
        root = logging.getLogger()
        root.handlers.clear()
        root.addHandler(h)
        root.setLevel(logging.INFO)
    LOG = logging.getLogger("train")


# ----------------------------------------------------------------------------- slow storage / OOM
class _SlowStream:
    def __init__(self, f, bps):
        self._f, self._bps = f, bps

    def write(self, b):
        n = memoryview(b).nbytes
        # write in 4 KiB pieces so that a kill lands in the middle of a file
        mv = memoryview(b).cast("B")
        for i in range(0, n, 4096):
            time.sleep(min(4096, n - i) / self._bps)
            self._f.write(mv[i:i + 4096])
        return n

    def __getattr__(self, name):
        return getattr(self._f, name)


class SlowFileSystem(FileSystem):
    def __init__(self, bps):
        super().__init__()
        self.bps = bps

    @contextlib.contextmanager
    def create_stream(self, path, mode):
        with super().create_stream(path, mode) as f:
            if str(path).endswith(".distcp"):
                yield _SlowStream(f, self.bps)
            else:
                yield f


def maybe_oom():
    if not (ARGS.oom_cgroup and ARGS.oom_rank == RANK and ARGS.oom_step == CUR_STEP):
        return
    fault_log("oom_move_into_cgroup", cgroup=ARGS.oom_cgroup,
              limit=open(os.path.join(ARGS.oom_cgroup, "memory.limit_in_bytes")).read().strip())
    with open(os.path.join(ARGS.oom_cgroup, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))
    fault_log("oom_alloc_begin", chunk_mb=64)
    bufs = []
    for i in range(1000):  # a host staging copy that grows until the kernel kills us
        bufs.append(torch.ones(16 * 1024 * 1024))
    fault_log("oom_alloc_survived")  # never expected


class FaultyWriter(FileSystemWriter):
    def __init__(self, path, **kw):
        super().__init__(path, **kw)
        if ARGS.slow_storage_bps > 0:
            self.fs = SlowFileSystem(ARGS.slow_storage_bps)

    def write_data(self, plan, planner):
        maybe_oom()
        return super().write_data(plan, planner)


def slow_torch_save(obj, path):
    if ARGS.slow_storage_bps > 0:
        with open(path, "wb") as f:
            torch.save(obj, _SlowStream(f, ARGS.slow_storage_bps))
    else:
        torch.save(obj, path)


# ----------------------------------------------------------------------------- model / data
def build_model():
    h = ARGS.hidden
    return nn.Sequential(nn.Linear(32, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 8))


def batch(step, rank, bs=16):
    g = torch.Generator().manual_seed(ARGS.seed * 100003 + step * 101 + rank)
    x = torch.randn(bs, 32, generator=g)
    w = torch.randn(32, 8, generator=torch.Generator().manual_seed(1234)) / 4
    return x, torch.tanh(x @ w) + 0.01 * torch.randn(bs, 8, generator=g)


def ckpt_path(step):
    if ARGS.ckpt == "torch":
        return os.path.join(ARGS.out, f"ckpt_step_{step}.pt")
    return os.path.join(ARGS.out, f"step_{step}")


# ----------------------------------------------------------------------------- save / load
def state_dicts(model, opt, full):
    if not DIST:
        return model.state_dict(), opt.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True) if full else None
    return get_state_dict(model, opt, options=opts) if opts else get_state_dict(model, opt)


def save(step, model, opt):
    t0 = time.time()
    path = ckpt_path(step)
    if ARGS.ckpt == "torch":
        msd, osd = state_dicts(model, opt, full=True)
        if RANK == 0:
            out(f"Saving checkpoint at step {step} to {path}")
            maybe_oom()
            slow_torch_save({"model": msd, "optimizer": osd, "step": step, "world_size": WORLD}, path)
            out(f"Checkpoint saved to {path} ({os.path.getsize(path) / 1e6:.2f} MB, {time.time() - t0:.2f}s)")
        if DIST:
            dist.barrier()
    elif ARGS.ckpt == "dcp":
        msd, osd = state_dicts(model, opt, full=False)
        out(f"Saving checkpoint at step {step} to {path}", all_ranks=True)
        dcp.save({"model": msd, "optimizer": osd, "step": step}, storage_writer=FaultyWriter(path))
        out(f"Checkpoint saved to {path} ({time.time() - t0:.2f}s)", all_ranks=True)
    else:  # rankfiles
        msd, osd = state_dicts(model, opt, full=False)
        os.makedirs(path, exist_ok=True)
        f = os.path.join(path, f"rank{RANK}.pt")
        out(f"Saving checkpoint shard at step {step} to {f}", all_ranks=True)
        maybe_oom()
        slow_torch_save({"model": msd, "optimizer": osd, "step": step, "world_size": WORLD}, f)
        if DIST:
            dist.barrier()
        out(f"Checkpoint saved to {path} ({time.time() - t0:.2f}s)", all_ranks=True)


def load(path, model, opt):
    out(f"Resuming from checkpoint {path}", all_ranks=ARGS.ckpt != "torch")
    if ARGS.ckpt == "torch":
        sd = torch.load(path, map_location="cpu")
        if DIST:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict
            set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optimizer"],
                           options=StateDictOptions(full_state_dict=True))
        else:
            model.load_state_dict(sd["model"])
            opt.load_state_dict(sd["optimizer"])
        step = int(sd["step"])
    elif ARGS.ckpt == "dcp":
        msd, osd = state_dicts(model, opt, full=False)
        state = {"model": msd, "optimizer": osd, "step": 0}
        dcp.load(state, checkpoint_id=path)
        if DIST:
            from torch.distributed.checkpoint.state_dict import set_state_dict
            set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
        else:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
        step = int(state["step"])
    else:
        sd = torch.load(os.path.join(path, f"rank{RANK}.pt"), map_location="cpu", weights_only=False)
        if DIST:
            from torch.distributed.checkpoint.state_dict import set_state_dict
            set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optimizer"])
        else:
            model.load_state_dict(sd["model"])
            opt.load_state_dict(sd["optimizer"])
        step = int(sd["step"])
    out(f"Resumed from {path} at step {step}", all_ranks=ARGS.ckpt != "torch")
    return step


# ----------------------------------------------------------------------------- main
def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--log-style", choices=["logging", "print"], default="logging")
    p.add_argument("--log-stream", choices=["stdout", "stderr"], default="stderr")
    p.add_argument("--ckpt", choices=["torch", "dcp", "rankfiles"], default="dcp")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--save-every", type=int, default=10)
    p.add_argument("--out", required=True)
    p.add_argument("--resume", default=None)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--step-sleep", type=float, default=0.05)
    p.add_argument("--slow-storage-bps", type=float, default=0)
    p.add_argument("--oom-rank", type=int, default=-1)
    p.add_argument("--oom-step", type=int, default=-1)
    p.add_argument("--oom-cgroup", default=None)
    p.add_argument("--fault-log", default=None)
    a = p.parse_args()
    # Fault settings may come from the environment instead, so that they never show up in a command
    # line a user would see (bash's "Killed" message, ps, run.sh): CKPTW_FAULT_LOG=path,
    # CKPTW_OOM=RANK:STEP:CGROUP_DIR
    a.fault_log = a.fault_log or os.environ.get("CKPTW_FAULT_LOG")
    if os.environ.get("CKPTW_OOM"):
        r, s, cg = os.environ["CKPTW_OOM"].split(":", 2)
        a.oom_rank, a.oom_step, a.oom_cgroup = int(r), int(s), cg
    return a


def main():
    global ARGS, RANK, WORLD, DIST, CUR_STEP
    ARGS = parse()
    DIST = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if DIST:
        RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    setup_logging()
    if DIST:
        dist.init_process_group("gloo")
    out(f"rank={RANK} local_rank={os.environ.get('LOCAL_RANK', 0)} world_size={WORLD} pid={os.getpid()} "
        f"host={socket.gethostname()} torch={torch.__version__} ckpt={ARGS.ckpt}", all_ranks=True)
    os.makedirs(ARGS.out, exist_ok=True)
    torch.manual_seed(ARGS.seed)
    model = build_model()
    if DIST:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (WORLD,))
        for m in model:
            if isinstance(m, nn.Linear):
                fully_shard(m, mesh=mesh)
        fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=ARGS.lr, weight_decay=0.01)

    start = 0
    if ARGS.resume:
        start = load(ARGS.resume, model, opt)
    for step in range(start + 1, ARGS.steps + 1):
        CUR_STEP = step
        x, y = batch(step, RANK)
        loss = F.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        lt = loss.detach().clone()
        if DIST:
            dist.all_reduce(lt)
        avg = lt.item() / WORLD
        time.sleep(ARGS.step_sleep)
        if ARGS.log_style == "logging":
            out(f"step {step}/{ARGS.steps} loss={avg:.5f} lr={ARGS.lr:.1e}")
        else:
            out(f"step {step}/{ARGS.steps} | loss {avg:.5f}")
        if step % ARGS.save_every == 0:
            save(step, model, opt)
    out(f"Training finished at step {ARGS.steps}")
    if DIST:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
