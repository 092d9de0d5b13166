"""Pages per incident, revised pages and page latency of a live ``ckptwatch run`` (issue 17).

Every case of the accuracy library (``ckptwatch.groundtruth.load_cases``: the corpus, the
real runs, the scenarios) is streamed into a directory a live ``ckptwatch run`` watches,
which pages a local webhook receiver (a real HTTP server on 127.0.0.1). Two speeds:

* ``replay``: each case's files appear whole, at once (a copy into the watched folder, a
  collector catching up after an outage);
* ``live``: each case's lines are appended in event-time order, the gaps between them
  compressed to at most ``--max-gap`` seconds, files flushed per line (a job running now).

Printed per speed: cases, incidents paged, pages per incident (target 1.0), revised pages
(an ``update`` of a page already sent: target 0), escalations, and page latency from the
write of the initiating line (the root cause's line, else the incident's first evidence
line) to the receiver's arrival, p50 / p99 / max in seconds.

    .venv/bin/python benchmarks/paging.py --speed replay live [--only NAME] [--jobs 4]

Each case has a ``ckptwatch run`` (and a receiver) of its own, ``--jobs`` of them at once:
cases whose logs name no job would otherwise be one job "unknown".
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ckptwatch.groundtruth import load_cases, restore_mtimes  # noqa: E402
import polars as pl  # noqa: E402

from ckptwatch.schema import TS  # noqa: E402
from ckptwatch.ingest.timestamps import add_event_time  # noqa: E402


class Receiver:
    """A webhook receiver on 127.0.0.1 recording ``(arrival monotonic, body)``."""

    def __init__(self) -> None:
        self.got: list[tuple[float, dict]] = []
        lock = threading.Lock()
        got = self.got

        class H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with lock:
                    got.append((time.monotonic(), body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *a) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def _lines_in_time_order(case_dir: Path) -> list[tuple[dt.datetime | None, Path, str]]:
    """Every line of every file under ``case_dir`` as (event time or None, file, line),
    merged by time; an undated line keeps its place after the line before it in its file."""
    per_file = []
    for f in sorted(p for p in case_dir.rglob("*") if p.is_file()):
        lines = f.read_text(errors="replace").splitlines(keepends=True)
        mtime = dt.datetime.fromtimestamp(f.stat().st_mtime, dt.timezone.utc)
        df = pl.DataFrame({"line": [x.rstrip("\n") for x in lines], "stream_key": ["_"] * len(lines),
                           "mtime": [mtime] * len(lines)}, schema={"line": pl.Utf8, "stream_key": pl.Utf8, "mtime": TS})
        ts = add_event_time(df)["ts"].to_list() if lines else []
        per_file.append([(t, f, line) for t, line in zip(ts, lines, strict=True)])
    merged = [r for rows in per_file for r in rows]
    epoch = dt.datetime.min.replace(tzinfo=dt.timezone.utc)
    merged.sort(key=lambda r: r[0] or epoch)  # stable: a file's own order stays within one time
    return merged


def stream(cases, watched: Path, speed: str, max_gap: float, written: dict) -> None:
    """Write ``cases`` under ``watched`` (one folder each); ``written[(case, line text)]`` =
    monotonic time the line was written."""
    if speed == "replay":
        for name, logs in cases:
            now = time.monotonic()
            shutil.copytree(logs, watched / name)
            for f in logs.rglob("*"):
                if f.is_file():
                    for line in f.read_text(errors="replace").splitlines():
                        written.setdefault((name, line.strip()), now)
        return
    merged = []
    for name, logs in cases:
        for t, f, line in _lines_in_time_order(logs):
            merged.append((name, logs, t, f, line))
    handles = {}
    prev: dict[str, dt.datetime | None] = {}
    try:
        # the cases run side by side: each advances by its own event-time gaps
        by_case: dict[str, list] = {}
        for row in merged:
            by_case.setdefault(row[0], []).append(row)
        cursors = {n: 0 for n in by_case}
        due = {n: time.monotonic() for n in by_case}
        while cursors:
            n = min(cursors, key=lambda k: due[k])
            wait = due[n] - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            name, logs, t, f, line = by_case[n][cursors[n]]
            out = watched / name / f.relative_to(logs)
            h = handles.get(out)
            if h is None:
                out.parent.mkdir(parents=True, exist_ok=True)
                h = handles[out] = open(out, "a")
            h.write(line)
            h.flush()
            written.setdefault((name, line.strip()), time.monotonic())
            cursors[n] += 1
            if cursors[n] == len(by_case[n]):
                del cursors[n]
                continue
            nt = by_case[n][cursors[n]][2]
            gap = (nt - t).total_seconds() if nt and t else 0.0
            prev[n] = t
            due[n] = time.monotonic() + min(max(gap, 0.0), max_gap)
    finally:
        for h in handles.values():
            h.close()


def run_batch(cases, speed: str, max_gap: float, settle_wait: float, work: Path) -> list[dict]:
    """Stream ``cases`` into one live run; returns one row per incident paged."""
    rx = Receiver()
    watched = work / "logs"
    watched.mkdir(parents=True)
    cfg = work / "ckptwatch.toml"
    cfg.write_text(f'[alerts.channels.hook]\ntype = "webhook"\nurl = "{rx.url}"\nmin_severity = "info"\n')
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "ckptwatch", "run", "--logs", str(watched), "--db",
                             str(work / "inc.duckdb"), "--config", str(cfg), "--interval", "0.5"],
                            stdout=subprocess.DEVNULL, stderr=open(work / "run.err", "w"), env=env, cwd=ROOT)
    try:
        time.sleep(2)
        written: dict = {}
        stream(cases, watched, speed, max_gap, written)
        time.sleep(settle_wait)
    finally:
        proc.terminate()
        proc.wait(30)
        rx.server.shutdown()
    rows: dict[str, dict] = {}
    for at, body in rx.got:
        inc = body["incident"]
        r = rows.setdefault(inc["id"], {"id": inc["id"], "kind": inc["kind"], "job": inc["job"], "pages": 0,
                                        "updates": 0, "escalations": 0, "first_page": at, "latency": None,
                                        "causes": []})
        rc = inc.get("root_cause") or {}
        r["causes"].append((body["action"], rc.get("class"), rc.get("rank")))
        if body["action"] in ("trigger", "update", "escalate", "realert"):
            r["pages"] += 1
        r["updates"] += body["action"] == "update"
        r["escalations"] += body["action"] == "escalate"
        if r["latency"] is None and body["action"] == "trigger":
            line = (rc.get("line") or next((e["line"] for e in inc.get("evidence", [])), "")).strip()
            t0 = min((w for (n, text), w in written.items() if text == line or (line and line in text)),
                     default=None)
            r["latency"] = None if t0 is None else at - t0
    return list(rows.values())


def _pct(xs: list[float], q: float) -> str:
    if not xs:
        return "-"
    xs = sorted(xs)
    return f"{xs[min(len(xs) - 1, int(q * len(xs)))]:.1f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--speed", nargs="+", default=["replay", "live"], choices=["replay", "live"])
    ap.add_argument("--only", default="", help="only cases whose name contains this")
    ap.add_argument("--jobs", type=int, default=4, help="live runs at once (one per case)")
    ap.add_argument("--max-gap", type=float, default=1.0, help="live: longest pause between two lines (s)")
    ap.add_argument("--wait", type=float, default=45.0, help="seconds to wait after the last line")
    ap.add_argument("--verbose", action="store_true")
    a = ap.parse_args()
    restore_mtimes(ROOT)
    seen, cases = set(), []
    for c in load_cases(ROOT):
        if a.only in c.name and c.logs not in seen and c.incidents:
            seen.add(c.logs)
            cases.append((f"{c.source}-{c.name}-{c.layout}".replace("/", "_"), c.logs))
    print(f"{len(cases)} cases with incidents")
    table = []
    for speed in a.speed:
        rows = []

        def one(case, speed=speed):
            with tempfile.TemporaryDirectory(prefix="paging-") as tmp:
                return case, run_batch([case], speed, a.max_gap, a.wait, Path(tmp))

        with ThreadPoolExecutor(max_workers=a.jobs) as pool:
            for case, got in pool.map(one, cases):
                rows += got
                if a.verbose:
                    for r in got:
                        if r["pages"] != 1 or r["updates"]:
                            print(f"  {speed}: {case[0]}: {r['kind']} {r['job']}: {r['causes']}")
        lat = [r["latency"] for r in rows if r["latency"] is not None]
        paged = [r for r in rows if r["pages"]]
        table.append([speed, len(cases), len(paged),
                      f"{sum(r['pages'] for r in paged) / max(1, len(paged)):.2f}",
                      sum(r["updates"] for r in rows), sum(r["escalations"] for r in rows),
                      _pct(lat, 0.5), _pct(lat, 0.99), f"{max(lat):.1f}" if lat else "-"])
    header = ["speed", "cases", "incidents paged", "pages / incident", "revised pages", "escalations",
              "latency p50 s", "p99 s", "max s"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in table:
        print("| " + " | ".join(str(x) for x in r) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
