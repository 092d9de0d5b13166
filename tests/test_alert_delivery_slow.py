"""Issue 14: duplicate pages against slow receivers. Real HTTP servers on 127.0.0.1 that
answer late (or hang), the notification log in a real DuckDB file; requests are counted per
notification (PagerDuty ``dedup_key``, webhook ``Idempotency-Key``, Slack incident id)."""

from __future__ import annotations

import datetime as dt
import http.server
import json
import socket
import threading
import time

import pytest

from ckptwatch.config import AlertSettings
from ckptwatch.pipeline import diagnose
from ckptwatch.sinks.alerts.http import Request, Timeouts, post
from ckptwatch.sinks.alerts.setup import alerter_from_config
from ckptwatch.sinks.duckdb_store import Store

T0 = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.timezone.utc)
ROUTING_KEY = "R0UT1NGKEY0123456789abcdef012345"


class SlowReceiver:
    """A real HTTP server on loopback that reads each POST in full, records it, waits
    ``delay`` seconds (settable while running) and answers ``status``."""

    def __init__(self, delay: float = 0.0, status: int = 200) -> None:
        self.delay, self.status = delay, status
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with outer._lock:
                    outer.requests.append((self.path, dict(self.headers), body))
                outer._stop.wait(outer.delay)
                try:
                    self.send_response(outer.status)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"ok")
                except OSError:
                    pass  # the client gave up

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def bodies(self, path: str) -> list[dict]:
        with self._lock:
            return [json.loads(b) for p, _, b in self.requests if p == path]

    def headers(self, path: str) -> list[dict[str, str]]:
        with self._lock:
            return [h for p, h, _ in self.requests if p == path]

    def __enter__(self) -> SlowReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def incident():
    from conftest import CORPUS

    (inc,) = diagnose([str(CORPUS / "02-sigkill-mid-save" / "logs" / "attempt-1-train")])[0]
    return inc


def tables(rx: SlowReceiver, **timeouts: float) -> dict:
    return {
        "oncall": {"type": "slack", "url": rx.url("/slack"), **timeouts},
        "pager": {"type": "pagerduty", "routing_key": ROUTING_KEY, "url": rx.url("/v2/enqueue"), **timeouts},
        "hook": {"type": "webhook", "url": rx.url("/hook"), **timeouts},
    }


def deliver_until_settled(store, alerter, attempts: int = 5) -> None:
    """Step (real HTTP, fake clock) until every notification is sent or ``attempts`` rounds
    were made; between rounds the clock jumps to the next retry."""
    now = T0
    for _ in range(attempts):
        alerter.step(now)
        deadline = time.monotonic() + 60
        while alerter.in_flight:
            assert time.monotonic() < deadline, "a send did not finish"
            time.sleep(0.01)
            alerter.step(now)
        nxt = alerter.log.next_attempt()
        if nxt is None:
            return
        now = max(now, nxt)


def per_channel(rx: SlowReceiver, incident) -> dict[str, list]:
    return {
        "pager": [b["dedup_key"] for b in rx.bodies("/v2/enqueue")],
        "hook": [h["Idempotency-Key"] for h in rx.headers("/hook")],
        "oncall": [b["blocks"][-1]["elements"][0]["text"] for b in rx.bodies("/slack")],
    }


def test_a_slow_receiver_within_the_read_timeout_gets_each_notification_once(tmp_path, incident):
    """The receiver answers 200 after 2 s: with a short connect timeout and a long read
    timeout, each channel gets exactly one request."""
    with SlowReceiver(delay=2.0) as rx:
        store = Store(str(tmp_path / "a.duckdb"))
        alerter = alerter_from_config(AlertSettings(channels=tables(rx, connect_timeout=1.0, read_timeout=10.0)),
                                      store, db_path=str(tmp_path / "a.duckdb"))
        try:
            with store.transaction():
                alerter.notify([incident], T0)
            deliver_until_settled(store, alerter)
            rows = store.con.execute("SELECT channel, status, attempts FROM alerts WHERE channel <> 'console' "
                                     "ORDER BY id").fetchall()
        finally:
            alerter.close()
            store.close()
        got = per_channel(rx, incident)
    assert got["pager"] == [incident.id]
    assert len(got["hook"]) == 1 and len(got["oncall"]) == 1
    assert rows == [("oncall", "sent", 1), ("pager", "sent", 1), ("hook", "sent", 1)]


def test_a_receiver_slower_than_the_read_timeout_gets_one_retry_not_a_storm(tmp_path, incident):
    """The receiver answers 200 after 1.6 s; the read timeout is 1 s. The first attempt's
    outcome is unknown (the body was sent, no answer came): it is retried once, with a longer
    read timeout, and carries the same idempotency keys; the Slack retry says it may be a
    duplicate. Before issue 14 every attempt timed out again: a request storm and no page."""
    with SlowReceiver(delay=1.6) as rx:
        store = Store(str(tmp_path / "b.duckdb"))
        said: list[str] = []
        alerter = alerter_from_config(AlertSettings(channels=tables(rx, timeout=1.0), retry_initial=1.0), store,
                                      db_path=str(tmp_path / "b.duckdb"), say=said.append)
        try:
            with store.transaction():
                alerter.notify([incident], T0)
            deliver_until_settled(store, alerter)
            rows = store.con.execute("SELECT channel, status, attempts, maybe_sent FROM alerts "
                                     "WHERE channel <> 'console' ORDER BY id").fetchall()
        finally:
            alerter.close()
            store.close()
        got = per_channel(rx, incident)
        slack = rx.bodies("/slack")
        hooks = [b for p, _, b in rx.requests if p == "/hook"]
    assert got["pager"] == [incident.id, incident.id]  # PagerDuty folds both into one alert
    assert len(got["hook"]) == 2 and got["hook"][0] == got["hook"][1]
    assert hooks[0] == hooks[1]  # the same bytes under the same key
    assert len(slack) == 2
    notes = [[e["text"] for b in m["blocks"] if b["type"] == "context" for e in b["elements"]] for m in slack]
    assert not any("possible duplicate" in t for t in notes[0])
    assert any("possible duplicate" in t for t in notes[1])
    assert rows == [("oncall", "sent", 2, True), ("pager", "sent", 2, True), ("hook", "sent", 2, True)]
    assert [m.split(":")[0] for m in said if "possible duplicate" in m] == [
        f"alert trigger of incident {incident.id} to oncall"]  # only Slack cannot deduplicate


def test_webhook_idempotency_key_header_and_body(tmp_path, incident):
    """draft-ietf-httpapi-idempotency-key-header: the key is a structured-field string; the
    body carries the same key and the notification id."""
    with SlowReceiver() as rx:
        store = Store(str(tmp_path / "c.duckdb"))
        t = {"hook": tables(rx)["hook"]}
        alerter = alerter_from_config(AlertSettings(channels=t), store, db_path=str(tmp_path / "c.duckdb"))
        try:
            with store.transaction():
                alerter.notify([incident], T0)
            deliver_until_settled(store, alerter)
            nid = store.con.execute("SELECT id FROM alerts WHERE channel = 'hook'").fetchone()[0]
        finally:
            alerter.close()
            store.close()
        (h,), (b,) = rx.headers("/hook"), rx.bodies("/hook")
    key = f"ckptwatch-{incident.id}-{nid}"
    assert h["Idempotency-Key"] == f'"{key}"'
    assert b["notification_id"] == nid and b["idempotency_key"] == key


def _raw_server(respond: bytes, hold: float):
    """A loopback server that reads one request, writes ``respond`` and holds the
    connection open ``hold`` seconds. Returns (url, thread, received-bytes list)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    got: list[bytes] = []

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = int([ln.split(b":")[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")][0])
            while len(body) < length:
                body += conn.recv(65536)
            got.append(body)
            conn.sendall(respond)
            time.sleep(hold)
        srv.close()

    th = threading.Thread(target=serve, daemon=True)
    th.start()
    return f"http://127.0.0.1:{srv.getsockname()[1]}/x", th, got


def test_a_2xx_whose_body_is_late_counts_as_sent():
    """The status line said 200: the receiver has the notification. A body that does not
    come within the read timeout must not turn that into a retry (a duplicate)."""
    url, th, got = _raw_server(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial", hold=3.0)
    out = post(Request(url, b'{"a": 1}'), Timeouts(connect=1.0, read=1.0))
    assert (out.status, got) == ("sent", [b'{"a": 1}'])
    th.join(5)


def test_no_answer_after_the_body_was_sent_is_a_maybe_delivered_retry():
    url, th, got = _raw_server(b"", hold=2.5)
    t = time.monotonic()
    out = post(Request(url, b"{}"), Timeouts(connect=1.0, read=1.0))
    assert out.status == "retry" and out.maybe_delivered and "timed out" in out.error
    assert 0.9 < time.monotonic() - t < 2.4 and got == [b"{}"]
    th.join(5)


def test_a_refused_connection_is_a_plain_retry():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = post(Request(f"http://127.0.0.1:{port}/x", b"{}"), Timeouts(connect=1.0, read=30.0))
    assert out.status == "retry" and not out.maybe_delivered and "refused" in out.error.lower()


def test_the_connect_timeout_is_short_whatever_the_read_timeout():
    """A listener whose accept queue is full drops new SYNs: the connect hangs. It gives up
    after the connect timeout (0.5 s), not the read timeout (30 s), and nothing was sent."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    fillers = []
    try:
        for _ in range(8):  # fill the accept queue (never accepted)
            c = socket.socket()
            c.setblocking(False)
            c.connect_ex(srv.getsockname())
            fillers.append(c)
        time.sleep(0.2)
        t = time.monotonic()
        out = post(Request(f"http://127.0.0.1:{srv.getsockname()[1]}/x", b"{}"), Timeouts(connect=0.5, read=30.0))
        took = time.monotonic() - t
    finally:
        for c in fillers:
            c.close()
        srv.close()
    assert out.status == "retry" and not out.maybe_delivered
    assert took < 5.0


def test_timeouts_come_from_the_channel_then_the_alerts_table_then_the_defaults():
    from ckptwatch.sinks.alerts.channels import timeouts
    from ckptwatch.sinks.alerts.settings import AlertConfigError, parse_channel

    def spec(**keys):
        return parse_channel("x", {"type": "webhook", "url": "http://127.0.0.1:9/", **keys})

    assert timeouts(spec()) == Timeouts(connect=5.0, read=30.0)
    assert timeouts(spec(), AlertSettings(timeout=12.0)) == Timeouts(connect=5.0, read=12.0)
    assert timeouts(spec(timeout=9), AlertSettings(timeout=12.0)) == Timeouts(connect=5.0, read=9.0)
    assert timeouts(spec(read_timeout=45, connect_timeout=2)) == Timeouts(connect=2.0, read=45.0)
    assert Timeouts(2.0, 30.0).for_attempt(0) == Timeouts(2.0, 30.0)
    assert [Timeouts(2.0, 30.0).for_attempt(a).read for a in (1, 2, 3, 9)] == [60.0, 120.0, 120.0, 120.0]
    with pytest.raises(AlertConfigError, match=r"^\[alerts.channels.x\] read_timeout: must be a number of seconds"):
        spec(read_timeout="slow")
