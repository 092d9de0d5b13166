"""``diagnose`` concludes a job as soon as every file its path names is read, and lets its
lines go (Detector.conclude): memory holds the jobs still being read, and the incidents are
those of a run that keeps every job to the end."""

from __future__ import annotations

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
