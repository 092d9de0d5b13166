"""``diagnose`` concludes a job as soon as every file its path names is read, and lets its
lines go (Detector.conclude): memory holds the jobs still being read, and the incidents are
those of a run that keeps every job to the end."""

from __future__ import annotations

import json

import pytest
from conftest import CORPUS, SCENARIOS

from ckptwatch.detectors.runner import Detector
from ckptwatch.ingest.layout import compile_template
from ckptwatch.ingest.watcher import SourceWatcher
from ckptwatch.pipeline import PipelineOptions, diagnose
from ckptwatch.simulate import FleetSpec, generate, score


def run(paths, options: PipelineOptions, monkeypatch, *, concluding: bool) -> tuple[list[dict], list[int], list]:
    """Incidents (dicts without detected_ts), the lines (events and progress lines) the
    detector held after each batch, and the open saves reported."""
    held: list[int] = []
    process = Detector.process_frame

    def counted(self, events, **kw):
        process(self, events, **kw)
        held.append(sum(len(j.events) + len(j.progress) for j in self.jobs.values()))

    with monkeypatch.context() as m:
        m.setattr(Detector, "process_frame", counted)
        if not concluding:
            m.setattr(SourceWatcher, "jobs_read", lambda self: None)
        incidents, stats = diagnose(paths, options)
    out = sorted(({k: v for k, v in i.to_dict().items() if k != "detected_ts"} for i in incidents),
                 key=lambda d: (d["job"], d["kind"], str(d["step"])))
    return out, held, stats.open_saves


def test_a_fleet_read_job_by_job_holds_few_jobs_and_finds_the_same_incidents(tmp_path, monkeypatch):
    truth = generate(tmp_path, FleetSpec(jobs=12, nodes_per_job=2, ranks_per_node=4, failures=0.5, seed=4,
                                         layout="rank-files", steps=90, save_every=30))
    options = PipelineOptions(template=compile_template(truth["template"]), poll_bytes=64 << 10)
    logs = [str(tmp_path / "logs")]
    kept, held_all, open_all = run(logs, options, monkeypatch, concluding=False)
    found, held, open_saves = run(logs, options, monkeypatch, concluding=True)
    assert found == kept and open_saves == open_all
    result = score(truth, found)
    assert (result["injected"], result["exact"], result["false"], result["clean_with_incident"]) == (6, 6, 0, 0)
    # the agents' consoles (their paths name no job) are read first, then the jobs' rank files
    # one job after another: a job or two held at a time, not all twelve
    assert max(held) * 4 < max(held_all), (max(held), max(held_all))
    assert held[-1] * 5 < held_all[-1], (held[-1], held_all[-1])


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_corpus_scenarios_give_the_same_incidents_concluding_jobs_early(scenario, monkeypatch):
    # consoles that name no job by their path are read first; resumed runs wait for the end
    options = PipelineOptions(poll_bytes=16 << 10)
    logs = [str(CORPUS / scenario / "logs")]
    kept, _, open_all = run(logs, options, monkeypatch, concluding=False)
    found, _, open_saves = run(logs, options, monkeypatch, concluding=True)
    assert found == kept and open_saves == open_all


def test_the_one_named_job_is_not_concluded_while_lines_that_name_none_may_be_folded_into_it(tmp_path, monkeypatch):
    job = tmp_path / "logs" / "job-7" / "node0"
    job.mkdir(parents=True)
    for rank in range(2):
        (job / f"rank{rank}.log").write_text("".join(
            f"[2026-11-30 10:00:{s:02d}] [INFO] saving checkpoint at iteration {s:8d} to /ckpt/it_{s} in torch format\n"
            f"[2026-11-30 10:00:{s:02d}] [INFO] successfully saved checkpoint from iteration {s:8d} to /ckpt/it_{s}\n"
            for s in (10, 20)) + "[2026-11-30 10:00:30] [INFO] saving checkpoint at iteration       30 to /ckpt/it_30 "
                                 "in torch format\n")
    # the launcher's log, beside the job's directory, names no job: diagnose folds it into job-7
    (tmp_path / "logs" / "agent.log").write_text(
        "E1130 10:00:31.456000 1234 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -9) "
        "local_rank: 1 (pid: 4245) of binary: /usr/bin/python3\n")
    options = PipelineOptions(template=compile_template("{job}/{host}/rank{rank}.log"), poll_bytes=1)
    kept, held_kept, _ = run([str(tmp_path / "logs")], options, monkeypatch, concluding=False)
    found, held, _ = run([str(tmp_path / "logs")], options, monkeypatch, concluding=True)
    assert found == kept
    assert [(i["kind"], i["job"], i["step"]) for i in found] == [("interrupted_save", "job-7", 30)]
    assert held[-1] == held_kept[-1] > 0  # job-7's lines stay to the end


def _rank_file(path, steps, *, killed_at=None, job_field=None):
    """A Megatron-style rank log saving every 10 steps; with ``killed_at`` it stops in that
    save. ``job_field``: JSON lines whose ``job`` field names the job (not the path)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    out = []
    for step in range(1, steps + 1):
        ts = f"2026-11-30 10:{step // 60 % 60:02d}:{step % 60:02d}"
        texts = [f"iteration {step:8d}/ 10000 | lm loss: 2.5E+00 | grad norm: 1.0 |"]
        if step % 10 == 0:
            texts.append(f"saving checkpoint at iteration {step:8d} to /ckpt/{path.parent.parent.name}/it_{step} "
                         "in torch format")
            if step != killed_at:
                texts.append(f"successfully saved checkpoint from iteration {step:8d} to /ckpt/it_{step}")
        for text in texts:
            if job_field:
                out.append(json.dumps({"time": ts.replace(" ", "T") + "Z", "job": job_field, "msg": text}))
            else:  # torchrun --tee's rank prefix: the rank whatever the path template says
                out.append(f"[rank{path.stem.removeprefix('rank')}]:[{ts}] [INFO] {text}")
        if step == killed_at:
            break
    path.write_text("\n".join(out) + "\n")


def victim_then_next(logs) -> None:
    """Job ``a-victim`` (4 ranks; rank 2 killed, SIGKILL per its agent, in the save of step
    300), then job ``z-next`` (4 ranks, clean), both on host ``h-1``, read in that order."""
    for rank in range(4):
        _rank_file(logs / "a-victim" / "h-1" / f"rank{rank}.log", 300, killed_at=300 if rank == 2 else None)
    (logs / "a-victim" / "h-1" / "console.log").write_text(
        "E1130 10:05:01.456000 1234 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -9) "
        "local_rank: 2 (pid: 5002) of binary: /usr/bin/python3\n")
    for rank in range(4):
        _rank_file(logs / "z-next" / "h-1" / f"rank{rank}.log", 200)


def kernel_log_under_the_later_job(logs) -> None:
    """:func:`victim_then_next`, and the node's syslog collected with the later job's logs:
    the OOM kill of a-victim's rank 2, read after a-victim was concluded."""
    victim_then_next(logs)
    (logs / "z-next" / "h-1" / "syslog").write_text(
        "2026-11-30T10:05:00.300000+00:00 h-1 kernel: [12345.678901] Out of memory: Killed process 5002 (python3) "
        "total-vm:98765432kB, anon-rss:61234567kB, file-rss:102400kB, shmem-rss:8192kB, UID:0 pgtables:130000kB "
        "oom_score_adj:0\n")


def test_a_kernel_log_filed_under_a_later_job_is_read_again_into_the_job_it_concerns(tmp_path, monkeypatch):
    logs = tmp_path / "logs"
    kernel_log_under_the_later_job(logs)
    options = PipelineOptions(template=compile_template("{job}/{host}/*"), poll_bytes=8 << 10)
    kept, _, _ = run([str(logs)], options, monkeypatch, concluding=False)
    found, _, _ = run([str(logs)], options, monkeypatch, concluding=True)
    assert found == kept
    (inc,) = found
    assert (inc["kind"], inc["job"], inc["step"], inc["root_cause"]["class"]) == ("interrupted_save", "a-victim", 300,
                                                                             "oom_kill")
    _, stats = diagnose([str(logs)], options)
    assert stats.notes.get("read_again_unconcluded", 0) > 0


def test_a_job_whose_lines_name_it_in_another_jobs_directory_is_read_again_whole(tmp_path, monkeypatch):
    logs = tmp_path / "logs"
    for rank in range(4):  # the job's first node, under its own name
        _rank_file(logs / "run17" / "n00" / f"rank{rank}.log", 120, job_field="run17")
    for rank in range(4, 8):  # an unrelated job, read in between
        _rank_file(logs / "run17-a" / "n00" / f"rank{rank}.log", 300)
    for rank in range(4, 8):  # its second node, under another directory; rank 6 dies in the save of step 120
        _rank_file(logs / "run17-b" / "n01" / f"rank{rank}.log", 120, killed_at=120 if rank == 6 else None,
                   job_field="run17")
    options = PipelineOptions(template=compile_template("{job}/{host}/rank{rank}.log"), poll_bytes=8 << 10)
    kept, _, _ = run([str(logs)], options, monkeypatch, concluding=False)
    found, _, _ = run([str(logs)], options, monkeypatch, concluding=True)
    assert found == kept
    _, stats = diagnose([str(logs)], options)
    assert stats.notes.get("read_again_unconcluded", 0) > 0
