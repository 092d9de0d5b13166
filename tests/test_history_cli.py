"""`ckptwatch incidents list | show | export` and `--version`, against a database at rest
written by schema version 1 (tests/fixtures/history) and one written now by `run --once`."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from ckptwatch import __version__, cli

V1 = Path(__file__).parent / "fixtures" / "history" / "schema-v1.duckdb.gz"
#: the fixture's incidents: (kind, job), see tests/fixtures/history/README.md
V1_INCIDENTS = {("interrupted_save", "job-0201-sigkill"), ("interrupted_save", "job-0301-timeout"),
                ("poisoned_resume", "job-0202-resume-iter40"), ("load_failure", "job-0202-resume-iter40"),
                ("poisoned_resume", "job-0302-resume-latest"), ("load_failure", "job-0302-resume-latest")}


@pytest.fixture(scope="module")
def v1_db(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("history") / "old.duckdb"
    with gzip.open(V1) as src, open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    path.chmod(0o444)  # readers never write (nor migrate) the file
    return str(path)


def invoke(*args: str):
    return CliRunner().invoke(cli.app, list(args))


def listed(db: str, *flags: str) -> list[dict]:
    res = invoke("incidents", "list", "--db", db, "--json", *flags)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_version():
    res = invoke("--version")
    assert res.exit_code == 0 and res.stdout == f"ckptwatch {__version__}\n"


def test_list_filters_on_an_old_database_at_rest(v1_db):
    every = listed(v1_db)
    assert {(i["kind"], i["job"]) for i in every} == V1_INCIDENTS
    assert {(i["root_cause_class"], i["root_rank"]) for i in every if i["kind"] == "interrupted_save"} \
        == {("signal", 2), ("collective_timeout", 1)}
    assert {i["job"] for i in listed(v1_db, "--kind", "interrupted_*")} == {"job-0201-sigkill", "job-0301-timeout"}
    assert len(listed(v1_db, "--severity", "critical")) == 4  # interrupted saves and poisoned resumes
    assert len(listed(v1_db, "--severity", "error")) == 6
    assert {i["job"] for i in listed(v1_db, "--job", "job-02*")} == {"job-0201-sigkill", "job-0202-resume-iter40"}
    assert listed(v1_db, "--status", "resolved") == []
    assert len(listed(v1_db, "--status", "all")) == 6
    assert len(listed(v1_db, "--since", "2026-12-03")) == 6  # the fixture was written on 2026-12-03 18:03 UTC
    assert listed(v1_db, "--since", "2026-12-03T18:30") == []
    table = invoke("incidents", "list", "--db", v1_db)
    assert table.exit_code == 0
    assert "(at rest)" in table.stderr and "6 incident(s)" in table.stderr
    row = next(line for line in table.stdout.splitlines() if "job-0201-sigkill" in line and "interrupted_save" in line)
    assert "critical" in row and "signal rank 2 on vm" in row and row.split()[-1] == "20"


def test_show_gives_the_report_with_each_evidence_line_s_file_and_the_alerts(v1_db):
    sigkill = next(i for i in listed(v1_db) if i["job"] == "job-0201-sigkill" and i["kind"] == "interrupted_save")
    res = invoke("incidents", "show", sigkill["id"][:6], "--db", v1_db)
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert f"CRITICAL interrupted_save  job job-0201-sigkill  step 40  id {sigkill['id']}" in out
    assert "root cause   signal (SIGKILL) on rank 2, host vm, pid 5879" in out
    assert "last good    step 20" in out
    console = "/tmp/fx/logs/02-sigkill-mid-save/logs/attempt-1-train/console.log"
    assert f"root_cause process_exit       {console}:63008" in out  # file and byte offset of the root line
    assert "console: trigger sent" in out
    as_json = json.loads(invoke("incidents", "show", sigkill["id"], "--db", v1_db, "--json").stdout)
    assert as_json["root_cause"]["class"] == "signal" and as_json["root_cause"]["rank"] == 2
    assert all(e["file"] == console and e["read_on"] is None for e in as_json["evidence"])  # v1 knew no read host
    assert [(a["channel"], a["action"], a["status"]) for a in as_json["alerts"]] == [("console", "trigger", "sent")]


def test_show_names_a_missing_or_ambiguous_id_in_one_line(v1_db):
    res = invoke("incidents", "show", "ffffffff", "--db", v1_db)
    assert res.exit_code == 1 and res.stderr == "error: incident ffffffff: no such id (ckptwatch incidents list shows them)\n"
    res = invoke("incidents", "show", "ab", "--db", v1_db)
    assert res.exit_code == 1 and "give at least 4 characters" in res.stderr


def test_an_id_prefix_two_incidents_share_is_refused():
    import duckdb

    from ckptwatch.history.queries import find_incident
    from ckptwatch.history.read import HistoryError

    con = duckdb.connect()
    con.execute("CREATE TABLE incidents AS SELECT * FROM (VALUES ('abcd1111'), ('abcd2222'), ('abce3333')) t(id)")
    assert find_incident(con, "abce") == "abce3333" and find_incident(con, "abcd2222") == "abcd2222"
    assert find_incident(con, "ABCE") == "abce3333"  # pasted in capitals
    with pytest.raises(HistoryError, match=r"^incident abcd: several ids start so \(abcd1111, abcd2222\): give more of it$"):
        find_incident(con, "abcd")


def test_export_parquet_and_csv(v1_db, tmp_path):
    out = tmp_path / "incidents.parquet"
    res = invoke("incidents", "export", str(out), "--db", v1_db)
    assert res.exit_code == 0, res.output
    assert res.stdout.strip() == f"6 incidents rows -> {out} (parquet)"
    frame = pl.read_parquet(out)
    assert frame.height == 6 and {"id", "kind", "root_cause_class", "detected_ts", "remediation"} <= set(frame.columns)
    ev = tmp_path / "evidence.csv"
    res = invoke("incidents", "export", str(ev), "--table", "evidence", "--kind", "interrupted_save", "--db", v1_db)
    assert res.exit_code == 0, res.output
    rows = pl.read_csv(ev)
    two = set(pl.read_parquet(out).filter(pl.col("kind") == "interrupted_save")["id"])
    assert set(rows["incident_id"]) == two and rows["file"].null_count() == 0
    alerts = tmp_path / "alerts.csv"
    assert invoke("incidents", "export", str(alerts), "--table", "alerts", "--db", v1_db).exit_code == 0
    assert pl.read_csv(alerts).height == 6


@pytest.mark.parametrize(("args", "message"), [
    (["list", "--since", "yesterday"], "error: --since yesterday: not a duration (30m, 2h, 7d) or a date"),
    (["list", "--since", "99999999d"], "error: --since 99999999d: reaches back before the year 1"),
    (["list", "--severity", "loud"], "error: --severity 'loud': one of info, warning, error, critical"),
    (["list", "--status", "closed"], "error: --status 'closed': one of open, resolved, superseded, or all"),
    (["export", "x.txt"], "error: --format: parquet or csv (OUT's suffix gives none)"),
    (["export", "x.csv", "--table", "events"], "error: --table events: one of incidents, evidence, alerts"),
])
def test_bad_options_are_one_line(v1_db, args, message):
    res = invoke("incidents", *args, "--db", v1_db)
    assert res.exit_code == 2 and res.stderr.startswith(message) and res.stderr.count("\n") == 1, res.stderr


def test_a_database_written_now_names_the_machine_each_file_was_read_on(copy_scenario, tmp_path):
    import socket

    logs = copy_scenario("03-collective-timeout")
    db = str(tmp_path / "now.duckdb")
    assert invoke("run", "--logs", str(logs), "--db", db, "--once").exit_code == 0
    timeout = next(i for i in listed(db) if i["kind"] == "interrupted_save")
    assert (timeout["root_cause_class"], timeout["root_rank"]) == ("collective_timeout", 1)
    doc = json.loads(invoke("incidents", "show", timeout["id"], "--db", db, "--json").stdout)
    assert doc["evidence"] and all(e["file"].startswith(str(logs)) and e["read_on"] == socket.gethostname()
                                   for e in doc["evidence"])
