"""An incident first seen already resolved is still told, once, to every channel that
would have been alerted (a trigger of the resolved version, then its resolve); a withdrawn
or superseded one, a stall that ended and a silenced one are not. Real local HTTP
receivers (pytest-httpserver on 127.0.0.1) stand in for Slack, PagerDuty and a webhook;
the notification log is a real DuckDB file."""

from __future__ import annotations

import datetime as dt
import io
import time

import pytest
from alert_support import sent, sigkill_incident, version
from rich.console import Console

from ckptwatch.config import AlertSettings
from ckptwatch.embedded import EmbeddedRunner
from ckptwatch.sinks.alerts.setup import alerter_from_config
from ckptwatch.sinks.duckdb_store import Store

ROUTING_KEY = "PAGEr0ut1ngKEY0123456789abcdef01"
ATTEMPT1 = "torchrun_logs/job-0201-sigkill_6pgs24bx/attempt_0"
T0 = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.timezone.utc)


@pytest.fixture
def receivers(httpserver):
    httpserver.expect_request("/slack", method="POST").respond_with_data("ok")
    httpserver.expect_request("/v2/enqueue", method="POST").respond_with_json({"status": "success"}, status=202)
    httpserver.expect_request("/hook", method="POST").respond_with_data("ok")
    return httpserver


def settings(server, **extra) -> AlertSettings:
    return AlertSettings(channels={
        "oncall": {"type": "slack", "url_env": "PAGE_TEST_SLACK_URL", "min_severity": "warning"},
        "pager": {"type": "pagerduty", "routing_key_env": "PAGE_TEST_PD_KEY", "url": server.url_for("/v2/enqueue")},
        "hook": {"type": "webhook", "url": server.url_for("/hook")},
    }, **extra)


@pytest.fixture
def env(monkeypatch, receivers):
    monkeypatch.setenv("PAGE_TEST_SLACK_URL", receivers.url_for("/slack"))
    monkeypatch.setenv("PAGE_TEST_PD_KEY", ROUTING_KEY)
    return receivers


def run_once(logs, db: str, server, out: io.StringIO) -> None:
    """``ckptwatch run --once`` in this process, alerting the receivers and the console."""
    runner = EmbeddedRunner(str(logs), db, alerter=lambda store, metrics: alerter_from_config(
        settings(server), store, db_path=db, console=Console(file=out, width=200)))
    try:
        runner.run(once=True, drain=20)
    finally:
        runner.close()


def test_an_interrupted_save_first_seen_resolved_is_told_once_on_every_channel(copy_scenario, tmp_path, env):
    """Rank 2 was SIGKILLed in the step-40 save; the job went on and saved step 60 on every
    rank. Both are in the logs when ckptwatch first reads them (a backlog after an outage,
    or --once), so the incident is born resolved. Before the fix nothing at all was sent:
    nobody learnt that a partial step-40 checkpoint was left on disk."""
    logs = copy_scenario("02-sigkill-mid-save", "attempt-1-train")
    for rank in range(4):
        with open(logs / ATTEMPT1 / str(rank) / "stdout.log", "a") as f:
            f.write(f"[2026-11-30 10:25:00.10{rank}] [INFO] [rank{rank}] saving checkpoint at iteration      60 to "
                    "/tmp/corpus-work/02-sigkill-mid-save/checkpoints in torch_dist format\n"
                    f"[2026-11-30 10:25:02.20{rank}] [INFO] [rank{rank}]   successfully saved checkpoint from "
                    "iteration      60 to /tmp/corpus-work/02-sigkill-mid-save/checkpoints [ t 1/1, p 1/1 ]\n")
    db, out = str(tmp_path / "inc.duckdb"), io.StringIO()
    run_once(logs, db, env, out)

    con = Store(db)
    try:
        assert con.con.execute("SELECT kind, status FROM incidents").fetchall() == [("interrupted_save", "resolved")]
        (iid,) = con.con.execute("SELECT id FROM incidents").fetchone()
        rows = con.con.execute("SELECT channel, action, status FROM alerts ORDER BY id").fetchall()
    finally:
        con.close()
    pd = sent(env, "/v2/enqueue")
    assert [(e["event_action"], e["dedup_key"]) for e in pd] == [("trigger", iid), ("resolve", iid)]
    assert pd[0]["payload"]["summary"].startswith("[resolved before it was alerted] interrupted_save: job "
                                                  "job-0201-sigkill: save of step 40 (")
    assert pd[0]["payload"]["severity"] == "critical"
    slack = sent(env, "/slack")
    assert len(slack) == 2
    assert slack[0]["blocks"][0]["text"]["text"] == ("RESOLVED CRITICAL interrupted_save: job job-0201-sigkill step 40 "
                                                    "(/tmp/corpus-work/02-sigkill-mid-save/checkpoints/iter_0000040)")
    assert slack[1]["text"].startswith("Resolved: interrupted_save job job-0201-sigkill step 40 (")
    hook = sent(env, "/hook")
    assert [(h["action"], h["incident"]["status"]) for h in hook] == [("trigger", "resolved"), ("resolve", "resolved")]
    assert "resolved before it was alerted" in out.getvalue()
    assert sorted(rows) == sorted((ch, a, "sent") for ch in ("oncall", "pager", "hook", "console")
                                  for a in ("trigger", "resolve"))

    n = len(env.log)
    run_once(logs, db, env, io.StringIO())  # a restart finds it again: told already
    assert len(env.log) == n


@pytest.fixture(scope="module")
def incident():
    return sigkill_incident()


def notify_and_deliver(tmp_path, server, *incs, **extra) -> list[tuple]:
    db = str(tmp_path / "alerts.duckdb")
    store = Store(db)
    alerter = alerter_from_config(settings(server, **extra), store, db_path=db,
                                  console=Console(file=io.StringIO(), width=200))
    try:
        with store.transaction():
            alerter.notify(incs, T0)
        for _ in range(400):
            alerter.step(T0)
            if not alerter.in_flight:
                break
            time.sleep(0.005)
        return store.con.execute("SELECT channel, action, status FROM alerts ORDER BY id").fetchall()
    finally:
        alerter.close()
        store.close()


def test_withdrawn_superseded_and_ended_stalls_are_never_paged(tmp_path, env, incident):
    withdrawn = version(incident)
    withdrawn.withdraw("the save of step 40 finished on every rank after all")
    superseded = version(incident, status="superseded")
    stall = version(incident, kind="stalled_save", severity="warning", status="resolved", id="stall0000000000")
    assert notify_and_deliver(tmp_path, env, withdrawn, superseded, stall) == []
    assert env.log == []


def test_a_resolved_incident_under_a_silence_is_not_told(tmp_path, env, incident):
    resolved = version(incident, status="resolved")
    silences = [{"job": "job-0201-*", "expires": "2099-01-01T00:00:00Z"}]
    assert notify_and_deliver(tmp_path, env, resolved, silences=silences) == []
    assert env.log == []
