"""``ckptwatch simulate``: a fleet's logs in the corpus formats with injected failures, and
their ground truth. Every injected failure is diagnosed with its cause and rank, by
``diagnose`` and by ``run --once``, in both layouts; clean jobs give nothing."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest

from ckptwatch.pipeline import PipelineOptions, diagnose
from ckptwatch.ingest.layout import compile_template
from ckptwatch.simulate import FAILURES, RANK_FILES_TEMPLATE, FleetSpec, generate, score
from ckptwatch.sinks.duckdb_store import read_incidents


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ckptwatch", *args], capture_output=True, text=True, timeout=300)


def test_diagnose_finds_every_injected_failure_with_cause_and_rank(tmp_path):
    truth = generate(tmp_path, FleetSpec(jobs=9, failures=2 / 3, seed=11, steps=90, save_every=30))
    injected = [j["failure"]["kind"] for j in truth["jobs"].values() if j["failure"]]
    assert len(injected) == 6 and set(injected) == set(FAILURES)  # every kind, not one lucky one
    incidents, stats = diagnose([str(tmp_path / "logs")])
    assert stats.errors == []
    result = score(truth, [i.to_dict() for i in incidents])
    assert (result["injected"], result["exact"], result["false"]) == (6, 6, 0), result
    assert (result["clean_jobs"], result["clean_with_incident"]) == (3, 0)


def test_rank_files_layout_through_run_once(tmp_path):
    truth = generate(tmp_path, FleetSpec(jobs=6, nodes_per_job=3, ranks_per_node=4, failures=0.5, seed=4,
                                         layout="rank-files", steps=90, save_every=30))
    assert truth["template"] == RANK_FILES_TEMPLATE
    assert (tmp_path / "logs" / "sim-4-0000" / "sim-4-0000-n02" / "rank11.log").exists()
    db = tmp_path / "fleet.duckdb"
    r = cli("run", "--logs", str(tmp_path / "logs"), "--db", str(db), "--once", "--path-template", truth["template"])
    assert r.returncode == 0, r.stderr
    result = score(truth, read_incidents(db))
    assert (result["injected"], result["exact"], result["false"], result["clean_with_incident"]) == (3, 3, 0, 0), result
    # and the same through diagnose with the template
    incidents, _ = diagnose([str(tmp_path / "logs")], PipelineOptions(template=compile_template(truth["template"])))
    assert score(truth, [i.to_dict() for i in incidents])["exact"] == 3


def test_the_same_seed_writes_the_same_fleet(tmp_path):
    def digest(root):
        return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(root.rglob("*")) if p.is_file()}

    spec = FleetSpec(jobs=3, failures=1.0, seed=8)
    generate(tmp_path / "a", spec)
    generate(tmp_path / "b", spec)
    assert digest(tmp_path / "a") == digest(tmp_path / "b")
    generate(tmp_path / "c", FleetSpec(jobs=3, failures=1.0, seed=9))
    assert digest(tmp_path / "c") != digest(tmp_path / "a")


def test_cli_writes_scores_and_names_bad_input(tmp_path):
    out = tmp_path / "fleet"
    r = cli("simulate", str(out), "--jobs", "4", "--failures", "0.5", "--seed", "2", "--steps", "90",
            "--save-every", "30")
    assert r.returncode == 0, r.stderr
    assert "4 jobs x 2 nodes x 8 ranks" in r.stdout and "2 injected failures" in r.stdout
    d = cli("diagnose", "--json", str(out / "logs"))
    assert d.returncode == 1  # incidents found
    (tmp_path / "d.json").write_text(d.stdout)
    ok = cli("simulate", str(out), "--score", str(tmp_path / "d.json"))
    assert ok.returncode == 0 and "injected 2: found 2, with the right cause and rank 2; false incidents 0" in ok.stdout
    diagnosis = json.loads(d.stdout)
    diagnosis["incidents"] = diagnosis["incidents"][1:]  # one missed
    (tmp_path / "short.json").write_text(json.dumps(diagnosis))
    short = cli("simulate", str(out), "--score", str(tmp_path / "short.json"))
    assert short.returncode == 1 and "found 1" in short.stdout and "missed: " in short.stdout


@pytest.mark.parametrize("args, message", [
    (["--kind", "meteor"], "unknown failure kind(s) meteor; known: sigkill, oom, enospc"),
    (["--failures", "1.5"], "failures must be a share between 0 and 1, not 1.5"),
    (["--steps", "50", "--save-every", "40"], "steps (50) must cover at least 3 saves of every 40 iterations "
                                              "(the first save is never the failing one: a good checkpoint exists)"),
    (["--save-every", "0"], "save_every must be at least 2 iterations, not 0"),
    (["--seed", "-5"], "seed must be 0 or more, not -5"),
    (["--layout", "flat"], "layout must be console or rank-files, not 'flat'"),
])
def test_a_bad_spec_is_one_line_and_exit_2(tmp_path, args, message):
    r = cli("simulate", str(tmp_path / "x"), *args)
    assert r.returncode == 2 and r.stderr.strip() == f"error: {message}" and "Traceback" not in r.stderr
    assert not (tmp_path / "x").exists()


def test_a_directory_holding_a_fleet_is_refused_not_mixed(tmp_path):
    assert cli("simulate", str(tmp_path), "--jobs", "2").returncode == 0
    before = (tmp_path / "truth.json").read_text()
    again = cli("simulate", str(tmp_path), "--jobs", "3", "--seed", "2")
    assert again.returncode == 2 and again.stderr.strip() == (
        f"error: {tmp_path / 'logs'} already holds logs (another fleet?): simulate into a new or empty directory")
    assert (tmp_path / "truth.json").read_text() == before


@pytest.mark.parametrize("content, message", [
    ("[1, 2]", "incident 0 is not an incident object with a kind (diagnose --json writes them)"),
    ('{"stats": {}}', "not a diagnose --json output (no incidents list)"),
    ("", "not JSON (a diagnose --json output): Expecting value: line 1 column 1 (char 0)"),
    ('{"incidents": [{"kind": "interrupted_save", "job": "elsewhere-0001", "step": 40}]}',
     "no job of the diagnosis is in the truth: the diagnosis of another fleet?"),
])
def test_score_names_a_file_that_is_not_this_fleets_diagnosis(tmp_path, content, message):
    assert cli("simulate", str(tmp_path / "f"), "--jobs", "2").returncode == 0
    (tmp_path / "d.json").write_text(content)
    r = cli("simulate", str(tmp_path / "f"), "--score", str(tmp_path / "d.json"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip() == f"error: {tmp_path / 'd.json'}: {message}"


def test_the_logs_read_in_order_a_save_after_its_iteration(tmp_path):
    generate(tmp_path, FleetSpec(jobs=1, nodes_per_job=1, ranks_per_node=1, failures=1.0, seed=3))
    lines = (tmp_path / "logs" / "sim-3-0000" / "sim-3-0000-n00" / "console.log").read_text().splitlines()
    saves = [i for i, line in enumerate(lines) if "saving checkpoint at iteration" in line]
    assert saves and all("iteration " in lines[i - 1] and "/" in lines[i - 1] for i in saves)
    assert "  <NO_OTHER_FAILURES>" in lines  # one rank: torchrun lists no other failure
    assert not any("NCCL INFO Channel" in line for line in lines)  # no peer to talk to
