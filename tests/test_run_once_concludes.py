"""``run --once`` concludes a job as soon as every file its path names is read, as
``diagnose`` does: the detector holds the jobs still being read, the stored incidents are
those of a run that keeps every job to the end, and lines that reach a concluded job make
the run judge every stored event again."""

from __future__ import annotations

from test_conclude import kernel_log_under_the_later_job, victim_then_next

from ckptwatch.detectors.runner import Detector
from ckptwatch.embedded import EmbeddedRunner
from ckptwatch.ingest.layout import compile_template
from ckptwatch.ingest.watcher import SourceWatcher
from ckptwatch.pipeline import PipelineOptions, diagnose
from ckptwatch.simulate import FleetSpec, generate, score


def run_once(logs, db, options, monkeypatch, *, concluding: bool) -> tuple[list[dict], list[int], EmbeddedRunner]:
    """The stored incidents (dicts without their detection time), ordered, the lines the
    detector held after each batch, and the runner (its store closed)."""
    held: list[int] = []
    process = Detector.process_frame

    def counted(self, events, **kw):
        process(self, events, **kw)
        held.append(sum(len(j.events) + len(j.progress) for j in self.jobs.values()))

    with monkeypatch.context() as m:
        m.setattr(Detector, "process_frame", counted)
        if not concluding:
            m.setattr(SourceWatcher, "jobs_read", lambda self: None)
        runner = EmbeddedRunner(str(logs), str(db), options)
        try:
            runner.run(once=True)
            stored = runner.store.con.execute(
                "SELECT kind, job, step, status, root_cause_class, root_rank, checkpoint_state FROM incidents "
                "ORDER BY job, kind, step").fetchall()
            tombstones, _ = runner.store.released()
        finally:
            runner.close()
    assert tombstones == []  # a concluded job is not released for good: a restart replays it
    return [dict(zip(("kind", "job", "step", "status", "class", "rank", "state"), row, strict=True))
            for row in stored], held, runner


def test_a_fleet_stored_job_by_job_holds_few_jobs_and_stores_the_same_incidents(tmp_path, monkeypatch):
    truth = generate(tmp_path, FleetSpec(jobs=12, nodes_per_job=2, ranks_per_node=4, failures=0.5, seed=4,
                                         layout="rank-files", steps=90, save_every=30))
    options = PipelineOptions(template=compile_template(truth["template"]), poll_bytes=64 << 10)
    kept, held_all, _ = run_once(tmp_path / "logs", tmp_path / "kept.duckdb", options, monkeypatch, concluding=False)
    found, held, runner = run_once(tmp_path / "logs", tmp_path / "found.duckdb", options, monkeypatch,
                                   concluding=True)
    assert found == kept
    # one first taken for an interrupted save, then superseded by the storage failure under it
    assert sorted(i["status"] for i in found) == ["open"] * 6 + ["superseded"]
    found = [i for i in found if i["status"] == "open"]
    assert runner.detector.stats.after_conclusion == 0 and "judged_again_unconcluded" not in runner.stats.notes
    # every injected failure, with its cause and rank, as diagnose finds them
    shaped = [{"kind": i["kind"], "job": i["job"], "step": i["step"],
               "root_cause": {"class": i["class"], "rank": i["rank"]}} for i in found]
    result = score(truth, shaped)
    assert (result["injected"], result["exact"], result["false"], result["clean_with_incident"]) == (6, 6, 0, 0)
    assert sorted((i["job"], i["kind"], i["step"]) for i in found) == sorted(
        (i.job, i.kind, i.step) for i in diagnose([str(tmp_path / "logs")], options)[0])
    # one job or two held at a time, not all twelve
    assert max(held) * 4 < max(held_all), (max(held), max(held_all))


def test_lines_that_reach_a_concluded_job_make_run_once_judge_again(tmp_path, monkeypatch):
    logs = tmp_path / "logs"
    kernel_log_under_the_later_job(logs)
    options = PipelineOptions(template=compile_template("{job}/{host}/*"), poll_bytes=8 << 10)
    kept, _, _ = run_once(logs, tmp_path / "kept.duckdb", options, monkeypatch, concluding=False)
    found, _, runner = run_once(logs, tmp_path / "found.duckdb", options, monkeypatch, concluding=True)
    assert [(i["kind"], i["job"], i["step"], i["status"], i["class"], i["rank"]) for i in found] == [
        ("interrupted_save", "a-victim", 300, "open", "oom_kill", 2)]
    assert found == kept
    assert runner.stats.notes["judged_again_unconcluded"] > 0


def test_run_once_pages_an_incident_once_as_it_ends_not_as_first_judged(tmp_path):
    """A job concluded, its save judged interrupted; then a line filed under a later job
    shows that save finished on the rank. Judged again, the incident is withdrawn; alerts
    wait for the end of ``run --once``, so nothing is paged for it (a page and its
    withdrawal before)."""
    import io
    import json

    from rich.console import Console

    from ckptwatch.config import AlertSettings
    from ckptwatch.sinks.alerts.setup import alerter_from_config

    logs = tmp_path / "logs"
    victim_then_next(logs)
    (logs / "z-next" / "h-1" / "zz.log").write_text(json.dumps(
        {"time": "2026-11-30T10:05:00.500Z", "job": "a-victim", "rank": 2,
         "msg": "successfully saved checkpoint from iteration      300 to /ckpt/it_300"}) + "\n")
    options = PipelineOptions(template=compile_template("{job}/{host}/*"), poll_bytes=8 << 10)
    assert diagnose([str(logs)], options)[0] == []
    db = str(tmp_path / "x.duckdb")
    out = io.StringIO()
    runner = EmbeddedRunner(str(logs), db, options, alerter=lambda store, metrics: alerter_from_config(
        AlertSettings(), store, db_path=db, console=Console(file=out, width=200)))
    try:
        runner.run(once=True, drain=10)
        rows = runner.store.con.execute(
            "SELECT kind, job, step, status, checkpoint_state->>'withdrawn' IS NOT NULL FROM incidents").fetchall()
        alerts = runner.store.con.execute("SELECT action, status FROM alerts").fetchall()
    finally:
        runner.close()
    assert runner.stats.notes["judged_again_unconcluded"] > 0
    assert rows == [("interrupted_save", "a-victim", 300, "superseded", True)]
    assert alerts == [] and out.getvalue() == ""
