#!/usr/bin/env python3
"""A simulated fleet end to end: every injected failure found, clean jobs quiet, and how long
it takes (issue 15).

    .venv/bin/python benchmarks/simulate.py [--nodes 1250] [--nodes-per-job 4] [--ranks 8]
                                            [--steps 120] [--save-every 40] [--failures 0.5] [--layout console] [--seed 1]

Writes the fleet with ``ckptwatch simulate`` (``--nodes`` nodes in all, ``--nodes-per-job``
per job), then runs ``ckptwatch diagnose --json`` and ``ckptwatch run --once`` on it (each a
subprocess; wall and peak RSS from ``/usr/bin/time``) and scores both against the fleet's
``truth.json`` (:func:`ckptwatch.simulate.score`): injected incidents found with the right
cause and rank, false incidents, clean jobs with an incident. Baseline in the same run:
``grep -c`` over the same files (the time to read them once).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ckptwatch.simulate import score  # noqa: E402
from ckptwatch.sinks.duckdb_store import read_incidents  # noqa: E402
from timing import timed  # noqa: E402  (benchmarks/timing.py)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1250)
    ap.add_argument("--nodes-per-job", type=int, default=4)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--save-every", type=int, default=40)
    ap.add_argument("--failures", type=float, default=0.5)
    ap.add_argument("--layout", default="console", choices=["console", "rank-files"])
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ckptwatch-sim-"))
    try:
        cli = [sys.executable, "-m", "ckptwatch"]
        jobs = max(1, a.nodes // a.nodes_per_job)
        gen = timed(cli + ["simulate", str(work), "--jobs", str(jobs), "--nodes", str(a.nodes_per_job),
                           "--ranks", str(a.ranks), "--steps", str(a.steps), "--save-every", str(a.save_every), "--failures", str(a.failures),
                           "--layout", a.layout, "--seed", str(a.seed)])
        truth = json.loads((work / "truth.json").read_text())
        template = ["--path-template", truth["template"]] if truth["template"] else []
        logs = str(work / "logs")
        size = sum(p.stat().st_size for p in (work / "logs").rglob("*") if p.is_file())
        print(f"{jobs} jobs x {a.nodes_per_job} nodes x {a.ranks} ranks ({jobs * a.nodes_per_job * a.ranks:,} ranks, "
              f"{a.layout}): {truth['files']:,} files, {truth['lines']:,} lines, {size / 1e6:.0f} MB, "
              f"written in {gen[0]:.1f} s", flush=True)
        files = [str(p) for p in (work / "logs").rglob("*") if p.is_file()]
        grep = timed(["grep", "-c", "-h", "saving checkpoint", *files])
        wall, rss, out, _ = timed(cli + ["diagnose", "--json", *template, logs])
        d = score(truth, json.loads(out)["incidents"])
        db = work / "run.duckdb"
        rwall, rrss, _, _ = timed(cli + ["run", "--logs", logs, "--db", str(db), "--once", *template])
        r = score(truth, read_incidents(db))
        print("\n| | wall, s | lines/s | peak RSS, MB | injected | right cause + rank | false | clean jobs with one |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for name, (w, m, s) in {"diagnose": (wall, rss, d), "run --once": (rwall, rrss, r)}.items():
            print(f"| {name} | {w:.1f} | {truth['lines'] / w:,.0f} | {m} | {s['injected']} | {s['exact']} | "
                  f"{s['false']} | {s['clean_with_incident']} of {s['clean_jobs']} |")
        print(f"| grep -c (one read of the files) | {grep[0]:.1f} | {truth['lines'] / max(grep[0], 0.01):,.0f} | "
              f"{grep[1]} | | | | |")
        for name, s in (("diagnose", d), ("run --once", r)):
            for key in ("missed", "wrong", "false_jobs"):
                if s[key]:
                    print(f"{name} {key}: {', '.join(s[key][:8])}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
