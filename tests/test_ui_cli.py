"""`ckptwatch ui` alone over a database at rest (an old one: schema version 1): the pages
and the JSON API over real HTTP on loopback."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

V1 = Path(__file__).parent / "fixtures" / "history" / "schema-v1.duckdb.gz"


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_ui_serves_a_database_at_rest(tmp_path):
    db = tmp_path / "old.duckdb"
    with gzip.open(V1) as src, open(db, "wb") as dst:
        shutil.copyfileobj(src, dst)
    proc = subprocess.Popen([sys.executable, "-m", "ckptwatch", "ui", "--db", str(db), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        url = re.match(r"console: (http://127\.0\.0\.1:\d+/)", line).group(1)
        status, page = get(url)
        assert status == 200 and page.count("<tr data-id=") == 6 and "(at rest)" in page
        status, body = get(url + "api/incidents?kind=interrupted_save&severity=critical")
        doc = json.loads(body)
        assert status == 200 and doc["count"] == 2
        assert {(i["job"], i["cause"]) for i in doc["incidents"]} == {
            ("job-0201-sigkill", "signal rank 2 on vm"), ("job-0301-timeout", "collective_timeout rank 1 on vm")}
        sigkill = next(i["id"] for i in doc["incidents"] if i["job"] == "job-0201-sigkill")
        status, page = get(url + f"incidents/{sigkill[:8]}")
        assert status == 200 and "<svg" in page and "/tmp/fx/logs/02-sigkill-mid-save/logs/attempt-1-train/console.log:63008" in page
        assert 'id="paging">alerted</span>' in page  # its console report went out (schema 1: no provisional column)
        assert {i["paging"] for i in doc["incidents"]} == {"alerted"}
        assert get(url + "incidents/ffffffff")[0] == 404
        status, body = get(url + "api/incidents?since=yesterday")
        assert status == 400 and json.loads(body)["error"].startswith("since yesterday: not a duration")
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "Traceback" not in err, err


def test_the_diagnose_form_works_without_the_page_s_script(tmp_path):
    """A browser without JavaScript posts the form itself: the page comes back with the
    report in it, or with the message (status 400) for nothing readable."""
    import urllib.parse

    from ckptwatch.ui.app import create_app
    from ckptwatch.ui.server import ConsoleServer

    corpus = Path(__file__).resolve().parent.parent / "examples" / "corpus"
    log = (corpus / "02-sigkill-mid-save" / "logs" / "attempt-1-train" / "console.log").read_text()
    server = ConsoleServer(create_app(str(tmp_path / "none.duckdb")), port=0).start()
    try:
        form = urllib.parse.urlencode({"text": log}).encode()
        with urllib.request.urlopen(urllib.request.Request(server.url + "diagnose", data=form), timeout=60) as r:
            page = r.read().decode()
        assert r.status == 200
        assert '<pre id="diagnosis-report">CRITICAL interrupted_save  job job-0201-sigkill  step 40' in page
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(urllib.request.Request(server.url + "diagnose", data=b"text="), timeout=30)
        assert caught.value.code == 400
        assert ('<div class="error" id="diagnose-error">nothing to diagnose: paste a log or drop log files</div>'
                in caught.value.read().decode())
    finally:
        server.close()
