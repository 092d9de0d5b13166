"""Issue 14: no secret leaves in any field of any alert channel. A corpus incident is given
secrets in every field that can carry text (paths, last good checkpoint, root cause, note,
evidence, checkpoint state, remediation) and sent through real loopback servers standing in
for Slack, PagerDuty and a webhook receiver, plus the console channel."""

from __future__ import annotations

import copy
import io
import json
import time

import pytest
from rich.console import Console

from ckptwatch.config import AlertSettings
from ckptwatch.detectors.incident import EvidenceItem
from ckptwatch.pipeline import diagnose
from ckptwatch.sinks.alerts import pagerduty, slack, webhook
from ckptwatch.sinks.alerts.notification_log import Notification
from ckptwatch.sinks.redact import MAX_FIELD_CHARS, Redactor
from ckptwatch.sinks.alerts.setup import alerter_from_config
from ckptwatch.sinks.duckdb_store import Store

REDACTOR = Redactor.load()
ROUTING_KEY = "R0UT1NGKEY0123456789abcdef012345"
SIG = "fe5f80f77d5fa3beca038a248ff027d0445342fe2855ddc963176630326f1024"

#: secret -> where it is planted (the test checks each is gone from every byte sent)
SECRETS = {
    "pw-in-path-7781": "checkpoint_path",
    "pw-in-lastgood-5521": "last_good_checkpoint.path",
    "FwoGZXIvYXdzEJrHUNTER2": "root_cause.line",
    SIG: "evidence line",
    "ghs_16C7e42F292c6912E7710c838347Ae178B4a": "evidence line",
    "dXNlcjpodW50ZXIyaHVudGVyMg": "remediation",
    "hunter2redis": "root_cause.note",
    "Zm9vYmFyYmF6cXV4MTIz": "checkpoint_state.detail",
    "wJalrXUtnFEMI-secret-key": "evidence line",
    "tail-secret-after-1mib": "evidence line over the field cap",
}


@pytest.fixture(scope="module")
def leaky():
    from conftest import CORPUS

    (inc,) = diagnose([str(CORPUS / "02-sigkill-mid-save" / "logs" / "attempt-1-train")])[0]
    inc = copy.deepcopy(inc)
    inc.checkpoint_path = "s3://ckpt:pw-in-path-7781@bucket/run1/iter_0000040"
    inc.last_good_checkpoint = {**(inc.last_good_checkpoint or {}),
                                "path": "s3://ckpt:pw-in-lastgood-5521@bucket/run1/iter_0000020"}
    inc.root_cause.line += " creds X-Amz-Security-Token=FwoGZXIvYXdzEJrHUNTER2"
    inc.root_cause.note = "cache redis://:hunter2redis@cache.internal:6379 was down"
    inc.checkpoint_state = {**inc.checkpoint_state, "detail": "https://a.blob.core.windows.net/c?sv=1&sig=Zm9vYmFyYmF6cXV4MTIz"}
    inc.remediation += " Retry with Authorization: Basic dXNlcjpodW50ZXIyaHVudGVyMg=="
    ev = inc.evidence[0]
    for i, line in enumerate([
        f"PUT https://b.s3.amazonaws.com/k?X-Amz-Signature={SIG} 403",
        "clone with ghs_16C7e42F292c6912E7710c838347Ae178B4a failed",
        'boto3 config secret_key = "wJalrXUtnFEMI-secret-key"',
        "x" * (1 << 20) + " token=tail-secret-after-1mib",
    ]):
        inc.evidence.append(EvidenceItem(source_id=ev.source_id, offset=10_000_000 + i, ts=ev.ts, kind="storage_error",
                                         rank=0, host=ev.host, rule_id="r", line=line, role="context"))
    return inc


def strings(obj):
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield k
            yield from strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from strings(v)


def test_no_secret_in_any_request_or_on_the_console(httpserver, tmp_path, monkeypatch, leaky):
    for path in ("/slack", "/v2/enqueue", "/hook"):
        httpserver.expect_request(path).respond_with_data("ok")
    monkeypatch.setenv("T_SLACK", httpserver.url_for("/slack"))
    tables = {"oncall": {"type": "slack", "url_env": "T_SLACK"},
              "pager": {"type": "pagerduty", "routing_key": ROUTING_KEY, "url": httpserver.url_for("/v2/enqueue")},
              "hook": {"type": "webhook", "url": httpserver.url_for("/hook")}}
    out = io.StringIO()
    store = Store(str(tmp_path / "a.duckdb"))
    alerter = alerter_from_config(AlertSettings(channels=tables), store, db_path=str(tmp_path / "a.duckdb"),
                                  console=Console(file=out, width=120))
    try:
        with store.transaction():
            assert alerter.notify([leaky]) == 4
        for _ in range(2000):
            alerter.step()
            if not alerter.in_flight and alerter.stats.sent == 4:
                break
            time.sleep(0.005)
    finally:
        alerter.close()
        store.close()
    assert alerter.stats.sent == 4
    sent = [(q.path, q.get_data(), dict(q.headers)) for q, _ in httpserver.log]
    assert sorted(p for p, _, _ in sent) == ["/hook", "/slack", "/v2/enqueue"]
    everything = b"".join(body + json.dumps(h).encode() for _, body, h in sent) + out.getvalue().encode()
    for secret, where in SECRETS.items():
        assert secret.encode() not in everything, f"secret planted in {where} left the process"
    for path, body, _ in sent:
        doc = json.loads(body)
        for s in strings(doc):  # every string sent is a fixed point of the redactor and within the cap
            if s != ROUTING_KEY:
                assert REDACTOR.redact(s) == s and len(s) <= MAX_FIELD_CHARS, (path, s[:200])
    pd = json.loads(next(b for p, b, _ in sent if p == "/v2/enqueue"))
    assert pd["dedup_key"] == leaky.id  # the stable incident id, whatever was redacted
    assert pd["payload"]["custom_details"]["checkpoint_path"] == "s3://ckpt:[REDACTED]@bucket/run1/iter_0000040"
    assert pd["payload"]["summary"].startswith("interrupted_save: job job-0201-sigkill: save of step 40 "
                                                "(s3://ckpt:[REDACTED]@bucket/run1/iter_0000040) cut off by")
    assert "s3://ckpt:[REDACTED]@bucket/run1/iter_0000040" in out.getvalue()
    hook = json.loads(next(b for p, b, _ in sent if p == "/hook"))
    assert hook["incident"]["id"] == leaky.id
    assert hook["incident"]["last_good_checkpoint"]["path"] == "s3://ckpt:[REDACTED]@bucket/run1/iter_0000020"


def test_payload_builders_redact_whatever_incident_they_are_given(leaky):
    """The channels' renderers are safe on their own too (the dispatcher redacts first)."""
    n = Notification(id=7, channel="c", action="trigger", attempts=0, created_ts=leaky.first_ts, incident=leaky)
    docs = [slack.message(leaky, redactor=REDACTOR),
            pagerduty.trigger(leaky, routing_key=ROUTING_KEY, redactor=REDACTOR),
            json.loads(webhook.body(n, "c", REDACTOR))]
    text = json.dumps(docs)
    for secret, where in SECRETS.items():
        assert secret not in text, where
