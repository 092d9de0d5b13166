"""Issue 35, items 2, 4, 5: a console that cannot be turned against its host. A real
console (Werkzeug's server on loopback) answered by real HTTP: foreign Host names and
cross-site posts refused, security headers on every answer, an optional token, uploads
bounded in unpacked bytes, lines, CPU and concurrency, a diagnosis killed when its client
leaves, and log text with ``$`` drawn as text by parallel requests."""

from __future__ import annotations

import concurrent.futures
import copy
import gzip
import http.client
import json
import multiprocessing
import re
import socket
import time
from urllib.parse import urlsplit

import pytest
from test_secrets_everywhere import multipart

from ckptwatch.pipeline import diagnose
from ckptwatch.sinks.duckdb_store import Store
from ckptwatch.ui.app import create_app
from ckptwatch.ui.diagnose import Limits
from ckptwatch.ui.server import ConsoleServer

MATH = r"loss $\frac{1}{0}$ and $unbalanced \sqrt{ and $$ empty"


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    from conftest import CORPUS

    (inc,) = diagnose([str(CORPUS / "02-sigkill-mid-save" / "logs" / "attempt-1-train")])[0]
    inc = copy.deepcopy(inc)
    inc.root_cause.line += " " + MATH  # issue 35 item 4: mathtext in a log line, drawn on the picture
    inc.root_cause.host = "node$1$"
    path = str(tmp_path_factory.mktemp("guard") / "h.duckdb")
    store = Store(path)
    try:
        store.upsert_incidents([inc])
    finally:
        store.close()
    return path, inc.id


def serve(db_path: str, **kw) -> ConsoleServer:
    return ConsoleServer(create_app(db_path, **kw), "127.0.0.1", 0).start()


def request(url: str, path: str, *, method: str = "GET", body: bytes | None = None,
            headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], str]:
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read().decode(errors="replace")
    finally:
        conn.close()


def test_foreign_hosts_cross_site_posts_and_framing_are_refused(db):
    path, _ = db
    server = serve(path, allow_hosts=["ckpt.example.internal"])
    try:
        port = server.port
        for host in ("attacker.example", f"attacker.example:{port}", "localhost.attacker.example"):
            status, _, body = request(server.url, "/api/incidents", headers={"Host": host})
            assert status == 421 and "is not this console's" in body, (host, status)
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", "ckpt.example.internal", f"[::1]:{port}",
                     socket.gethostname()):
            assert request(server.url, "/api/incidents", headers={"Host": host})[0] == 200, host
        body, ctype = multipart({"text": "[rank0]: Saving checkpoint to /ckpt/step_10\n"})
        for extra in ({"Origin": "http://attacker.example"}, {"Origin": f"http://localhost:{port + 1}"},
                      {"Sec-Fetch-Site": "cross-site"}):
            for page in ("/api/diagnose", "/diagnose"):
                status, _, text = request(server.url, page, method="POST", body=body,
                                          headers={"Content-Type": ctype, **extra})
                assert status == 403 and "cross-origin request refused" in text, (extra, page, status)
        own = {"Origin": f"http://127.0.0.1:{port}", "Sec-Fetch-Site": "same-origin"}
        status, _, text = request(server.url, "/api/diagnose", method="POST", body=body,
                                  headers={"Content-Type": ctype, **own})
        assert status == 200 and json.loads(text)["read"] == ["pasted.log"]
        status, headers, page = request(server.url, "/")
        assert status == 200
        nonce = re.search(r"script-src 'nonce-([^']+)'", headers["content-security-policy"]).group(1)
        assert f'<script nonce="{nonce}">' in page and "frame-ancestors 'none'" in headers["content-security-policy"]
        assert headers["x-frame-options"] == "DENY" and headers["x-content-type-options"] == "nosniff"
        assert request(server.url, "/")[1]["content-security-policy"] != headers["content-security-policy"]  # fresh nonce
    finally:
        server.close()


def test_a_token_is_required_when_set(db, caplog):
    caplog.set_level("INFO", logger="werkzeug")
    path, iid = db
    server = serve(path, token="s3cret-console-token")
    try:
        for page in ("/", "/api/incidents", f"/incidents/{iid}", "/diagnose"):
            status, _, body = request(server.url, page)
            assert status == 401 and "needs its token" in body, page
        assert request(server.url, "/?token=wrong")[0] == 401
        status, headers, _ = request(server.url, "/?token=s3cret-console-token&kind=interrupted_save")
        assert status == 303 and headers["location"] == "/?kind=interrupted_save"
        cookie = headers["set-cookie"]
        assert cookie.startswith("ckptwatch_token=s3cret-console-token") and "HttpOnly" in cookie and \
            "SameSite=Strict" in cookie
        assert request(server.url, "/", headers={"Cookie": "ckptwatch_token=s3cret-console-token"})[0] == 200
        status, _, body = request(server.url, "/api/incidents", headers={"Authorization": "Bearer s3cret-console-token"})
        assert status == 200 and json.loads(body)["count"] == 1
        assert request(server.url, "/api/incidents", headers={"Authorization": "Bearer s3cret"})[0] == 401
        for odd in ("/?token=%C3%A9t%C3%A9", "/api/incidents"):  # non-ASCII: refused, not a 500
            assert request(server.url, odd, headers={"Cookie": "ckptwatch_token=\u00e9t\u00e9".encode().decode("latin-1")}
                           )[0] == 401
    finally:
        server.close()
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "/?token=[REDACTED]&kind=interrupted_save" in logged and "s3cret-console-token" not in logged


def post_log(url: str, data: bytes, name: str = "x.log", **headers: str) -> tuple[int, dict]:
    boundary = "ckptwatchtestboundary"
    body = (f'--{boundary}\r\nContent-Disposition: form-data; name="files"; filename="{name}"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()
    status, _, text = request(url, "/api/diagnose", method="POST", body=body,
                              headers={"Content-Type": f"multipart/form-data; boundary={boundary}", **headers})
    return status, json.loads(text)


def heavy_log(lines: int) -> bytes:
    """A log that takes the pipeline a while: progress and save lines of one rank."""
    rows = []
    for i in range(lines):
        rows.append(f"[rank0]: 2026-12-01 10:{i // 6000 % 60:02d}:{i // 100 % 60:02d} INFO step {i} loss 1.25 "
                    "lr 3e-4 grad_norm 0.9")
        if i % 5000 == 0:
            rows.append(f"[rank0]: 2026-12-01 10:{i // 6000 % 60:02d}:{i // 100 % 60:02d} INFO Saving checkpoint "
                        f"to /ckpt/step_{i}")
    return ("\n".join(rows) + "\n").encode()


def test_uploads_are_bounded_unpacked_by_lines_by_cpu_and_at_once(db):
    path, _ = db
    server = serve(path, limits=Limits(text_bytes=32 << 20, lines=400_000, cpu_s=1, wall_s=30, concurrent=1))
    try:
        bomb = gzip.compress(b"a" * (64 << 20), 1)  # 64 MiB of text in ~64 KiB
        t0 = time.monotonic()
        status, doc = post_log(server.url, bomb, "bomb.log.gz")
        assert status == 400 and doc["error"].startswith("more than 32 MiB of text once unpacked"), doc
        assert time.monotonic() - t0 < 10
        status, doc = post_log(server.url, gzip.compress(b"x\n" * 450_000), "many.log.gz")
        assert status == 400 and doc["error"].startswith("more than 400,000 lines"), doc
        status, doc = post_log(server.url, heavy_log(380_000))  # under both caps, several seconds of CPU
        assert status == 400 and doc["error"].startswith("reading it took more than 1 s of CPU"), doc
        status, doc = post_log(server.url, heavy_log(50))
        assert status == 200 and doc["read"] == ["x.log"]
        status, doc = post_log(server.url, gzip.compress(gzip.compress(b"x\n" * 6_000_000)), "n.log.gz.gz")
        assert status == 400 and doc["error"] == "n.log.gz.gz: a gzip inside a gzip: unpack it once and send that"
        status, doc = post_log(server.url, heavy_log(50), "password=FNLEAK13 ghp_16C7e42F292c6912E7710c838347Ae178B4a.log")
        assert status == 200 and "FNLEAK13" not in json.dumps(doc) and "ghp_16C7" not in json.dumps(doc), doc["read"]
        body, ctype = multipart({"text": heavy_log(9000).decode()})  # ~700 kB pasted (Flask's form default: 500 kB)
        assert len(body) > 600_000
        status, _, text = request(server.url, "/api/diagnose", method="POST", body=body, headers={"Content-Type": ctype})
        assert status == 200 and json.loads(text)["read"] == ["pasted.log"]
    finally:
        server.close()


def test_one_diagnosis_at_a_time_and_a_client_that_leaves_stops_its_work(db):
    path, _ = db
    server = serve(path, limits=Limits(cpu_s=120, wall_s=120, concurrent=1))
    try:
        data = heavy_log(200_000)
        boundary = "b0undary"
        body = (f'--{boundary}\r\nContent-Disposition: form-data; name="files"; filename="big.log"\r\n\r\n').encode() + \
            data + f"\r\n--{boundary}--\r\n".encode()
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.sendall((f"POST /api/diagnose HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: multipart/form-data; "
                      f"boundary={boundary}\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body)
        deadline = time.monotonic() + 30
        while not [p for p in multiprocessing.active_children() if p.name == "ckptwatch-diagnose"]:
            assert time.monotonic() < deadline, "the diagnosis never started"
            time.sleep(0.05)
        status, doc = post_log(server.url, heavy_log(10))
        assert status == 503 and doc["error"].startswith("the console is already reading 1 upload"), doc
        slow = socket.create_connection(("127.0.0.1", server.port))  # a sender that trickles holds no slot
        slow.sendall(b"POST /api/diagnose HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: multipart/form-data; "
                     b"boundary=zz\r\nContent-Length: 10000000\r\n\r\n--zz\r\n")
        sock.close()  # the client leaves: its child is killed within the poll interval
        deadline = time.monotonic() + 10
        while [p for p in multiprocessing.active_children() if p.name == "ckptwatch-diagnose"]:
            assert time.monotonic() < deadline, "the diagnosis went on after its client left"
            time.sleep(0.05)
        status, doc = post_log(server.url, heavy_log(10))  # the slot is free again, the trickler still sending
        assert status == 200
        slow.close()
    finally:
        server.close()


def test_dollar_signs_in_logs_are_drawn_as_text_under_parallel_requests(db, tmp_path):
    path, iid = db
    server = serve(path)
    try:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda _: request(server.url, f"/incidents/{iid}"), range(24)))
        assert [a[0] for a in answers] == [200] * 24
        assert all("<svg" in a[2] for a in answers)
        assert "node$1$" in answers[0][2]  # the host's name as written, not typeset
    finally:
        server.close()
    from typer.testing import CliRunner

    from ckptwatch import cli
    for ext in ("png", "svg"):
        res = CliRunner().invoke(cli.app, ["incidents", "plot", iid[:8], "--out", str(tmp_path / f"m.{ext}"), "--db", path])
        assert res.exit_code == 0, res.output


def test_the_token_from_the_environment_starts_the_console_and_is_required(db, tmp_path):
    """Found by a fresh user: ``CKPTWATCH_UI_TOKEN``, as the README and ``ui --help`` give
    it, made ``ui`` and ``run --ui`` exit 2 (``no config section 'ui'``)."""
    import os
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "CKPTWATCH_UI_TOKEN": "env-token-7f3a"}
    proc = subprocess.Popen([sys.executable, "-m", "ckptwatch", "ui", "--db", db[0], "--port", str(port)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 30
        while True:
            assert proc.poll() is None, f"the console exited {proc.returncode}: {proc.stderr.read()}"
            try:
                refused = request(url, "/")
                break
            except OSError:
                assert time.monotonic() < deadline, "the console did not start"
                time.sleep(0.2)
        assert refused[0] == 401
        assert request(url, "/", headers={"Authorization": "Bearer env-token-7f3a"})[0] == 200
    finally:
        proc.terminate()
        proc.wait(timeout=10)
