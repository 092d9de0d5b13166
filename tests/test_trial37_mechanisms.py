"""The mechanisms behind issue 36's second-trial fixes, each on the smallest log that needs it:
verl's ``[rank-N]:`` label, the rank of a Ray OOM kill, a world size a shard's name states,
mmengine's epoch saves, a checkpoint path only the failure names, a kernel log's host for a
one-process job, and the hosts of a torchrun node's block of ranks."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

from ckptwatch.ingest.layout import compile_template
from ckptwatch.naming import world_size_from_path
from ckptwatch.pipeline import PipelineOptions, diagnose

RAY = "(WorkerDict pid={pid}, ip=10.0.3.7) [rank-{rank}]: Saving model to /ckpt/ppo/global_step_{step}/actor/model_world_size_2_rank_{rank}.pt\n"


def _verl(tmp_path: Path, steps: list[int]) -> Path:
    lines = ["2026-12-04 06:58:41,112\tINFO worker.py:1821 -- Started a local Ray instance.\n"]
    for step in steps:
        lines.append(f"(TaskRunner pid=900) step:{step} - actor/pg_loss:-0.012 - training/global_step:{step}\n")
        lines += [RAY.format(pid=500 + r, rank=r, step=step) for r in (0, 1)]
    lines += [
        "(raylet) [2026-12-04 07:42:31,443 E 23641 23641] (raylet) node_manager.cc:3193: 1 Workers (tasks / actors) "
        "killed due to memory pressure (OOM), 0 Workers crashed due to other reasons at node (ID: 8f3a, IP: 10.0.3.7) "
        "over the last time period.\n",
        "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n",
        "\tclass_name: create_colocated_worker_cls.<locals>.WorkerDict\n",
        "\tactor_id: 9a8b7c6d5e4f30211f0e0d0c01000000\n",
        "\tpid: 501\n",
        "\tip: 10.0.3.7\n",
        "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: "
        "Worker unexpectedly exits with a connection error code 2. End of file.\n",
    ]
    log = tmp_path / "main_ppo.log"
    log.write_text("".join(lines))
    return log


def test_verl_rank_labels_keep_each_save_of_a_worker_apart(tmp_path):
    """verl prints ``[rank-{rank}]: Saving model to …`` (fsdp_checkpoint_manager.py): a global
    rank, then a space. Read as torchrun's ``[<role><local_rank>]:`` the space was left at the
    line's start and each worker's next save line was glued to the last as its continuation,
    so the step-100 save was the one torn, not step 300."""
    found, _ = diagnose([str(_verl(tmp_path, [100, 200, 300]))], PipelineOptions(job="ppo"))
    assert [(i.kind, i.step, i.checkpoint_path) for i in found] == [
        ("interrupted_save", 300, "/ckpt/ppo/global_step_300/actor")]
    assert found[0].last_good_checkpoint["step"] == 200


def test_a_ray_oom_kill_takes_the_rank_of_the_one_worker_ray_reports_dead(tmp_path):
    """The raylet counts the workers its memory monitor killed and names none; the
    ActorDiedError names the dead worker's pid, whose lines carry its rank."""
    found, _ = diagnose([str(_verl(tmp_path, [100]))], PipelineOptions(job="ppo"))
    rc = found[0].root_cause
    assert (rc.cls, rc.rank, rc.pid, rc.host) == ("oom_kill", 1, 501, "10.0.3.7")
    assert found[0].collateral == []


def test_a_shard_name_states_the_world_size(tmp_path):
    assert world_size_from_path("/ckpt/global_step_300/actor/model_world_size_8_rank_6.pt") == 8
    assert world_size_from_path("/ckpt/global_step_300/actor/optim_world_size_8_rank_0.pt") == 8
    assert world_size_from_path("/ckpt/world_size_8_rank_9.pt") is None  # a rank past the size: not this name
    assert world_size_from_path("/ckpt/world_size_8/model.pt") is None
    found, _ = diagnose([str(_verl(tmp_path, [100]))], PipelineOptions(job="ppo"))
    assert found[0].checkpoint_state["world_size"] == 2


MMDET = """2026/12/03 01:00:00 - mmengine - INFO - Epoch(train) [22][500/500]  lr: 2.0000e-02  loss: 0.61
2026/12/03 01:00:01 - mmengine - INFO - Saving checkpoint at 22 epochs
2026/12/03 01:00:30 - mmengine - INFO - Epoch(train) [23][ 50/500]  lr: 2.0000e-02  loss: 0.60
2026/12/03 01:20:00 - mmengine - INFO - Epoch(train) [23][500/500]  lr: 2.0000e-02  loss: 0.59
2026/12/03 01:20:01 - mmengine - INFO - Saving checkpoint at 23 epochs
Traceback (most recent call last):
  File "/opt/conda/lib/python3.10/site-packages/mmengine/runner/checkpoint.py", line 791, in save_checkpoint
    file_backend.put(f.getvalue(), filename)
  File "/opt/conda/lib/python3.10/site-packages/mmengine/fileio/backends/local_backend.py", line 68, in put
    with open(filepath, 'wb') as f:
OSError: [Errno 5] Input/output error: '/mnt/nfs/work_dirs/mask-rcnn/epoch_23.pth'
"""
KERN = "Dec  3 01:20:10 det-node-4 kernel: [98211.000000] nfs: server fs01 not responding, still trying\n"


def test_mmengine_s_epoch_save_is_stepped_by_its_epoch_and_named_by_its_failure(tmp_path):
    """CheckpointHook logs 'Saving checkpoint at 23 epochs' and writes epoch_23.pth: the
    epoch is the step (as naming.py reads epoch_23.pth), so epoch 22 is the last good one,
    and the path the OSError names is the checkpoint's, since the save line names none."""
    job = tmp_path / "mask-rcnn"
    job.mkdir()
    (job / "20261203_010000.log").write_text(MMDET)
    found, _ = diagnose([str(job)])
    assert [(i.kind, i.step, i.checkpoint_path) for i in found] == [
        ("storage_failure_during_save", 23, "/mnt/nfs/work_dirs/mask-rcnn/epoch_23.pth")]
    assert found[0].last_good_checkpoint["step"] == 22


def test_a_kernel_log_among_a_one_process_job_s_files_names_its_host(tmp_path):
    """A fleet root read with ``{job}/*``: the kernel log in the job's directory is that job's
    host's (a one-process job has one host)."""
    job = tmp_path / "fleet" / "mask-rcnn"
    job.mkdir(parents=True)
    (job / "20261203_010000.log").write_text(MMDET)
    (job / "kern.log").write_text(KERN)
    found, _ = diagnose([str(tmp_path / "fleet")], PipelineOptions(template=compile_template("{job}/*")))
    assert [(i.job, i.root_cause.rank, i.root_cause.host) for i in found] == [("mask-rcnn", 0, "det-node-4")]


TORCHRUN = """+ torchrun --nnodes 1 --nproc_per_node 3 tools/train.py configs/det.py --launcher pytorch
[2026-12-06 23:40:00] Saving checkpoint at 3 epochs
[rank1]:[E1206 23:58:55.781221690 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=150213, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600012 milliseconds before timing out.
[rank2]:[E1206 23:58:55.790114002 ProcessGroupNCCL.cpp:616] [Rank 2] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=150213, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600019 milliseconds before timing out.
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
tools/train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-06_23:58:57
  host      : det-node-9
  rank      : 2 (local_rank: 2)
  exitcode  : -6 (pid: 7702)
  error_file: <N/A>
  traceback : Signal 6 (SIGABRT) received by PID 7702
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-06_23:58:57
  host      : det-node-9
  rank      : 1 (local_rank: 1)
  exitcode  : -6 (pid: 7701)
  error_file: <N/A>
  traceback : Signal 6 (SIGABRT) received by PID 7701
============================================================
"""


def test_the_host_torchrun_reports_for_a_rank_is_its_node_s_lower_ranks_host_too(tmp_path):
    """torchrun numbers a node's ranks as a block (rank = group rank x local world size +
    local rank): rank 2 at local rank 2 on det-node-9 puts ranks 0 and 1 there too, so the
    rank the others waited for (0, which reported nothing) has a host."""
    log = tmp_path / "console.log"
    log.write_text(TORCHRUN)
    found, _ = diagnose([str(log)], PipelineOptions(job="det"))
    rc = found[0].root_cause
    assert (found[0].step, rc.cls, rc.rank, rc.host, found[0].collateral) == (
        3, "collective_timeout", 0, "det-node-9", [1, 2])


DS_LAUNCHER = """[2026-12-07 09:00:02,101] [INFO] [launch.py:164:main] dist_world_size=2
[2026-12-07 09:00:02,101] [INFO] [launch.py:256:main] process 5501 spawned with command: ['/usr/bin/python', '-u', 'pretrain_bert.py', '--local_rank=0', '--deepspeed', 'ds_config.json']
[2026-12-07 09:00:02,101] [INFO] [launch.py:256:main] process 5502 spawned with command: ['/usr/bin/python', '-u', 'pretrain_bert.py', '--local_rank=1', '--deepspeed', 'ds_config.json']
[2026-12-07 09:15:32,101] [INFO] [logging.py:128:log_dist] [Rank 0] [Torch] Checkpoint global_step3000 is about to be saved!
[2026-12-07 09:15:32,131] [INFO] [logging.py:128:log_dist] [Rank 0] Saving model checkpoint: /ckpt/bert/global_step3000/mp_rank_00_model_states.pt
[rank1]: Traceback (most recent call last):
[rank1]:   File "/usr/local/lib/python3.10/dist-packages/deepspeed/runtime/engine.py", line 3422, in _save_checkpoint
[rank1]:     module=self.module_state_dict(exclude_frozen_parameters=exclude_frozen_parameters),
[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.50 GiB. GPU 1 has a total capacity of 79.15 GiB of which 1.21 GiB is free.
[2026-12-07 09:15:36,101] [INFO] [launch.py:319:sigkill_handler] Killing subprocess 5501
[2026-12-07 09:15:36,101] [INFO] [launch.py:319:sigkill_handler] Killing subprocess 5502
[2026-12-07 09:15:37,101] [ERROR] [launch.py:325:sigkill_handler] ['/usr/bin/python', '-u', 'pretrain_bert.py', '--local_rank=1', '--deepspeed', 'ds_config.json'] exits with return code = 1
"""


def test_the_ranks_deepspeed_s_launcher_kills_by_pid_are_collateral(tmp_path):
    """DeepSpeed's launcher kills every worker by pid when one fails ('Killing subprocess
    5501', launch.py sigkill_handler); its spawn lines map the pids to local ranks. The
    CUDA OOM's line has no time of its own, and the report says its time is approximate."""
    log = tmp_path / "deepspeed_launcher.log"
    log.write_text(DS_LAUNCHER)
    found, _ = diagnose([str(log)], PipelineOptions(job="bert"))
    inc = found[0]
    assert (inc.step, inc.root_cause.cls, inc.root_cause.rank, inc.collateral) == (3000, "cuda_oom", 1, [0])
    assert [(e.kind, e.role, e.own_time) for e in inc.evidence if e.kind == "cuda_oom"] == [
        ("cuda_oom", "root_cause", False)]


LIGHTNING = """Epoch 2, global step 1000: 'val_loss' reached 0.51 (best 0.51), saving model to '/ckpt/ft/epoch=1-step=1000.ckpt' as top 1
Epoch 2:  100%|██████████| 500/500 [14:10<00:00,  0.59it/s, v_num=7, train_loss=1.300]
Epoch 2, global step 1500: 'val_loss' reached 0.49871 (best 0.49871), saving model to '/ckpt/ft/epoch=2-step=1500.ckpt' as top 1
/var/spool/slurmd/job/run.sh: line 14: 40211 Killed                  python train_lit.py --config configs/llama_ft.yaml
"""
KILLED = dt.datetime(2026, 12, 5, 3, 22, 41, tzinfo=dt.timezone.utc).timestamp()
DMESG = ("[Sat Dec  5 03:22:40 2026] Out of memory: Killed process 40211 (python) total-vm:412339812kB, "
         "anon-rss:498211044kB, file-rss:91232kB, shmem-rss:8192kB, UID:1001 pgtables:982340kB oom_score_adj:0\n")


def test_the_plain_python_process_a_shell_started_is_rank_0(tmp_path):
    """Lightning's DDP launcher starts the other ranks from the process the shell started, which
    keeps global rank 0: the pid the shell's 'Killed' names, and the kernel OOM-killed, is rank 0
    (the job states world size 4; its lines name no rank)."""
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "train.log").write_text("Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/4\n" + LIGHTNING)
    os.utime(logs / "train.log", (KILLED, KILLED))  # its lines have no time: the file's mtime dates them
    (logs / "dmesg-T.txt").write_text(DMESG)
    found, _ = diagnose([str(logs)], PipelineOptions(job="ft"))
    rc = found[0].root_cause
    assert (found[0].step, rc.cls, rc.rank, rc.pid) == (1500, "oom_kill", 0, 40211)
    torchrun = LIGHTNING.replace("python train_lit.py", "torchrun --nproc_per_node 4 train_lit.py")
    (logs / "train.log").write_text("Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/4\n" + torchrun)
    os.utime(logs / "train.log", (KILLED, KILLED))
    found, _ = diagnose([str(logs)], PipelineOptions(job="ft"))
    assert found[0].root_cause.rank is None  # a launcher between: its pid is no rank's
