"""Alert delivery through real local HTTP servers standing in for Slack, PagerDuty and a
webhook receiver (pytest-httpserver on 127.0.0.1), the notification log in a real DuckDB
file. Time is passed explicitly (``now``) so retries and backoff are checked without
sleeping; only the HTTP round trips are real."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import io
import json
import socket
import time

import pytest
from alert_support import sent, sigkill_incident, version
from pytest_httpserver import HTTPServer
from rich.console import Console

from ckptwatch.history import queries
from ckptwatch.config import AlertSettings
from ckptwatch.detectors.incident import EvidenceItem
from ckptwatch.sinks.alerts import pagerduty, slack
from ckptwatch.sinks.redact import Redactor
from ckptwatch.sinks.alerts.settings import AlertConfigError
from ckptwatch.sinks.alerts.setup import alerter_from_config
from ckptwatch.sinks.alerts.silences import SilenceFile
from ckptwatch.sinks.duckdb_store import Store

T0 = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.timezone.utc)
ROUTING_KEY = "R0UT1NGKEY0123456789abcdef012345"
HOOK_SECRET = "s3cret-for-hmac"


@pytest.fixture(scope="module")
def incident():
    return sigkill_incident()


@pytest.fixture
def env(monkeypatch, tmp_path, httpserver):
    """Channel secrets from the environment, as in production."""
    monkeypatch.setenv("TEST_SLACK_URL", httpserver.url_for("/slack"))
    monkeypatch.setenv("TEST_PD_KEY", ROUTING_KEY)
    monkeypatch.setenv("TEST_HOOK_SECRET", HOOK_SECRET)
    return tmp_path


def channels(server: HTTPServer, *only: str):
    tables = {
        "oncall": {"type": "slack", "url_env": "TEST_SLACK_URL", "min_severity": "warning"},
        "pager": {"type": "pagerduty", "routing_key_env": "TEST_PD_KEY", "url": server.url_for("/v2/enqueue")},
        "hook": {"type": "webhook", "url": server.url_for("/hook"), "secret_env": "TEST_HOOK_SECRET"},
    }
    return {k: v for k, v in tables.items() if not only or k in only}


class Rig:
    """An alerter over a DuckDB file, its console captured."""

    def __init__(self, db: str, settings: AlertSettings, metrics=None) -> None:
        self.db, self.settings = db, settings
        self.out = io.StringIO()
        self.closed = False
        self.said: list[str] = []
        self.store = Store(db)
        self.alerter = alerter_from_config(settings, self.store, db_path=db, say=self.said.append,
                                           console=Console(file=self.out, width=200), metrics=metrics)

    def notify(self, *incs, now=T0):
        with self.store.transaction():
            return self.alerter.notify(incs, now)

    def pump(self, now=T0):
        """Step until nothing is in flight (the real HTTP round trips finish)."""
        for _ in range(1000):
            self.alerter.step(now)
            if not self.alerter.in_flight:
                return
            time.sleep(0.005)
        raise AssertionError("deliveries did not finish")

    def rows(self):
        return self.store.con.execute("SELECT channel, action, status, attempts, last_error FROM alerts "
                                      "ORDER BY id").fetchall()

    def close(self):
        if not self.closed:
            self.closed = True
            self.alerter.close()
            self.store.close()


@pytest.fixture
def rig(env):
    made = []

    def _make(tables, metrics=None, **settings):
        r = Rig(str(env / "alerts.duckdb"), AlertSettings(channels=tables, **settings), metrics)
        made.append(r)
        return r

    yield _make
    for r in made:
        r.close()


def test_each_channel_gets_its_api_payload_once(httpserver, rig, incident):
    httpserver.expect_request("/slack", method="POST").respond_with_data("ok")
    httpserver.expect_request("/v2/enqueue", method="POST").respond_with_json({"status": "success"}, status=202)
    httpserver.expect_request("/hook", method="POST").respond_with_data("", status=204)
    r = rig(channels(httpserver))
    assert r.notify(incident) == 4  # slack, pagerduty, webhook, console
    r.pump()
    # later versions of the same incident (more evidence, same severity) page nobody again
    assert r.notify(version(incident, remediation=incident.remediation + " Also check the NFS mount.")) == 0
    r.pump()

    redactor = Redactor.load()
    (sl,) = sent(httpserver, "/slack")
    assert sl == slack.message(incident, redactor=redactor)
    assert sl["blocks"][0]["text"]["text"] == "CRITICAL interrupted_save: job job-0201-sigkill step 40 (/tmp/corpus-work/02-sigkill-mid-save/checkpoints/iter_0000040)"
    (pd,) = sent(httpserver, "/v2/enqueue")
    assert pd == pagerduty.trigger(incident, routing_key=ROUTING_KEY, redactor=redactor)
    assert (pd["event_action"], pd["dedup_key"], pd["payload"]["severity"]) == ("trigger", incident.id, "critical")
    (req, _), = [(q, s) for q, s in httpserver.log if q.path == "/hook"]
    raw = req.get_data()
    want = "sha256=" + hmac.new(HOOK_SECRET.encode(), raw, hashlib.sha256).hexdigest()
    assert req.headers["X-Ckptwatch-Signature-256"] == want
    hook = json.loads(raw)
    assert (hook["version"], hook["action"], hook["channel"]) == (1, "trigger", "hook")
    assert hook["incident"]["id"] == incident.id and hook["incident"]["root_cause"]["rank"] == 2
    assert hook["incident"]["collateral"] == [0, 1, 3] and hook["incident"]["last_good_checkpoint"]["step"] == 20
    assert "CRITICAL interrupted_save  job job-0201-sigkill  step 40" in r.out.getvalue()
    assert [(c, a, s, n) for c, a, s, n, _ in r.rows()] == [
        ("oncall", "trigger", "sent", 1), ("pager", "trigger", "sent", 1), ("hook", "trigger", "sent", 1),
        ("console", "trigger", "sent", 1)]


def test_dedup_survives_a_restart_and_resolve_reaches_each_alerted_channel(httpserver, rig, incident):
    httpserver.expect_request("/v2/enqueue").respond_with_json({"status": "success"}, status=202)
    httpserver.expect_request("/slack").respond_with_data("ok")
    first = rig(channels(httpserver, "pager", "oncall"))
    first.notify(incident)
    first.pump()
    first.close()
    again = rig(channels(httpserver, "pager", "oncall"))  # a restart: same database file
    assert again.notify(incident, now=T0 + dt.timedelta(hours=1)) == 0
    resolved = version(incident, status="resolved")
    assert again.notify(resolved, now=T0 + dt.timedelta(hours=2)) == 3  # pager, slack, console
    again.pump(T0 + dt.timedelta(hours=2))
    assert again.notify(resolved, now=T0 + dt.timedelta(hours=3)) == 0  # resolved once
    again.pump(T0 + dt.timedelta(hours=3))
    pd = sent(httpserver, "/v2/enqueue")
    assert [b["event_action"] for b in pd] == ["trigger", "resolve"]
    assert pd[1] == {"routing_key": ROUTING_KEY, "event_action": "resolve", "dedup_key": incident.id}
    sl = sent(httpserver, "/slack")
    assert len(sl) == 2 and sl[1]["text"].startswith("Resolved: interrupted_save job job-0201-sigkill step 40 (")


def test_severity_rise_pages_again_with_the_same_dedup_key(httpserver, rig, incident):
    httpserver.expect_request("/v2/enqueue").respond_with_json({"status": "success"}, status=202)
    r = rig({"pager": {**channels(httpserver)["pager"], "min_severity": "warning"}})
    r.notify(version(incident, severity="warning"))
    r.pump()
    r.notify(version(incident, severity="warning"))  # same severity: nothing
    r.notify(version(incident, severity="critical"), now=T0 + dt.timedelta(minutes=1))
    r.pump(T0 + dt.timedelta(minutes=1))
    pd = sent(httpserver, "/v2/enqueue")
    assert [(b["event_action"], b["dedup_key"], b["payload"]["severity"]) for b in pd] == [
        ("trigger", incident.id, "warning"), ("trigger", incident.id, "critical")]
    assert [a for c, a, *_ in r.rows() if c == "pager"] == ["trigger", "escalate"]


def test_5xx_is_retried_with_backoff_until_it_succeeds(httpserver, rig, incident):
    httpserver.expect_oneshot_request("/hook").respond_with_data("upstream down", status=500)
    httpserver.expect_oneshot_request("/hook").respond_with_data("still down", status=503)
    httpserver.expect_request("/hook").respond_with_data("ok")
    r = rig(channels(httpserver, "hook"), retry_initial=2.0, retry_max=60.0)
    r.notify(incident)
    r.pump(T0)
    assert r.rows()[0][1:] == ("trigger", "pending", 1, "HTTP 500: upstream down")
    r.pump(T0 + dt.timedelta(seconds=1.9))  # backoff 2 s: not yet
    assert len(sent(httpserver, "/hook")) == 1
    r.pump(T0 + dt.timedelta(seconds=2))
    assert r.rows()[0][2:4] == ("pending", 2)
    r.pump(T0 + dt.timedelta(seconds=5.9))  # second backoff is 4 s after t=2
    assert len(sent(httpserver, "/hook")) == 2
    r.pump(T0 + dt.timedelta(seconds=6))
    hooks = sent(httpserver, "/hook")
    assert len(hooks) == 3 and hooks[0] == hooks[2]  # the same bytes each time: same notification_id
    assert r.rows()[0][2:4] == ("sent", 3)
    assert r.alerter.stats.retried == 2 and r.alerter.stats.sent == 2  # hook + console
    assert any("HTTP 500: upstream down; retrying (next in 2 s)" in m for m in r.said)


def test_429_waits_for_retry_after_and_pauses_the_channel(httpserver, rig, incident):
    httpserver.expect_oneshot_request("/slack").respond_with_data("rate limited", status=429,
                                                                  headers={"Retry-After": "30"})
    httpserver.expect_request("/slack").respond_with_data("ok")
    r = rig(channels(httpserver, "oncall"), retry_initial=1.0)
    other = version(incident, id="other-incident-0001", job="job-other")
    r.notify(incident)
    r.pump(T0)
    next_ts = r.store.con.execute("SELECT next_attempt_ts FROM alerts WHERE channel = 'oncall'").fetchone()[0]
    assert next_ts == T0 + dt.timedelta(seconds=30)
    r.notify(other, now=T0 + dt.timedelta(seconds=1))  # the channel is paused: not sent either
    r.pump(T0 + dt.timedelta(seconds=29))
    assert len(sent(httpserver, "/slack")) == 1
    r.pump(T0 + dt.timedelta(seconds=30))
    sl = sent(httpserver, "/slack")
    assert len(sl) == 3 and {b["blocks"][-1]["elements"][0]["text"] for b in sl[1:]} == {
        f"ckptwatch incident `{incident.id}`", "ckptwatch incident `other-incident-0001`"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_endpoint_down_for_minutes_loses_nothing(monkeypatch, rig, incident):
    port = _free_port()
    url = f"http://127.0.0.1:{port}/v2/enqueue"
    monkeypatch.setenv("TEST_PD_KEY", ROUTING_KEY)
    r = rig({"pager": {"type": "pagerduty", "routing_key_env": "TEST_PD_KEY", "url": url}},
            retry_initial=1.0, retry_max=60.0)
    r.notify(incident)
    t = T0
    for _ in range(8):  # connection refused for 8 attempts, about 4 minutes with the backoff
        r.pump(t)
        t = r.store.con.execute("SELECT next_attempt_ts FROM alerts WHERE channel = 'pager'").fetchone()[0]
    assert (t - T0).total_seconds() == 1 + 2 + 4 + 8 + 16 + 32 + 60 + 60
    status, attempts, error = r.store.con.execute(
        "SELECT status, attempts, last_error FROM alerts WHERE channel = 'pager'").fetchone()
    assert (status, attempts) == ("pending", 8) and "refused" in error.lower()
    server = HTTPServer(host="127.0.0.1", port=port)
    server.expect_request("/v2/enqueue").respond_with_json({"status": "success"}, status=202)
    server.start()
    try:
        r.pump(t)
        r.pump(t + dt.timedelta(minutes=10))
        assert [json.loads(q.get_data())["dedup_key"] for q, _ in server.log] == [incident.id]
    finally:
        server.stop()
    assert r.store.con.execute("SELECT status, attempts FROM alerts WHERE channel = 'pager'").fetchone() == ("sent", 9)


def test_a_4xx_is_recorded_and_counted_not_retried(httpserver, rig, incident):
    httpserver.expect_request("/v2/enqueue").respond_with_json(
        {"status": "invalid event", "message": "Event object is invalid", "errors": ["Length of 'routing_key' is "
                                                                                     "incorrect"]}, status=400)
    r = rig(channels(httpserver, "pager"))
    r.notify(incident)
    r.pump(T0)
    r.pump(T0 + dt.timedelta(hours=1))
    assert len(sent(httpserver, "/v2/enqueue")) == 1
    (row,) = [x for x in r.rows() if x[0] == "pager"]
    assert row[:4] == ("pager", "trigger", "rejected", 1) and row[4].startswith("HTTP 400: {")
    assert r.alerter.stats.rejected == 1
    assert any("rejected (HTTP 400" in m and "not retried" in m for m in r.said)
    assert r.notify(incident, now=T0 + dt.timedelta(hours=2)) == 0  # recorded: not re-queued either


def test_a_send_failing_past_give_up_after_expires(httpserver, rig, incident):
    httpserver.expect_request("/hook").respond_with_data("down", status=502)
    r = rig(channels(httpserver, "hook"), retry_initial=10.0, give_up_after=25.0)
    r.notify(incident)
    for s in (0, 10, 30):
        r.pump(T0 + dt.timedelta(seconds=s))
    assert [x[:4] for x in r.rows() if x[0] == "hook"] == [("hook", "trigger", "expired", 3)]
    r.pump(T0 + dt.timedelta(hours=1))
    assert len(sent(httpserver, "/hook")) == 3


def test_secrets_in_log_lines_never_leave_in_an_alert(httpserver, rig, incident):
    for path in ("/slack", "/v2/enqueue", "/hook"):
        httpserver.expect_request(path).respond_with_data("ok")
    secrets = ["ghp_" + "a1B2" * 9, "AKIAIOSFODNN7EXAMPLE", "hunter2hunter2"]
    leaky = version(incident)
    leaky.root_cause.line = f"{leaky.root_cause.line} token={secrets[0]}"
    leaky.evidence.append(EvidenceItem(
        source_id="s", offset=1, ts=incident.first_ts, kind="storage_error", rank=0, host="vm", rule_id="r",
        line=f"upload failed: aws_access_key_id={secrets[1]} url=https://ckpt:{secrets[2]}@store.internal/x",
        role="root_cause"))
    leaky.remediation += f" (DB_PASSWORD={secrets[2]})"
    r = rig(channels(httpserver))
    r.notify(leaky)
    r.pump()
    sent = b"".join(q.get_data() for q, _ in httpserver.log) + r.out.getvalue().encode()
    assert len(httpserver.log) == 3
    for s in secrets + [HOOK_SECRET]:
        assert s.encode() not in sent
    assert sent.count(b"aws_access_key_id=[REDACTED-AWS-KEY-ID] url=https://ckpt:[REDACTED]@store.internal/x") == 4


def test_silences_from_config_and_file_and_their_expiry(httpserver, rig, incident, env):
    httpserver.expect_request("/v2/enqueue").respond_with_json({"status": "success"}, status=202)
    other = version(incident, id="inc-of-debug-job", job="debug-7")
    silences = [{"job": "debug-*", "expires": "2026-12-31T00:00:00Z", "comment": "debug jobs"}]
    r = rig(channels(httpserver, "pager"), silences=silences)
    silence_file = SilenceFile(str(env / "alerts.duckdb.silences.json"))
    s = silence_file.add({"kind": "interrupted_*", "host": "vm"}, T0 + dt.timedelta(minutes=30), "maintenance",
                         now=T0)
    assert r.notify(incident, other) == 0
    r.pump(T0)
    assert sent(httpserver, "/v2/enqueue") == []
    assert sorted((c, st) for c, _, st, *_ in r.rows()) == [("console", "silenced"), ("console", "silenced"),
                                                            ("pager", "silenced"), ("pager", "silenced")]
    assert r.notify(incident, other, now=T0 + dt.timedelta(minutes=1)) == 0  # muted once, recorded once
    assert len(r.rows()) == 4
    # silenced is not gone: the console says what was muted and by what, the summary counts it
    out = r.out.getvalue()
    assert (f"silenced until 2026-11-30 12:30 UTC by silence {s.id} (maintenance): interrupted_save: job "
            "job-0201-sigkill: save of step 40") in out
    assert "silenced until 2026-12-31 00:00 UTC by silence config-1 (debug jobs): interrupted_save: job debug-7" in out
    assert r.alerter.summary().endswith("0 pending, 4 silenced")
    r.store.upsert_incidents([incident, other])
    from ckptwatch.history import queries

    assert sorted(queries.list_incidents(r.store.raw).select("job", "paging").rows()) == [
        ("debug-7", "silenced"), ("job-0201-sigkill", "silenced")]
    silence_file.expire(s.id, now=T0 + dt.timedelta(minutes=2))  # ended early, while running
    r.pump(T0 + dt.timedelta(minutes=3))
    r.pump(T0 + dt.timedelta(minutes=3))
    assert [b["dedup_key"] for b in sent(httpserver, "/v2/enqueue")] == [incident.id]  # debug-7 stays muted
    assert [r[0] for r in queries.list_incidents(r.store.raw).sort("job").select("paging").rows()] == [
        "silenced", "alerted"]


def test_routing_by_severity_and_job_pattern(httpserver, rig, incident):
    httpserver.expect_request("/slack").respond_with_data("ok")
    httpserver.expect_request("/v2/enqueue").respond_with_json({"status": "success"}, status=202)
    tables = channels(httpserver, "oncall", "pager")
    tables["oncall"]["match"] = {"job": ["job-02*", "llama-*"]}
    r = rig(tables)
    warning = version(incident, id="stalled-1", kind="stalled_save", severity="warning")
    elsewhere = version(incident, id="other-job-1", job="job-0301-timeout")
    r.notify(incident, warning, elsewhere)
    r.pump()
    assert sorted(b["blocks"][-1]["elements"][0]["text"] for b in sent(httpserver, "/slack")) == [
        f"ckptwatch incident `{incident.id}`", "ckptwatch incident `stalled-1`"]
    assert sorted(b["dedup_key"] for b in sent(httpserver, "/v2/enqueue")) == sorted([incident.id, "other-job-1"])


def test_realert_after_the_interval_while_still_open(httpserver, rig, incident):
    httpserver.expect_request("/slack").respond_with_data("ok")
    r = rig(channels(httpserver, "oncall"), realert_interval=3600.0)
    r.notify(incident)
    r.pump(T0)
    r.pump(T0 + dt.timedelta(minutes=59))
    assert len(sent(httpserver, "/slack")) == 1
    r.pump(T0 + dt.timedelta(minutes=61))
    sl = sent(httpserver, "/slack")
    assert len(sl) == 2 and sl[1]["blocks"][0]["text"]["text"].startswith("STILL OPEN CRITICAL interrupted_save")
    with r.store.transaction():
        r.store.upsert_incidents([version(incident, status="resolved")])
    r.pump(T0 + dt.timedelta(hours=5))  # resolved in the database: no more re-alerts
    assert len(sent(httpserver, "/slack")) == 2


def test_a_missing_secret_is_named_not_shown(monkeypatch, tmp_path):
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    store = Store(str(tmp_path / "x.duckdb"))
    try:
        with pytest.raises(AlertConfigError) as e:
            alerter_from_config(AlertSettings(channels={"p": {"type": "pagerduty", "routing_key_env": "NOT_SET_ANYWHERE"}}),
                                store, db_path=str(tmp_path / "x.duckdb"))
        assert str(e.value) == "[alerts.channels.p] routing_key_env: environment variable NOT_SET_ANYWHERE is not set"
    finally:
        store.close()


@pytest.mark.parametrize("layer, message", [
    ({"alerts": {"silences": [{"job": "x"}]}}, "[[alerts.silences]] #1: needs expires (silences always end)"),
    ({"alerts": {"silences": [{"expires": "2026-12-01"}]}}, "[[alerts.silences]] #1: needs at least one label"),
    ({"alerts": {"silences": [{"rank": "3", "expires": "2026-12-01"}]}}, "[[alerts.silences]] #1 rank: unknown key"),
    ({"alerts": {"channels": {"s": {"type": "slack", "url": "https://x/T/B/SECRETPART", "url_env": "U"}}}},
     "[alerts.channels.s] url: give one of url, url_env, not several"),
    ({"alerts": {"channels": {"s": {"type": "slack", "url_env": "U", "match": {"rank": "1"}}}}},
     "[alerts.channels.s] match: unknown label 'rank'"),
    ({"alerts": {"retry_max": 0}}, "[alerts] retry_max: must be more than 0 seconds"),
])
def test_alert_config_errors_name_the_table_and_key_never_the_secret(layer, message):
    from ckptwatch import config

    with pytest.raises(config.ConfigError) as e:
        config.build([("ckptwatch.toml", layer)])
    assert message in str(e.value) and str(e.value).startswith("ckptwatch.toml: [alerts]")
    assert "SECRETPART" not in str(e.value)


def test_alert_metrics_scraped_over_http(httpserver, rig, incident):
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    from ckptwatch.sinks.metrics import Metrics, MetricsServer

    httpserver.expect_oneshot_request("/slack").respond_with_data("busy", status=503)
    httpserver.expect_request("/slack").respond_with_data("ok")
    httpserver.expect_request("/v2/enqueue").respond_with_json({"status": "invalid event"}, status=400)
    metrics = Metrics()
    r = rig(channels(httpserver, "oncall", "pager"), metrics=metrics, retry_initial=1.0)
    r.notify(incident)
    r.pump(T0)
    r.pump(T0 + dt.timedelta(seconds=1))
    with MetricsServer(metrics, 0) as server:
        text = urllib.request.urlopen(server.url, timeout=10).read().decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples[("ckptwatch_alerts_sent_total", (("action", "trigger"), ("channel", "oncall")))] == 1
    assert samples[("ckptwatch_alerts_sent_total", (("action", "trigger"), ("channel", "console")))] == 1
    assert samples[("ckptwatch_alerts_failed_total", (("channel", "pager"), ("reason", "rejected")))] == 1
    assert samples[("ckptwatch_alert_retries_total", (("channel", "oncall"),))] == 1
    assert samples[("ckptwatch_alerts_pending", (("channel", "oncall"),))] == 0


def test_a_changed_root_cause_is_sent_as_an_update_once(httpserver, rig, incident):
    httpserver.expect_request("/v2/enqueue").respond_with_json({"status": "success"}, status=202)
    r = rig(channels(httpserver, "pager"))
    early = version(incident)
    early.root_cause.cls, early.root_cause.rank = "unknown", 0  # before the evidence settled
    r.notify(early)
    r.pump()
    r.notify(incident)
    r.pump()
    r.notify(version(incident, remediation="more evidence, same cause"))
    r.pump()
    pd = sent(httpserver, "/v2/enqueue")
    assert [(b["event_action"], b["payload"]["custom_details"]["root_cause"]["class"],
             b["payload"]["custom_details"]["root_cause"]["rank"]) for b in pd] == [
        ("trigger", "unknown", 0), ("trigger", "signal", 2)]
    assert [a for c, a, *_ in r.rows() if c == "pager"] == ["trigger", "update"]


def test_retry_after_in_the_past_still_backs_off(httpserver, rig, incident):
    httpserver.expect_request("/hook").respond_with_data("slow down", status=429,
                                                         headers={"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"})
    r = rig(channels(httpserver, "hook"), retry_initial=4.0)
    r.notify(incident)
    r.pump(T0)
    nxt = r.store.con.execute("SELECT next_attempt_ts FROM alerts WHERE channel = 'hook'").fetchone()[0]
    assert nxt == T0 + dt.timedelta(seconds=4)


def test_a_restart_retries_pending_notifications_at_once(httpserver, rig, incident):
    httpserver.expect_oneshot_request("/hook").respond_with_data("busy", status=429, headers={"Retry-After": "3600"})
    httpserver.expect_request("/hook").respond_with_data("ok")
    first = rig(channels(httpserver, "hook"))
    now = dt.datetime.now(dt.timezone.utc)
    first.notify(incident, now=now)
    first.pump(now)
    assert first.store.con.execute("SELECT next_attempt_ts FROM alerts WHERE channel = 'hook'").fetchone()[0] == (
        now + dt.timedelta(seconds=3600))
    first.close()
    again = rig(channels(httpserver, "hook"))  # the restart does not wait out the hour
    again.pump(dt.datetime.now(dt.timezone.utc))
    assert len(sent(httpserver, "/hook")) == 2
    assert [x[:3] for x in again.rows() if x[0] == "hook"] == [("hook", "trigger", "sent")]


def test_a_silence_file_broken_while_running_keeps_the_last_good_silences(tmp_path):
    said = []
    sf = SilenceFile(str(tmp_path / "s.json"), on_error=said.append)
    sf.add({"job": "job-02*"}, T0 + dt.timedelta(hours=1), now=T0)
    assert [s.matchers for s in sf.current()] == [{"job": "job-02*"}]
    (tmp_path / "s.json").write_text('{"silences": [ {"id": "oops", ')
    for _ in range(3):
        assert [s.matchers for s in sf.current()] == [{"job": "job-02*"}]
    assert len(said) == 1 and "not a silence file" in said[0] and "keeping the 1 silence(s)" in said[0]
    (tmp_path / "s.json").write_text("")  # emptied: no silence, no complaint
    assert sf.current() == [] and len(said) == 1


@pytest.mark.parametrize("value, reason", [
    ("not a url SECRETVALUE", "is not an http:// or https:// URL with a host"),
    ("ftp://files.internal/SECRETVALUE", "is not an http:// or https:// URL with a host"),
    ("https://bob:SECRETVALUE@hooks.internal/x", "has a user:password@ part, which is not supported"),
])
def test_an_unusable_url_is_refused_at_start_without_echoing_it(monkeypatch, tmp_path, value, reason):
    monkeypatch.setenv("TEST_SLACK_URL", value)
    store = Store(str(tmp_path / "x.duckdb"))
    try:
        with pytest.raises(AlertConfigError) as e:
            alerter_from_config(AlertSettings(channels={"s": {"type": "slack", "url_env": "TEST_SLACK_URL"}}),
                                store, db_path=str(tmp_path / "x.duckdb"))
        assert str(e.value) == f"[alerts.channels.s] url_env: TEST_SLACK_URL: the value {reason}"
    finally:
        store.close()


def test_group_by_pages_one_storage_outage_once_on_a_direct_channel(httpserver, rig, incident):
    """Issue 17: three jobs failing on one NFS server within the window are one page; a
    fourth on another server is its own; resolves follow the paged incident only."""
    import dataclasses

    from ckptwatch.detectors.incident import incident_id

    httpserver.expect_request("/v2/enqueue").respond_with_json({"status": "success"}, status=202)
    tables = channels(httpserver, "pager")
    tables["pager"]["group_by"] = ["storage_host"]
    r = rig(tables)

    def on(job: str, server: str):
        rc = dataclasses.replace(incident.root_cause, cls="storage_error",
                                 line=f"kernel: nfs: server {server} not responding, still trying")
        return version(incident, job=job, root_cause=rc, kind="storage_failure_during_save",
                       id=incident_id(job, "storage_failure_during_save", 40, incident.checkpoint_path))

    outage = [on(f"llm-{i}", "filer-2") for i in range(3)]
    other = on("llm-9", "filer-7")
    r.notify(*outage, other)
    r.pump()
    pd = sent(httpserver, "/v2/enqueue")
    assert sorted(p["dedup_key"] for p in pd) == sorted([outage[0].id, other.id])
    rows = r.store.raw.execute("SELECT incident_id, status, last_error FROM alerts WHERE channel = 'pager' "
                               "AND status = 'grouped' ORDER BY incident_id").fetchall()
    assert rows == sorted((i.id, "grouped", f"grouped under incident {outage[0].id} (storage_host=filer-2)")
                          for i in outage[1:])
    # the page's incident lists what it stands for (ckptwatch incidents show)
    r.store.upsert_incidents([*outage, other])
    under = queries.grouped_under(r.store.raw, outage[0].id)
    assert under.select("incident_id", "job", "channel").rows() == [(i.id, i.job, "pager") for i in outage[1:]]
    assert queries.grouped_under(r.store.raw, other.id).is_empty()
    r.notify(*[version(i, remediation="more evidence") for i in outage], now=T0 + dt.timedelta(minutes=1))
    r.notify(*[version(i, status="resolved") for i in outage], now=T0 + dt.timedelta(minutes=2))
    r.pump(T0 + dt.timedelta(minutes=2))
    pd = sent(httpserver, "/v2/enqueue")
    assert [(p["event_action"], p["dedup_key"]) for p in pd[2:]] == [("resolve", outage[0].id)]
    assert "2 grouped" in r.alerter.summary()
    r.close()
    from typer.testing import CliRunner

    from ckptwatch import cli

    shown = CliRunner().invoke(cli.app, ["incidents", "show", outage[0].id, "--db", r.db])
    assert shown.exit_code == 0, shown.output
    assert "  grouped here 2 incident(s), not paged on their own\n" in shown.stdout
    assert f"    {outage[1].id}  storage_failure_during_save job llm-1 step 40  (pager)" in shown.stdout
    doc = json.loads(CliRunner().invoke(cli.app, ["incidents", "show", outage[0].id, "--db", r.db, "--json"]).stdout)
    assert [g["job"] for g in doc["grouped_here"]] == ["llm-1", "llm-2"]
    import urllib.request

    from ckptwatch.ui.app import create_app
    from ckptwatch.ui.server import ConsoleServer

    server = ConsoleServer(create_app(r.db), port=0).start()  # the web console's incident page, over HTTP
    try:
        with urllib.request.urlopen(f"{server.url}incidents/{outage[0].id}", timeout=60) as res:
            page = res.read().decode()
    finally:
        server.close()
    assert '<h2 style="font-size:1rem">Grouped under this page</h2>' in page
    assert page.count(f'<a href="/incidents/{outage[1].id}"><code>{outage[1].id}</code></a>') == 1
