"""Issue 17: incidents through a real Prometheus Alertmanager (built from its Go module by
``scripts/alertmanager-local``), configured with the shipped ``deploy/alertmanager/alertmanager.yml``
(only timings shortened and receiver URLs pointed at a local receiver).

Checked through Alertmanager's own API and what its webhook receiver is sent: three jobs
failing on one NFS server are one group (one notification) by ``storage_host``; a
``load_failure`` under its ``poisoned_resume`` is inhibited; a resolve ends the alerts
(``endsAt``) and Alertmanager sends the resolved notification; a revised root cause ends
the old label set; firing alerts are re-posted so an Alertmanager that restarted has them
back.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from alert_support import version
from pytest_httpserver import HTTPServer

from ckptwatch.config import AlertSettings
from ckptwatch.detectors.incident import incident_id
from ckptwatch.pipeline import diagnose
from ckptwatch.sinks.alerts import alertmanager
from ckptwatch.sinks.redact import Redactor
from ckptwatch.sinks.alerts.setup import alerter_from_config
from ckptwatch.sinks.duckdb_store import Store

ROOT = Path(__file__).resolve().parents[1]
NFS_LINE = "kernel: nfs: server filer-2 not responding, still trying"


@pytest.fixture(scope="session")
def alertmanager_binary():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import alertmanager_local
    finally:
        sys.path.pop(0)
    try:
        return alertmanager_local.build(quiet=True)
    except SystemExit as e:
        pytest.fail(f"could not build Alertmanager: {e}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str):
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


class AM:
    """A running Alertmanager on loopback with the shipped configuration."""

    def __init__(self, binary: Path, tmp: Path, receiver: HTTPServer) -> None:
        self.binary, self.tmp = binary, tmp
        secrets = tmp / "secrets"
        secrets.mkdir(exist_ok=True)
        (secrets / "oncall-webhook-url").write_text(receiver.url_for("/oncall"))
        (secrets / "chat-webhook-url").write_text(receiver.url_for("/chat"))
        text = (ROOT / "deploy" / "alertmanager" / "alertmanager.yml").read_text()
        text = text.replace("/etc/alertmanager/secrets", str(secrets))
        for k, v in (("group_wait: 30s", "group_wait: 1s"), ("group_interval: 5m", "group_interval: 1s"),
                     ("repeat_interval: 4h", "repeat_interval: 1h")):
            assert k in text, k
            text = text.replace(k, v)
        self.config = tmp / "alertmanager.yml"
        self.config.write_text(text)
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [str(self.binary), f"--config.file={self.config}", f"--storage.path={self.tmp / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--cluster.listen-address="],
            stdout=subprocess.DEVNULL, stderr=open(self.tmp / "alertmanager.log", "ab"))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        pytest.fail(f"Alertmanager did not become ready: {(self.tmp / 'alertmanager.log').read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None

    def alerts(self, **filters: str) -> list[dict]:
        q = "&".join(f"{k}={v}" for k, v in filters.items())
        return _get(f"{self.url}/api/v2/alerts?{q}")

    def groups(self) -> list[dict]:
        return _get(f"{self.url}/api/v2/alerts/groups")


@pytest.fixture
def am(alertmanager_binary, tmp_path, httpserver):
    httpserver.expect_request("/oncall").respond_with_data("ok")
    httpserver.expect_request("/chat").respond_with_data("ok")
    a = AM(alertmanager_binary, tmp_path, httpserver)
    a.start()
    yield a
    a.stop()


@pytest.fixture(scope="module")
def corpus02():
    from conftest import CORPUS

    incidents, _ = diagnose([str(CORPUS / "02-sigkill-mid-save" / "logs")])
    return {i.kind: i for i in incidents if i.job == "job-0202-resume-iter40"}


@pytest.fixture(scope="module")
def storage_incident():
    incidents, _ = diagnose([str(ROOT / "tests/fixtures/realruns/hf-torchrun-enospc/logs")])
    return next(i for i in incidents if i.kind == "storage_failure_during_save")


def _nfs_failure(inc, job: str):
    """``inc`` as it would be in job ``job`` whose save failed on NFS server filer-2."""
    rc = dataclasses.replace(inc.root_cause, line=NFS_LINE, host=f"{job}-node")
    path = f"/mnt/ckpt/{job}/checkpoint-30"
    return version(inc, job=job, root_cause=rc, checkpoint_path=path, id=incident_id(job, inc.kind, inc.step, path))


def _alerter(db: Path, am_url: str, **extra):
    table = {"type": "alertmanager", "url": am_url, "labels": {"cluster": "train-a"},
             "console_url": "http://127.0.0.1:8470", **extra}
    settings = AlertSettings(channels={"am": table})
    store = Store(str(db))
    return store, alerter_from_config(settings, store, db_path=str(db))


def _deliver(store, alerter, *incs) -> None:
    with store.transaction():
        alerter.notify(incs)
    assert alerter.drain(20) == 0


def _wait(what, check, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}")


def _received(server: HTTPServer, path: str) -> list[dict]:
    return [json.loads(q.get_data()) for q, _ in server.log if q.path == path]


def test_one_storage_outage_under_three_jobs_is_one_group_and_one_notification(am, httpserver, tmp_path,
                                                                               storage_incident):
    jobs = [_nfs_failure(storage_incident, f"llm-{i}") for i in range(3)]
    store, alerter = _alerter(tmp_path / "a.duckdb", am.url)
    try:
        _deliver(store, alerter, *jobs)
        groups = _wait("one group of three", lambda: [g for g in am.groups() if len(g["alerts"]) == 3])
        (g,) = groups
        assert g["labels"] == {"storage_host": "filer-2"}
        got = {a["labels"]["job"]: a for a in g["alerts"]}
        assert sorted(got) == ["llm-0", "llm-1", "llm-2"]
        a = got["llm-1"]
        assert a["labels"] == {"alertname": "storage_failure_during_save", "incident_id": jobs[1].id,
                               "kind": "storage_failure_during_save", "severity": "critical", "job": "llm-1",
                               "step": "30", "checkpoint": "/mnt/ckpt/llm-1/checkpoint-30", "host": "llm-1-node",
                               "cause": "storage_error", "storage_host": "filer-2", "cluster": "train-a"}
        assert a["annotations"]["summary"] == (
            "storage_failure_during_save: job llm-1: save of step 30 (/mnt/ckpt/llm-1/checkpoint-30) failed on "
            "storage: NFS server filer-2 not responding (rank 0, host llm-1-node); last good: step 20 "
            "(out/checkpoint-20)")
        assert a["annotations"]["incident_url"] == f"http://127.0.0.1:8470/incidents/{jobs[1].id}"
        assert a["generatorURL"] == a["annotations"]["incident_url"]
        assert a["status"]["state"] == "active"
        sent = _wait("the group's notification", lambda: _received(httpserver, "/oncall"))
        time.sleep(2.5)  # two more group intervals: nothing else may come for this group
        sent = _received(httpserver, "/oncall")
        assert len(sent) == 1, [s["groupLabels"] for s in sent]
        assert sent[0]["groupLabels"] == {"storage_host": "filer-2"} and len(sent[0]["alerts"]) == 3

        # the outage ends: every job saved again; Alertmanager ends the alerts and says so
        _deliver(store, alerter, *[version(j, status="resolved") for j in jobs])
        _wait("no active alert", lambda: am.alerts(active="true") == [])
        assert am.alerts(active="true", silenced="true", inhibited="true") == []
        done = _wait("the resolved notification", lambda: [s for s in _received(httpserver, "/oncall")
                                                          if s["status"] == "resolved"])
        assert len(done[0]["alerts"]) == 3 and all(a["endsAt"] != "0001-01-01T00:00:00Z" for a in done[0]["alerts"])
    finally:
        alerter.close()
        store.close()


def test_a_load_failure_under_its_poisoned_resume_is_inhibited(am, httpserver, tmp_path, corpus02):
    store, alerter = _alerter(tmp_path / "a.duckdb", am.url)
    try:
        _deliver(store, alerter, corpus02["poisoned_resume"], corpus02["load_failure"])

        def states():
            got = {a["labels"]["alertname"]: a["status"] for a in am.alerts()}
            return got if len(got) == 2 and got["load_failure"]["state"] == "suppressed" else None

        st = _wait("the load failure inhibited", states)
        assert st["poisoned_resume"]["state"] == "active"
        assert len(st["load_failure"]["inhibitedBy"]) == 1
        sent = _wait("the page", lambda: _received(httpserver, "/oncall"))
        time.sleep(2)
        sent = _received(httpserver, "/oncall")
        assert [[a["labels"]["alertname"] for a in s["alerts"]] for s in sent] == [["poisoned_resume"]]
    finally:
        alerter.close()
        store.close()


def test_a_revised_root_cause_ends_the_old_label_set(am, tmp_path, storage_incident):
    first = _nfs_failure(storage_incident, "llm-7")
    store, alerter = _alerter(tmp_path / "a.duckdb", am.url)
    try:
        _deliver(store, alerter, first)
        _wait("the first version", lambda: am.alerts(active="true"))
        rc = dataclasses.replace(first.root_cause, cls="oom_kill", rank=3, host="gpu-9", line="Killed process 77")
        _deliver(store, alerter, version(first, root_cause=rc))  # late evidence: an update, same incident
        _wait("only the new cause active", lambda: [a["labels"].get("cause") for a in am.alerts(active="true")]
              == ["oom_kill"])
        (a,) = am.alerts(active="true")
        assert (a["labels"]["incident_id"], a["labels"]["host"]) == (first.id, "gpu-9")
        assert "storage_host" not in a["labels"]
    finally:
        alerter.close()
        store.close()


def test_firing_alerts_come_back_after_alertmanager_restarts(am, tmp_path, corpus02):
    store, alerter = _alerter(tmp_path / "a.duckdb", am.url, resend_interval=1)
    try:
        _deliver(store, alerter, corpus02["poisoned_resume"])
        first = _wait("the alert", lambda: am.alerts(active="true"))
        ends = dt.datetime.fromisoformat(first[0]["endsAt"].replace("Z", "+00:00"))
        assert 0 < (ends - dt.datetime.now(dt.timezone.utc)).total_seconds() <= 4 * 1 + 1
        am.stop()
        import shutil

        shutil.rmtree(am.tmp / "data", ignore_errors=True)  # alerts live in memory: a new one knows none
        am.start()
        assert am.alerts(active="true") == []

        def refreshed():
            alerter.step()
            return am.alerts(active="true")

        back = _wait("the re-posted alert", refreshed, timeout=15)
        assert [a["labels"]["incident_id"] for a in back] == [corpus02["poisoned_resume"].id]
    finally:
        alerter.close()
        store.close()


def test_the_payload_is_alertmanagers_postable_alert(corpus02):
    inc = corpus02["poisoned_resume"]
    now = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.timezone.utc)
    detected = version(inc, detected_ts=now - dt.timedelta(seconds=30))
    doc = alertmanager.alert(Redactor.load().incident(detected), firing=True, now=now, static={"cluster": "a"},
                             runbook_url="https://runbooks.example/ckpt#{kind}", resend_interval=60)
    assert set(doc) == {"labels", "annotations", "startsAt", "endsAt"}
    assert (doc["startsAt"], doc["endsAt"]) == ("2026-12-01T11:59:30Z", "2026-12-01T12:04:00Z")
    assert doc["annotations"]["first_event"] == inc.first_ts.isoformat().replace("+00:00", "Z")
    assert doc["labels"] == {"cluster": "a", "alertname": "poisoned_resume", "incident_id": inc.id,
                             "kind": "poisoned_resume", "severity": "critical", "job": "job-0202-resume-iter40",
                             "step": "40", "checkpoint": "/tmp/corpus-work/02-sigkill-mid-save/checkpoints/iter_0000040"}
    assert set(doc["annotations"]) == {"summary", "description", "remediation", "last_good", "first_event",
                                       "runbook_url", "commands", "verify_command"}
    assert doc["annotations"]["verify_command"] == \
        "ckptwatch verify /tmp/corpus-work/02-sigkill-mid-save/checkpoints/iter_0000040"
    assert doc["annotations"]["runbook_url"] == "https://runbooks.example/ckpt#poisoned_resume"
    assert doc["annotations"]["description"] == "its save was interrupted by SIGKILL (rank 2, host vm)"
    ended = alertmanager.alert(detected, firing=False, now=now)
    assert (ended["startsAt"], ended["endsAt"]) == ("2026-12-01T11:59:30Z", "2026-12-01T12:00:00Z")


@pytest.mark.parametrize(("table", "message"), [
    ({"type": "alertmanager"}, "[alerts.channels.am]: an alertmanager channel needs url_env, url_file or url"),
    ({"type": "alertmanager", "url": "http://127.0.0.1:9093", "labels": {"bad-name": "x"}},
     "[alerts.channels.am] labels.bad-name: a label name is [a-zA-Z_][a-zA-Z0-9_]* and its value a string"),
    ({"type": "alertmanager", "url": "http://127.0.0.1:9093", "resend_interval": 0},
     "[alerts.channels.am] resend_interval: must be a positive number of seconds"),
])
def test_a_bad_alertmanager_table_is_one_line_naming_the_key(table, message):
    from ckptwatch.sinks.alerts.settings import AlertConfigError, parse_channel

    with pytest.raises(AlertConfigError) as e:
        parse_channel("am", table)
    assert str(e.value) == message
