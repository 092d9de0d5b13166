"""Issue 17, right the first time: a page names the root cause the evidence settles on.

The launcher's "job failed" line arrives before the kernel's OOM-killer line (the kernel
log is read a poll behind). The incident is stored at once, provisional, with the root
cause known so far (SIGKILL of rank 2); nothing is paged until its evidence settles; then
one page names the OOM kill, and no "root cause revised" page follows. Before, the first
page said SIGKILL and a second one revised it.
"""

from __future__ import annotations

import datetime as dt
import json

from alert_support import sent

from ckptwatch.config import AlertSettings
from ckptwatch.detectors import Detector, DetectorConfig
from ckptwatch.sinks.alerts.setup import alerter_from_config
from ckptwatch.sinks.duckdb_store import Store

T0 = dt.datetime(2026, 11, 30, 10, 0, tzinfo=dt.timezone.utc)
_n = iter(range(10_000))


def ev(kind, sec, *, source="rank-log", rank=None, pid=None, step=None, job="job-a", host=None, **attrs):
    off = next(_n)
    return {"ts": T0 + dt.timedelta(seconds=sec), "ts_source": "line", "job": job, "host": host, "rank": rank,
            "local_rank": rank, "pid": pid, "kind": kind, "step": step, "path": f"/c/step_{step}" if step else None,
            "rule_id": f"test.{kind}", "attrs": json.dumps(attrs), "source_id": source, "source_kind": "log",
            "offset": off, "line": f"{kind} {attrs}", "dedup_key": f"k{off}"}


def at(sec: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=sec)


def test_the_first_page_waits_for_the_kernel_line_and_is_the_only_one(tmp_path, httpserver):
    httpserver.expect_request("/hook").respond_with_data("ok")
    store = Store(str(tmp_path / "inc.duckdb"))
    settings = AlertSettings(channels={"hook": {"type": "webhook", "url": httpserver.url_for("/hook")}})
    alerter = alerter_from_config(settings, store, db_path=str(tmp_path / "inc.duckdb"))
    d = Detector(DetectorConfig(source_idle=60.0))  # as `ckptwatch run` and the fleet detector set it
    stored = []

    def cycle(rows, now):
        if rows:
            d.process(rows, now=now)
        changed = d.advance(now=now)
        stored.extend(changed)
        with store.transaction():
            store.upsert_incidents(changed)
            alerter.notify(changed, now)
        alerter.drain(10)
        return changed

    world = [ev("world_size", 0, rank=r, pid=100 + r, host="h1", world_size=4) for r in range(4)]
    saves = [ev("save_start", 1, rank=r, step=20) for r in range(4)] + \
        [ev("save_end", 2, rank=r, step=20) for r in range(4)] + [ev("save_start", 10, rank=r, step=40) for r in range(4)]
    launcher = [ev("process_exit", 11, pid=102, exitcode=-9, reporter="agent", source="console"),
                ev("agent_signal", 11.1, pid=100, signal="SIGTERM", source="console"),
                ev("job_failed", 11.5, exitcode=1, source="console")]
    (first,) = cycle(world + saves + launcher, at(12))
    assert first.provisional and (first.kind, first.root_cause.cls, first.root_cause.rank) == \
        ("interrupted_save", "signal", 2)
    assert store.con.execute("SELECT provisional FROM incidents").fetchall() == [(True,)]  # shown at once
    assert sent(httpserver, "/hook") == []  # not paged yet

    kernel = [ev("oom_kill", 10.3, pid=102, job=None, host="h1", comm="python3", source="kern.log")]
    cycle(kernel, at(13))
    for second in (14, 16, 18, 20, 25):
        cycle([], at(second))
    final = stored[-1]
    assert not final.provisional and (final.root_cause.cls, final.root_cause.rank) == ("oom_kill", 2)
    pages = sent(httpserver, "/hook")
    assert [(p["action"], p["incident"]["root_cause"]["class"]) for p in pages] == [("trigger", "oom_kill")]
    assert pages[0]["summary"].startswith("interrupted_save: job job-a: save of step 40 (/c/step_40) cut off by the "
                                          "OOM killer (rank 2, host h1)")
    assert store.con.execute("SELECT provisional, root_cause_class FROM incidents").fetchall() == [(False, "oom_kill")]
    alerter.close()
    store.close()
