#!/usr/bin/env python3
"""Throughput, memory and tail lag against fleet size (issue 15's plot).

    .venv/bin/pip install -e '.[bench]'     # matplotlib, for the picture
    .venv/bin/python benchmarks/scaling.py [--nodes 16 64 256 1250] [--per-rank-rate 0.5] [--seconds 20]

For each fleet size (nodes x 8 ranks):

* **batch**: ``ckptwatch simulate`` writes the fleet's logs (jobs of 4 nodes, half with an
  injected failure in a save, as :mod:`benchmarks.simulate`), then ``diagnose --json`` and
  ``run --once`` are timed (wall, peak RSS) and their lines/s taken; the diagnosis is scored
  against the fleet's truth (injected incidents found with the right cause and rank);
* **live**: :func:`tail.measure` over as many growing rank files as the fleet has ranks,
  each written at ``--per-rank-rate`` lines/s: lag (line written -> out of the rules) p50
  and p99, and whether it kept up.

Prints a Markdown table and draws ``--out`` (default ``benchmarks/scaling.png``): lines/s and
peak RSS of the batch runs, and the live lag with the 2 s target, against the number of ranks.
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
from tail import measure  # noqa: E402  (benchmarks/tail.py)
from timing import timed  # noqa: E402  (benchmarks/timing.py)

RANKS_PER_NODE, NODES_PER_JOB = 8, 4


def batch(nodes: int, steps: int) -> dict[str, float]:
    """Simulate a fleet of ``nodes`` nodes, time diagnose and run --once over it."""
    work = Path(tempfile.mkdtemp(prefix="ckptwatch-scale-"))
    cli = [sys.executable, "-m", "ckptwatch"]
    try:
        jobs = max(1, nodes // NODES_PER_JOB)
        timed(cli + ["simulate", str(work / "fleet"), "--jobs", str(jobs), "--nodes", str(NODES_PER_JOB),
                     "--ranks", str(RANKS_PER_NODE), "--steps", str(steps), "--seed", "1"], cwd=ROOT)
        truth = json.loads((work / "fleet" / "truth.json").read_text())
        logs = str(work / "fleet" / "logs")
        d = timed(cli + ["diagnose", "--json", logs], cwd=ROOT)
        (work / "d.json").write_text(d.stdout)
        graded = score(truth, json.loads(d.stdout)["incidents"])
        r = timed(cli + ["run", "--logs", logs, "--db", str(work / "x.duckdb"), "--once"], cwd=ROOT)
        lines = truth["lines"]
        return {"ranks": jobs * NODES_PER_JOB * RANKS_PER_NODE, "lines": lines,
                "diagnose_s": d.wall, "diagnose_lps": lines / d.wall, "diagnose_rss": d.rss_mb,
                "run_s": r.wall, "run_lps": lines / r.wall, "run_rss": r.rss_mb,
                "injected": graded["injected"], "right": graded["exact"], "false": graded["false"]}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def draw(rows: list[dict[str, float]], out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = [r["ranks"] for r in rows]
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 4.4))
    a.plot(ranks, [r["diagnose_lps"] for r in rows], "o-", label="diagnose")
    a.plot(ranks, [r["run_lps"] for r in rows], "s-", label="run --once")
    a.set(xscale="log", xlabel="ranks in the fleet", ylabel="lines / s (one process, 2 cores)",
          title="Batch throughput")
    a.set_ylim(bottom=0)
    b.plot(ranks, [r["diagnose_rss"] for r in rows], "o-", label="diagnose")
    b.plot(ranks, [r["run_rss"] for r in rows], "s-", label="run --once")
    b.axhline(500, color="grey", ls="--", lw=1, label="target 500 MB")
    b.set(xscale="log", xlabel="ranks in the fleet", ylabel="peak RSS, MB", title="Batch memory")
    b.set_ylim(bottom=0)
    c.plot(ranks, [r["lag_p50"] for r in rows], "o-", label="lag p50")
    c.plot(ranks, [r["lag_p99"] for r in rows], "s-", label="lag p99")
    c.axhline(2.0, color="grey", ls="--", lw=1, label="target p99 2 s")
    c.set(xscale="log", xlabel="growing rank files (= ranks)", ylabel="seconds, line written -> event",
          title=f"Live tail lag at {rows[0]['per_rank_rate']:g} lines/s per rank")
    c.set_ylim(bottom=0)
    for ax in (a, b, c):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[16, 64, 256, 1250])
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--per-rank-rate", type=float, default=0.5, help="lines/s each live rank file grows by")
    ap.add_argument("--seconds", type=float, default=20.0, help="how long the live fleet is written")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "scaling.png"))
    a = ap.parse_args()
    rows = []
    for nodes in a.nodes:
        row = batch(nodes, a.steps)
        live = measure(row["ranks"], 55, row["ranks"] * a.per_rank_rate, a.seconds, echo=False)
        row.update(lag_p50=live["lag_p50"], lag_p99=live["lag_p99"], kept_up=live["written"] == live["read"],
                   live_rate=row["ranks"] * a.per_rank_rate, per_rank_rate=a.per_rank_rate,
                   start_s=live["start_s"])
        rows.append(row)
        print(f"{row['ranks']:,} ranks done", file=sys.stderr, flush=True)
    print("| ranks | lines | diagnose s | lines/s | RSS MB | run --once s | lines/s | RSS MB | right / injected "
          "| false | live lines/s | start s | lag p50 s | lag p99 s | kept up |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r['ranks']:,} | {r['lines']:,} | {r['diagnose_s']:.1f} | {r['diagnose_lps']:,.0f} | "
              f"{r['diagnose_rss']} | {r['run_s']:.1f} | {r['run_lps']:,.0f} | {r['run_rss']} | "
              f"{r['right']} / {r['injected']} | {r['false']} | {r['live_rate']:,.0f} | {r['start_s']:.1f} | "
              f"{r['lag_p50']:.2f} | {r['lag_p99']:.2f} | {'yes' if r['kept_up'] else 'no'} |")
    try:
        draw(rows, Path(a.out))
        print(f"\nplot: {a.out}")
    except ImportError:
        print("\nno plot: matplotlib is not installed (pip install -e '.[bench]')")


if __name__ == "__main__":
    main()
