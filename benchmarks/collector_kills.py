#!/usr/bin/env python3
"""Collectors and the broker killed (-9) under a live fleet: is any line stored twice?

    .venv/bin/python benchmarks/collector_kills.py OUT --seed 1 --kills 12 --collectors split|same
                                                   [--copytruncate] [--steps 400] [--every 3 8]
                                                   [--victims collect0,collect1,broker,all]

Writes a simulated fleet live (``ckptwatch simulate --rate 250``: 4 jobs x 2 nodes of
torchrun consoles plus kernel logs), rotated by ``--rotate-mb 0.04`` (rename), or with
``--copytruncate`` by a copytruncate of a random console every 0.3-1.5 s (``.2 -> .3`` and
``.1 -> .2`` shifted first, as logrotate does). A broker (``scripts/kafka-local``, its own
directory under OUT), two collectors, two detectors and a sink follow it. Every ``--every``
seconds (drawn between the two bounds) one of ``--victims`` is killed with SIGKILL and
started again 0.5-4 s later (``all``: both collectors and the broker at once).

``--collectors split``: each collector follows half of the job directories (one collector
per file, as deployed). ``same``: both follow the whole tree (two collectors per file, the
mistake the sink names: ``ckptwatch/sinks/shared_sources.py``).

At the end the collectors catch up (``collect --once``), the detectors and the sink drain
(``--until-idle``), and one JSON line gives the events stored, the lines stored more than
once (same line text, own time, host and rank; lines without a time of their own, such as
tracebacks, repeat legitimately and are left out), and how many times the sink said a file
is followed by two collectors. ``OUT/timeline.log`` has every kill and start.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import duckdb

REPO = Path(__file__).resolve().parents[1]
CLI = str(REPO / ".venv" / "bin" / "ckptwatch")
KAFKA_LOCAL = str(REPO / "scripts" / "kafka-local")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Fleet:
    """The live services of one run, under ``root``."""

    def __init__(self, root: Path, port: int, logs: Path, mode: str) -> None:
        self.root, self.port, self.logs, self.mode = root, port, logs, mode
        self.env = {**os.environ, "CKPTWATCH_KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{port}"}
        self.procs: dict[str, subprocess.Popen] = {}
        self.timeline = open(root / "timeline.log", "a")

    def log(self, *what: object) -> None:
        print(f"{time.time():.1f}", *what, file=self.timeline, flush=True)

    def broker(self, command: str) -> None:
        subprocess.run([KAFKA_LOCAL, "--dir", str(self.root / "kafka"), "--port", str(self.port), command],
                       check=True, capture_output=True)
        self.log("broker", command)

    def kill_broker(self) -> None:
        subprocess.run(["pkill", "-9", "-f", str(self.root / "kafka")], check=False)
        self.log("kill -9 broker")

    def paths(self, i: int) -> list[str]:
        if self.mode == "same":
            return [str(self.logs)]
        jobs = sorted(p.name for p in self.logs.iterdir() if p.is_dir() and p.name != "kernel")
        return [str(self.logs / j) for j in jobs[i::2]]

    def args(self, name: str, *extra: str) -> list[str]:
        if name.startswith("collect"):
            i = int(name[-1])
            return [CLI, "collect", *self.paths(i), "--checkpoint", str(self.root / f"ckpt{i}.json"), *extra]
        if name.startswith("detect"):
            return [CLI, "detect", *extra]
        return [CLI, "sink", "--db", str(self.root / "sink.duckdb"), *extra]

    def run(self, name: str, *extra: str) -> None:
        with open(self.root / f"{name}.out", "a") as out:
            subprocess.run(self.args(name, *extra), env=self.env, stdout=out, stderr=subprocess.STDOUT, check=False)

    def start(self, name: str) -> None:
        out = open(self.root / f"{name}.out", "a")
        self.procs[name] = subprocess.Popen(self.args(name), env=self.env, stdout=out, stderr=subprocess.STDOUT)
        self.log("start", name, self.procs[name].pid)

    def kill(self, name: str) -> None:
        self.procs[name].send_signal(signal.SIGKILL)
        self.procs[name].wait()
        self.log("kill -9", name)

    def stop(self, name: str) -> None:
        self.procs[name].terminate()
        self.procs[name].wait()


def copytruncates(logs: Path, seed: int, stop: threading.Event, done: list[int]) -> None:
    """Copytruncate a random console every 0.3-1.5 s until ``stop`` (count in ``done[0]``)."""
    rnd = random.Random(seed + 1)
    while not stop.wait(rnd.uniform(0.3, 1.5)):
        consoles = sorted(logs.glob("*/*/console.log"))
        if not consoles:
            continue
        f = rnd.choice(consoles)
        for k in (3, 2):
            older = f.with_name(f"{f.name}.{k - 1}")
            if older.exists():
                os.replace(older, f.with_name(f"{f.name}.{k}"))
        if f.stat().st_size:
            shutil.copyfile(f, f.with_name(f.name + ".1"))
            os.truncate(f, 0)
            done[0] += 1


def twice(db: Path) -> dict[str, int]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        events = con.execute("SELECT count(*) FROM events").fetchone()[0]
        lines, extra = con.execute(
            "SELECT count(*), coalesce(sum(n - 1), 0) FROM (SELECT count(*) n FROM events WHERE ts_source = 'line' "
            "GROUP BY line, ts, host, rank HAVING n > 1)").fetchone()
    finally:
        con.close()
    return {"events": events, "lines_stored_twice": lines, "extra_rows": int(extra)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--kills", type=int, default=12)
    ap.add_argument("--collectors", choices=["split", "same"], default="split")
    ap.add_argument("--copytruncate", action="store_true")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--every", type=float, nargs=2, default=(3.0, 8.0))
    ap.add_argument("--victims", default="collect0,collect1,broker")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=False)
    rnd = random.Random(a.seed)
    sim = a.out / "sim"
    fleet = Fleet(a.out, free_port(), sim / "logs", a.collectors)
    fleet.broker("start")
    rotate = [] if a.copytruncate else ["--rotate-mb", "0.04"]
    writer = subprocess.Popen([CLI, "simulate", str(sim), "--jobs", "4", "--nodes", "2", "--ranks", "4",
                               "--steps", str(a.steps), "--save-every", "40", "--rate", "250", *rotate,
                               "--seed", str(a.seed)],
                              stdout=open(a.out / "simulate.out", "w"), stderr=subprocess.STDOUT)
    while not (sim / "logs").is_dir() and writer.poll() is None:
        time.sleep(0.2)
    time.sleep(1)
    stop, copies = threading.Event(), [0]
    if a.copytruncate:
        threading.Thread(target=copytruncates, args=(sim / "logs", a.seed, stop, copies), daemon=True).start()
    for name in ("collect0", "collect1", "detect0", "detect1", "sink"):
        fleet.start(name)
    kills = 0
    while writer.poll() is None and kills < a.kills:
        time.sleep(rnd.uniform(*a.every))
        victim = rnd.choice(a.victims.split(","))
        if victim in ("broker", "all"):
            if victim == "all":
                fleet.kill("collect0")
                fleet.kill("collect1")
            fleet.kill_broker()
            time.sleep(rnd.uniform(1, 4))
            fleet.broker("start")
            if victim == "all":
                fleet.start("collect0")
                fleet.start("collect1")
        else:
            fleet.kill(victim)
            time.sleep(rnd.uniform(0.5, 3))
            fleet.start(victim)
        kills += 1
    writer.wait()
    stop.set()
    fleet.log("writes done; copytruncates", copies[0])
    time.sleep(15)
    for name in ("collect0", "collect1"):
        fleet.stop(name)
        fleet.run(name, "--once")
    time.sleep(20)
    for name in ("detect0", "detect1", "sink"):
        fleet.stop(name)
    fleet.run("detect0", "--until-idle", "10")
    fleet.run("sink", "--until-idle", "10")
    fleet.broker("stop")
    said = (a.out / "sink.out").read_text(errors="replace").count("is followed by two collectors")
    print(json.dumps({"seed": a.seed, "collectors": a.collectors, "copytruncate": a.copytruncate,
                      "kills": kills, "copytruncates": copies[0], **twice(a.out / "sink.duckdb"),
                      "said_two_collectors": said}))


if __name__ == "__main__":
    main()
