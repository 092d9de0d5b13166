"""Issue 36's third new-user trial (tests/fixtures/trial38): every fact of each case's
TRUTH.md that ckptwatch gets, and no incident on the clean jobs. Facts it does not get yet
are marked ``ANY`` with what the truth says, and listed in the issue's note."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from log_support import ANY, assert_facts, trial_case

from ckptwatch.ingest.layout import compile_template
from ckptwatch.pipeline import PipelineOptions, diagnose

TRIAL = Path(__file__).parent / "fixtures" / "trial38"
ALL = [0, 1, 2, 3, 4, 5, 6, 7]

# path under TRIAL -> (options, [(job, kind, step, cause class, rank, host, collateral, world size)])
CASES = {
    "c01-titan-console-two-runs/llama3-8b-c4/train.log": ({}, [
        ("6f1e2b9c-0d0a-4c4e-9a0f-3f3e7f2f2a11", "interrupted_save", 1500, "signal", 5, "gpu-node-17",
         [0, 1, 2, 3, 4, 6, 7], 8)]),
    # world size: the truth says 1 (one Keras process; the logs never state it)
    "c02-keras-two-dirs-one-db/effnet-b3-run1": ({}, [
        ("effnet-b3-run1", "interrupted_save", 12, "oom_kill", 0, "effnet-vm", [], ANY)]),
    "c03-hf-accelerate-clean-noisy/qwen25-1.5b-clm/train.log": ({}, []),
    # host: the truth says a3-train-0 (the launch line 'launching train.py on a3-train-0'); world size 1
    "c04-jax-orbax-glog-live/gemma2-2b-sft/train.log": ({"job": "gemma2-2b-sft"}, [
        ("gemma2-2b-sft", "storage_failure_during_save", 6000, "storage_error", 0, ANY, [], ANY)]),
    # host: the truth says gpu-a800-21 (in the launcher's environment dump)
    "c05-paddle-rank6-oom-launcher/llama2-13b-sft-paddle": ({}, [
        ("llama2-13b-sft-paddle", "interrupted_save", 600, "cuda_oom", 6, ANY, [0, 1, 2, 3, 4, 5, 7], 8)]),
    "c06-megatron-slurm-timelimit-pernode/gpt-13b-pretrain": ({}, [
        ("slurm-812345", "interrupted_save", 12000, "signal", None, "gpu101", list(range(32)), 32)]),
    "c07-openrlhf-paste-cut/pasted.log": ({"job": "unknown"}, [
        ("unknown", "storage_failure_during_save", 400, "storage_error", 2, "10.0.3.7", [], 4)]),
    # rtmdet: host (the pod), collateral 1-7 and world size 8 ('GPU number: 8') are what the truth says
    "c08-fleet-root/fleet": ({"template": "{job}/*"}, [
        ("gptj-ds-90211", "interrupted_save", 7000, "node_lost", None, "gpu-b13", ALL, 16),
        ("rtmdet-l-coco", "interrupted_save", 12, "oom_kill", 0, ANY, ANY, ANY)]),
    # the load failure's host: the truth says gpu-a11 (the requeued run's node); the resume's world size 4
    "c09-hf-slurm-preempt-requeue/qwen15b-sft/slurm-77123.out": ({}, [
        ("slurm-77123", "interrupted_save", 1500, "signal", None, "gpu-a07", [0, 1, 2, 3], 4),
        ("slurm-77123", "load_failure", 1500, "load_error", 0, ANY, [], None),
        ("slurm-77123", "poisoned_resume", 1500, None, None, None, [], ANY)]),
    "c10-ds-pdsh-nfs-hang/bloom-3b-ds": ({}, [
        ("bloom-3b-ds", "storage_failure_during_save", 5000, "storage_error", 13, "node-b",
         [r for r in range(16) if r != 13], 16)]),
    "c11-nemo-async-stalled/llama3-8b-pretrain": ({}, [
        ("llama3-8b-pretrain", "stalled_save", 5999, None, None, None, [], 16)]),
    # collateral: the truth says 0-7 (the head node's ranks, torn down when the driver failed)
    "c12-verl-ray-node-lost/verl-grpo-qwen2-7b": ({}, [
        ("verl-grpo-qwen2-7b", "interrupted_save", 300, "node_lost", None, "10.0.3.9", ANY, 16)]),
    # world size: the truth says 2 (Lightning DDP, two ranks)
    "c13-lightning-load-size-mismatch/finetune-vit-b16-flowers/train.log": ({"job": "finetune-vit-b16-flowers"}, [
        ("finetune-vit-b16-flowers", "load_failure", 75060, "load_error", 0, None, [], ANY)]),
    "c14-fsdp-srun-partial-shard/moe-1b-fsdp/slurm-90877.out": ({}, [
        ("slurm-90877", "partial_checkpoint", 2000, "storage_error", 5, "gpu-c07", [], 8)]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_fact_of_the_third_trial_s_case(case, tmp_path):
    opts, expected = CASES[case]
    options = PipelineOptions(job=opts.get("job"),
                              template=compile_template(opts["template"]) if "template" in opts else None)
    found, _ = diagnose([str(trial_case(TRIAL, case, tmp_path))], options)
    assert_facts(found, expected)


def test_the_checkpoints_and_last_good_ones_of_the_third_trial(tmp_path):
    """Paths and last good steps the truths name: Paddle's step-400 save ends at each rank's
    step-600 start (rank 6's OOM in that save ends none of the others'); the partial shard
    save is resolved by the complete step-2500 one."""
    cases = {"c05-paddle-rank6-oom-launcher/llama2-13b-sft-paddle": ("./checkpoints/llama_sft_ckpts/checkpoint-600",
                                                                      400, "open"),
             "c14-fsdp-srun-partial-shard/moe-1b-fsdp/slurm-90877.out": ("/scratch/proj/ckpt/moe-1b/step_2000",
                                                                          1500, "resolved"),
             "c06-megatron-slurm-timelimit-pernode/gpt-13b-pretrain": ("/lustre/fs1/ckpt/gpt-13b/iter_0012000",
                                                                        11000, "open")}
    for case, want in cases.items():
        found, stats = diagnose([str(trial_case(TRIAL, case, tmp_path))])
        assert [(i.checkpoint_path, i.last_good_checkpoint["step"], i.status) for i in found] == [want], case
        assert stats.open_saves == [], case  # no save left open: the good step-400 one was the notice


def test_two_run_once_into_one_database_find_the_resume_from_the_first_s_torn_save(tmp_path):
    """c02: Keras under nohup (no pid, no death in its console) OOM-killed mid-save, its
    kern.log beside it; the next job, read by a second `run --once` into the same database,
    resumes from that epoch-12 weights file. The registry is kept at the end of a one-shot
    run, so the second run knows the checkpoint is torn."""
    case = trial_case(TRIAL, "c02-keras-two-dirs-one-db", tmp_path)
    db = str(tmp_path / "c02.duckdb")
    for job in ("effnet-b3-run1", "effnet-b3-run2"):
        out = subprocess.run([sys.executable, "-m", "ckptwatch", "run", "--logs", str(case / job), "--db", db, "--once"],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
    with duckdb.connect(db, read_only=True) as con:
        rows = con.execute("SELECT job, kind, step, root_cause_class, root_rank FROM incidents ORDER BY job, kind").fetchall()
    assert rows == [("effnet-b3-run1", "interrupted_save", 12, "oom_kill", 0),
                    ("effnet-b3-run2", "load_failure", 12, "load_error", 0),
                    ("effnet-b3-run2", "poisoned_resume", 12, None, None)]
