#!/usr/bin/env python3
"""Incident latency on a live simulated fleet, embedded (issue 15): from a failure's first
line written to its incident row.

    .venv/bin/python benchmarks/latency.py [--jobs 40] [--nodes 4] [--ranks 8] [--rate 2000] [--rotate-mb 2]

1. Starts ``ckptwatch run --logs OUT/logs --db OUT/incidents.duckdb`` on an empty directory;
   with ``--kafka``, the fleet's three stages instead (``collect OUT/logs``, ``detect``,
   ``sink``, each a process, through a broker: ``scripts/kafka-local`` unless one is named);
   with ``--kafka --publish``, no files and no collector: ``simulate --kafka`` publishes the
   fleet's events straight to the events topic at ``--rate`` events/s.
2. ``ckptwatch simulate OUT --rate R`` writes a fleet (half the jobs with one failure in a
   save) live, ``R`` lines/s in total, in event-time order, rotating files past
   ``--rotate-mb``; it records the wall time each failure's first line was written
   (``OUT/live.json``; with ``--publish``, acknowledged by the broker: ``OUT/kafka.json``).
3. Waits ``--settle`` seconds, stops ``run`` (SIGTERM) and reads the incidents table: per
   injected failure, the first ``detected_ts`` of an incident of its job and step, minus the
   time its first line was written; and the incidents scored against the fleet's truth.

Prints the latency p50 / p99 / max next to the target (p99 <= 2 s) and the score. The
latency includes ``run``'s poll interval (``--interval``) and its hold of a file's last
record (``flush_after``, 2 s, while a traceback may go on).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from kafka_support import cli_env, fresh_config, kafka_local, wait_for_members  # noqa: E402

from ckptwatch.simulate import score  # noqa: E402
from ckptwatch.sinks.duckdb_store import read_incidents  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=40)
    ap.add_argument("--nodes", type=int, default=4, help="nodes per job")
    ap.add_argument("--ranks", type=int, default=8, help="ranks per node")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--rate", type=float, default=2000.0, help="lines/s written in total")
    ap.add_argument("--rotate-mb", type=float, default=2.0)
    ap.add_argument("--interval", type=float, default=0.5, help="run's seconds between polls")
    ap.add_argument("--settle", type=float, default=20.0, help="seconds to wait after the last line")
    ap.add_argument("--keep", action="store_true", help="keep the fleet and the database (the path is printed)")
    ap.add_argument("--kafka", nargs="?", const="local", metavar="HOST:PORT",
                    help="through Kafka: collect | detect | sink processes instead of run (no value: start a "
                         "broker with scripts/kafka-local)")
    ap.add_argument("--source-idle", type=float, default=None,
                    help="with --kafka: detect's [detect] source_idle, seconds (default its own, 30)")
    ap.add_argument("--publish", action="store_true",
                    help="with --kafka: simulate --kafka publishes the events (--rate in events/s), no collector")
    a = ap.parse_args()
    if a.publish and not a.kafka:
        ap.error("--publish needs --kafka")
    cli = [sys.executable, "-m", "ckptwatch"]
    work = Path(tempfile.mkdtemp(prefix="ckptwatch-latency-"))
    local = kafka_local() if a.kafka == "local" else None
    try:
        (work / "logs").mkdir()
        db = work / "incidents.duckdb"
        if a.kafka:
            bootstrap = local.start(work / "broker", None, 180.0) if local else a.kafka
            cfg = fresh_config(bootstrap, work, partitions=6)
            env = cli_env(cfg, CKPTWATCH_SINK_DB=str(db), CKPTWATCH_COLLECT_INTERVAL=str(a.interval),
                          CKPTWATCH_DETECT_INTERVAL=str(a.interval))
            if a.source_idle is not None:
                env["CKPTWATCH_DETECT_SOURCE_IDLE"] = str(a.source_idle)
            stages = [subprocess.Popen(cli + args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                       text=True)
                      for args in ([] if a.publish else [["collect", str(work / "logs")]]) + [["detect"], ["sink"]]]
            wait_for_members(bootstrap, cfg.detect.group, 1)
        else:
            stages = [subprocess.Popen(cli + ["run", "--logs", str(work / "logs"), "--db", str(db), "--interval",
                                              str(a.interval)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                       text=True)]
        time.sleep(3.0)  # started and polling
        t0 = time.monotonic()
        fleet = ["simulate", str(work), "--jobs", str(a.jobs), "--nodes", str(a.nodes), "--ranks", str(a.ranks),
                 "--steps", str(a.steps), "--rate", str(a.rate), "--seed", "1"]
        if a.publish:
            subprocess.run(cli + fleet + ["--kafka", bootstrap], check=True, stdout=subprocess.DEVNULL, env=env)
        else:
            subprocess.run(cli + fleet + ["--rotate-mb", str(a.rotate_mb)], check=True, stdout=subprocess.DEVNULL)
        wrote = time.monotonic() - t0
        time.sleep(a.settle)
        said = []
        for p in stages:
            p.send_signal(signal.SIGINT)
            err = p.communicate(timeout=120)[1]
            if p.returncode not in (0, 1):
                raise SystemExit(f"{' '.join(p.args[3:5])} exited {p.returncode}: {err[-800:]}")
            said.append(f"{p.args[3]}: {err.strip().splitlines()[-1] if err.strip() else ''}")
        live = json.loads((work / ("kafka.json" if a.publish else "live.json")).read_text())
        truth = json.loads((work / "truth.json").read_text())
        stored = read_incidents(db)
        first: dict[tuple[str, int], dt.datetime] = {}
        for inc in stored:
            key = (inc["job"], inc["step"])
            first[key] = min(first.get(key, inc["detected_ts"]), inc["detected_ts"])
        lat, missing = [], []
        by_kind: dict[str, list[float]] = {}
        by_time: list[tuple[dt.datetime, float]] = []  # (when the failure began, its latency)
        for job, at in live["initiated"].items():
            failure = truth["jobs"][job]["failure"]
            seen = first.get((job, failure["step"]))
            if seen is None:
                missing.append(job)
                continue
            began = dt.datetime.fromisoformat(at)
            lat.append((seen - began).total_seconds())
            by_kind.setdefault(failure["kind"], []).append(lat[-1])
            by_time.append((began, lat[-1]))
        graded = score(truth, stored)
        lat.sort()
        q = statistics.quantiles(lat, n=100, method="inclusive") if len(lat) > 1 else (lat * 99 or [0.0] * 99)
        ranks = a.jobs * a.nodes * a.ranks
        if a.publish:
            print(f"{a.jobs} jobs x {a.nodes} nodes x {a.ranks} ranks ({ranks:,} ranks): {live['events']:,} events "
                  f"in {live['messages']:,} messages published at {a.rate:,.0f} events/s asked, "
                  f"{live['events_per_s']:,} done, in {live['seconds']:.1f} s ({wrote:.1f} s with making the fleet)\n")
        else:
            print(f"{a.jobs} jobs x {a.nodes} nodes x {a.ranks} ranks ({ranks:,} ranks): {live['lines']:,} lines "
                  f"written live at {a.rate:,.0f} lines/s in {wrote:.1f} s, {live['rotations']} rotations\n")
        stages_said = ("simulate --kafka, detect, sink" if a.publish else "collect, detect, sink through Kafka"
                       if a.kafka else "embedded `run`")
        print(f"| {stages_said} | |\n|---|---:|")
        print(f"| failures injected / with an incident | {len(live['initiated'])} / {len(lat)} |")
        print(f"| right cause + rank / injected, false | {graded['exact']} / {graded['injected']}, {graded['false']} |")
        print(f"| latency p50 / p99 / max, s (target p99 <= 2) | {q[49]:.2f} / {q[98]:.2f} / "
              f"{lat[-1] if lat else 0:.2f} |")
        # where the tail comes from: one kind of failure (what concludes it), or a stage
        # falling behind as the run goes on (the later quarters slower)
        print("\n| failure injected | n | p50, s | max, s |\n|---|---:|---:|---:|")
        for kind, xs in sorted(by_kind.items()):
            print(f"| {kind} | {len(xs)} | {statistics.median(xs):.2f} | {max(xs):.2f} |")
        by_time.sort()
        quarter = max(1, -(-len(by_time) // 4))
        print("\n| failures in the order they began | n | p50, s | max, s |\n|---|---:|---:|---:|")
        for n in range(0, len(by_time), quarter):
            xs = [x for _, x in by_time[n:n + quarter]]
            print(f"| {n // quarter + 1} of 4 | {len(xs)} | {statistics.median(xs):.2f} | {max(xs):.2f} |")
        if missing:
            print(f"\nno incident for: {', '.join(missing[:10])}")
        print("\n" + "\n".join(said))
    finally:
        if local:
            local.stop(work / "broker")
        if a.keep:
            print(f"\nkept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
