"""Alert payloads built from a real corpus incident: exact schema, limits, redaction."""

from __future__ import annotations

import dataclasses

import pytest

from ckptwatch.detectors.incident import RootCause
from ckptwatch.pipeline import diagnose
from ckptwatch.sinks.alerts import pagerduty
from ckptwatch.sinks.redact import Redactor


@pytest.fixture(scope="module")
def sigkill_incident():
    from conftest import CORPUS

    incidents, _ = diagnose([str(CORPUS / "02-sigkill-mid-save" / "logs" / "attempt-1-train")])
    (inc,) = incidents
    return inc


def test_pagerduty_trigger_and_resolve(sigkill_incident):
    inc = sigkill_incident
    ev = pagerduty.trigger(inc, routing_key="R" * 32, redactor=Redactor.load())
    assert set(ev) == {"routing_key", "event_action", "dedup_key", "payload"}
    assert ev["event_action"] == "trigger" and ev["dedup_key"] == inc.id == "8ea36dbeed8d58eb"
    p = ev["payload"]
    assert set(p) == {"summary", "source", "severity", "timestamp", "component", "group", "class", "custom_details"}
    assert p["summary"] == ("interrupted_save: job job-0201-sigkill: save of step 40 "
                            "(/tmp/corpus-work/02-sigkill-mid-save/checkpoints/iter_0000040) cut off by SIGKILL "
                            "(rank 2, host vm); last good: step 20 "
                            "(/tmp/corpus-work/02-sigkill-mid-save/checkpoints/iter_0000020)")
    assert (p["severity"], p["source"], p["component"], p["class"]) == ("critical", "vm", "job-0201-sigkill",
                                                                         "interrupted_save")
    d = p["custom_details"]
    assert d["root_cause"]["rank"] == 2 and d["root_cause"]["pid"] == 5879 and d["root_cause"]["signal"] == "SIGKILL"
    assert d["collateral_ranks"] == [0, 1, 3]
    assert d["last_good_checkpoint"]["step"] == 20
    assert any(line.startswith("*") and "exitcode: -9" in line for line in d["timeline"])
    assert pagerduty.resolve(inc, routing_key="R" * 32) == {
        "routing_key": "R" * 32, "event_action": "resolve", "dedup_key": "8ea36dbeed8d58eb"}


def test_pagerduty_limits_and_redaction(sigkill_incident):
    rc = RootCause(cls="storage_error", rank=1, host="h" * 2000,
                   line="upload to s3://AKID:wJalr/XUtn+FE@bucket/ckpt failed: password=hunter2")
    inc = dataclasses.replace(sigkill_incident, root_cause=rc, checkpoint_path="/x" * 1000, severity="bogus")
    ev = pagerduty.trigger(inc, routing_key="R", redactor=Redactor.load())
    assert len(ev["payload"]["summary"]) == pagerduty.SUMMARY_MAX
    assert ev["payload"]["severity"] == "error"
    line = ev["payload"]["custom_details"]["root_cause"]["line"]
    assert line == "upload to s3://AKID:[REDACTED]@bucket/ckpt failed: password=[REDACTED]"
    assert "hunter2" not in str(ev) and "wJalr" not in str(ev)


def test_slack_message_blocks_and_limits(sigkill_incident):
    from ckptwatch.sinks.alerts import slack

    msg = slack.message(sigkill_incident, redactor=Redactor.load())
    assert msg["text"].startswith("interrupted_save: job job-0201-sigkill: save of step 40 ")
    kinds = [b["type"] for b in msg["blocks"]]
    assert kinds == ["header", "section", "section", "section", "section", "section", "section", "context"]
    assert msg["blocks"][5]["text"]["text"] == (
        "*Commands*\n```ckptwatch verify /tmp/corpus-work/02-sigkill-mid-save/checkpoints/iter_0000040  # verify\n"
        "mv /tmp/corpus-work/02-sigkill-mid-save/checkpoints/iter_0000040 "
        "/tmp/corpus-work/02-sigkill-mid-save/checkpoints/iter_0000040.partial  # quarantine\n"
        "ckptwatch verify /tmp/corpus-work/02-sigkill-mid-save/checkpoints/iter_0000020  # verify\n"
        "echo 20 > /tmp/corpus-work/02-sigkill-mid-save/checkpoints/latest_checkpointed_iteration.txt  # resume\n"
        "--load /tmp/corpus-work/02-sigkill-mid-save/checkpoints --ckpt-step 20  # resume```")
    assert msg["blocks"][0]["text"]["text"] == ("CRITICAL interrupted_save: job job-0201-sigkill step 40 "
                                                "(/tmp/corpus-work/02-sigkill-mid-save/checkpoints/iter_0000040)")
    assert msg["blocks"][1]["text"]["text"] == msg["text"]
    fields = [f["text"] for f in msg["blocks"][2]["fields"]]
    assert "*Root cause*\nsignal (SIGKILL), rank 2, host vm, pid 5879, 2026-11-30 10:21:21 UTC" in fields
    assert "*Collateral ranks*\n0, 1, 3" in fields
    assert any(f.startswith("*Last good checkpoint*\nstep 20 ") for f in fields)
    assert "exitcode: -9" in msg["blocks"][3]["text"]["text"]
    for b in msg["blocks"]:
        if b["type"] == "section" and "text" in b:
            assert len(b["text"]["text"]) <= slack.SECTION_MAX

    long_remedy = dataclasses.replace(sigkill_incident, remediation="password=hunter2 " + "x" * 5000)
    cut = slack.message(long_remedy, redactor=Redactor.load())
    text = cut["blocks"][4]["text"]["text"]
    assert len(text) == slack.SECTION_MAX and text.endswith("(cut to fit Slack; full evidence in DuckDB: "
                                                            "incident_evidence)")
    assert "hunter2" not in text and "password=[REDACTED]" in text
