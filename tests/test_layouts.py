"""Labels (job, rank, local rank, host, pid) come out right for every launcher layout:
the real runs of tests/fixtures/realruns (torchrun --tee / --role / --local-ranks-filter /
a prefix template / two nodes, srun --label, pdsh, a bare python) and the layouts written
in the formats the tools document (Ray, Open MPI, JSON lines, Lightning, torchrun's own
template example), each read through the real ingest (SourceWatcher)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from ckptwatch.ingest import prefix
from ckptwatch.ingest.watcher import SourceWatcher

REAL = Path(__file__).resolve().parent / "fixtures" / "realruns"
SIGKILL = REAL / "torch-dcp-sigkill-mid-save" / "logs"
SLOW = REAL / "torch-dcp-clean-slow-saves" / "logs"


def records(*paths: Path | str, **kw) -> pl.DataFrame:
    w = SourceWatcher([str(p) for p in paths], **kw)
    try:
        return w.poll(final=True)
    finally:
        w.close()


def worker_lines(recs: pl.DataFrame, text: str) -> pl.DataFrame:
    return recs.filter(pl.col("line").str.contains(text, literal=True))


# --- real runs ------------------------------------------------------------------------------


def test_two_node_consoles_keep_each_nodes_local_ranks_apart():
    """torchrun --nnodes 2 --nproc-per-node 2 --tee 3: each node's console says [default0]:
    and [default1]:; the ranks the workers log are read, and the --log-dir files agree."""
    recs = records(SIGKILL / "c-two-nodes" / "attempt-1")
    steps = worker_lines(recs, "train: step 5/30")
    consoles = steps.filter(pl.col("file").str.ends_with("console.log"))
    by_node = {node: sorted(part.select("local_rank", "rank").rows())
               for (node,), part in consoles.group_by(pl.col("file").str.extract(r"(node-[ab])/"))}
    assert [lr for lr, _ in by_node["node-a"]] == [0, 1] and [lr for lr, _ in by_node["node-b"]] == [0, 1]
    assert sorted(r for rows in by_node.values() for _, r in rows) == [0, 1, 2, 3]  # no node collapsed on another
    per_rank = steps.filter(~pl.col("file").str.ends_with("console.log"))
    assert sorted(per_rank["rank"].to_list()) == [0, 1, 2, 3]
    assert steps["job"].n_unique() == 1 and steps["job"][0].startswith("job-")


def test_srun_label_task_ids_are_global_ranks_and_the_label_is_removed():
    recs = records(SIGKILL / "e1-srun-label" / "attempt-1")
    steps = worker_lines(recs, "Saving checkpoint at step 10 to")  # print()ed: no rank in the text
    assert sorted(steps["rank"].to_list()) == [0, 1, 2, 3]
    assert all(line.startswith("Saving") for line in steps["line"])  # "2: " is gone
    tb = worker_lines(recs, "Traceback (most recent call last)")
    assert tb.height and all(line.startswith("Traceback") for line in tb["line"])  # "3: [rank3]: " removed too
    assert tb["rank"].null_count() == 0 and set(tb["rank"].to_list()) <= {0, 1, 2, 3}
    assert steps["job"].unique().to_list() == ["slurm-4242"]  # from sbatch's slurm-<jobid>.out
    srun = worker_lines(recs, "srun: error: vm: task 2: Killed")
    assert srun.height == 1 and srun["rank"][0] is None  # srun's own line is not a task's


def test_pdsh_host_prefix_is_the_host_and_each_nodes_tee_prefix_its_local_rank():
    recs = records(SIGKILL / "e2-pdsh-two-nodes" / "attempt-1")
    steps = worker_lines(recs, "train: step 5/30")
    got = sorted(steps.select("host", "local_rank").rows())
    assert got == [("node-a", 0), ("node-a", 1), ("node-b", 0), ("node-b", 1)]
    assert sorted(steps["rank"].to_list()) == [0, 1, 2, 3]
    assert all(line.startswith("2026-") for line in steps["line"])  # "node-a: [default0]:" removed


def test_role_and_local_ranks_filter_give_local_ranks_of_the_filtered_workers():
    recs = records(SLOW / "b1-role-trainer-ranks-filter")
    workers = recs.filter(pl.col("local_rank").is_not_null())
    assert set(workers["local_rank"].to_list()) == {0, 2}  # --local-ranks-filter 0,2
    assert not workers["line"].str.starts_with("[trainer").any()


def test_a_prefix_template_of_the_default_shape_is_removed_and_read():
    """TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE='[${role_name}${local_rank}|${rank}]:'"""
    recs = records(SLOW / "b2-prefix-template")
    steps = worker_lines(recs, "train: step 5/30")
    assert sorted(steps["local_rank"].to_list()) == [0, 1, 2, 3]
    assert sorted(steps["rank"].to_list()) == [0, 1, 2, 3]
    assert steps["ts_source"].unique().to_list() == ["line"]  # the time behind the prefix is read
    assert not steps["line"].str.contains(r"^\[trainer").any()


def test_the_users_own_template_is_read_exactly_by_its_macros(tmp_path):
    log = tmp_path / "console.log"
    log.write_text("gpu-07|r12|l4> 2026-11-30 10:00:00,000 INFO saving checkpoint step 40\n"
                   "gpu-07|r13|l5> 2026-11-30 10:00:00,100 INFO saving checkpoint step 40\n")
    recs = records(log, line_prefix="${hostname}|r${rank}|l${local_rank}> ")
    assert recs.select("host", "rank", "local_rank").rows() == [("gpu-07", 12, 4), ("gpu-07", 13, 5)]
    assert recs["line"][0].startswith("2026-11-30 10:00:00,000 INFO")


# --- documented formats of tools that need a cluster ---------------------------------------------


def test_hostname_rank_template_example_of_torchrun_is_sniffed(tmp_path):
    """torch/distributed/run.py documents --log-line-prefix-template "${hostname}:${rank}: "."""
    log = tmp_path / "console.log"
    log.write_text("r12i0n8:3: python: src/psm2_nccl_net.c:756: Assertion `r->used' failed.\n"
                   "r12i0n8:3: Fatal Python error: Segmentation fault\n"
                   "r12i0n9:11: 2026-11-30 10:00:00,000 step 5 loss 0.5\n")
    recs = records(log)
    assert recs.select("host", "rank").rows() == [("r12i0n8", 3), ("r12i0n8", 3), ("r12i0n9", 11)]
    assert recs["line"][0].startswith("python: src/psm2")


def test_a_python_warning_is_not_taken_for_a_host_and_rank(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("2026-11-30 10:00:00,000 INFO step 1\n"
                   "train.py:45: UserWarning: something\n"
                   "2026-11-30 10:00:01,000 INFO step 2\n")
    recs = records(log)
    assert recs["host"].to_list() == [None, None, None] and recs["rank"].to_list() == [None, None, None]


def test_srun_label_padding_and_host_task_and_open_mpi_labels(tmp_path):
    (tmp_path / "a.out").write_text(" 3: saving checkpoint step 40\n12: saving checkpoint step 40\n"
                                    " 0: step 41 loss 0.5\n")
    (tmp_path / "b.out").write_text("[node-a:3]: saving checkpoint step 40\n[node-b:12] step 41\n")
    (tmp_path / "c.out").write_text("[1,3]<stdout>:saving checkpoint step 40\n[1,0]<stderr>: step 41\n")
    recs = records(tmp_path)
    by = {Path(f).name: r for f, r in recs.group_by("file", maintain_order=True).agg(pl.col("rank")).iter_rows()}
    assert by["a.out"] == [3, 12, 0]
    assert by["b.out"] == [3, 12]
    assert by["c.out"] == [3, 0]
    assert recs.filter(pl.col("file").str.ends_with("b.out"))["host"].to_list() == ["node-a", "node-b"]
    assert set(recs["line"].str.slice(0, 6)) <= {"saving", "step 4"}


def test_ray_worker_prefix_gives_pid_and_host(tmp_path):
    (tmp_path / "driver.log").write_text(
        "(RayTrainWorker pid=48213, ip=10.0.3.7) 2026-11-30 10:00:00,000 Saving checkpoint\n"
        "(TorchTrainer pid=48100) Training started\n")
    recs = records(tmp_path)
    assert recs.select("pid", "host").rows() == [(48213, "10.0.3.7"), (48100, None)]
    assert recs["line"][0].startswith("2026-11-30") and recs["ts_source"][0] == "line"


def test_json_lines_fields_are_labels_and_the_message_is_the_line(tmp_path):
    (tmp_path / "train.jsonl").write_text(
        '{"time": "2026-11-30T10:00:00.250Z", "level": "INFO", "rank": 3, "host": "gpu-2", '
        '"job_id": "llama-7", "message": "saving checkpoint step 40"}\n'
        '{"ts": 1764496800.5, "local_rank": 1, "pid": 777, "msg": "step 41 loss 0.5"}\n'
        '{"log":"[default1]:boom\\n","stream":"stderr","time":"2026-11-30T10:00:02Z"}\n')
    recs = records(tmp_path)
    assert recs.select("rank", "local_rank", "host", "pid", "job").rows() == [
        (3, None, "gpu-2", None, "llama-7"), (None, 1, None, 777, None), (None, 1, None, None, None)]
    assert recs["line"][0] == "2026-11-30T10:00:00.250Z INFO saving checkpoint step 40"
    assert [str(t) for t in recs["ts"]] == ["2026-11-30 10:00:00.250000+00:00", "2025-11-30 10:00:00.500000+00:00",
                                            "2026-11-30 10:00:02+00:00"]


@pytest.mark.parametrize(("text", "rank"), [
    ("2026-11-30 10:00:00,000 [rank: 1] Saving checkpoint", 1),  # Lightning rank_prefixed_message
    ("[2026-11-30 10:00:00,000] [INFO] [logging.py:128:log_dist] [Rank 0] Saving model checkpoint", 0),
    ("2026-11-30 10:00:00 train rank=5 world_size=8 step=40 saving", 5),
    ("2026-11-30 10:00:00 global_rank=6 saving", 6),
    ("2026-11-30 10:00:00 local_rank=2 saving", None),  # a local rank is not a global one
])
def test_ranks_named_inside_the_line(tmp_path, text, rank):
    (tmp_path / "t.log").write_text(text + "\n")
    assert records(tmp_path)["rank"].to_list() == [rank]


def test_role_rank_on_a_second_node_is_a_local_rank(tmp_path):
    """torchrun --role rank --tee 3 prints [rank<LOCAL_RANK>]: on every node: on the node
    whose rendezvous says global_ranks=[2, 3] they are ranks 2 and 3; an excepthook's
    [rankN]: behind it is the global rank."""
    agent = "I1130 10:00:00.000000 900 torch/distributed/elastic/agent/server/api.py:553]"
    (tmp_path / "console.log").write_text(
        f"{agent} [rank] Rendezvous complete for workers. Result:\n"
        f"{agent}   local_ranks=[0, 1]\n{agent}   global_ranks=[2, 3]\n"
        "[rank0]:2026-11-30 10:00:01,000 step 5 loss 0.5\n"
        "[rank1]:2026-11-30 10:00:01,000 step 5 loss 0.5\n"
        "[rank1]:[rank3]: Traceback (most recent call last):\n"
        '[rank1]:[rank3]:   File "train.py", line 9, in <module>\n'
        "[rank1]:[rank3]: RuntimeError: boom\n")
    recs = records(tmp_path).filter(pl.col("local_rank").is_not_null())
    assert recs.select("local_rank", "rank").rows() == [(0, 2), (1, 3), (1, 3)]
    assert recs["line"][2].startswith("Traceback") and recs["line"][2].endswith("RuntimeError: boom")


def test_sniff_needs_most_lines_to_carry_the_prefix():
    assert prefix.sniff(["node-a: x", "node-b: y", "node-a: z"]).host_prefix
    assert not prefix.sniff(["INFO: x", "WARNING: y", "ERROR: z"]).host_prefix
    assert not prefix.sniff(["node-a: x", "plain", "plain", "plain"]).host_prefix
    assert prefix.sniff([" 3: x", "10: y", " 0: z"]).task_prefix
    assert not prefix.sniff(["3: x", "plain", "plain", "plain", "plain"]).task_prefix


def test_bad_line_prefix_templates_are_refused_with_the_reason():
    with pytest.raises(prefix.LinePrefixError, match="unknown macro"):
        prefix.compile_line_prefix("[${node}]:")
    with pytest.raises(prefix.LinePrefixError, match="no macro"):
        prefix.compile_line_prefix("[x]:")


# --- found by a fresh user ---------------------------------------------------------------------

AGENT = "I1130 10:20:41.003000 {pid} torch/distributed/elastic/agent/server/api.py:553]"
FAILED = ("E1130 10:21:21.702000 {pid} torch/distributed/elastic/multiprocessing/api.py:1002] failed "
          "(exitcode: -9) local_rank: {lr} (pid: 6127) of binary: /usr/bin/python3")


def _rendezvous(pid: int, local: str, glob: str) -> list[str]:
    a = AGENT.format(pid=pid)
    return [f"{a} [default] Rendezvous complete for workers. Result:", f"{a}   local_ranks=[{local}]",
            f"{a}   global_ranks=[{glob}]"]


def test_srun_tasks_that_are_torchrun_agents_are_nodes_not_ranks(tmp_path):
    """srun -l launching one torchrun per node: ``1: [default2]:`` is node 1's local rank 2."""
    lines = [f"0: {x}" for x in _rendezvous(5872, "0, 1, 2, 3", "0, 1, 2, 3")]
    lines += [f"1: {x}" for x in _rendezvous(6120, "0, 1, 2, 3", "4, 5, 6, 7")]
    lines += ["0: [default2]:2026-11-30 10:21:00,000 step 40", "1: [default2]:2026-11-30 10:21:00,000 step 40",
              "1: " + FAILED.format(pid=6120, lr=2)]
    (tmp_path / "slurm-5151.out").write_text("\n".join(lines) + "\n")
    recs = records(tmp_path)
    steps = worker_lines(recs, "step 40")
    assert steps.select("local_rank", "rank").rows() == [(2, 2), (2, 6)]
    assert worker_lines(recs, "failed (exitcode: -9)")["rank"].to_list() == [6]


def test_two_agents_in_one_unlabelled_file_map_their_own_lines_by_pid(tmp_path):
    lines = _rendezvous(5872, "0, 1, 2, 3", "0, 1, 2, 3") + _rendezvous(6120, "0, 1, 2, 3", "4, 5, 6, 7")
    lines += ["[default2]:2026-11-30 10:21:00,000 step 40", FAILED.format(pid=6120, lr=2),
              FAILED.format(pid=5872, lr=1)]
    (tmp_path / "console.log").write_text("\n".join(lines) + "\n")
    recs = records(tmp_path)
    assert worker_lines(recs, "failed (exitcode: -9)")["rank"].to_list() == [6, 1]
    assert worker_lines(recs, "step 40")["rank"].to_list() == [None]  # which node's local rank 2: unknown


def test_a_host_from_the_path_template_keeps_the_rendezvous_mapping(tmp_path):
    from ckptwatch.ingest.layout import compile_template

    job = tmp_path / "job-77"
    job.mkdir()
    (job / "node-b.log").write_text("\n".join(_rendezvous(6120, "0, 1", "2, 3") + [
        "[default1]:2026-11-30 10:21:00,000 step 40"]) + "\n")
    recs = records(tmp_path, template=compile_template("{job}/{host}.log"))
    assert worker_lines(recs, "step 40").select("host", "local_rank", "rank").rows() == [("node-b", 1, 3)]


def test_a_kubernetes_json_file_log_keeps_the_torchrun_prefix_inside(tmp_path):
    (tmp_path / "worker-1.log").write_text(
        '{"log":"[default1]:2026-11-30 10:21:00,000 INFO [rank5] saving checkpoint step 40 to /ckpt/step_40\\n",'
        '"stream":"stderr","time":"2026-11-30T10:21:00.003412345Z"}\n')
    recs = records(tmp_path)
    assert recs.select("local_rank", "rank").rows() == [(1, 5)]
    assert recs["line"][0].startswith("2026-11-30T10:21:00.003412345Z 2026-11-30 10:21:00,000 INFO [rank5] saving")


def test_hostname_rank_template_is_sniffed_among_the_agents_own_lines(tmp_path):
    lines = [AGENT.format(pid=1) + f" line {i}" for i in range(6)]
    lines += [f"r12i0n8:{r}: 2026-11-30 10:21:00,000 step 40" for r in range(3)]
    (tmp_path / "console.log").write_text("\n".join(lines) + "\n")
    assert worker_lines(records(tmp_path), "step 40").select("host", "rank").rows() == [
        ("r12i0n8", 0), ("r12i0n8", 1), ("r12i0n8", 2)]


def test_workers_that_only_print_take_the_consoles_time_in_file_order(tmp_path):
    (tmp_path / "console.log").write_text(
        AGENT.format(pid=1) + " [default] Starting worker group\n"
        "[default2]:saving checkpoint step 40 to /ckpt/step_40\n"
        + FAILED.format(pid=1, lr=2) + "\n")
    recs = records(tmp_path)
    assert recs["ts_source"].to_list() == ["line", "inherited", "line"]
    assert recs["ts"][1] == recs["ts"][0] < recs["ts"][2]  # the save started before the kill


def test_a_console_beside_its_run_directory_takes_the_run_id(tmp_path):
    run = tmp_path / "myrun_c2kx0d8k" / "attempt_0" / "0"
    run.mkdir(parents=True)
    (run / "stderr.log").write_text("x\n")
    (tmp_path / "console.log").write_text("[default0]:x\n")
    assert set(records(tmp_path)["job"].to_list()) == {"myrun"}


def test_kernel_uptime_stamps_without_a_boot_time_are_reported(tmp_path):
    from ckptwatch.pipeline import diagnose

    (tmp_path / "dmesg.log").write_text("[ 8812.230000] Out of memory: Killed process 6127 (python)\n")
    _, stats = diagnose([str(tmp_path)])
    assert stats.notes == {"kernel_uptime_without_boot_time": 1}
    assert any("--boot-time" in w for w in stats.label_warnings())


def test_accelerate_launch_console_is_tied_to_its_log_dir_run():
    """accelerate launch --multi_gpu --tee 3 --log_dir: the console and accelerate_logs/<run>/
    are one job (torchrun's default run id 'none' is not a job: the run directory names it)."""
    recs = records(REAL / "hf-accelerate-enospc" / "logs" / "attempt-1")
    jobs = recs.group_by(pl.col("file").str.contains("accelerate_logs")).agg(pl.col("job").unique())
    assert all(j.to_list() == [recs["job"][0]] for j in jobs["job"]) and recs["job"][0].startswith("none_")
    workers = recs.filter(pl.col("file").str.ends_with("console.log") & pl.col("local_rank").is_not_null())
    assert set(workers["local_rank"].to_list()) == {0, 1}


def test_deepspeed_launcher_console_reads_each_workers_rank():
    """The deepspeed launcher prints worker output unprefixed; DeepSpeed's log_dist names rank 0
    ("[Rank 0] ..."), its launcher lines none; every line has a time of its own or its file's."""
    recs = records(REAL / "deepspeed-zero2-launcher-sigkill-mid-save" / "logs" / "attempt-1")
    ranked = recs.filter(pl.col("rank").is_not_null())
    assert ranked.height and set(ranked["rank"].to_list()) == {0}
    assert ranked["line"].str.contains("[Rank 0]", literal=True).all()
    assert recs["ts_source"].value_counts().filter(pl.col("ts_source") == "mtime").is_empty()


def test_the_users_path_template_wins_over_prefixes(tmp_path):
    from ckptwatch.ingest.layout import compile_template

    d = tmp_path / "llama-9" / "gpu-3"
    d.mkdir(parents=True)
    (d / "rank3.log").write_text("[default1]:2026-11-30 10:00:00,000 [rank1] saving checkpoint step 40 to /c\n"
                                 "node-x: 2026-11-30 10:00:01,000 step 41\n")
    recs = records(tmp_path, template=compile_template("{job}/{host}/rank{rank}.log"))
    assert recs.select("job", "host", "rank").rows() == [("llama-9", "gpu-3", 3)] * 2


def test_run_says_each_labelling_gap_once(tmp_path):
    import subprocess
    import sys

    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "a.log").write_text("2026-11-30 10:05:00,000 INFO train: saving checkpoint step 40 to /ckpt/step_40\n")
    (logs / "b.log").write_text("2026-11-30 10:05:00,000 INFO train: saving checkpoint step 40 to /ckpt/step_40\n")
    r = subprocess.run([sys.executable, "-m", "ckptwatch", "run", "--logs", str(logs), "--db", str(tmp_path / "x.duckdb"),
                        "--once"], capture_output=True, text=True)
    assert r.stderr.count("carry no job") == 1, r.stderr
