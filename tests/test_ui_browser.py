"""The web console end to end in a real headless browser (Debian's Chromium, driven by
Selenium through the OS's chromedriver): `ckptwatch run --ui` on corpus logs, the list
updating live when a new job's logs arrive, an incident page, and "diagnose a log" with
pasted text, a dropped file, and bad input (binary, empty, too big)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from ckptwatch.ui.diagnose import MAX_UPLOAD

CORPUS = Path(__file__).resolve().parent.parent / "examples" / "corpus"
CHROMEDRIVER = os.environ.get("CKPTWATCH_CHROMEDRIVER", shutil.which("chromedriver") or "/usr/bin/chromedriver")
CHROMIUM = os.environ.get("CKPTWATCH_CHROMIUM", shutil.which("chromium") or "/usr/bin/chromium")


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    assert os.path.exists(CHROMEDRIVER) and os.path.exists(CHROMIUM), (
        "the browser tests need Chromium and its driver: apt-get install chromium chromium-driver (Debian), "
        "or CKPTWATCH_CHROMIUM / CKPTWATCH_CHROMEDRIVER naming them")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.implicitly_wait(0)
    yield driver
    driver.quit()


def wait_for(what: str, condition, timeout: float = 60.0, proc: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout
    while True:
        got = condition()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{what}: the process exited: {proc.stderr.read()}")
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
        time.sleep(0.25)


def text_of(driver, css: str) -> str:
    from selenium.webdriver.common.by import By

    found = driver.find_elements(By.CSS_SELECTOR, css)
    return found[0].text if found else ""


@pytest.fixture
def live_run(tmp_path):
    """`ckptwatch run --ui 0` over a directory holding scenario 02's logs; yields (url, logs, db)."""
    logs = tmp_path / "logs"
    shutil.copytree(CORPUS / "02-sigkill-mid-save" / "logs", logs / "02")
    db = tmp_path / "live.duckdb"
    env = {**os.environ, "CKPTWATCH_SINK_SNAPSHOT_EVERY": "0.5"}
    proc = subprocess.Popen([sys.executable, "-m", "ckptwatch", "run", "--logs", str(logs), "--db", str(db),
                             "--ui", "0", "--interval", "0.3"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    url = None
    lines = []
    deadline = time.monotonic() + 60
    while url is None:
        line = proc.stderr.readline()
        assert line or proc.poll() is None, "".join(lines)
        lines.append(line)
        m = re.search(r"console: (http://127\.0\.0\.1:\d+/)", line)
        url = m.group(1) if m else None
        assert time.monotonic() < deadline, "".join(lines)
    try:
        yield url, logs, db, proc
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)


def rows(driver) -> list[dict]:
    """The list's rows, read in one script run: the page re-renders the table every 2 s, so
    elements found one by one may be gone before they are read."""
    return driver.execute_script("""
        return Array.from(document.querySelectorAll("#incidents tr[data-id]")).map(tr => ({
            id: tr.dataset.id, text: tr.innerText, cls: tr.className, href: tr.querySelector("a").href}));""")


def test_the_list_updates_live_and_an_incident_page_shows_its_timeline(browser, live_run):
    from selenium.webdriver.common.by import By

    url, logs, _, proc = live_run
    browser.get(url)
    # the first incident is in the snapshot within seconds; the page's own refresh shows it
    wait_for("job-0201-sigkill listed", lambda: any("job-0201-sigkill" in r["text"] for r in rows(browser)), proc=proc)
    assert "read snapshot of" in text_of(browser, "#source")
    before = {r["id"] for r in rows(browser)}
    # a new job's logs arrive in the watched directory: its incident appears without a reload
    shutil.copytree(CORPUS / "03-collective-timeout" / "logs", logs / "03")
    new_row = wait_for("job-0301-timeout appears live", lambda: [
        r for r in rows(browser) if "job-0301-timeout" in r["text"] and "interrupted_save" in r["text"]],
        timeout=90, proc=proc)[0]
    assert new_row["id"] not in before
    assert "new" in new_row["cls"].split()
    assert "new incident(s) since" in text_of(browser, "#banner")
    # listed while provisional, from the files read so far (copytree writes them one by one):
    # the row follows as the rest arrive, to the rank the others waited for
    new_row = wait_for("job-0301-timeout's root rank", lambda: [
        r for r in rows(browser) if r["id"] == new_row["id"] and "collective_timeout rank 1" in r["text"]],
        timeout=60, proc=proc)[0]
    # its page (the link the row holds): timeline picture, report, evidence with the file each line came from
    assert new_row["href"] == f"{url}incidents/{new_row['id']}"
    browser.get(new_row["href"])
    wait_for("incident page", lambda: browser.find_elements(By.CSS_SELECTOR, "#timeline svg"))
    assert "root cause   collective_timeout on rank 1" in text_of(browser, "#report")
    evidence = text_of(browser, "#evidence")
    assert str(logs / "03") in evidence and "collateral" in evidence
    # the incident is listed at once, provisional, and paged once its evidence settles (issue
    # 17): reloaded, its page then shows the console channel's trigger and "alerted"

    def alerted():
        browser.get(new_row["href"])
        return text_of(browser, "#paging") == "alerted"

    wait_for("the settled incident paged", alerted, timeout=90, proc=proc)
    assert "console" in text_of(browser, "#alerts")  # the console channel's trigger


def test_diagnose_a_pasted_log_a_dropped_file_and_bad_input(browser, tmp_path):
    from selenium.webdriver.common.by import By

    from ckptwatch.ui.app import create_app
    from ckptwatch.ui.server import ConsoleServer

    server = ConsoleServer(create_app(str(tmp_path / "none.duckdb")), port=0).start()
    try:
        browser.get(server.url + "diagnose")
        console_log = (CORPUS / "02-sigkill-mid-save" / "logs" / "attempt-1-train" / "console.log").read_text()
        # paste: the textarea gets the log (set by script: typing 278 lines key by key is slow)
        browser.execute_script("document.getElementById('text').value = arguments[0];", console_log)
        browser.find_element(By.ID, "go").click()
        report = wait_for("pasted log diagnosed", lambda: text_of(browser, "#diagnosis-report"))
        assert "CRITICAL interrupted_save  job job-0201-sigkill  step 40" in report
        assert "root cause   signal (SIGKILL) on rank 2" in report
        assert browser.find_elements(By.CSS_SELECTOR, "#result .timeline svg")
        assert "1 file(s) read" in text_of(browser, "#summary")

        # drop: a drop event carrying a file, as a browser fires it when a file is dropped
        browser.get(server.url + "diagnose")
        timeout_log = (CORPUS / "03-collective-timeout" / "logs" / "attempt-1-train" / "console.log").read_text()
        browser.execute_script("""
            const dt = new DataTransfer();
            dt.items.add(new File([arguments[0]], "console.log", {type: "text/plain"}));
            document.getElementById("drop").dispatchEvent(new DragEvent("drop", {dataTransfer: dt, bubbles: true}));
        """, timeout_log)
        assert "console.log" in text_of(browser, "#dropped")
        browser.find_element(By.ID, "go").click()
        report = wait_for("dropped log diagnosed", lambda: text_of(browser, "#diagnosis-report"))
        assert "interrupted_save  job job-0301-timeout  step 40" in report
        assert "collective_timeout on rank 1" in report

        # bad input: binary, empty, too big: a clear message each, no traceback
        binary = tmp_path / "model.safetensors"
        binary.write_bytes(b"\x00\x01\x02" * 4000)
        browser.get(server.url + "diagnose")
        browser.find_element(By.ID, "files").send_keys(str(binary))
        browser.find_element(By.ID, "go").click()
        msg = wait_for("binary refused", lambda: text_of(browser, "#diagnose-error"))
        assert msg == ("nothing readable: model.safetensors: binary, not a text log (a checkpoint or an archive? "
                       "ckptwatch verify checks checkpoints)")
        browser.get(server.url + "diagnose")
        browser.find_element(By.ID, "go").click()
        assert wait_for("empty refused", lambda: text_of(browser, "#diagnose-error")) == \
            "nothing to diagnose: paste a log or drop log files"
        huge = tmp_path / "huge.log"
        with open(huge, "wb") as f:
            f.truncate(MAX_UPLOAD + 1)
        browser.get(server.url + "diagnose")
        browser.find_element(By.ID, "files").send_keys(str(huge))
        browser.find_element(By.ID, "go").click()
        assert wait_for("huge refused", lambda: text_of(browser, "#diagnose-error")) == \
            "64.0 MiB selected: at most 64 MiB here; for bigger logs run ckptwatch diagnose on them"
        # the server refuses it too, for a client without the page's script
        request = urllib.request.Request(server.url + "api/diagnose", data=b"x" * (MAX_UPLOAD + (2 << 20)),
                                         headers={"Content-Type": "application/octet-stream"})
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=60)
        assert caught.value.code == 413
        assert json.loads(caught.value.read())["error"].startswith("upload too large: at most 64 MiB")
        # no page fetches anything from the network: no external script, style, image or font
        for page in ("", "diagnose"):
            html = urllib.request.urlopen(server.url + page, timeout=10).read().decode()
            assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//|url\(\s*["']?(https?:)?//""", html), page
    finally:
        server.close()
