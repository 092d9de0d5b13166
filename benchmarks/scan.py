#!/usr/bin/env python3
"""Parse throughput and memory against the scan limit, on fleet-like logs (issue 15).

    .venv/bin/python benchmarks/scan.py [--mb 200] [--nodes 40] [--rounds 3] [--keep DIR] [--before CHECKOUT] [--days N]

Writes ``--mb`` MB of logs shaped like a fleet's (``--nodes`` nodes x 8 rank files, one
job per 4 nodes; torchrun ``[rankN]:`` prefixes, HF / Megatron / DeepSpeed progress and
metrics lines, NCCL INFO chatter, warnings, tqdm bars; a checkpoint save every 500 steps
on every rank and, in one job, a SIGKILL of one rank in the middle of the save of step 1000,
after which the launcher stops that job), then times, in
interleaved rounds over the same bytes (page cache warm):

* ``ckptwatch diagnose --json DIR`` (a subprocess; wall and peak RSS from ``/usr/bin/time``);
* ``ckptwatch run --once`` on the same directory;
* the baseline a user would script by hand: a per-line Python loop that tests every rule's
  literal prefilter with ``in`` and runs its ``re`` pattern where the literal is present;
* ``grep -F -f LITERALS -c`` (the literal prefilters of every rule, one pass);
* the polars floor: reading, splitting into lines and one Aho-Corasick pass of those
  literals in polars, in process: the ceiling of any pipeline made of polars passes.

Prints medians and the ratios the issue asks for: ckptwatch vs the ``re`` loop (target
>= 20x), lines/s per core (target >= 2 M), and vs ``grep -F`` (target >= 1/3).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import polars as pl  # noqa: E402

from ckptwatch.rules import RuleSet  # noqa: E402
from timing import timed  # noqa: E402  (benchmarks/timing.py)

NOISE = [
    "{ts} [INFO] iteration {step:8d}/ 500000 | consumed samples: {samples:12d} | elapsed time per iteration (ms): "
    "{ms:.1f} | learning rate: {lr:.6E} | global batch size:  1024 | lm loss: {loss:.6E} | loss scale: 1.0 | "
    "grad norm: {gn:.3f} | number of skipped iterations:   0 | number of nan iterations:   0 |",
    "{{'loss': {loss:.4f}, 'grad_norm': {gn:.4f}, 'learning_rate': {lr:.3e}, 'epoch': {epoch:.2f}}}",
    "{host}:{pid}:{pid2} [{local}] NCCL INFO Channel {ch:02d}/0 : {local} -> {peer} via P2P/IPC/read",
    "{host}:{pid}:{pid2} [{local}] NCCL INFO comm 0x{ptr:x} rank {rank} nRanks {world} nNodes {nodes} "
    "localRanks 8 localRank {local} MNNVL 0",
    "{ts},{msec:03d} - INFO - train.py:{lineno} - step {step} throughput {tput:.1f} tokens/s mfu {mfu:.2f}%",
    " {pct:3d}%|{bar:<20}| {step}/500000 [{mins:02d}:{secs:02d}<{rem:02d}:00:00, {its:.2f}it/s]",
    "[{ts}] [WARNING] [stage_1_and_2.py:1823:step] [deepspeed] OVERFLOW! Rank {rank} Skipping step. "
    "Attempted loss scale: {scale}, reducing to {scale2}",
    "{ts} | INFO | dataloader | worker {local} prefetched shard {shard:05d} ({mb:.1f} MB) from /data/tokens",
    "/usr/lib/python3/dist-packages/torch/utils/checkpoint.py:{lineno}: UserWarning: torch.utils.checkpoint: "
    "the use_reentrant parameter should be passed explicitly",
]
SAVE = [
    "{ts} [INFO] saving checkpoint at iteration {step:8d} to /ckpt/{job}/iter_{step:07d} in torch format",
    "{ts} [INFO]   successfully saved checkpoint from iteration {step:8d} to /ckpt/{job}/iter_{step:07d} "
    "[ t 1/1, p 1/1 ]",
]
KILL = [
    "{ts} [INFO] saving checkpoint at iteration {step:8d} to /ckpt/{job}/iter_{step:07d} in torch format",
    "W1130 10:22:31.123000 1234 torch/distributed/elastic/multiprocessing/api.py:897] Sending process 4242 "
    "closing signal SIGTERM",
    "E1130 10:22:31.456000 1234 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -9) "
    "local_rank: 3 (pid: 4245) of binary: /usr/bin/python3",
]


def write_logs(root: Path, mb: int, nodes: int, seed: int = 15) -> tuple[int, int]:
    """``mb`` MB over ``nodes`` x 8 rank files; returns (files, lines)."""
    rnd = random.Random(seed)
    ranks = nodes * 8
    per_file = mb * 1_000_000 // ranks
    files = lines = 0
    for node in range(nodes):
        job = f"job-{node // 4:04d}"
        for local in range(8):
            rank = (node % 4) * 8 + local
            path = root / job / f"node{node:04d}" / f"rank{rank}.log"
            path.parent.mkdir(parents=True, exist_ok=True)
            out, size, step, sec = [], 0, 0, 0
            while size < per_file:
                step += 1
                sec += 1
                ts = f"2026-11-30 {10 + sec // 3600 % 12:02d}:{sec // 60 % 60:02d}:{sec % 60:02d}"
                if step % 500 == 0:
                    kill = job == "job-0000" and step == 1000 and local == 3
                    for t in (KILL if kill else SAVE):
                        out.append(f"[rank{rank}]:" + t.format(ts=ts, step=step, job=job))
                    if job == "job-0000" and step == 1000:
                        break  # the launcher tears the whole job down
                t = rnd.choice(NOISE)
                line = "[rank{rank}]:".format(rank=rank) + t.format(
                    ts=ts, step=step, samples=step * 1024, ms=rnd.uniform(300, 900), lr=3e-4, loss=rnd.uniform(1, 3),
                    gn=rnd.uniform(0.1, 2), epoch=step / 1e4, host=f"node{node:04d}", pid=4000 + local, pid2=5000,
                    local=local, peer=(local + 1) % 8, ch=rnd.randrange(32), ptr=rnd.getrandbits(40), rank=rank,
                    world=ranks, nodes=nodes, msec=rnd.randrange(1000), lineno=rnd.randrange(100, 900),
                    tput=rnd.uniform(1e3, 1e4), mfu=rnd.uniform(30, 55), pct=step % 100, bar="#" * (step % 20),
                    mins=sec // 60 % 60, secs=sec % 60, rem=rnd.randrange(99), its=rnd.uniform(1, 3), scale=65536,
                    scale2=32768, shard=rnd.randrange(99999), mb=rnd.uniform(10, 200))
                out.append(line)
                size += len(line) + 1
            path.write_text("\n".join(out) + "\n")
            files += 1
            lines += len(out)
    return files, lines


def lengthen(root: Path, days: int) -> None:
    """Make every file under ``root`` ``days`` times as long, in place: its lines ``days``
    times, the first copies dated ``days - 1`` .. 1 days before the original (2026-11-30; the
    glog ``W1130`` / ``E1130`` stamps too), so time moves forward in each file: the same
    files and jobs, running ``days`` times as long (the issue's "10x larger input")."""
    for path in sorted(root.rglob("*.log")):
        data = path.read_bytes()
        with path.open("wb") as out:
            for day in range(30 - days + 1, 30):
                out.write(data.replace(b"2026-11-30", b"2026-11-%02d" % day)
                          .replace(b"W1130 ", b"W11%02d " % day).replace(b"E1130 ", b"E11%02d " % day))
            out.write(data)


def re_loop(paths: list[Path], rules: list[tuple[tuple[str, ...], re.Pattern[str]]]) -> int:
    """The hand-written baseline: per line, every rule's literals with ``in``, then its regex."""
    hits = 0
    for p in paths:
        with open(p, encoding="utf-8", errors="replace") as f:
            for line in f:
                for lits, rx in rules:
                    if any(lit in line for lit in lits) and rx.search(line):
                        hits += 1
                        break
    return hits


def polars_floor(paths: list[Path], literals: list[str]) -> int:
    """The least a pipeline of polars passes does per line: read each file, split it into
    lines (one Series per file) and run one Aho-Corasick pass of every rule's literal over
    them. Its speed bounds any such pipeline from above. Returns the candidate lines."""
    hits = 0
    for p in paths:
        lines = pl.Series("line", [p.read_bytes().decode("utf-8", "replace")]).str.split("\n").explode()
        hits += int(lines.str.contains_any(literals).sum())
    return hits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--nodes", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3, help="0: write the logs and stop")
    ap.add_argument("--keep", help="write the logs here and keep them")
    ap.add_argument("--days", type=int, default=1,
                    help="make each file this many times as long (earlier-dated copies of its lines first): the "
                         "memory of a longer input over the same files; at most 29")
    ap.add_argument("--before", metavar="CHECKOUT",
                    help="also time diagnose of another checkout (e.g. `git worktree add /tmp/before HEAD~3`), "
                         "interleaved, on the same bytes: the before/after of a change to the hot path")
    a = ap.parse_args()
    work = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="ckptwatch-scan-"))
    logs = work / "logs"
    if not logs.exists():
        files, lines = write_logs(logs, a.mb, a.nodes)
        if a.days > 1:
            lengthen(logs, a.days)
    paths = sorted(logs.rglob("*.log"))
    files = len(paths)
    lines = sum(1 for p in paths for _ in open(p, "rb"))
    size = sum(p.stat().st_size for p in paths)
    print(f"{size / 1e6:.0f} MB, {lines:,} lines, {files:,} files in {logs}", flush=True)
    if a.rounds == 0:  # only write the logs (with --keep: for a run of your own)
        return
    ruleset = RuleSet.load()
    # Rust regex spells "end of text" \z, Python's re \Z (\z only from Python 3.14)
    rules = [(r.prefilters, re.compile(r.pattern.replace(r"\z", r"\Z"))) for r in ruleset.rules]
    lits = work / "literals.txt"
    lits.write_text("\n".join(sorted({lit for r in ruleset.rules for lit in r.prefilters})) + "\n")
    cli = [sys.executable, "-m", "ckptwatch"]
    template = ["--path-template", "{job}/{host}/rank{rank}.log"]
    literals = sorted({lit for r in ruleset.rules for lit in r.prefilters})
    results: dict[str, list[tuple[float, int]]] = {k: [] for k in ("diagnose", "run --once", "re loop", "grep -F",
                                                                   "polars floor")}
    if a.before:
        results["diagnose (before)"] = []
    for i in range(a.rounds):
        if a.before:
            env = {**os.environ, "PYTHONPATH": str(Path(a.before).resolve())}
            results["diagnose (before)"].append(
                timed(cli + ["diagnose", "--json", *template, str(logs)], env=env, cwd=a.before)[:2])
        wall, rss, out, _ = timed(cli + ["diagnose", "--json", *template, str(logs)])
        results["diagnose"].append((wall, rss))
        found = sorted(f"{i['kind']} {i['job']} step {i['step']}" for i in json.loads(out)["incidents"])
        db = work / f"r{i}.duckdb"
        results["run --once"].append(timed(cli + ["run", "--logs", str(logs), "--db", str(db), "--once", *template])[:2])
        for p in work.glob(f"r{i}.duckdb*"):
            p.unlink()
        t0 = time.perf_counter()
        re_loop(paths, rules)
        results["re loop"].append((time.perf_counter() - t0, 0))
        results["grep -F"].append(timed(["grep", "-F", "-c", "-h", "-f", str(lits), *map(str, paths)])[:2])
        t0 = time.perf_counter()
        polars_floor(paths, literals)
        results["polars floor"].append((time.perf_counter() - t0, 0))
        print(f"round {i + 1}: " + ", ".join(f"{k} {v[-1][0]:.1f} s" for k, v in results.items())
              + f"; diagnose found: {'; '.join(found)}", flush=True)
    med = {k: (statistics.median(w for w, _ in v), max(m for _, m in v)) for k, v in results.items()}
    print(f"\n| on {size / 1e6:.0f} MB / {lines / 1e6:.2f} M lines ({files:,} files) | wall, s | lines/s | "
          f"peak RSS, MB |\n|---|---:|---:|---:|")
    for k, (w, m) in med.items():
        print(f"| {k} | {w:.2f} | {lines / w:,.0f} | {m if m else '(in process)'} |")
    d = med["diagnose"][0]
    if a.before:
        print(f"\ndiagnose, this checkout vs {a.before}: {med['diagnose (before)'][0] / d:.2f}x faster, peak RSS "
              f"{med['diagnose'][1]} MB vs {med['diagnose (before)'][1]} MB")
    print(f"\ndiagnose vs re loop: {med['re loop'][0] / d:.2f}x (target >= 20x); "
          f"vs grep -F: {med['grep -F'][0] / d:.3f} (target >= 0.333); "
          f"lines/s per core: {lines / d / min(os.cpu_count() or 1, 2):,.0f} (target >= 2,000,000)")
    f = med["polars floor"][0]
    print(f"polars floor (read, split, one Aho-Corasick pass; no prefix, record, time or label): "
          f"{lines / f:,.0f} lines/s, {med['re loop'][0] / f:.1f}x the re loop, {med['grep -F'][0] / f:.3f} of grep -F: "
          f"the most a pipeline of polars passes can reach; diagnose does {f / d:.3f} of it")
    if not a.keep:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
