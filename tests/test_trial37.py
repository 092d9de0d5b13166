"""Issue 36's second new-user trial (tests/fixtures/trial37): every fact of each case's
TRUTH.md that ckptwatch gets, and no incident on the clean jobs. Facts it does not get yet
are marked ``ANY`` with what the truth says, and listed in the issue's note."""

from __future__ import annotations

from pathlib import Path

import pytest
from log_support import ANY, assert_facts, trial_case

from ckptwatch.ingest.layout import compile_template
from ckptwatch.pipeline import PipelineOptions, diagnose

TRIAL = Path(__file__).parent / "fixtures" / "trial37"
FLEET = {"template": "{job}/*"}

# path under TRIAL -> (options, [(job, kind, step, cause class, rank, host, collateral, world size)])
CASES = {
    "c01_two_runs_one_dir/sft-sweep": ({}, [("sft7b-lr2e5", "storage_failure_during_save", 500, "storage_error", 0,
                                             "sft-box-2", [1], 2)]),
    "c02_two_jobs_one_db/llama-ft-a": ({}, [("llama-ft-a", "interrupted_save", 1500, "oom_kill", 0, None, [], 4)]),
    "c02_two_jobs_one_db/bert-pt-b": ({}, [("bert-pt-b", "interrupted_save", 3000, "cuda_oom", 1, None, [0], 2)]),
    "c03_clean_noise/qwen-sft": ({}, []),
    "c04_mmdet_glog_live/faster-rcnn": ({}, [("faster-rcnn", "interrupted_save", 12, "collective_timeout", 0,
                                              "det-node-9",
                                              [1, 2, 3], 4)]),
    "c05_megatron_ws8_segv/gpt-13b": ({}, [("gpt13b-0712", "interrupted_save", 2000, "native_crash", 5, "gpu-node-17",
                                            [0, 1, 2, 3, 4, 6, 7], 8)]),
    "c06_untimed_save/resnet-plain": ({}, [("resnet-plain", "interrupted_save", 3000, "oom_kill", 0, "gpu-box-3", [],
                                            1)]),
    # the worker pod (ranks 4-7) was OOMKilled: the root is that pod, no one rank of it
    "c07_k8s_pytorchjob/llama-fsdp": ({}, [("llama-fsdp", "interrupted_save", 1200, "oom_kill", None,
                                            "llama-fsdp-worker-0", [0, 1, 2, 3], 8)]),
    "c08_fleet/fleet": (FLEET, [("mmdet-nfs", "storage_failure_during_save", 24, "storage_error", 0, "det-node-4", [],
                                 None),
                                ("verl-ppo", "interrupted_save", 300, "oom_kill", 6, "10.0.3.7", [], 8)]),
    # cause: the truth says unknown, from the README of then, which said so; a traceback is printed only for an
    # exception that propagated, so the class is `exception` (the README now says so), the report says it is cut
    "c09_paste_cut/paste.txt": ({"job": "mistral-ft-dec06"}, [("mistral-ft-dec06", "interrupted_save", 1200, "exception", 0,
                                                               None, [], None)]),
    # the root is the scheduler's time limit, whole-job (no rank: the truth accepts any), every rank collateral
    "c10_slurm_timelimit_nemo/gpt-nemo": ({}, [("slurm-771234", "interrupted_save", 3999, "signal", None, "gpu-b07",
                                                [0, 1, 2, 3, 4, 5, 6, 7], 8)]),
    # the load failure's rank: every rank failed to load (.metadata missing), the truth names them all
    "c11_logdir_attempts/gpt2-elastic": ({}, [
        ("gpt2-elastic", "interrupted_save", 600, "signal", 2, "trn-node-3", [0, 1, 3], 4),
        ("gpt2-elastic", "poisoned_resume", 600, None, None, None, [], None),
        ("gpt2-elastic", "load_failure", 600, "load_error", ANY, "trn-node-3", [], None)]),
    "c11b_logdir_runid/exp-dir": ({}, [
        ("gpt2-elastic", "interrupted_save", 600, "signal", 2, "trn-node-3", [0, 1, 3], 4),
        ("gpt2-elastic", "poisoned_resume", 600, None, None, None, [], None),
        ("gpt2-elastic", "load_failure", 600, "load_error", ANY, "trn-node-3", [], None)]),
    "c12_multinode_ds_sibling/bloom-3b": ({}, [("bloom3b-dec06", "storage_failure_during_save", 800, "storage_error", 6,
                                                "node-b", [0, 1, 2, 3, 4, 5, 7], 8)]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_fact_of_the_second_trial_s_case(case, tmp_path):
    opts, expected = CASES[case]
    options = PipelineOptions(job=opts.get("job"),
                              template=compile_template(opts["template"]) if "template" in opts else None)
    found, _ = diagnose([str(trial_case(TRIAL, case, tmp_path))], options)
    assert_facts(found, expected)


def test_a_cut_traceback_s_advice_says_the_exception_is_cut_off_not_what_it_names(tmp_path):
    """c09: the paste ends inside the traceback, so the advice cannot quote the exception's
    line (it used to quote the header, 'Traceback (most recent call last):', as what to fix)."""
    found, _ = diagnose([str(trial_case(TRIAL, "c09_paste_cut/paste.txt", tmp_path))],
                        PipelineOptions(job="mistral-ft-dec06"))
    assert [i.root_cause.line for i in found] == ["Traceback (most recent call last):"]
    advice = found[0].remediation
    assert "whose name and message the logs read cut off" in advice
    assert "(Traceback (most recent call last):)" not in advice


def test_the_missing_job_warning_names_the_job_the_lines_were_folded_into(tmp_path):
    """c11b: the rank files name no job and the directory is exp-dir, but the torchrun
    --log-dir layout names run gpt2-elastic: the rank files' lines are folded into it, and
    the warning said they were judged as job 'exp-dir' (the directory's name)."""
    found, stats = diagnose([str(trial_case(TRIAL, "c11b_logdir_runid/exp-dir", tmp_path))])
    assert {i.job for i in found} == {"gpt2-elastic"}
    (warning,) = [w for w in stats.label_warnings() if "carry no job" in w]
    assert "judged together as job 'gpt2-elastic' (the one job the other lines name)" in warning


def test_a_save_s_path_is_its_checkpoint_directory_not_a_part_inside_it(tmp_path):
    """c07: Accelerate logs 'Saving current state to …/checkpoint_1200' and then its FSDP
    model folder inside it; the checkpoint (what to move aside, what 'last good' names) is
    the directory the step's name is on."""
    found, _ = diagnose([str(trial_case(TRIAL, "c07_k8s_pytorchjob/llama-fsdp", tmp_path))])
    assert [(i.checkpoint_path, i.last_good_checkpoint["path"]) for i in found] == [
        ("/mnt/ckpt/llama-fsdp/checkpoint_1200", "/mnt/ckpt/llama-fsdp/checkpoint_800")]


def test_an_undated_save_start_with_nothing_dated_after_it_began_by_its_failure(tmp_path):
    """c06: the save line has no time and comes after 48 minutes of undated evaluation; the
    next own time known is the kernel's OOM kill that ended it (in kern.log, not its file).
    The save began by then: first_ts was the last stamped line's, 48 minutes earlier."""
    found, _ = diagnose([str(trial_case(TRIAL, "c06_untimed_save/resnet-plain", tmp_path))])
    assert [(i.first_ts.isoformat(), i.root_cause.ts.isoformat()) for i in found] == [
        ("2026-12-07T10:47:12+00:00", "2026-12-07T10:47:12+00:00")]
