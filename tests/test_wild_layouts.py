"""Layouts a new user's own logs had (tests/fixtures/wild/README.md), each once a missed or
misplaced incident: srun's padded task labels, a Slurm file whose labels start after an
unlabelled banner (read whole, or live), interleaved ``[rankN]:`` tracebacks in one console,
a rank log whose tail a crash left as NUL bytes, and compressed archives `run` leaves alone."""

from __future__ import annotations

import datetime as dt
import gzip
import io
import shutil
from pathlib import Path

import pytest

from ckptwatch.ingest.layout import compile_template, labels_for
from ckptwatch.ingest.reader import looks_binary
from ckptwatch.ingest.watcher import SourceWatcher
from ckptwatch.pipeline import PipelineOptions, diagnose

WILD = Path(__file__).parent / "fixtures" / "wild"
T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.timezone.utc)


def only(incidents):
    assert len(incidents) == 1, [(i.kind, i.step) for i in incidents]
    return incidents[0].to_dict()


def test_srun_labels_padded_to_the_widest_task_id_are_read():
    inc = only(diagnose([str(WILD / "srun-label-padded.out")])[0])
    assert (inc["kind"], inc["step"], inc["last_good_checkpoint"]["step"]) == ("interrupted_save", 1000, 500)
    # Slurm's time limit is a job-wide signal: it names no rank (before Lightning's stated world
    # size, MEMBER: i/12, was read, the rank-less save's rank 0 was named)
    assert inc["root_cause"]["rank"] is None and "TIME LIMIT" in inc["root_cause"]["line"]


@pytest.mark.parametrize("preamble", [0, 600, 2000])
def test_srun_labels_after_an_unlabelled_banner_are_read(tmp_path, preamble):
    """The labels start after the batch script's banner (and, here, 600 or 2,000 lines of ``pip
    freeze``: with 2,000 the file is over 32 KB and read in bulk, so the labels are looked for
    in a Series, not a list)."""
    freeze = "".join(f"package{i}==1.{i}.0\n" for i in range(preamble))
    text = (WILD / "srun-banner.txt").read_text() + freeze + (WILD / "srun-label-body.txt").read_text()
    (tmp_path / "slurm-8001.out").write_text(text)
    inc = only(diagnose([str(tmp_path)])[0])
    assert (inc["kind"], inc["step"], inc["root_cause"]["rank"], inc["last_good_checkpoint"]["step"]) == (
        "interrupted_save", 200, 2, 100)
    assert inc["checkpoint_state"]["finished"] == [0, 1, 3]


def test_srun_labels_that_start_after_the_first_poll_are_read_live(tmp_path):
    log = tmp_path / "slurm-8001.out"
    log.write_text((WILD / "srun-banner.txt").read_text())
    w = SourceWatcher([str(tmp_path)], flush_after=0)
    first = w.poll(now=T0)
    assert first.height == 3 and first["rank"].null_count() == 3
    with log.open("a") as f:
        f.write((WILD / "srun-label-body.txt").read_text())
    later = w.poll(now=T0 + dt.timedelta(seconds=1))
    w.close()
    saves = later.filter(later["line"].str.contains("saving checkpoint at iteration     200"))
    assert sorted(saves["rank"].to_list()) == [0, 1, 2, 3]
    assert not saves["line"].str.starts_with("0: ").any()  # the label is taken off the text


def test_interleaved_rank_tracebacks_stay_apart():
    inc = only(diagnose([str(WILD / "rank-tracebacks-interleaved.log")])[0])
    assert inc["kind"] == "storage_failure_during_save" and inc["step"] == 400
    assert inc["root_cause"]["rank"] == 1 and "No space left on device" in inc["root_cause"]["line"]
    w = SourceWatcher([str(WILD / "rank-tracebacks-interleaved.log")], flush_after=0)
    records = w.poll(final=True, now=T0)
    w.close()
    tracebacks = records.filter(records["line"].str.starts_with("Traceback"))
    assert sorted(tracebacks["rank"].to_list()) == [1, 3]
    by_rank = dict(zip(tracebacks["rank"].to_list(), tracebacks["line"].to_list(), strict=True))
    assert "OSError: [Errno 28]" in by_rank[1] and "DistBackendError" not in by_rank[1]
    assert "DistBackendError" in by_rank[3] and "torch.save" not in by_rank[3]


@pytest.mark.parametrize(("head", "binary"), [
    (b"2026-03-01 12:00:00 INFO step 1\nSaving checkpoint\n" + b"\x00" * 4096, False),  # a crash's NUL tail
    (b"\x00" * 5000 + b"step 1\nstep 2\n", False),  # copytruncate without O_APPEND: a hole, then lines
    ("caf\u00e9\nstep 2 na\u00ef".encode()[:-1] + b"\x00\x00", False),  # a character cut by the NULs
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", True),
    (b"PK\x03\x04\x14\x00\x00\x00", True),  # a .pt / zip
    (b"\x7fELF\x02\x01\x01\x00", True),
    (b"\x00" * 100, True),
    (b"no newline before the NUL\x00", True),
    (b"\x00\x01binary", True),
])
def test_a_nul_tail_or_hole_is_a_log_and_binary_data_is_not(head, binary):
    assert looks_binary(io.BytesIO(head)) is binary


def test_a_rank_log_with_a_nul_tail_is_read(tmp_path):
    """A node crashed in the save of step 200: rank 1's log ends in NULs. Its save start is read
    (it was skipped whole as binary): the save of step 200 is open, rank 1's part of it too."""
    job = tmp_path / "jobE"
    job.mkdir()
    for r in range(2):
        text = ("2026-03-01 12:00:00,000 INFO step 100/1000 loss=1.0\n"
                "2026-03-01 12:00:00,100 INFO Saving checkpoint at step 100 to /ckpt/jobE/step_100\n"
                "2026-03-01 12:00:01,000 INFO Checkpoint saved to /ckpt/jobE/step_100\n"
                "2026-03-01 12:01:00,000 INFO step 200/1000 loss=0.9\n"
                "2026-03-01 12:01:00,100 INFO Saving checkpoint at step 200 to /ckpt/jobE/step_200\n")
        tail = b"\x00" * 4096 if r == 1 else b"2026-03-01 12:01:01,000 INFO Checkpoint saved to /ckpt/jobE/step_200\n"
        (job / f"rank{r}.log").write_bytes(text.encode() + tail)
    incidents, stats = diagnose([str(tmp_path)], PipelineOptions(template=compile_template("{job}/rank{rank}.log")))
    assert not stats.errors and stats.files == 2
    assert [(j, s) for j, s, _ in stats.open_saves] == [("jobE", 200)]


def test_run_names_the_compressed_logs_it_leaves_alone(tmp_path):
    shutil.copy(WILD / "rank-tracebacks-interleaved.log", tmp_path / "console.log")
    with gzip.open(tmp_path / "console.log.1.gz", "wt") as f:
        f.write("an earlier console, rotated and compressed\n")
    live = SourceWatcher([str(tmp_path)], flush_after=0)
    live.poll(final=True, now=T0)
    live.close()
    assert live.stats.archives_left == [str(tmp_path / "console.log.1.gz")]
    warning = live.stats.label_warning_items()["archives"]
    assert warning.startswith("1 compressed log(s) not read (e.g. ") and "ckptwatch diagnose" in warning
    once = SourceWatcher([str(tmp_path)], flush_after=0, archives=True)  # diagnose reads them
    once.poll(final=True, now=T0)
    once.close()
    assert once.stats.archives_left == [] and once.stats.files == 2


@pytest.mark.parametrize(("oom_at", "cause"), [("12:02:01", "signal"), ("12:01:12", "oom_kill")])
def test_an_oom_kill_after_the_step_was_cancelled_is_not_its_cause(tmp_path, oom_at, cause):
    """srun's ``task 2: Killed`` carries no time (it has the line before's, 12:01:12.1); the
    next dated line of its file, slurmstepd's ``CANCELLED AT 12:01:13``, bounds it. An OOM kill
    on its node at 12:02:01 came after: another job's. One at 12:01:12 is its cause."""
    (tmp_path / "slurm-8001.out").write_text((WILD / "srun-banner.txt").read_text()
                                             + (WILD / "srun-label-body.txt").read_text())
    kern = (WILD / "kern-oom-of-another-job.log").read_text().replace("12:02:01", oom_at)
    (tmp_path / "kern.log").write_text(kern)
    inc = only(diagnose([str(tmp_path)])[0])
    assert (inc["kind"], inc["step"], inc["root_cause"]["class"], inc["root_cause"]["rank"]) == (
        "interrupted_save", 200, cause, 2)


@pytest.mark.parametrize(("path", "rank"), [
    ("a/rank0.log", 0), ("a/rank_3.out", 3), ("x/train-rank-12.txt", 12), ("x/rank1.log.1", 1),
    ("x/rank1.log-20261130.gz", 1), ("x/frank3.log", None), ("x/worker3.log", None), ("x/console.log", None),
])
def test_a_file_named_after_its_rank_is_that_ranks(path, rank):
    assert labels_for(path).rank == rank


def test_a_template_matches_a_rotated_copy_of_its_file():
    labels = labels_for("logs/jobC/rank1.log.1", compile_template("{job}/rank{rank}.log"))
    assert (labels.job, labels.rank) == ("jobC", 1)


def test_rank_files_without_a_template():
    """rank_0.out and rank_2.out: both finished step 250; rank 2's rank-less ENOSPC traceback
    broke the save of step 500. One incident (there was a false one for step 250)."""
    inc = only(diagnose([str(WILD / "deepspeed-rank-files")])[0])
    assert (inc["kind"], inc["step"], inc["root_cause"]["rank"], inc["last_good_checkpoint"]["step"]) == (
        "storage_failure_during_save", 500, 2, 250)


@pytest.mark.parametrize("template", [None, "{job}/rank{rank}.log"])
def test_a_copytruncate_copy_is_its_ranks(template):
    options = PipelineOptions(template=compile_template(template) if template else None)
    inc = only(diagnose([str(WILD / "copytruncate")], options)[0])
    assert (inc["kind"], inc["job"], inc["step"], inc["root_cause"]["rank"]) == (
        "storage_failure_during_save", "jobC" if template else "copytruncate", 200, 1)  # no template: the directory's name
    assert inc["checkpoint_state"]["finished"] == [0]


@pytest.mark.parametrize(("path", "pod"), [
    ("/var/log/pods/ml_trainer-0_0b1c2d3e-aaaa-bbbb-cccc-0123456789ab/trainer/0.log", "trainer-0"),
    ("/var/log/containers/trainer-0_ml_trainer-3f9c.log", "trainer-0"),
    ("logs/jobK-worker-1.log", "jobK-worker-1"),
    ("logs/my_job.log", None),
])
def test_a_pods_log_names_its_pod_as_host(path, pod):
    assert labels_for(path).host == pod


def test_two_pods_identical_lines_are_two_workers_lines():
    """Without a template the pods' identical lines were taken for one line read twice, and
    worker 1's failed save for worker 0's finished one."""
    _, stats = diagnose([str(WILD / "k8s-pods")])
    assert stats.duplicate_events == 0 and stats.events == 12
    inc = only(diagnose([str(WILD / "k8s-pods")],
                        PipelineOptions(template=compile_template("{job}-worker-{rank}.log")))[0])
    assert (inc["kind"], inc["job"], inc["step"], inc["root_cause"]["rank"]) == (
        "storage_failure_during_save", "jobK", 200, 1)


def test_a_local_rank_on_a_paste_of_the_second_node_is_that_nodes_rank(tmp_path):
    """Only node1's console was pasted: its ranks are 4-7, so the agent's local rank 1 is rank 5
    (it was taken for rank 1, a false collateral on a node not in the paste)."""
    inc = only(diagnose([str(WILD / "second-node-paste.log")])[0])
    assert (inc["kind"], inc["step"], inc["root_cause"]["rank"]) == ("storage_failure_during_save", 300, 5)
    assert inc["collateral"] == [4, 6, 7]
    timeline_ranks = {e["rank"] for e in inc["evidence"]}
    assert 1 not in timeline_ranks and 5 in timeline_ranks


def test_a_rendezvous_result_split_across_two_polls_still_maps_the_ranks(tmp_path):
    log = tmp_path / "node1.log"
    log.write_text((WILD / "torchrun-node1-part1.txt").read_text())
    w = SourceWatcher([str(tmp_path)], flush_after=0)
    w.poll(now=T0)
    with log.open("a") as f:
        f.write((WILD / "torchrun-node1-part2.txt").read_text())
    later = w.poll(final=True, now=T0 + dt.timedelta(seconds=1))
    w.close()
    saves = later.filter(later["line"].str.contains("Saving checkpoint at step 300"))
    assert sorted(zip(saves["local_rank"].to_list(), saves["rank"].to_list())) == [(0, 4), (1, 5), (2, 6), (3, 7)]


def test_a_new_file_after_a_rename_rotation_keeps_the_job_and_rank_map(tmp_path):
    """torchrun names its run id and the node's ranks once, at the top of its console: after
    logrotate renamed node1.log to node1.log.1, the new node1.log's lines are still job-nccl's
    and its local rank 1 is still rank 5 (they were job 'unknown', local rank as rank)."""
    text = (WILD / "torchrun-node1-part1.txt").read_text() + (WILD / "torchrun-node1-part2.txt").read_text()
    lines = text.splitlines(keepends=True)
    cut = next(i for i, x in enumerate(lines) if "step 300/1000" in x)
    log = tmp_path / "node1.log"
    log.write_text("".join(lines[:cut]))
    w = SourceWatcher([str(tmp_path)], flush_after=0)
    first = w.poll(now=T0)
    assert set(first["job"].drop_nulls()) == {"job-nccl"}
    log.rename(tmp_path / "node1.log.1")
    log.write_text("".join(lines[cut:]))
    later = w.poll(final=True, now=T0 + dt.timedelta(seconds=1))
    w.close()
    new = later.filter(later["file"] == str(log))
    assert new.height > 10 and new["job"].to_list() == ["job-nccl"] * new.height
    saves = new.filter(new["line"].str.contains("Saving checkpoint at step 300"))
    assert sorted(saves["rank"].to_list()) == [4, 5, 6, 7]


def test_a_rotated_family_first_read_in_one_poll_shares_the_job(tmp_path):
    """Both generations already there at the first poll (rotated between two polls of a busy
    watcher): the new node1.log, read in the same poll as node1.log.1 that names the job,
    is job-nccl's too."""
    text = (WILD / "torchrun-node1-part1.txt").read_text() + (WILD / "torchrun-node1-part2.txt").read_text()
    lines = text.splitlines(keepends=True)
    cut = next(i for i, x in enumerate(lines) if "step 300/1000" in x)
    (tmp_path / "node1.log.1").write_text("".join(lines[:cut]))
    (tmp_path / "node1.log").write_text("".join(lines[cut:]))
    w = SourceWatcher([str(tmp_path)], flush_after=0)
    records = w.poll(final=True, now=T0)
    w.close()
    new = records.filter(records["file"] == str(tmp_path / "node1.log"))
    assert new.height > 10 and set(new["job"].to_list()) == {"job-nccl"}
    assert sorted(w.stats.errors) == []


def test_padded_srun_labels_are_never_glued_as_terminal_wraps():
    """Rank 15's iteration lines are all one width, as a terminal's hard wrap would be; a
    line that starts with a padded label (`` 0: saving …``) is a record of its own."""
    inc = only(diagnose([str(WILD / "srun-16-tasks-fixed-width.out")])[0])
    assert (inc["kind"], inc["step"], inc["last_good_checkpoint"]["step"]) == ("interrupted_save", 200, 100)
    assert inc["checkpoint_state"]["started_not_finished"] == [0]
    assert "TIME LIMIT" in inc["root_cause"]["line"]


def test_a_checkpoint_saved_as_a_file_per_rank_is_named_by_its_directory():
    inc = only(diagnose([str(WILD / "per-rank-torch-save.log")])[0])
    assert (inc["kind"], inc["step"], inc["checkpoint_path"]) == ("storage_failure_during_save", 300, "/ckpt/step_300")
    assert inc["last_good_checkpoint"]["path"] == "/ckpt/step_100"
    assert inc["root_cause"]["rank"] == 1


@pytest.mark.parametrize(("name", "rank"), [("dcp-save-traceback-only.log", 1), ("torch-save-traceback-only.log", 1)])
def test_a_pasted_save_traceback_alone_is_a_failed_save_of_unknown_step(name, rank):
    """No step, path or time anywhere: still the storage failure of a save (DCP's coordinator,
    rank 0, reports the rank its exception names), its step reported as unknown."""
    inc = only(diagnose([str(WILD / name)])[0])
    assert (inc["kind"], inc["step"], inc["checkpoint_path"]) == ("storage_failure_during_save", None, None)
    assert inc["root_cause"]["rank"] == rank and "No space left on device" in inc["root_cause"]["line"]
    assert "its step and path were not logged" in inc["remediation"]


def test_kubectl_logs_prefix_names_the_pod_as_host():
    """Without reading the ``[pod/NAME/CONTAINER] `` prefix, the worker pod's ``local_rank: 0``
    was rank 0 and rank 0's collective timeout the root cause."""
    inc = only(diagnose([str(WILD / "kubectl-logs-prefix.log")])[0])
    assert (inc["kind"], inc["step"], inc["last_good_checkpoint"]["step"]) == ("interrupted_save", 2000, 1000)
    rc = inc["root_cause"]
    assert (rc["class"], rc["signal"], rc["rank"], rc["host"]) == ("signal", "SIGKILL", 1, "bert-ft-worker-0")
    assert inc["collateral"] == [0]


def test_a_schedulers_cancel_is_no_ranks_fault():
    """Every rank receives Slurm's SIGTERM; the first to say so was named the root rank."""
    inc = only(diagnose([str(WILD / "lightning-preempted-paste.log")])[0])
    assert (inc["kind"], inc["step"], inc["last_good_checkpoint"]["step"]) == ("interrupted_save", 1250, 1000)
    rc = inc["root_cause"]
    assert (rc["class"], rc["signal"], rc["rank"], rc["host"]) == ("signal", "SIGTERM", None, "gpu-b03")
    assert "PREEMPTION" in rc["line"] and inc["collateral"] == [0, 1]
