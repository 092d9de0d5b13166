"""Every corpus scenario with logs passes its expected.json in full: each expected incident
(every kind) is matched by a distinct incident with the ground truth's step, root-cause
class and rank (not torchrun's opinion), as many save incidents as expected, none of the
must_not kinds; clean runs give no incident at all."""

from __future__ import annotations

import json
import subprocess
import sys

import duckdb
import pytest

from ckptwatch.pipeline import diagnose
from conftest import CORPUS, SAVE_KINDS, SCENARIOS, expected, unmatched


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_diagnose_matches_ground_truth(scenario):
    exp = expected(scenario)
    incidents, stats = diagnose([str(CORPUS / scenario / "logs")])
    got = [i.to_dict() for i in incidents]
    assert stats.errors == []
    assert unmatched(exp["incidents"], got) == [], f"{scenario}: got {[(i['kind'], i['step']) for i in got]}"
    for kind in exp["must_not"]:
        assert kind not in {i["kind"] for i in got}, f"{scenario}: must not report {kind}"
    wanted_save = [w for w in exp["incidents"] if w["kind"] in SAVE_KINDS]
    assert len([i for i in got if i["kind"] in SAVE_KINDS]) == len(wanted_save)
    if not exp["incidents"]:
        assert got == []


def test_sigkill_incident_in_full():
    incidents, _ = diagnose([str(CORPUS / "02-sigkill-mid-save" / "logs")])
    (inc,) = [i.to_dict() for i in incidents if i.kind == "interrupted_save"]
    rc = inc["root_cause"]
    assert (inc["job"], inc["step"]) == ("job-0201-sigkill", 40)
    assert inc["checkpoint_path"] == "/tmp/corpus-work/02-sigkill-mid-save/checkpoints/iter_0000040"
    assert (rc["class"], rc["rank"], rc["pid"], rc["host"], rc["signal"]) == ("signal", 2, 5879, "vm", "SIGKILL")
    assert rc["ts"] == "2026-11-30T10:21:21.702000+00:00"
    assert "OOM killer is the usual sender of SIGKILL" in rc["note"]
    assert inc["collateral"] == [0, 1, 3]
    assert inc["checkpoint_state"]["started_not_finished"] == [0, 1, 2, 3]
    assert inc["last_good_checkpoint"] == {"step": 20,
                                           "path": "/tmp/corpus-work/02-sigkill-mid-save/checkpoints/iter_0000020"}
    assert "Resume from the last good checkpoint, step 20" in inc["remediation"]
    assert inc["severity"] == "critical"


def test_timeout_blames_the_silent_rank_not_torchruns_root_cause():
    incidents, _ = diagnose([str(CORPUS / "03-collective-timeout" / "logs")])
    (inc,) = [i.to_dict() for i in incidents if i.kind == "interrupted_save"]
    assert inc["root_cause"]["class"] == "collective_timeout"
    assert inc["root_cause"]["rank"] == 1  # torchrun's "Root Cause" says rank 0
    assert inc["root_cause"]["pid"] == 6921
    assert inc["collateral"] == [0, 2, 3]
    assert inc["last_good_checkpoint"]["step"] == 20


def test_incident_ids_are_deterministic():
    a, _ = diagnose([str(CORPUS / "02-sigkill-mid-save" / "logs")])
    b, _ = diagnose([str(CORPUS / "02-sigkill-mid-save" / "logs" / "attempt-1-train")])
    a = [i for i in a if i.job == "job-0201-sigkill"]  # the resume jobs are not in b
    assert [i.id for i in a] == [i.id for i in b]
    assert [i.fingerprint() for i in a] == [i.fingerprint() for i in b]


def test_cli_json_shape_and_exit_codes():
    out = subprocess.run([sys.executable, "-m", "ckptwatch", "diagnose", "--json",
                          str(CORPUS / "02-sigkill-mid-save" / "logs")], capture_output=True, text=True)
    assert out.returncode == 1, out.stderr
    doc = json.loads(out.stdout)
    assert [i["kind"] for i in doc["incidents"]] == ["interrupted_save", "poisoned_resume", "load_failure"]
    inc = doc["incidents"][0]
    assert set(inc) >= {"id", "kind", "severity", "job", "step", "checkpoint_path", "root_cause", "collateral",
                        "checkpoint_state", "last_good_checkpoint", "remediation", "evidence"}
    assert set(inc["root_cause"]) >= {"class", "rank", "host", "pid", "ts", "rule_id", "line"}
    assert doc["stats"]["lines"] == 1807 and doc["stats"]["files"] == 27
    clean = subprocess.run([sys.executable, "-m", "ckptwatch", "diagnose", str(CORPUS / "01-clean" / "logs")],
                           capture_output=True, text=True)
    assert clean.returncode == 0 and "No incident found" in clean.stdout


def test_run_once_writes_duckdb_and_rerun_adds_nothing(tmp_path):
    db = tmp_path / "i.duckdb"
    cmd = [sys.executable, "-m", "ckptwatch", "run", "--logs", str(CORPUS), "--db", str(db), "--once"]
    first = subprocess.run(cmd, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    con = duckdb.connect(str(db))
    rows = con.execute("SELECT kind, job, step, root_cause_class, root_rank, collateral, last_good_step "
                   "FROM incidents WHERE job LIKE 'job-02%' OR job LIKE 'job-03%' ORDER BY job, kind").fetchall()
    assert rows == [
        ("interrupted_save", "job-0201-sigkill", 40, "signal", 2, [0, 1, 3], 20),
        ("load_failure", "job-0202-resume-iter40", 40, "load_error", 3, [], 20),
        ("poisoned_resume", "job-0202-resume-iter40", 40, None, None, [], 20),
        ("interrupted_save", "job-0301-timeout", 40, "collective_timeout", 1, [0, 2, 3], 20),
        ("load_failure", "job-0302-resume-latest", 40, "load_error", 1, [], 20),
        ("poisoned_resume", "job-0302-resume-latest", 40, None, None, [], 20),
    ]
    counts = con.execute("SELECT (SELECT count(*) FROM events), (SELECT count(*) FROM incident_evidence), "
                     "(SELECT count(*) FROM events WHERE kind = 'save_start')").fetchone()
    detected = con.execute("SELECT id, detected_ts FROM incidents ORDER BY id").fetchall()
    dup = con.execute('SELECT count(*) FROM (SELECT source_id, "offset" FROM events GROUP BY ALL HAVING count(*) > 1)')
    assert dup.fetchone()[0] == 0
    con.close()
    second = subprocess.run(cmd, capture_output=True, text=True)
    assert second.returncode == 0, second.stderr
    con = duckdb.connect(str(db))
    assert con.execute("SELECT (SELECT count(*) FROM events), (SELECT count(*) FROM incident_evidence), "
                   "(SELECT count(*) FROM events WHERE kind = 'save_start')").fetchone() == counts
    assert con.execute("SELECT id, detected_ts FROM incidents ORDER BY id").fetchall() == detected
    # evidence links back to stored events by (source_id, offset)
    orphans = con.execute('SELECT count(*) FROM incident_evidence e ANTI JOIN events v USING (source_id, "offset")')
    assert orphans.fetchone()[0] == 0
