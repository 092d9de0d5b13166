"""Times a line inherited (issue 36, item 6). A line without a time of its own carries the
time of a line before it: a bound from below only. An untimed save line printed 40 minutes
after the last dated line took that line's time, and the incident's ``first_ts``, its
failure's time and the picture's save bar went back 40 minutes (4 hours for a Slurm job
whose only dated lines were its ``START`` and ``CANCELLED AT``); the picture drew those
events solid though its legend said faded. Now such a line is dated by the next own time of
its file (the failure block, the next dated line), and drawn faded there."""

from __future__ import annotations

import datetime as dt

import duckdb
from matplotlib.collections import PathCollection, PolyCollection
from typer.testing import CliRunner

from ckptwatch import cli
from ckptwatch.detectors import saves
from ckptwatch.history import plot, queries
from ckptwatch.history.read import open_history
from ckptwatch.history.timeline import build_timeline
from ckptwatch.pipeline import diagnose

UTC = dt.timezone.utc


def at(*hms: float, day: tuple[int, int, int]) -> dt.datetime:
    h, m, s = hms
    return dt.datetime(*day, h, m, int(s), round((s % 1) * 1e6), tzinfo=UTC)


#: c06: torchrun ``--log-line-prefix-template '[${rank}]: '``; rank 0's last dated line at
#: 09:00:00.123, then untimed bars, the untimed save print and the safetensors ENOSPC
#: traceback (really ~09:40:50), then torchrun's agent lines and its failure block
C06 = "\n".join([
    "W0314 07:37:40.000000 3300 torch/distributed/run.py:793] *****************************************",
    "[0]: 2025-03-14 07:38:00,123 INFO train.py:141 world_size=2 save_every=1500 log_every=1000 out=/ckpt/exp12",
    "[0]: 2025-03-14 09:00:00,123 INFO train.py:141 step=1000 loss=3.4127 lr=6.0e-04 tok/s=22310",
    *[f"[0]: \rtrain:  {p}%|████      | {s}/3000 [1:38:00<2:27:00,  4.90s/it]"
      for p, s in ((36, 1100), (40, 1200), (43, 1300), (46, 1400), (50, 1500))],
    "[0]: saving checkpoint to /ckpt/exp12/step_1500 ...",
    "[0]:   model.safetensors",
    "[0]: Traceback (most recent call last):",
    '[0]:   File "/home/ayu/exp12/ckpt.py", line 31, in save_checkpoint',
    '[0]:     save_file(model.state_dict(), os.path.join(d, "model.safetensors"))',
    '[0]:   File "/usr/local/lib/python3.10/dist-packages/safetensors/torch.py", line 286, in save_file',
    "[0]:     serialize_file(_flatten(tensors), filename, metadata=metadata)",
    '[0]: safetensors_rust.SafetensorError: Error while serializing: IoError(Os { code: 28, kind: StorageFull, '
    'message: "No space left on device" })',
    "W0314 09:40:54.623000 3300 torch/distributed/elastic/multiprocessing/api.py:897] Sending process 3312 closing "
    "signal SIGTERM",
    "E0314 09:40:54.923000 3300 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) "
    "local_rank: 0 (pid: 3311) of binary: /usr/bin/python3",
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
    "============================================================",
    "train.py FAILED",
    "------------------------------------------------------------",
    "Failures:",
    "  <NO_OTHER_FAILURES>",
    "------------------------------------------------------------",
    "Root Cause (first observed failure):",
    "[0]:",
    "  time      : 2025-03-14_09:40:54",
    "  host      : dgx-14",
    "  rank      : 0 (local_rank: 0)",
    "  exitcode  : 1 (pid: 3311)",
    "  error_file: <N/A>",
    "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
    "============================================================",
]) + "\n"

#: c07: ``srun -l`` output of a Lightning job, 4 tasks; dated only by its START line and
#: slurmstepd's CANCELLED AT; the save of step 16000 (untimed) cut by the time limit
C07 = "\n".join([
    "START 2025-06-02T10:00:01+00:00 job 88123 on gpu-n12 (4 tasks)",
    *[f"{r}: Initializing distributed: GLOBAL_RANK: {r}, MEMBER: {r + 1}/4" for r in range(4)],
    *[line for e in range(8) for line in (
        f"0: Epoch {e}: 100%|██████████| 2000/2000 [0:29:36<00:00, 1.13it/s, v_num=88123, train_loss=1.{80 - e}]",
        f"0: Epoch {e}, global step {2000 * (e + 1)}: 'val/loss' reached 0.9{e} (best 0.9{e}), saving model to "
        f"'/scratch/ckpt/vit/epoch={e}-step={2000 * (e + 1)}.ckpt' as top 3")],
    "slurmstepd: error: *** JOB 88123 ON gpu-n12 CANCELLED AT 2025-06-02T14:00:04 DUE TO TIME LIMIT ***",
    "slurmstepd: error: *** STEP 88123.0 ON gpu-n12 CANCELLED AT 2025-06-02T14:00:04 DUE TO TIME LIMIT ***",
    "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.",
    *[f"{r}: [rank: {r}] Received SIGTERM: 15" for r in (0, 2, 1, 3)],
    "srun: error: gpu-n12: tasks 0-3: Terminated",
    "srun: Force Terminated StepId=88123.0",
]) + "\n"


def _agent(node: str, pid: int, ranks: range) -> list[str]:
    head = f"I0903 13:50:03.600000 {pid} torch/distributed/elastic/agent/server/api.py:525]"
    return [f"{head} [default] Rendezvous complete for workers. Result:", f"{head}   restart_count=0",
            f"{head}   group_rank={0 if node == 'a' else 1}", f"{head}   group_world_size=2",
            f"{head}   local_ranks=[0, 1, 2, 3]", f"{head}   global_ranks=[{', '.join(map(str, ranks))}]",
            f"{head}   global_world_sizes=[8, 8, 8, 8]", f"{head} "]


def _failure_block(rank: int, local: int, pid: int, code: int, when: str, host: str) -> list[str]:
    return ["torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
            "============================================================", "pretrain_gpt.py FAILED",
            "------------------------------------------------------------", "Failures:", "  <NO_OTHER_FAILURES>",
            "------------------------------------------------------------", "Root Cause (first observed failure):",
            "[0]:", f"  time      : 2025-09-03_{when}", f"  host      : {host}",
            f"  rank      : {rank} (local_rank: {local})", f"  exitcode  : {code} (pid: {pid})",
            "  error_file: <N/A>", "============================================================"]


#: c05: Megatron-LM, world size 8 on two nodes, a console per node in sibling directories.
#: Rank 0 (gpu-a) prints the save lines, untimed (``print_rank_0``); its last dated line is
#: 13:51:24. Rank 7 (gpu-b) prints the dated iteration lines; rank 5 (gpu-b) runs out of GPU
#: memory in the save of iteration 800 (logged at 14:10:17); gpu-a's ranks time out 10 min later.
GPU_A = "\n".join([
    *_agent("a", 41001, range(0, 4)),
    "[default0]:using world size: 8, data-parallel size: 8, context-parallel size: 1",
    "[default0]:[before the start of training step] datetime: 2025-09-03 13:51:24 ",
    "[default0]:saving checkpoint at iteration     400 to /lustre/ckpt/gpt-1.3b in torch format",
    "[default0]:  successfully saved checkpoint from iteration     400 to /lustre/ckpt/gpt-1.3b [ t 1/1, p 1/1 ]",
    "[default0]:saving checkpoint at iteration     800 to /lustre/ckpt/gpt-1.3b in torch format",
    *[f"[default{r}]:[rank{r}]:[E903 14:20:19.94{r}000041 ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught "
      f"collective operation timeout: WorkNCCL(SeqNum=90113, OpType=_ALLGATHER_BASE, NumelIn=327680000, "
      f"NumelOut=2621440000, Timeout(ms)=600000) ran for 600041 milliseconds before timing out." for r in range(4)],
    *[f"W0903 14:20:21.240000 41001 torch/distributed/elastic/multiprocessing/api.py:897] Sending process {p} "
      f"closing signal SIGTERM" for p in (41021, 41022, 41023)],
    "E0903 14:20:21.640000 41001 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -6) "
    "local_rank: 0 (pid: 41020) of binary: /usr/bin/python3",
    *_failure_block(0, 0, 41020, -6, "14:20:21", "gpu-a"),
]) + "\n"
GPU_B = "\n".join([
    *_agent("b", 52002, range(4, 8)),
    "[default3]: [2025-09-03 14:00:44] iteration      400/   20000 | consumed samples:       204800 | "
    "elapsed time per iteration (ms): 1402.3 | lm loss: 2.861E+00 |",
    "[default3]: [2025-09-03 14:10:17] iteration      800/   20000 | consumed samples:       409600 | "
    "elapsed time per iteration (ms): 1402.3 | lm loss: 2.617E+00 |",
    "[default1]:[rank5]: Traceback (most recent call last):",
    '[default1]:[rank5]:   File "/workspace/megatron/training/checkpointing.py", line 404, in save_checkpoint',
    "[default1]:[rank5]:     optimizer.save_parameter_state(optim_checkpoint_name)",
    '[default1]:[rank5]:   File "/workspace/megatron/core/optimizer/distrib_optimizer.py", line 1079, in '
    "save_parameter_state",
    "[default1]:[rank5]:     state_dict = self.get_parameter_state_dp_zero()",
    "[default1]:[rank5]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.89 GiB. GPU 1 has a "
    "total capacity of 79.15 GiB of which 3.12 GiB is free. Process 52021 has 76.02 GiB memory in use.",
    *[f"W0903 14:10:21.440000 52002 torch/distributed/elastic/multiprocessing/api.py:897] Sending process {p} "
      f"closing signal SIGTERM" for p in (52020, 52022, 52023)],
    "E0903 14:10:22.140000 52002 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) "
    "local_rank: 1 (pid: 52021) of binary: /usr/bin/python3",
    *_failure_block(5, 1, 52021, 1, "14:10:22", "gpu-b"),
]) + "\n"


def test_dating_a_line_by_the_next_own_time_of_its_file():
    t = at(9, 0, 0, day=(2025, 3, 14))
    later = t + dt.timedelta(minutes=40)
    dating = saves.Dating([("f", 10, t, "line"), ("f", 20, t, "inherited"), ("f", 30, t, "inherited"),
                     ("f", 40, later + dt.timedelta(seconds=1), "line"), ("f", 50, later, "rule"),
                     ("g", 5, later + dt.timedelta(hours=1), "line")])
    # the earliest own time after it in its file (a rule-captured one in a failure block
    # after a dated agent line counts), never a line's of another file
    assert dating.at("f", 20, t, "inherited") == later
    assert dating.at("f", 30, t, "mtime") == later
    assert dating.at("f", 10, t, "line") == t  # a time of its own stays
    assert dating.at("f", 60, t, "inherited") == t  # nothing dated after it: its time, a lower bound, stays
    assert dating.at("g", 1, later + dt.timedelta(hours=2), "inherited") == later + dt.timedelta(hours=2)  # never earlier
    assert dating.at("h", 1, t, "inherited") == t


def test_an_untimed_save_line_long_after_the_last_dated_line(tmp_path):
    """c06: first_ts and the failure's time were 09:00:00.123, the time the save line and the
    traceback inherited; torchrun's failure block dates the same exit 09:40:54."""
    (tmp_path / "train.out").write_text(C06)
    incidents, _ = diagnose([str(tmp_path)])
    assert [(i.kind, i.step, i.checkpoint_path, i.root_cause.cls, i.root_cause.rank) for i in incidents] == [
        ("storage_failure_during_save", 1500, "/ckpt/exp12/step_1500", "storage_error", 0)]  # and no stalled_save
    inc = incidents[0]
    assert inc.first_ts == at(9, 40, 54, day=(2025, 3, 14))
    assert inc.root_cause.ts == at(9, 40, 54, day=(2025, 3, 14))
    assert inc.to_dict()["first_ts"] == "2025-03-14T09:40:54+00:00"  # what JSON and the webhooks carry
    # the evidence keeps the time the lines carry (the save's place among the job's lines)
    assert min(e.ts for e in inc.evidence) == at(9, 0, 0.123, day=(2025, 3, 14))


def test_a_slurm_time_limit_during_an_untimed_lightning_save(tmp_path):
    """c07: first_ts was 10:00:01, the START line's time the save line inherited, 4 hours before
    the scheduler's CANCELLED AT 14:00:04 that cut it."""
    (tmp_path / "slurm-88123.out").write_text(C07)
    incidents, _ = diagnose([str(tmp_path / "slurm-88123.out")])
    assert [(i.kind, i.step, i.root_cause.cls, i.root_cause.sender) for i in incidents] == [
        ("interrupted_save", 16000, "signal", "scheduler_time_limit")]
    inc = incidents[0]
    assert inc.root_cause.ts == at(14, 0, 4, day=(2025, 6, 2))  # dated by its own line, as before
    assert inc.first_ts == at(14, 0, 4, day=(2025, 6, 2))


def test_a_megatron_save_line_dated_on_the_other_node(tmp_path):
    """c05: rank 0's untimed save line of iteration 800 inherited 13:51:24 (its node's last
    dated line), 19 minutes before iteration 800 was logged on the other node; the OOM on
    rank 5 has no time either. first_ts was 13:51:24."""
    for node, text in (("gpu-a", GPU_A), ("gpu-b", GPU_B)):
        (tmp_path / node).mkdir()
        (tmp_path / node / "console.log").write_text(text)
    incidents, _ = diagnose([str(tmp_path)])
    assert [(i.kind, i.step, i.root_cause.cls, i.root_cause.rank) for i in incidents] == [
        ("interrupted_save", 800, "cuda_oom", 5)]
    inc = incidents[0]
    # the OOM happened by gpu-b's next dated line, the agent's teardown at 14:10:21.44 (its
    # failure block says 14:10:22); the save began by then
    assert inc.first_ts == at(14, 10, 21.44, day=(2025, 9, 3))
    assert inc.root_cause.ts == at(14, 10, 21.44, day=(2025, 9, 3))


def test_the_picture_fades_inherited_events_and_draws_no_bar_from_their_time(tmp_path):
    """``incidents plot`` of c06 from a database ``run --once`` wrote: the job is named after
    the directory (its lines name none, so they are stored with no job), and the events' times'
    sources were not found: the save line and the traceback were drawn solid at 09:00, the
    save bar from there."""
    logs = tmp_path / "exp12"
    logs.mkdir()
    (logs / "train.out").write_text(C06)
    db = str(tmp_path / "h.duckdb")
    res = CliRunner().invoke(cli.app, ["run", "--once", "--logs", str(logs), "--db", db])
    assert res.exit_code == 0, res.output
    with duckdb.connect(db, read_only=True) as con:
        assert con.execute("SELECT count(*) FROM events WHERE job IS NOT NULL").fetchone() == (0,)
    with open_history(db) as (con, _):
        inc, _ = queries.load_incident(con, queries.list_incidents(con)["id"][0])
        tl = build_timeline(con, inc)
    failed = at(9, 40, 54, day=(2025, 3, 14))
    marks = {(m.kind, m.role): m for m in tl.marks}
    for key in (("save_start", "context"), ("storage_error", "root_cause")):
        assert marks[key].approx and marks[key].ts == failed, key  # faded, at the failure block's time
    assert not marks["process_exit", "collateral"].approx
    assert [(b.step, b.start, b.outcome, b.approx) for b in tl.bars] == [(1500, failed, "cut", True)]
    assert tl.start >= failed  # the picture is the failure's few seconds, not 40 minutes
    fig = plot.draw(tl)
    ax = fig.axes[0]
    bars = [c for c in ax.collections if isinstance(c, PolyCollection) and not isinstance(c, PathCollection)]
    assert [c.get_alpha() for c in bars] == [plot.FADED]
    alphas = sorted((c.get_alpha() or 1.0) for c in ax.collections if isinstance(c, PathCollection))
    assert alphas.count(plot.FADED) == sum(m.approx for m in tl.marks) >= 2
    assert alphas.count(1.0) == sum(not m.approx for m in tl.marks) >= 1
    assert plot.FADED_LABEL in [t.get_text() for t in ax.get_legend().get_texts()]
    assert "≈ (no time of its own)" in plot.html_page(tl, "report")


def test_the_report_json_and_the_database_mark_each_inherited_time(tmp_path):
    """The evidence keeps the inherited time (the line's place in its file), marked as such
    wherever it is shown: ``ts_source`` in the JSON and in ``incident_evidence``, and a
    ``≈`` with a legend in the report's timeline."""
    import subprocess
    import sys

    import duckdb

    (tmp_path / "train.out").write_text(C06)
    (inc,), _ = diagnose([str(tmp_path)])
    marked = {e.line[:40]: e.to_dict().get("ts_source", "line") for e in inc.evidence}
    assert "inherited" in marked.values() and "line" in marked.values()
    db = str(tmp_path / "x.duckdb")
    cli = [sys.executable, "-m", "ckptwatch"]
    subprocess.run([*cli, "run", "--logs", str(tmp_path), "--db", db, "--once"], capture_output=True, timeout=120)
    with duckdb.connect(db, read_only=True) as con:
        stored = dict(con.execute("SELECT left(line, 40), ts_source FROM incident_evidence").fetchall())
    assert stored == marked
    shown = subprocess.run([*cli, "incidents", "show", inc.id[:8], "--db", db], capture_output=True, text=True,
                           timeout=120).stdout
    inherited = [ln for ln in shown.splitlines() if "≈ " in ln and ln.strip()[:2].isdigit()]
    assert inherited and "≈ no time of its own: an earlier line's (the line came no earlier)" in shown
    assert "at ≈2025-03-14 09:40:54.000 UTC (no time of its own: the next dated line of its file)" in shown


def test_a_diagnosed_paste_s_picture_fades_inherited_evidence_without_a_database(tmp_path):
    """The console's "diagnose a log" draws from the evidence alone (no database): its
    ``ts_source`` marks what to fade."""
    from ckptwatch.history import timeline

    (tmp_path / "train.out").write_text(C06)
    (inc,), _ = diagnose([str(tmp_path)])
    tl = timeline.build_timeline(None, inc)
    assert any(m.approx for m in tl.marks) and any(not m.approx for m in tl.marks)
