"""End to end: ``ckptwatch run`` over a corpus scenario alerts real local HTTP servers
standing in for Slack and PagerDuty (configured by a TOML file, secrets from the
environment); restarts do not page again; a later complete save resolves; silences and
bad channel configs from the command line."""

from __future__ import annotations

import os
import subprocess
import sys

import duckdb
import pytest
from alert_support import sent

ROUTING_KEY = "e2eR0UT1NGKEY0123456789abcdef012"


def run(args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ckptwatch", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def alerting(tmp_path, httpserver):
    """(config path, env): Slack + PagerDuty pointed at the local server."""
    httpserver.expect_request("/slack", method="POST").respond_with_data("ok")
    httpserver.expect_request("/v2/enqueue", method="POST").respond_with_json({"status": "success"}, status=202)
    cfg = tmp_path / "ckptwatch.toml"
    cfg.write_text(f"""
[alerts.channels.oncall]
type = "slack"
url_env = "E2E_SLACK_WEBHOOK_URL"

[alerts.channels.pager]
type = "pagerduty"
routing_key_file = "{tmp_path / 'pd.key'}"
url = "{httpserver.url_for('/v2/enqueue')}"
""")
    (tmp_path / "pd.key").write_text(ROUTING_KEY + "\n")
    env = {**os.environ, "E2E_SLACK_WEBHOOK_URL": httpserver.url_for("/slack")}
    return str(cfg), env


ATTEMPT1 = "attempt-1-train/torchrun_logs/job-0201-sigkill_6pgs24bx/attempt_0"


def test_run_pages_once_survives_restart_and_resolves(copy_scenario, tmp_path, httpserver, alerting):
    cfg, env = alerting
    logs = copy_scenario("02-sigkill-mid-save", "attempt-1-train")
    db = str(tmp_path / "inc.duckdb")
    first = run(["run", "--logs", str(logs), "--db", db, "--once", "--config", cfg], env)
    assert first.returncode == 0, first.stderr
    slack, pd = sent(httpserver, "/slack"), sent(httpserver, "/v2/enqueue")
    assert len(slack) == 1 and len(pd) == 1
    assert slack[0]["text"].startswith("interrupted_save: job job-0201-sigkill: save of step 40 (")
    assert (pd[0]["event_action"], pd[0]["dedup_key"], pd[0]["routing_key"]) == ("trigger", "8ea36dbeed8d58eb",
                                                                                  ROUTING_KEY)
    assert pd[0]["payload"]["severity"] == "critical"
    assert "CRITICAL interrupted_save" in first.stdout  # the console channel, always on
    assert ROUTING_KEY not in first.stdout + first.stderr

    again = run(["run", "--logs", str(logs), "--db", db, "--once", "--config", cfg], env)
    assert again.returncode == 0, again.stderr
    assert len(httpserver.log) == 2 and "interrupted_save" not in again.stdout

    # The job went on (as if restarted under the same job id) and saved step 60 on every rank.
    for rank in range(4):
        with open(logs.parent / ATTEMPT1 / str(rank) / "stdout.log", "a") as f:
            f.write(f"[2026-11-30 10:25:00.10{rank}] [INFO] [rank{rank}] saving checkpoint at iteration      60 to "
                    "/tmp/corpus-work/02-sigkill-mid-save/checkpoints in torch_dist format\n"
                    f"[2026-11-30 10:25:02.20{rank}] [INFO] [rank{rank}]   successfully saved checkpoint from "
                    "iteration      60 to /tmp/corpus-work/02-sigkill-mid-save/checkpoints [ t 1/1, p 1/1 ]\n")
    resolved = run(["run", "--logs", str(logs), "--db", db, "--once", "--config", cfg], env)
    assert resolved.returncode == 0, resolved.stderr
    pd = sent(httpserver, "/v2/enqueue")
    assert [e["event_action"] for e in pd] == ["trigger", "resolve"]
    assert pd[1] == {"routing_key": ROUTING_KEY, "event_action": "resolve", "dedup_key": "8ea36dbeed8d58eb"}
    assert sent(httpserver, "/slack")[1]["text"].startswith("Resolved: interrupted_save job job-0201-sigkill step 40 (")
    assert "resolved interrupted_save: job job-0201-sigkill step 40" in resolved.stdout
    con = duckdb.connect(db, read_only=True)
    assert con.execute("SELECT status FROM incidents WHERE id = '8ea36dbeed8d58eb'").fetchone() == ("resolved",)
    assert con.execute("SELECT channel, action, status FROM alerts ORDER BY id").fetchall() == [
        ("oncall", "trigger", "sent"), ("pager", "trigger", "sent"), ("console", "trigger", "sent"),
        ("oncall", "resolve", "sent"), ("pager", "resolve", "sent"), ("console", "resolve", "sent")]


def test_silence_cli_mutes_a_job_until_expired(copy_scenario, tmp_path, httpserver, alerting):
    cfg, env = alerting
    logs = copy_scenario("02-sigkill-mid-save", "attempt-1-train")
    db = str(tmp_path / "inc.duckdb")
    add = run(["silence", "add", "--job", "job-02*", "--label", "cause=signal", "--for", "2h", "--comment",
               "chaos test", "--db", db], env)
    assert add.returncode == 0, add.stderr
    sid = add.stdout.split()[0]
    listed = run(["silence", "list", "--db", db], env)
    assert sid in listed.stdout and "job=job-02* cause=signal" in listed.stdout and "# chaos test" in listed.stdout
    muted = run(["run", "--logs", str(logs), "--db", db, "--once", "--config", cfg], env)
    assert muted.returncode == 0, muted.stderr
    assert httpserver.log == [] and "CRITICAL interrupted_save" not in muted.stdout  # no report, no page
    # but not invisible (issue 17): one line on the console, counted in the summary
    assert f"by silence {sid} (chaos test): interrupted_save: job job-0201-sigkill: save of step 40" in muted.stdout
    assert "silenced" in muted.stderr.split("alerts: ")[1]
    assert run(["silence", "expire", sid, "--db", db], env).returncode == 0
    assert sid not in run(["silence", "list", "--db", db], env).stdout
    after = run(["run", "--logs", str(logs), "--db", db, "--once", "--config", cfg], env)
    assert after.returncode == 0, after.stderr
    assert len(sent(httpserver, "/slack")) == 1 and len(sent(httpserver, "/v2/enqueue")) == 1


@pytest.mark.parametrize("table, message", [
    ('type = "teams"', "[alerts.channels.x] type: must be one of slack, pagerduty, webhook, alertmanager, console (got 'teams')"),
    ('type = "slack"\nurl_env = "E2E_UNSET_VARIABLE"',
     "[alerts.channels.x] url_env: environment variable E2E_UNSET_VARIABLE is not set"),
    ('type = "slack"\nurl = "https://hooks.example/T000/B000/XXXXSECRETXXXX"\nmin_severity = "loud"',
     "[alerts.channels.x] min_severity: 'loud' is not a severity (info, warning, error, critical)"),
    ('type = "webhook"', "[alerts.channels.x]: a webhook channel needs url_env, url_file or url"),
])
def test_bad_channel_config_is_one_line_naming_the_key(copy_scenario, tmp_path, table, message):
    cfg = tmp_path / "bad.toml"
    cfg.write_text(f"[alerts.channels.x]\n{table}\n")
    logs = copy_scenario("01-clean")
    out = run(["run", "--logs", str(logs), "--db", str(tmp_path / "x.duckdb"), "--once", "--config", str(cfg)],
              {k: v for k, v in os.environ.items() if k != "E2E_UNSET_VARIABLE"})
    assert out.returncode == 2
    assert message in out.stderr and "Traceback" not in out.stderr
    assert "XXXXSECRETXXXX" not in out.stderr


@pytest.mark.kafka
def test_sink_service_pages_once_through_kafka(copy_scenario, tmp_path, httpserver, alerting, kafka_bootstrap):
    from kafka_support import cli_env, fresh_config

    cfg_path, env = alerting
    cfg = fresh_config(kafka_bootstrap, tmp_path, partitions=2)
    env = {**cli_env(cfg), "E2E_SLACK_WEBHOOK_URL": env["E2E_SLACK_WEBHOOK_URL"]}
    logs = copy_scenario("02-sigkill-mid-save", "attempt-1-train")
    assert run(["collect", str(logs), "--once"], env).returncode == 0
    assert run(["detect", "--until-idle", "4"], env).returncode == 0
    for _ in range(2):  # the second sink run is a restart: nothing new to page
        out = run(["sink", "--until-idle", "3", "--config", cfg_path], env)
        assert out.returncode == 0, out.stderr
    slack, pd = sent(httpserver, "/slack"), sent(httpserver, "/v2/enqueue")
    assert len(slack) == 1 and [(e["event_action"], e["dedup_key"]) for e in pd] == [("trigger", "8ea36dbeed8d58eb")]
    con = duckdb.connect(cfg.sink.db, read_only=True)
    assert con.execute("SELECT channel, status FROM alerts ORDER BY id").fetchall() == [
        ("oncall", "sent"), ("pager", "sent"), ("console", "sent")]


def test_once_exits_3_when_an_alert_was_not_delivered(copy_scenario, tmp_path, httpserver):
    httpserver.expect_request("/v2/enqueue").respond_with_json({"status": "invalid event"}, status=400)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[alerts.channels.pager]\ntype = "pagerduty"\nrouting_key_env = "E2E_PD"\n'
                   f'url = "{httpserver.url_for("/v2/enqueue")}"\n')
    logs = copy_scenario("02-sigkill-mid-save", "attempt-1-train")
    out = run(["run", "--logs", str(logs), "--db", str(tmp_path / "x.duckdb"), "--once", "--config", str(cfg)],
              {**os.environ, "E2E_PD": ROUTING_KEY})
    assert out.returncode == 3, out.stderr
    assert "alert trigger of incident 8ea36dbeed8d58eb to pager: rejected (HTTP 400" in out.stderr
    assert "alerts: 1 sent, 1 rejected, 0 expired, 0 pending" in out.stderr  # the console's report was sent


def test_sigint_stops_run_even_when_started_in_the_background(copy_scenario, tmp_path):
    import signal
    import time

    logs = copy_scenario("01-clean")
    # a non-interactive shell starts background jobs with SIGINT ignored; the child inherits that
    p = subprocess.Popen([sys.executable, "-m", "ckptwatch", "run", "--logs", str(logs), "--db",
                          str(tmp_path / "x.duckdb"), "--interval", "0.2"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "x.duckdb").exists():  # the handlers are in place before the database opens
            assert time.monotonic() < deadline and p.poll() is None
            time.sleep(0.1)
        time.sleep(1)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
    finally:
        p.kill()
    assert p.returncode == 0, err
    assert "Traceback" not in err and "events; database" in err
