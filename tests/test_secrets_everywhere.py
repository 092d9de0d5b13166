"""Issue 35, item 1: no secret in anything ckptwatch shows or sends. Each secret shape the
attacker found escaping is planted in each field an incident carries (commands rebuilt
after, as the detector builds them), then every outbound rendering is searched for it:
the alert channels' payloads, the report, the console's pages and JSON, ``incidents
show`` / ``list`` / ``export`` / ``plot``, and a diagnosed upload."""

from __future__ import annotations

import copy
import json
import os
import stat
import urllib.request

import polars as pl
import pytest
from typer.testing import CliRunner

from ckptwatch import cli
from ckptwatch.detectors.commands import commands
from ckptwatch.detectors.events import cut
from ckptwatch.detectors.headline import headline
from ckptwatch.detectors.incident import EvidenceItem
from ckptwatch.history.cli import report_text
from ckptwatch.pipeline import diagnose
from ckptwatch.sinks.alerts import alertmanager, pagerduty, slack, webhook
from ckptwatch.sinks.alerts.notification_log import Notification
from ckptwatch.sinks.duckdb_store import Store
from ckptwatch.sinks.redact import Redactor
from ckptwatch.ui.app import create_app
from ckptwatch.ui.server import ConsoleServer

REDACTOR = Redactor.load()

#: (how the secret appears in a log or path, the secret itself): the shapes of issue 35
SHAPES = [
    ("s3://ckpt:PWinURL7781@bucket/run1/iter_0000040", "PWinURL7781"),
    ("https://hooks.slack.com/services/T0001/B0002/SLACKhook5521xyz", "SLACKhook5521xyz"),
    ("/cache/hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567_model", "hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567"),
    ("/secrets/AKIAIOSFODNN7EXAMPLE_creds.json", "AKIAIOSFODNN7EXAMPLE"),
    ('{"X-Amz-Signature": "sigJSON0a1b2c3d4e"}', "sigJSON0a1b2c3d4e"),
    ("next=https%3A%2F%2Fb%2Fk%3FX-Amz-Signature%3DsigENC9f8e7d6c%26X-Amz-Date%3D1", "sigENC9f8e7d6c"),
    ("rsync ckpt:PWnoScheme42@backup.internal:/ckpt", "PWnoScheme42"),
    ("aws configure set aws_secret_access_key wJalrXUtnFEMIK7MDENGbPxRfiCYsecret", "wJalrXUtnFEMIK7MDENGbPxRfiCYsecret"),
    # the second attack round's fresh user: a failed Slack POST as urllib3 prints it, a GitLab token
    ("HTTPSConnectionPool(host='hooks.slack.com', port=443): Max retries exceeded with url: "
     "/services/T0AB12CD3/B0EF45GH6/a1B2c3D4e5F6g7H8i9J0k1L2 (Caused by X)", "a1B2c3D4e5F6g7H8i9J0k1L2"),
    ("git clone https://gitlab.example/r.git with glpat-AbCdEfGhIjKlMnOpQrSt", "glpat-AbCdEfGhIjKlMnOpQrSt"),
    # and the third attack round's: an encoded webhook path, a versioned Discord API, SigV2 and CloudFront
    ("url: %2Fservices%2FT0AAAAAAA%2FB0BBBBBBB%2FencSLACK0a1b2c3d4e5f6g7", "encSLACK0a1b2c3d4e5f6g7"),
    ("url: /api/v10/webhooks/123456789012345678/discordV10secretTOKEN0123?wait=true", "discordV10secretTOKEN0123"),
    ("https://d1.cloudfront.net/ckpt?Expires=1764489600&Signature=cfSIGsecret0a1b2c~x&Key-Pair-Id=K2J", "cfSIGsecret0a1b2c"),
    # and the fourth's: JSON-escaped slashes, twice URL-encoded, an encoded bearer, tokens after "_"
    ('{"url": "https:\\/\\/hooks.slack.com\\/services\\/T0AB12CD3\\/B0EF45GH6\\/escSLACK0a1b2c3d4e5f6g"}',
     "escSLACK0a1b2c3d4e5f6g"),
    ("u=%253FX-Amz-Signature%253Ddbl0encoded0123456789abcdef", "dbl0encoded0123456789abcdef"),
    ("auth=Bearer%20encBearer0123456789", "encBearer0123456789"),
    ("SLACK_xoxb-1234567890-underscoreSlack", "xoxb-1234567890-underscoreSlack"),
    ("flags glffct-FeatureFlagClient0123456", "glffct-FeatureFlagClient0123456"),
]

FIELDS = ("checkpoint_path", "last_good_path", "root_line", "root_note", "evidence", "checkpoint_state", "remediation",
          "host")


@pytest.fixture(scope="module")
def base():
    from conftest import CORPUS

    (inc,) = diagnose([str(CORPUS / "02-sigkill-mid-save" / "logs" / "attempt-1-train")])[0]
    return inc


def planted(inc, text: str, fields=FIELDS):
    """A copy of ``inc`` carrying ``text`` in each of ``fields``, its commands rebuilt."""
    inc = copy.deepcopy(inc)
    for f in fields:
        if f == "checkpoint_path":
            inc.checkpoint_path = text if "://" in text else "/ckpt/" + text
        elif f == "last_good_path":
            inc.last_good_checkpoint = {**(inc.last_good_checkpoint or {}), "path": text}
        elif f == "root_line":
            inc.root_cause.line += " " + text
        elif f == "root_note":
            inc.root_cause.note = f"see {text}"
        elif f == "evidence":
            ev = inc.evidence[0]
            inc.evidence.append(EvidenceItem(source_id=ev.source_id, offset=ev.offset + 1, ts=ev.ts, kind="storage_error",
                                             rank=0, host=ev.host, rule_id="r", line=f"upload failed: {text}",
                                             role="context"))
        elif f == "checkpoint_state":
            inc.checkpoint_state = {**inc.checkpoint_state, "detail": text}
        elif f == "remediation":
            inc.remediation += " " + text
        elif f == "host":
            inc.root_cause.host = text
    inc.commands = commands(inc)
    return inc


@pytest.mark.parametrize(("shape", "secret"), SHAPES, ids=[s for _, s in SHAPES])
def test_each_shape_in_each_field_leaves_no_channel(base, shape, secret):
    for field in FIELDS:
        inc = planted(base, shape, (field,))
        raw = json.dumps(inc.to_dict(), default=str)
        assert secret in raw, f"{field}: the secret was not planted"
        safe = REDACTOR.incident(inc)  # what the dispatcher hands every channel
        n = Notification(id=1, channel="c", action="trigger", attempts=0, created_ts=inc.first_ts, incident=inc)
        out = json.dumps([slack.message(inc, redactor=REDACTOR), pagerduty.trigger(inc, routing_key="k", redactor=REDACTOR),
                          json.loads(webhook.body(n, "c", REDACTOR)),
                          alertmanager.alert(safe, firing=True, now=inc.first_ts),
                          safe.to_dict(), headline(safe), report_text(safe)], default=str)
        assert secret not in out, f"{shape!r} planted in {field} left in a payload"


def test_console_show_list_export_and_plot_show_no_secret(base, tmp_path):
    shapes = " ".join(s for s, _ in SHAPES)
    inc = planted(base, shapes)
    inc.checkpoint_path = SHAPES[0][0]
    inc.commands = commands(inc)
    db = str(tmp_path / "leaky.duckdb")
    store = Store(db)
    try:
        store.upsert_incidents([inc])
    finally:
        store.close()
    runner = CliRunner()
    outputs = []
    for args in (["show", inc.id[:8]], ["show", inc.id[:8], "--json"], ["list", "--json"]):
        res = runner.invoke(cli.app, ["incidents", *args, "--db", db])
        assert res.exit_code == 0, res.output
        outputs.append(res.stdout)
    assert "s3://ckpt:[REDACTED]@bucket/run1/iter_0000040" in outputs[0]
    files = []
    for table in ("incidents", "evidence"):
        for ext in ("csv", "parquet"):
            out = tmp_path / f"{table}.{ext}"
            res = runner.invoke(cli.app, ["incidents", "export", str(out), "--table", table, "--db", db])
            assert res.exit_code == 0, res.output
            files.append(out)
    for ext in ("svg", "html", "png"):
        out = tmp_path / f"plot.{ext}"
        res = runner.invoke(cli.app, ["incidents", "plot", inc.id[:8], "--out", str(out), "--db", db])
        assert res.exit_code == 0, res.output
        files.append(out)
    for f in files:  # issue 35 item 7: what is written holds log lines: its user's only
        assert stat.S_IMODE(os.stat(f).st_mode) == 0o600, f
    frames = [pl.read_csv(f) if f.suffix == ".csv" else pl.read_parquet(f) for f in files if f.suffix in (".csv", ".parquet")]
    assert frames[0].height == 1 and frames[2].height == len(inc.evidence)
    texts = outputs + [f.read_text() for f in files if f.suffix in (".csv", ".svg", ".html")] + \
        [json.dumps(fr.to_dicts(), default=str) for fr in frames]
    server = ConsoleServer(create_app(db), "127.0.0.1", 0).start()
    try:
        for page in ("", "api/incidents", f"incidents/{inc.id}"):
            with urllib.request.urlopen(server.url + page, timeout=30) as r:
                texts.append(r.read().decode())
        assert "<svg" in texts[-1] and "[REDACTED]" in texts[-1]
        log = "\n".join(f"[rank0]: 2026-12-01 10:00:0{i} ERROR save failed: OSError: {s}" for i, (s, _) in enumerate(SHAPES))
        log = "[rank0]: 2026-12-01 09:59:59 INFO Saving checkpoint to /ckpt/step_40\n" + log + "\n"
        # a secret across the 240th character, where the detector cuts a stored line (the attack on
        # the fix: "s3://ckptuser:CUTLEAK9S" was shown); a JSON line whose secret is keyed, not shaped
        log += ("[rank1]: 2026-12-01 10:00:09 ERROR save failed: OSError: [Errno 5] Input/output error: " + "x" * 139
                + " s3://ckptuser:CUTLEAK9SECRET@minio.internal/ckpt/step_40\n")
        log += '{"rank": 1, "password": "JSONKEYLEAK10", "msg": "Saving checkpoint to /ckpt/step_40"}\n'
        body, ctype = multipart({"text": log})
        req = urllib.request.Request(server.url + "api/diagnose", data=body, headers={"Content-Type": ctype})
        with urllib.request.urlopen(req, timeout=60) as r:
            doc = json.loads(r.read())
        assert doc["incidents"], doc["report"]
        texts.append(json.dumps(doc))
    finally:
        server.close()
    everything = "\n".join(texts)
    for shape, secret in [*SHAPES, ("cut at 240", "CUTLEAK9"), ("keyed JSON", "JSONKEYLEAK10")]:
        assert secret not in everything, f"{shape!r} left in an output"


def multipart(fields: dict[str, str]) -> tuple[bytes, str]:
    """A multipart/form-data body of text ``fields`` and its Content-Type."""
    boundary = "ckptwatchtestboundary"
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n' for k, v in fields.items()]
    return ("".join(parts) + f"--{boundary}--\r\n").encode(), f"multipart/form-data; boundary={boundary}"


def test_a_line_is_never_cut_inside_a_url_or_token():
    line = "OSError: " + "x" * 228 + " s3://u:pw@minio/b/iter_40 and more words after it"
    assert cut(line, 240) == line[:line.index(" and more")]  # the URL kept whole for redaction to see
    assert cut("short", 240) == "short" and len(cut("y" * 9000, 240)) == 240 + 4096


def test_json_text_is_redacted_by_key_and_stays_json():
    doc = '{"password": "hunter2", "pwd": 1234, "Authorization": "Basic dXNl", "detail": {"token": "t0k"}, "n": 5}'
    out = REDACTOR.text_or_json(doc)
    assert json.loads(out) == {"password": "[REDACTED]", "pwd": "[REDACTED]", "Authorization": "[REDACTED]",
                               "detail": {"token": "[REDACTED]"}, "n": 5}
    nested = json.dumps({"detail": json.dumps({"password": "X9y"})})  # JSON inside JSON: escaped quotes
    assert "X9y" not in REDACTOR.text_or_json(nested)
