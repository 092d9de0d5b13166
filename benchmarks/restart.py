#!/usr/bin/env python3
"""Restart cost of the embedded pipeline against the age of its database.

    .venv/bin/python benchmarks/restart.py [--sizes 100000,1000000,10000000] [--baseline-max 1000000]

For each size N, a DuckDB file is built holding N stored events: those of 1,000 finished
jobs, released by the detector (``released_jobs``, a registry snapshot), plus one live
job of 20,000 events (saves on 8 ranks, progress lines). Then, in a fresh child process
each, ``EmbeddedRunner`` is opened on it over an empty log directory, and its start
(restore + replay) is timed with the child's peak RSS. The baseline in the same run is
what a start did before state was bounded: every stored event replayed through the
detector (``Store.events()``), run for sizes up to ``--baseline-max`` (beyond, it takes
minutes and gigabytes). The target: start time and RSS flat in N.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, {root!r})
from ckptwatch.embedded import EmbeddedRunner
from ckptwatch.detectors import Detector
from ckptwatch.sinks.duckdb_store import Store
db, logs, mode = sys.argv[1], sys.argv[2], sys.argv[3]
t = time.perf_counter()
if mode == "bounded":
    r = EmbeddedRunner(logs, db)
    jobs, replayed = len(r.detector.jobs), r.detector.stats.events
    r.close()
else:  # what a start did before: replay every stored event
    s = Store(db)
    d = Detector()
    ev = s.events()
    d.process(ev.iter_rows(named=True))
    jobs, replayed = len(d.jobs), d.stats.events
    s.close()
secs = time.perf_counter() - t
print(json.dumps({{"secs": secs, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "jobs": jobs, "replayed": replayed}}))
"""


def build(db: str, n: int) -> None:
    """N events: 1,000 released jobs sharing N - 20,000, and one live job of 20,000."""
    sys.path.insert(0, str(ROOT))
    from ckptwatch.sinks.duckdb_store import Store

    s = Store(db)
    live = 20_000
    old = max(0, n - live)
    per_job = max(1, old // 1000)
    s.con.execute("BEGIN")
    # finished jobs: progress lines with a save every 100 steps, a month ago
    s.con.execute(f"""
        INSERT INTO events SELECT
          TIMESTAMPTZ '2026-10-01 00:00:00+00' + to_seconds(i // 8) AS ts, 'line', 'old-' || (i // {per_job}) AS job,
          'h' || ((i % 8) // 8), (i % 8)::INTEGER, (i % 8)::INTEGER, 1000 + i % 8,
          CASE WHEN (i // 8) % 100 = 0 THEN 'save_start' WHEN (i // 8) % 100 = 1 THEN 'save_end' ELSE 'metric' END,
          (i // 8) % 100000, NULL, 'bench', '{{}}', 'src-' || (i // {per_job}), 'worker', i,
          'step=' || (i // 8) || ' loss=0.5 rank ' || (i % 8), 'k' || i
        FROM range({old}) t(i)""")
    s.con.execute(f"""
        INSERT INTO released_jobs SELECT DISTINCT 'old-' || (i // {per_job}),
          TIMESTAMPTZ '2026-11-01 00:00:00+00', TIMESTAMPTZ '2026-11-01 01:00:00+00' FROM range({old}) t(i)""")
    s.con.execute(f"""
        INSERT INTO events SELECT
          now() - INTERVAL 1 HOUR + to_seconds(i // 8), 'line', 'live', 'h0', (i % 8)::INTEGER, (i % 8)::INTEGER,
          2000 + i % 8,
          CASE WHEN (i // 8) % 100 = 0 THEN 'save_start' WHEN (i // 8) % 100 = 1 THEN 'save_end' ELSE 'metric' END,
          i // 8, NULL, 'bench', '{{}}', 'live-src', 'worker', i, 'step=' || (i // 8) || ' loss=0.5', 'L' || i
        FROM range({live}) t(i)""")
    s.con.execute("INSERT INTO detector_state VALUES ('registry', ?, now())",
                  [json.dumps({"saves": [], "bad": [], "verified": []})])
    s.con.execute("COMMIT")
    s.con.execute("CHECKPOINT")  # as a long-running database is: no WAL left to replay at open
    s.close()


def start(db: str, logs: str, mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD.format(root=str(ROOT)), db, logs, mode],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100000,1000000,10000000")
    ap.add_argument("--baseline-max", type=int, default=1_000_000)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        logs = os.path.join(tmp, "logs")
        os.mkdir(logs)
        for n in (int(x) for x in args.sizes.split(",")):
            db = os.path.join(tmp, f"h{n}.duckdb")
            t = time.perf_counter()
            build(db, n)
            built = time.perf_counter() - t
            b = start(db, logs, "bounded")
            full = start(db, logs, "full") if n <= args.baseline_max else None
            rows.append((n, built, b, full))
            os.remove(db)
            if os.path.exists(db + ".wal"):
                os.remove(db + ".wal")
    print("| stored events | start, s | RSS, MB | replayed | full replay (before), s | RSS, MB | start / full |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n, _built, b, full in rows:
        f = (f"{full['secs']:.2f} | {full['rss_mb']:.0f} | {b['secs'] / full['secs']:.3f}" if full
             else "not run | | ")
        print(f"| {n:,} | {b['secs']:.2f} | {b['rss_mb']:.0f} | {b['replayed']:,} | {f} |")


if __name__ == "__main__":
    main()
