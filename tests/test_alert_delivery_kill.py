"""Issue 14: a process killed (SIGKILL) between sending a notification and recording the
answer. The attempt was recorded (intent) before the send, so the restarted dispatcher knows
the send may have happened: it re-sends (at least once) under the same idempotency keys, and
the Slack re-send says it may be a duplicate. Real receiver on loopback, real DuckDB file,
a real child process killed with SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

from test_alert_delivery_slow import ROUTING_KEY, SlowReceiver, incident, per_channel, tables  # noqa: F401

from ckptwatch.config import AlertSettings
from ckptwatch.sinks.alerts.setup import alerter_from_config
from ckptwatch.sinks.duckdb_store import Store

CHILD = textwrap.dedent("""
    import json, sys, time
    from ckptwatch.config import AlertSettings
    from ckptwatch.detectors.incident import Incident
    from ckptwatch.sinks.alerts.setup import alerter_from_config
    from ckptwatch.sinks.duckdb_store import Store

    db, channels, inc = sys.argv[1], json.loads(sys.argv[2]), Incident.from_dict(json.load(open(sys.argv[3])))
    store = Store(db)
    alerter = alerter_from_config(AlertSettings(channels=channels), store, db_path=db)
    with store.transaction():
        alerter.notify([inc])
    alerter.step()  # the sends start on worker threads; the receiver holds them
    print("sending", flush=True)
    time.sleep(600)
""")


def test_a_kill_between_send_and_record_resends_under_the_same_keys(tmp_path, incident):  # noqa: F811
    db = str(tmp_path / "k.duckdb")
    inc_file = tmp_path / "inc.json"
    inc_file.write_text(json.dumps(incident.to_dict()))
    with SlowReceiver(delay=600) as rx:  # holds every request: the child dies before any answer
        chans = tables(rx, read_timeout=600.0)
        child = subprocess.Popen([sys.executable, "-c", CHILD, db, json.dumps(chans), str(inc_file)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 120
            while len(rx.requests) < 3:
                assert child.poll() is None, child.stderr.read()
                assert time.monotonic() < deadline, "the child never sent"
                time.sleep(0.05)
        finally:
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
        first = per_channel(rx, incident)
        rx.delay = 0.0  # the receiver recovers; the pipeline restarts
        store = Store(db)
        alerter = alerter_from_config(AlertSettings(channels=chans), store, db_path=db)
        try:
            deadline = time.monotonic() + 60
            while alerter.stats.sent < 3:
                assert time.monotonic() < deadline, "the restart did not re-send"
                alerter.step()
                time.sleep(0.02)
            rows = store.con.execute("SELECT channel, status, attempts, maybe_sent FROM alerts "
                                     "WHERE channel <> 'console' ORDER BY id").fetchall()
        finally:
            alerter.close()
            store.close()
        got = per_channel(rx, incident)
        hook_bodies = [b for p, _, b in rx.requests if p == "/hook"]
        slack = rx.bodies("/slack")
    assert first["pager"] == [incident.id] and len(first["hook"]) == 1 and len(first["oncall"]) == 1
    assert got["pager"] == [incident.id, incident.id]  # harmless: PagerDuty dedups on the incident id
    assert got["hook"] == [first["hook"][0]] * 2 and hook_bodies[0] == hook_bodies[1]
    assert len(slack) == 2 and any("possible duplicate" in e["text"] for b in slack[1]["blocks"]
                                   if b["type"] == "context" for e in b["elements"])
    assert rows == [("oncall", "sent", 2, True), ("pager", "sent", 2, True), ("hook", "sent", 2, True)]
