"""World size, collateral and hosts as the launcher states them (issue 36, item 5), from a
torchrun console (``--tee 3``, LOGLEVEL=INFO) of an HF Trainer run on one node: rank 1
SIGKILLed during rank 0's save, torchrun SIGTERMs the three others by pid and reports the
root cause with its host. Before: collateral none (the SIGTERMed pids map to no rank in
the logs), no host, and the report said "expected ranks 0" with no world size."""

from __future__ import annotations

import subprocess
import sys

from ckptwatch.pipeline import diagnose

A = "I0312 09:14:03.718000 139826 torch/distributed/elastic/agent/server/api.py:525]"
W = "W0312 09:41:44.968000 139826 torch/distributed/elastic/multiprocessing/api.py:897]"
CONSOLE = f"""\
{A} [default] Rendezvous complete for workers. Result:
{A}   group_world_size=1
{A}   local_ranks=[0, 1, 2, 3]
{A}   global_world_sizes=[4, 4, 4, 4]
[default0]:[INFO|trainer.py:3801] 2025-03-12 09:41:42,518 >> Saving model checkpoint to out/llama-ft-a/checkpoint-500
{W} Sending process 140122 closing signal SIGTERM
{W} Sending process 140124 closing signal SIGTERM
{W} Sending process 140125 closing signal SIGTERM
E0312 09:41:45.298000 139826 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -9) local_rank: 1 (pid: 140123) of binary: /usr/bin/python3
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train_hf.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2025-03-12_09:41:45
  host      : gpu-07
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 140123)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 140123
============================================================
"""


def test_torchrun_sigtermed_pids_are_collateral_ranks_and_its_report_names_the_host(tmp_path):
    (tmp_path / "run1.log").write_text(CONSOLE)
    (inc,), _ = diagnose([str(tmp_path / "run1.log")])
    assert (inc.kind, inc.step, inc.root_cause.cls, inc.root_cause.rank) == ("interrupted_save", 500, "signal", 1)
    assert inc.collateral == [0, 2, 3]  # before: []
    assert inc.root_cause.host == "gpu-07"  # before: None
    assert inc.checkpoint_state["world_size"] == 4 and inc.checkpoint_state["expected_ranks"] == [0]


def test_pids_out_of_rank_order_are_not_guessed(tmp_path):
    """The failed rank's pid below a signalled one of a lower rank: pids do not follow the
    ranks here, so no signalled pid is given a rank."""
    (tmp_path / "run1.log").write_text(CONSOLE.replace("140122", "140129"))
    (inc,), _ = diagnose([str(tmp_path / "run1.log")])
    assert inc.collateral == []


def test_the_report_shows_the_world_size_beside_the_ranks_seen_saving(tmp_path):
    (tmp_path / "run1.log").write_text(CONSOLE)
    out = subprocess.run([sys.executable, "-m", "ckptwatch", "diagnose", str(tmp_path)], capture_output=True,
                         text=True, timeout=120)
    assert "collateral   ranks 0, 2, 3" in out.stdout
    assert ("shards       world size 4; ranks seen saving 0; finished: none; started, not finished: 0; "
            "not started: none") in out.stdout


def test_the_tasks_srun_reports_terminated_are_collateral_on_their_nodes(tmp_path):
    """torchtitan under ``srun -l`` on two nodes, preempted in a save: srun reports each
    node's tasks as a range ("nid001205: tasks 4-7: Terminated"); before, only its one-task
    lines were read and the collateral was none."""
    saves = "".join(f"{r}: [titan] 2025-10-01 02:42:02,90{r} - root - INFO - Saving the checkpoint (or staging if "
                    "async is enabled).\n" for r in range(8))
    (tmp_path / "slurm-99123.out").write_text(
        saves
        + "slurmstepd: error: *** STEP 99123.0 ON nid001204 CANCELLED AT 2025-10-01T02:42:09 DUE TO PREEMPTION ***\n"
        "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.\n"
        "srun: error: nid001205: tasks 4-7: Terminated\n"
        "srun: error: nid001204: tasks 0-3: Terminated\n")
    (inc,), _ = diagnose([str(tmp_path)])
    assert (inc.kind, inc.root_cause.cls, inc.root_cause.rank) == ("interrupted_save", "signal", None)
    assert inc.collateral == [0, 1, 2, 3, 4, 5, 6, 7]


def test_a_task_list_gives_its_ranks_and_nothing_else():
    from ckptwatch.detectors.events import task_ranks

    assert task_ranks("4-7") == {4, 5, 6, 7}
    assert task_ranks("[0,2-3]") == {0, 2, 3}
    assert task_ranks("3") == {3}
    assert task_ranks("7-4") == task_ranks("0-999999") == task_ranks("a-b") == task_ranks(None) == set()
