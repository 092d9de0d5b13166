#!/usr/bin/env python3
"""Write the hand-written scenarios of tests/scenarios for frameworks and launchers that need
GPUs or clusters this machine does not have: Composer, Ray Train, diffusers, DCP async under
Slurm, CUDA OOM in a save, Kubernetes OOMKilled, DCP's CheckpointException rank list.

    .venv/bin/python scripts/scenarios/write_more_frameworks.py   # rewrites those scenario folders (and their mtimes.json)

Every line family is the wording of the framework's source (cited in tests/scenarios/PROVENANCE.md,
"Scenarios added by write_more_frameworks.py"); times, pids, hosts, paths and losses are invented.
Deterministic: no randomness, so re-running rewrites the same bytes.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path

from ckptwatch.groundtruth import record_mtimes

OUT = Path(__file__).resolve().parents[2] / "tests" / "scenarios"
T0 = dt.datetime(2026, 11, 30, 9, 0, 0, tzinfo=dt.timezone.utc)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def std(t: dt.datetime) -> str:  # logging's default asctime
    return t.strftime("%Y-%m-%d %H:%M:%S,") + f"{t.microsecond // 1000:03d}"


def glog(t: dt.datetime, level: str = "I") -> str:  # torchrun's glog prefix
    return f"{level}{t.strftime('%m%d %H:%M:%S')}.{t.microsecond:06d}"


def write(name: str, spec: dict, files: dict[str, list[str]]) -> None:
    d = OUT / name
    if d.exists():
        shutil.rmtree(d)
    for rel, lines in files.items():
        p = d / "logs" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("\n".join(lines) + "\n")
    (d / "scenario.json").write_text(json.dumps(spec, indent=1) + "\n")
    record_mtimes(d)


ALL_KINDS = ["interrupted_save", "storage_failure_during_save", "partial_checkpoint", "stalled_save",
             "load_failure", "poisoned_resume", "world_size_mismatch", "post_resume_regression", "corrupt_checkpoint"]


def must_not(*wanted: str) -> list[str]:
    return [k for k in ALL_KINDS if k not in wanted]


def torchrun_tail(t: dt.datetime, agent: int, dead: tuple[int, int, int], others: list[tuple[int, int]],
                  script: str) -> list[str]:
    """torchrun's agent lines after a worker failed: SIGTERM to the others, the failure line,
    the ChildFailedError block (torch/distributed/elastic/multiprocessing/api.py, errors/__init__.py)."""
    local, pid, code = dead
    out = [f"{glog(t, 'W')} {agent} torch/distributed/elastic/multiprocessing/api.py:897] Sending process {p} "
           f"closing signal SIGTERM" for _, p in others]
    out.append(f"{glog(t + dt.timedelta(seconds=0.3), 'E')} {agent} torch/distributed/elastic/multiprocessing/api.py:869] "
               f"failed (exitcode: {code}) local_rank: {local} (pid: {pid}) of binary: /usr/bin/python3")
    out += ["Traceback (most recent call last):",
            '  File "/usr/local/bin/torchrun", line 8, in <module>',
            "    sys.exit(main())",
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
            "============================================================",
            f"{script} FAILED",
            "------------------------------------------------------------",
            "Failures:",
            "  <NO_OTHER_FAILURES>",
            "------------------------------------------------------------",
            "Root Cause (first observed failure):",
            "[0]:",
            f"  time      : {(t + dt.timedelta(seconds=0.3)).strftime('%Y-%m-%d_%H:%M:%S')}",
            "  host      : localhost",
            f"  rank      : {local} (local_rank: {local})",
            f"  exitcode  : {code} (pid: {pid})",
            "  error_file: <N/A>",
            "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
            "============================================================"]
    return out


# --- Composer -------------------------------------------------------------------------------

def composer_line(t: dt.datetime, rank: int, pid: int, level: str, logger: str, msg: str) -> str:
    # mosaicml/llm-foundry scripts/train.py logging format, used with Composer
    return f"[default{rank}]:{std(t)}: rank{rank}[{pid}][MainThread]: {level}: {logger}: {msg}"


def composer_progress(batch: int, total: int, loss: float) -> list[str]:
    # composer/loggers/console_logger.py: progress string, then one tab-indented line per metric (stderr, rank 0)
    return [f"[default0]:[epoch=1][batch={batch}/{total}]:",
            f"[default0]:\t Train time/batch: {batch - 1}",
            f"[default0]:\t Train loss/train/total: {loss:.4f}"]


def composer_scenarios() -> None:
    pids = {0: 4101, 1: 4102}
    run1: list[str] = [f"{glog(at(0))} 4100 torch/distributed/run.py:793] Using nproc_per_node=2."]
    for r in (0, 1):
        run1.append(composer_line(at(5 + r * 0.01), r, pids[r], "INFO", "composer.trainer.trainer", "Run name: mpt-125m-ft"))
    t = 10.0
    loss = 3.2
    for batch in range(100, 1001, 100):
        t += 60
        loss *= 0.95
        run1 += composer_progress(batch, 2000, loss)
    # the batch-1000 checkpoint (Event.BATCH_CHECKPOINT after BATCH_END): monolithic, rank 0 writes; the disk fills
    t += 4.2
    tb = [
        "Traceback (most recent call last):",
        '  File "/workspace/llm-foundry/scripts/train.py", line 301, in <module>',
        "    main(cfg)",
        '  File "/usr/lib/python3/dist-packages/composer/trainer/trainer.py", line 2325, in fit',
        "    self._train_loop()",
        '  File "/usr/lib/python3/dist-packages/composer/core/engine.py", line 311, in run_event',
        "    self._run_nonlogger_callbacks(event)",
        '  File "/usr/lib/python3/dist-packages/composer/callbacks/checkpoint_saver.py", line 385, in batch_checkpoint',
        "    self._save_checkpoint(",
        '  File "/usr/lib/python3/dist-packages/composer/callbacks/checkpoint_saver.py", line 411, in _save_checkpoint',
        "    saved_path = checkpoint.save_checkpoint(",
        '  File "/usr/lib/python3/dist-packages/composer/utils/checkpoint.py", line 1128, in save_checkpoint',
        "    return _save_checkpoint(state, save_filename, weights_only, ignore_keys)",
        '  File "/usr/lib/python3/dist-packages/composer/utils/checkpoint.py", line 1097, in _save_checkpoint',
        "    _write_checkpoint_file(state_dict, save_filename)",
        '  File "/usr/lib/python3/dist-packages/composer/utils/checkpoint.py", line 1030, in _write_checkpoint_file',
        "    torch.save(state_dict, f)",
        '  File "/usr/lib/python3/dist-packages/torch/serialization.py", line 944, in save',
        "    _save(",
        "OSError: [Errno 28] No space left on device",
    ]
    run1 += [f"[default0]:[rank0]: {x}" for x in tb]
    run1 += torchrun_tail(at(t + 1.5), 4100, (0, pids[0], 1), [(1, pids[1])], "/workspace/llm-foundry/scripts/train.py")
    # run 2: autoresume from latest-rank0.pt, which points at the torn ep0-ba1000-rank0.pt
    p2 = {0: 5151, 1: 5152}
    t2 = 3600.0
    run2 = [f"{glog(at(t2))} 5150 torch/distributed/run.py:793] Using nproc_per_node=2."]
    for r in (0, 1):
        run2.append(composer_line(at(t2 + 5), r, p2[r], "INFO", "composer.trainer.trainer",
                                  "Searching for a previous checkpoint to autoresume"))
        run2.append(composer_line(at(t2 + 6), r, p2[r], "INFO", "composer.trainer.trainer",
                                  "Autoresuming training from checkpoint"))
        run2.append(composer_line(at(t2 + 6.01), r, p2[r], "INFO", "composer.trainer.trainer",
                                  "Loading checkpoint from /runs/mpt-125m-ft/checkpoints/latest-rank0.pt"))
    for r in (0, 1):
        run2 += [f"[default{r}]:[rank{r}]: {x}" for x in [
            "Traceback (most recent call last):",
            '  File "/usr/lib/python3/dist-packages/composer/utils/checkpoint.py", line 571, in load_checkpoint',
            "    rng_state_dicts = _restore_checkpoint(",
            '  File "/usr/lib/python3/dist-packages/composer/utils/checkpoint.py", line 880, in _restore_checkpoint',
            "    state_dict = safe_torch_load(composer_states_filepath)",
            '  File "/usr/lib/python3/dist-packages/torch/serialization.py", line 1004, in load',
            "    with _open_zipfile_reader(opened_file) as opened_zipfile:",
            "RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central directory"]]
    run2 += torchrun_tail(at(t2 + 9), 5150, (0, p2[0], 1), [(1, p2[1])], "/workspace/llm-foundry/scripts/train.py")
    write("composer-enospc-during-save", {
        "description": "MosaicML Composer (llm-foundry train.py logging format, ConsoleLogger progress), torchrun --tee 3, "
                       "2 ranks. Composer prints no save line at INFO. The batch-1000 checkpoint (monolithic, rank 0) fails "
                       "in torch.save with ENOSPC; torchrun tears the group down. Run 2 autoresumes from latest-rank0.pt "
                       "(the torn file) and fails in torch.load.",
        "framework": "Composer 0.2x (llm-foundry), torchrun",
        "incidents": [{"kind": "storage_failure_during_save", "step": 1000, "root_cause_class": "storage_error",
                       "root_rank": 0},
                      {"kind": "load_failure", "step": None, "root_cause_class": None, "root_rank": None}],
        "must_not": must_not("storage_failure_during_save", "load_failure"),
    }, {"run1/console.log": run1, "run2/console.log": run2})

    # clean: run 1 trains, saves silently, is stopped by its time limit between saves; run 2 autoresumes
    c1 = [f"{glog(at(0))} 6100 torch/distributed/run.py:793] Using nproc_per_node=2."]
    t = 0.0
    for batch in range(50, 651, 50):
        t += 30
        c1 += composer_progress(batch, 2000, 3.0 - batch / 1000)
    c1.append("slurmstepd: error: *** JOB 77120 ON gpu-m CANCELLED AT 2026-11-30T09:07:00 DUE TO TIME LIMIT ***")
    c1.append(f"{glog(at(t + 1), 'W')} 6100 torch/distributed/elastic/agent/server/api.py:704] Received Signals.SIGTERM death signal, shutting down workers")
    c2 = []
    for r in (0, 1):
        c2.append(composer_line(at(900), r, 6201 + r, "INFO", "composer.trainer.trainer", "Autoresuming training from checkpoint"))
        c2.append(composer_line(at(901), r, 6201 + r, "INFO", "composer.trainer.trainer",
                                "Loading checkpoint from /runs/mpt-125m-b/checkpoints/latest-rank0.pt"))
        c2.append(composer_line(at(905), r, 6201 + r, "INFO", "composer.utils.checkpoint",
                                "Trainer checkpoint loaded from /tmp/tmpq1w2e3/ep0-ba500-rank0.pt"))
    t = 905.0
    for batch in range(550, 801, 50):
        t += 30
        c2 += composer_progress(batch, 2000, 3.0 - batch / 1000)
    write("composer-clean-autoresume", {
        "description": "Composer, 2 ranks; run 1 is cancelled by its Slurm time limit with no save known in flight (Composer's "
                       "save lines are DEBUG); run 2 autoresumes ('Trainer checkpoint loaded from .../ep0-ba500-rank0.pt') "
                       "and trains on. Failure-like text: the time-limit cancellation and torchrun's death signal.",
        "framework": "Composer 0.2x (llm-foundry), torchrun, Slurm",
        "incidents": [], "must_not": ALL_KINDS,
    }, {"run1/slurm-77120.out": c1, "run2/slurm-77188.out": c2})


# --- Ray Train ------------------------------------------------------------------------------

def ray_scenario(clean: bool = False) -> None:
    ips = {0: "10.0.0.7", 1: "10.0.0.8"}
    pids = {0: 94730, 1: 94811}
    out = ["2026-11-30 09:00:00,306\tINFO worker.py:2018 -- Connecting to existing Ray cluster at address: 10.0.0.7:6379...",
           "(TrainController pid=94721) Started training worker group of size 2: "]
    for r in (0, 1):
        out.append(f"(TrainController pid=94721) - (ip={ips[r]}, pid={pids[r]}) world_rank={r}, local_rank=0, node_rank={r}")

    def w(r: int, t: float, msg: str) -> str:
        ip = f", ip={ips[r]}" if r else ""
        return f"(RayTrainWorker pid={pids[r]}{ip}) {std(at(t))} INFO train: [rank{r}] {msg}"

    t = 10.0
    for step in range(1, 301):
        t += 1.2
        if step % 50 == 0:
            for r in (0, 1):
                out.append(w(r, t + 0.01 * r, f"step {step} loss={2.0 - step / 400:.4f}"))
        if step % 100 == 0:
            for r in (0, 1):
                out.append(w(r, t + 0.02 + 0.01 * r, f"Saving checkpoint at step {step} to /tmp/ray_ckpt/step_{step}"))
            if step < 300 or clean:
                t += 6
                for r in (0, 1):
                    out.append(f"(RayTrainWorker pid={pids[r]}{', ip=' + ips[r] if r else ''}) Checkpoint successfully "
                               f"created at: Checkpoint(filesystem=local, path=/mnt/cluster_storage/llama-ft/checkpoint_{step // 100:06d})")
    if clean:
        out += [f"(TrainController pid=94721) {std(at(t + 3))}\tINFO controller.py:410 -- Training finished successfully.",
                "(raylet, ip=10.0.0.8) Refer to the documentation on how to address the out of memory issue: "
                "https://docs.ray.io/en/latest/ray-core/scheduling/ray-oom-prevention.html."]
        write("ray-clean-checkpoints", {
            "description": "Ray Train v2, 2 workers on 2 nodes: saves at 100, 200 and 300, each persisted by Ray ('Checkpoint "
                           "successfully created at: ...checkpoint_00000N'), training finishes; raylet's OOM-prevention "
                           "advice is printed at the end (failure-like text, no kill).",
            "framework": "Ray Train 2.4x (v2), torch",
            "incidents": [], "must_not": ALL_KINDS,
        }, {"driver.log": out})
        return
    # the step-300 save: rank 1's host runs out of memory while the state dict is copied to CPU
    t += 8
    out.append(f"(raylet, ip={ips[1]}) [{std(at(t)).replace(',', '.')} E 31200 31200] (raylet) node_manager.cc:3277: 1 Workers "
               f"(tasks / actors) killed due to memory pressure (OOM), 0 Workers crashed due to other reasons at node "
               f"(ID: 8289f87b0c, IP: {ips[1]}) over the last time period.")
    out += [
        f"{std(at(t + 2))}\tERROR trainer.py:612 -- Training failed due to worker errors:",
        "[Rank 1]:",
        "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.",
        f"Memory on the node (IP: {ips[1]}, ID: 8289f87b0c) where the task (actor ID: f9cc340f5aef, name=RayTrainWorker.__init__, "
        f"pid={pids[1]}, memory used=58.21GB) was running was 59.49GB / 62.58GB (0.950744), which exceeds the memory usage "
        "threshold of 0.95. Ray killed this worker (ID: d98ac96c) because it was the most recently scheduled task.",
    ]
    write("ray-oom-kill-during-save", {
        "description": "Ray Train v2 TorchTrainer, 2 workers on 2 nodes (driver console: worker lines prefixed "
                       "'(RayTrainWorker pid=N, ip=A)', the controller's worker-group line maps pid to world rank). Steps 100 "
                       "and 200 saved and persisted ('Checkpoint successfully created at: Checkpoint(...checkpoint_000001)': a "
                       "report index, not a step). During the step-300 save Ray's memory monitor kills rank 1 (raylet OOM summary, "
                       "OutOfMemoryError naming its pid).",
        "framework": "Ray Train 2.4x (v2), torch",
        "incidents": [{"kind": "interrupted_save", "step": 300, "root_cause_class": "oom_kill", "root_rank": 1}],
        "must_not": must_not("interrupted_save"),
    }, {"driver.log": out})


# --- diffusers ------------------------------------------------------------------------------

def diffusers_scenario() -> None:
    def line(t: float, logger: str, msg: str) -> str:  # diffusers examples' basicConfig
        return f"{at(t).strftime('%m/%d/%Y %H:%M:%S')} - INFO - {logger} - {msg}"

    def bar(step: int, loss: float) -> str:
        pct = step * 100 // 2000
        return f"Steps:  {pct}%|#####     | {step}/2000 [10:01<09:15,  1.73it/s, lr=1e-05, step_loss={loss:.4f}]"

    run1 = [line(0, "__main__", "***** Running training *****"), line(0, "__main__", "  Num examples = 833"),
            line(0, "__main__", "  Total optimization steps = 2000")]
    t = 1.0
    for step in range(20, 1201, 20):
        t += 11.5
        run1.append(bar(step, 0.12 - step / 40000))
        if step % 500 == 0:
            d = f"sd-pokemon/checkpoint-{step}"
            run1 += [line(t, "accelerate.accelerator", f"Saving current state to {d}"),
                     line(t + 2, "accelerate.checkpointing", f"Model weights saved in {d}/model.safetensors"),
                     line(t + 3, "accelerate.checkpointing", f"Optimizer state saved in {d}/optimizer.bin"),
                     line(t + 3, "accelerate.checkpointing", f"Scheduler state saved in {d}/scheduler.bin"),
                     line(t + 3, "accelerate.checkpointing", f"Random states saved in {d}/random_states_0.pkl"),
                     line(t + 3, "__main__", f"Saved state to {d}")]
            if step == 1000:
                run1 += [line(t + 3, "__main__", "1 checkpoints already exist, removing 1 checkpoints"),
                         line(t + 3, "__main__", "removing checkpoints: checkpoint-500")]
    run1.append("Killed")  # failure-like text: the user's notebook cell after the run, an unrelated process
    run1.append("W1130 09:15:00.000000 1 nvidia-smi: GPU 0: No space left on device for the persistence log (ignored)")
    run2 = ["Resuming from checkpoint checkpoint-1000",
            line(3000, "accelerate.accelerator", "Loading states from sd-pokemon/checkpoint-1000"),
            line(3004, "accelerate.checkpointing", "All model weights loaded successfully"),
            line(3004, "accelerate.checkpointing", "All optimizer states loaded successfully"),
            line(3004, "accelerate.checkpointing", "All random states loaded successfully")]
    for step in range(1020, 1101, 20):
        run2.append(bar(step, 0.095 - step / 60000))
    write("diffusers-clean-resume", {
        "description": "diffusers examples/text_to_image/train_text_to_image.py under accelerate (one process): accelerate's "
                       "save_state lines and 'Saved state to' at 500 and 1000, checkpoint rotation ('removing checkpoints'), "
                       "then a bare 'Killed' and an ENOSPC-looking warning after the run (not the job). Run 2 prints the "
                       "folder's base name only ('Resuming from checkpoint checkpoint-1000') and loads it.",
        "framework": "diffusers 0.3x examples + accelerate 1.x",
        "incidents": [], "must_not": ALL_KINDS,
    }, {"run1/train.log": run1[:-2], "run1/notebook.txt": run1[-2:], "run2/train.log": run2})


# --- DCP async under Slurm, hitting the time limit --------------------------------------------

def dcp_async_timelimit(clean: bool = False) -> None:
    hosts = {0: "gpu-k", 1: "gpu-k", 2: "gpu-l", 3: "gpu-l"}

    def r(rank: int, t: float, msg: str) -> str:  # srun --label, python logging with a key=value message
        return f"{rank}: {std(at(t))} INFO [rank{rank}] trainer: {msg}"

    out = []
    t = 0.0
    for rank in range(4):
        out.append(r(rank, 1, f"rank={rank} local_rank={rank % 2} world_size=4 host={hosts[rank]}"))
    for step in range(1, 831):
        t += 2.0
        if step % 100 == 0:
            for rank in range(4):
                out.append(r(rank, t + 0.003 * rank, f"step={step} loss={1.5 - step / 2000:.4f}"))
        if step in (400, 800):
            for rank in range(4):
                out.append(r(rank, t + 0.01 + 0.003 * rank, f"dcp.async_save begin step={step} path=/lustre/ckpt/llm/step_{step}"))
        if step == 430:
            for rank in range(4):
                out.append(r(rank, t + 0.005 * rank, "dcp.async_save committed step=400"))
        if step == 828:
            for rank in ((0, 1, 2, 3) if clean else (0, 1)):
                out.append(r(rank, t + 0.005 * rank, "dcp.async_save committed step=800"))
    out += ["slurmstepd: error: *** JOB 51234 ON gpu-k CANCELLED AT 2026-11-30T09:27:42 DUE TO TIME LIMIT ***",
            "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.",
            "srun: error: gpu-l: tasks 2-3: Terminated",
            "srun: error: gpu-k: tasks 0-1: Terminated"]
    if clean:
        write("dcp-async-clean-timelimit", {
            "description": "The same DCP async_save loop and layout; the step-800 async save commits on every rank while "
                           "training goes on, then the job reaches its Slurm time limit with no save in flight.",
            "framework": "torch.distributed.checkpoint async_save, Slurm",
            "incidents": [], "must_not": ALL_KINDS,
        }, {"slurm-51300.out": out})
        return
    resume = []
    for rank in range(4):
        resume.append(r(rank, 4000, f"rank={rank} local_rank={rank % 2} world_size=4 host={hosts[rank]}"))
        resume.append(r(rank, 4002, "Resuming from checkpoint /lustre/ckpt/llm/step_800"))
    for step in range(810, 861, 10):
        for rank in range(4):
            resume.append(r(rank, 4002 + (step - 800) * 2, f"step={step} loss={1.1 - step / 4000:.4f}"))
    write("dcp-async-timelimit-during-save", {
        "description": "A plain loop with torch.distributed.checkpoint.async_save and key=value log lines, srun --label, 2 "
                       "nodes x 2 ranks (Slurm job 51234). The step-400 async save commits on every rank; the step-800 one "
                       "commits on ranks 0-1 only when the job reaches its time limit (slurmstepd: CANCELLED ... DUE TO TIME "
                       "LIMIT). Training went on meanwhile (async): progress does not end an async save. Job 51240 resumes "
                       "from step_800 and trains on (nothing fails, the checkpoint is still missing ranks 2-3's shards).",
        "framework": "torch.distributed.checkpoint async_save, Slurm",
        "incidents": [{"kind": "interrupted_save", "step": 800, "root_cause_class": "signal", "root_rank": None},
                      {"kind": "poisoned_resume", "step": 800, "root_cause_class": None, "root_rank": None}],
        "must_not": must_not("interrupted_save", "poisoned_resume"),
    }, {"slurm-51234.out": out, "slurm-51240.out": resume})


# --- CUDA OOM in a save -----------------------------------------------------------------------

def cuda_oom_scenario() -> None:
    out = []
    for rank in range(4):
        out.append(f"[default{rank}]:{std(at(1))} INFO [rank{rank}] train: rank={rank} local_rank={rank} world_size=4 "
                   f"pid={7100 + rank} host=gpu-q")
    t = 2.0
    for step in range(1, 1201):
        t += 0.9
        if step % 200 == 0:
            for rank in range(4):
                out.append(f"[default{rank}]:{std(at(t + 0.002 * rank))} INFO [rank{rank}] train: step {step} | loss {2 - step / 1000:.4f}")
                out.append(f"[default{rank}]:{std(at(t + 0.01 + 0.002 * rank))} INFO [rank{rank}] train: "
                           f"Saving checkpoint at step {step} to /ckpt/run-17/step_{step}")
            if step < 1200:
                for rank in range(4):
                    out.append(f"[default{rank}]:{std(at(t + 4 + 0.002 * rank))} INFO [rank{rank}] train: "
                               f"Checkpoint saved to /ckpt/run-17/step_{step} (4.0s)")
                t += 4.5
    tb = ["Traceback (most recent call last):",
          '  File "/app/train.py", line 212, in <module>',
          "    main()",
          '  File "/app/train.py", line 190, in main',
          "    dcp.save(state, checkpoint_id=path)",
          '  File "/usr/lib/python3/dist-packages/torch/distributed/checkpoint/state_dict_saver.py", line 150, in save',
          "    return _save_state_dict(",
          '  File "/usr/lib/python3/dist-packages/torch/distributed/checkpoint/state_dict_saver.py", line 323, in _save_state_dict',
          "    central_plan: SavePlan = distW.reduce_scatter(\"plan\", local_step, global_step)",
          "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity of 79.15 GiB "
          "of which 1.06 GiB is free. Process 7103 has 78.08 GiB memory in use. Of the allocated memory 76.20 GiB is allocated "
          "by PyTorch, and 1.31 GiB is reserved by PyTorch but unallocated."]
    out += [f"[default3]:[rank3]: {x}" for x in tb]
    for rank in (0, 1, 2):
        out.append(f"[default{rank}]:[rank{rank}]:[E1130 {at(t + 600).strftime('%H:%M:%S')}.1{rank}0000000 ProcessGroupNCCL.cpp:632] "
                   f"[Rank {rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9120, OpType=ALLGATHER, "
                   f"NumelIn=1, NumelOut=4, Timeout(ms)=600000) ran for 600043 milliseconds before timing out.")
    out += torchrun_tail(at(t + 601), 7099, (3, 7103, 1), [(0, 7100), (1, 7101), (2, 7102)], "/app/train.py")
    write("plain-cuda-oom-during-save", {
        "description": "A plain DCP loop under torchrun --tee 3, 4 ranks on one host, checkpoints under /ckpt/run-17 (a number "
                       "in the root that is not a step). In the step-1200 save rank 3 runs out of GPU memory "
                       "(torch.OutOfMemoryError, its traceback through dcp.save); the others wait in the ALLGATHER and hit the "
                       "10-minute watchdog. The cause is GPU memory, not a timeout.",
        "framework": "torch 2.6 DCP, torchrun",
        "incidents": [{"kind": "interrupted_save", "step": 1200, "root_cause_class": "cuda_oom", "root_rank": 3}],
        "must_not": must_not("interrupted_save"),
    }, {"console.log": out})


# --- Kubernetes OOMKilled ----------------------------------------------------------------------

def k8s_scenario() -> None:
    log = []
    t = 0.0
    for step in range(1, 3001):
        t += 1.1
        if step % 250 == 0:
            log.append(f"{std(at(t))} INFO train: step {step}/10000 loss={1.8 - step / 10000:.4f}")
        if step % 1000 == 0:
            log.append(f"{std(at(t + 0.01))} INFO train: Saving checkpoint at step {step} to /data/ckpt/ckpt_step_{step}.pt")
            if step < 3000:
                log.append(f"{std(at(t + 12))} INFO train: Checkpoint saved to /data/ckpt/ckpt_step_{step}.pt (12.0s)")
                t += 12
    describe = ["Name:             finetune-7b-0",
                "Namespace:        ml-team",
                "Status:           Running",
                "Containers:",
                "  trainer:",
                "    State:          Running",
                "      Started:      Mon, 30 Nov 2026 09:58:04 +0000",
                "    Last State:     Terminated",
                "      Reason:       OOMKilled",
                "      Exit Code:    137",
                "      Started:      Mon, 30 Nov 2026 09:00:00 +0000",
                "      Finished:     Mon, 30 Nov 2026 09:57:31 +0000",
                "    Ready:          True",
                "    Restart Count:  1",
                "    Limits:",
                "      memory:  64Gi"]
    write("k8s-oomkilled-during-save", {
        "description": "A single-process plain loop in a Kubernetes pod: `kubectl logs --previous` of the killed container "
                       "(the step-3000 save starts, nothing after) and `kubectl describe pod` (Last State Terminated, Reason "
                       "OOMKilled, Exit Code 137). The container's memory limit was hit while the checkpoint was built.",
        "framework": "Kubernetes, plain loop",
        "incidents": [{"kind": "interrupted_save", "step": 3000, "root_cause_class": "oom_kill", "root_rank": 0}],
        "must_not": must_not("interrupted_save"),
    }, {"previous.log": log, "describe-pod.txt": describe})


# --- DCP CheckpointException naming the failed rank, with clock skew ---------------------------

def dcp_saves(files: dict[str, list[str]], hosts: dict[int, str], ln, *, start: float, last: int, step_s: float,
              save_s: float, root: str) -> float:
    """Every 100 steps up to ``last``, on every rank: a key=value loss line and
    ``dcp.save begin``; every save but the last one ends (``dcp.save done``) ``save_s`` later.
    Returns the time (seconds from T0) of the last save's start."""
    t = start
    for step in range(100, last + 1, 100):
        t += 100 * step_s
        for rank in sorted(hosts):
            f = files[f"{hosts[rank]}/console.log"]
            f.append(ln(rank, t + 0.01 * rank, f"step {step} | loss {2.0 - step / 1000:.4f}"))
            f.append(ln(rank, t + 0.02 + 0.01 * rank, f"dcp.save begin step={step} path={root}/step_{step}"))
        if step < last:
            t += save_s
            for rank in sorted(hosts):
                files[f"{hosts[rank]}/console.log"].append(
                    ln(rank, t + 0.01 * rank, f"dcp.save done step={step} path={root}/step_{step}"))
    return t


def dcp_exception_scenario() -> None:
    hosts = {0: "node-a", 1: "node-a", 2: "node-b", 3: "node-b"}
    skew = {"node-a": 0.0, "node-b": -0.4}  # node-b's clock is 400 ms behind

    def ln(rank: int, t: float, msg: str) -> str:
        return f"[default{rank % 2}]:{std(at(t + skew[hosts[rank]]))} INFO [rank{rank}] train: {msg}"

    files: dict[str, list[str]] = {"node-a/console.log": [], "node-b/console.log": []}
    for rank in range(4):
        files[f"{hosts[rank]}/console.log"].append(ln(rank, 1, f"rank={rank} local_rank={rank % 2} world_size=4 host={hosts[rank]}"))
    t = dcp_saves(files, hosts, ln, start=2.0, last=600, step_s=1.0, save_s=3, root="/scratch/ckpt")
    # rank 3's local disk fills; DCP gathers the failure and every rank raises the same CheckpointException
    t += 5
    for rank in range(4):
        f = files[f"{hosts[rank]}/console.log"]
        f.append(ln(rank, t + (0.05 if rank == 3 else 0.0), "dcp.save failed, see the traceback"))
        tb = ["Traceback (most recent call last):",
              '  File "/app/train.py", line 150, in main',
              "    dcp.save(state, checkpoint_id=path)",
              '  File "/usr/lib/python3/dist-packages/torch/distributed/checkpoint/state_dict_saver.py", line 150, in save',
              "    return _save_state_dict(",
              "torch.distributed.checkpoint.api.CheckpointException: CheckpointException ranks:dict_keys([3])",
              "Traceback (most recent call last): (RANK 3)",
              '  File "/usr/lib/python3/dist-packages/torch/distributed/checkpoint/filesystem.py", line 190, in _write_files_from_queue',
              "    _write_item(stream, data, write_item, storage_key)",
              "OSError: [Errno 28] No space left on device"]
        f += [f"[default{rank % 2}]:[rank{rank}]: {x}" for x in tb]
    for host, agent, locs in (("node-a", 8100, (0, 1)), ("node-b", 8200, (0, 1))):
        base = 0 if host == "node-a" else 2
        files[f"{host}/console.log"].append(
            f"{glog(at(t + 1 + skew[host]), 'E')} {agent} torch/distributed/elastic/multiprocessing/api.py:869] failed "
            f"(exitcode: 1) local_rank: 0 (pid: {agent + 1}) of binary: /usr/bin/python3")
        files[f"{host}/console.log"].insert(0, f"{glog(at(0.5 + skew[host]))} {agent} torch/distributed/elastic/agent/server/api.py:553]   local_ranks=[0, 1]")
        files[f"{host}/console.log"].insert(1, f"{glog(at(0.5 + skew[host]))} {agent} torch/distributed/elastic/agent/server/api.py:553]   global_ranks=[{base}, {base + 1}]")
    write("dcp-checkpoint-exception-rank-list", {
        "description": "A plain DCP loop (key=value save lines) under torchrun on 2 nodes x 2 ranks, one console per node; "
                       "node-b's clock is 400 ms behind node-a's. In the step-600 save rank 3's local scratch disk fills; DCP "
                       "gathers the failure and EVERY rank raises the same 'CheckpointException ranks:dict_keys([3])' with "
                       "rank 3's ENOSPC section; rank 3 prints it last by the clocks. The rank list, not the clock, names "
                       "the culprit.",
        "framework": "torch.distributed.checkpoint, torchrun",
        "incidents": [{"kind": "storage_failure_during_save", "step": 600, "root_cause_class": "storage_error", "root_rank": 3}],
        "must_not": must_not("storage_failure_during_save"),
    }, files)


# --- NCCL: a node lost mid-save, known from the peers' transport errors ------------------------

def nccl_node_lost() -> None:
    hosts = {0: "gpu-a", 1: "gpu-a", 2: "gpu-b", 3: "gpu-b"}
    pids = {0: 61001, 1: 61002, 2: 72001, 3: 72002}
    files: dict[str, list[str]] = {"gpu-a/console.log": [], "gpu-b/console.log": []}

    def ln(rank: int, t: float, msg: str) -> str:
        return f"[default{rank % 2}]:{std(at(t))} INFO [rank{rank}] train: {msg}"

    for rank in range(4):
        f = files[f"{hosts[rank]}/console.log"]
        # nccl src/init.cc under src/debug.cc's 'host:pid:tid [cudaDev] NCCL INFO ' prefix
        f.append(f"[default{rank % 2}]:{hosts[rank]}:{pids[rank]}:{pids[rank] + 90} [{rank % 2}] NCCL INFO ncclCommInitRank "
                 f"comm 0x55{rank}1e4a0 rank {rank} nranks 4 cudaDev {rank % 2} nvmlDev {rank % 2} busId {'1b' if rank % 2 else '0a'}000 "
                 f"commId 0x9a1e0c2f - Init COMPLETE")
    t = dcp_saves(files, hosts, ln, start=5.0, last=400, step_s=1.5, save_s=6, root="/ckpt/llm")
    # 3 s into the step-400 save gpu-b loses power: its console stops; gpu-a's ranks lose their peer
    t += 3
    for rank in (0, 1):
        f = files["gpu-a/console.log"]
        f.append(f"[default{rank}]:gpu-a:{pids[rank]}:{pids[rank] + 91} [{rank}] misc/socket.cc:50 NCCL WARN socketProgress: "
                 f"Connection closed by remote peer gpu-b<{51234 + rank}>")
        f += [f"[default{rank}]:[rank{rank}]: {x}" for x in [
            "Traceback (most recent call last):",
            '  File "/app/train.py", line 150, in main',
            "    dcp.save(state, checkpoint_id=path)",
            '  File "/usr/lib/python3/dist-packages/torch/distributed/checkpoint/state_dict_saver.py", line 150, in save',
            "    return _save_state_dict(",
            "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:2027, "
            "remote process exited or there was a network error, NCCL version 2.21.5",
            "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely."]]
    files["gpu-a/console.log"].append(
        f"{glog(at(t + 2), 'E')} 61000 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) "
        f"local_rank: 0 (pid: {pids[0]}) of binary: /usr/bin/python3")
    write("dcp-nccl-node-lost-during-save", {
        "description": "A plain DCP loop under torchrun on 2 nodes x 2 (one console per node, NCCL_DEBUG=INFO init lines naming "
                       "host, pid and rank). 3 s into the step-400 save gpu-b loses power: its console stops mid-save; gpu-a's "
                       "ranks log NCCL's 'socketProgress: Connection closed by remote peer gpu-b<port>' and fail in dcp.save "
                       "with ncclRemoteError; torchrun on gpu-a reports exit code 1. No rank on gpu-b says anything.",
        "framework": "torch.distributed.checkpoint, NCCL, torchrun",
        "incidents": [{"kind": "interrupted_save", "step": 400, "root_cause_class": "node_lost", "root_rank": None}],
        "must_not": must_not("interrupted_save"),
    }, files)


# --- a rank-less traceback, tied to the worker torchrun saw fail -------------------------------

def rankless_traceback() -> None:
    hosts = {0: "gpu-z", 1: "gpu-z"}
    files: dict[str, list[str]] = {"gpu-z/console.log": [
        f"{glog(at(0))} 9000 torch/distributed/elastic/agent/server/api.py:553]   local_ranks=[0, 1]",
        f"{glog(at(0))} 9000 torch/distributed/elastic/agent/server/api.py:553]   global_ranks=[0, 1]"]}

    def ln(rank: int, t: float, msg: str) -> str:  # a plain console: no --tee, no prefix; the logger names the rank
        return f"{std(at(t))} INFO [rank{rank}] train: {msg}"

    t = dcp_saves(files, hosts, ln, start=1.0, last=300, step_s=0.5, save_s=2, root="/nvme/ckpt")
    files["gpu-z/console.log"] += [
        "Traceback (most recent call last):",
        '  File "/app/train.py", line 150, in main',
        "    dcp.save(state, checkpoint_id=path)",
        '  File "/usr/lib/python3/dist-packages/torch/distributed/checkpoint/filesystem.py", line 190, in _write_files_from_queue',
        "    _write_item(stream, data, write_item, storage_key)",
        "OSError: [Errno 28] No space left on device",
        f"{glog(at(t + 1.0), 'W')} 9000 torch/distributed/elastic/multiprocessing/api.py:897] Sending process 9001 closing signal SIGTERM",
        f"{glog(at(t + 1.3), 'E')} 9000 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) "
        "local_rank: 1 (pid: 9002) of binary: /usr/bin/python3"]
    write("dcp-rankless-traceback-failed-worker", {
        "description": "torchrun without --tee: the workers' stderr reaches the console unprefixed, so the ENOSPC traceback "
                       "of the step-300 dcp.save names no rank; torchrun then reports local rank 1 failed with exit code 1 "
                       "(and SIGTERMs rank 0). The traceback is rank 1's.",
        "framework": "torch.distributed.checkpoint, torchrun",
        "incidents": [{"kind": "storage_failure_during_save", "step": 300, "root_cause_class": "storage_error", "root_rank": 1}],
        "must_not": must_not("storage_failure_during_save"),
    }, files)


if __name__ == "__main__":
    composer_scenarios()
    ray_scenario()
    ray_scenario(clean=True)
    diffusers_scenario()
    dcp_async_timelimit()
    dcp_async_timelimit(clean=True)
    cuda_oom_scenario()
    k8s_scenario()
    dcp_exception_scenario()
    nccl_node_lost()
    rankless_traceback()
    print("written under", OUT)
