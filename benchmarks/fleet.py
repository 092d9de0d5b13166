#!/usr/bin/env python3
"""Fleet mode vs the embedded pipeline, measured in one run on this machine.

    .venv/bin/python benchmarks/fleet.py [--kafka HOST:PORT] [--events 60000] [--trials 20]

Without ``--kafka`` a broker is started with ``scripts/kafka-local`` (and stopped after).

1. **Throughput** (events/s): ``--events`` log lines, every one an event, over 8 jobs x 2
   ranks, read once. Embedded: ``EmbeddedRunner.run(once=True)``. Kafka: collector ->
   broker -> detector -> DuckDB sink, stages driven in this process one after the other,
   timed until the sink has stored every event.
2. **Latency** (seconds, p50 / p99): the three fleet services as separate processes
   (``ckptwatch collect | detect | sink``) next to ``ckptwatch run`` (embedded), all
   polling every 0.1 s. Each trial appends to a new job's logs a save that a SIGKILL
   interrupts (save_start on two ranks, torchrun's ``failed (exitcode: -9)`` and
   ``ChildFailedError``, one more line) and measures the time from that append to the
   incident line the sink (or ``run``) prints right after its DuckDB commit.

Figures print as a table with the Kafka / embedded ratio. Targets on 2 cores: p99 <= 2 s
through Kafka, <= 1 s embedded.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import os
import queue
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from kafka_support import cli_env, fresh_config, kafka_local, save_lines  # noqa: E402

from ckptwatch.embedded import EmbeddedRunner  # noqa: E402
from ckptwatch.ingest.layout import compile_template  # noqa: E402
from ckptwatch.pipeline import PipelineOptions  # noqa: E402
from ckptwatch.rules import RuleSet  # noqa: E402
from ckptwatch.services.collect import Collector  # noqa: E402
from ckptwatch.services.detect import DetectorMember  # noqa: E402
from ckptwatch.services.sink import SinkMember  # noqa: E402
from ckptwatch.sinks.duckdb_store import Store  # noqa: E402

TEMPLATE = "{job}/rank{rank}.log"


def make_logs(root: Path, events: int, jobs: int = 8, ranks: int = 2) -> None:
    per_file = events // (jobs * ranks)
    for j in range(jobs):
        for r in range(ranks):
            p = root / f"bench-{j}" / f"rank{r}.log"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(save_lines(0, per_file))


def throughput_embedded(logs: Path, tmp: Path) -> tuple[float, int]:
    opts = PipelineOptions(template=compile_template(TEMPLATE))
    t0 = time.perf_counter()
    runner = EmbeddedRunner(str(logs), str(tmp / "embedded.duckdb"), opts)
    runner.run(once=True)
    n = runner.stats.events
    runner.close()
    return time.perf_counter() - t0, n


def throughput_kafka(logs: Path, tmp: Path, bootstrap: str) -> tuple[float, int, dict[str, float]]:
    cfg = fresh_config(bootstrap, tmp, partitions=4)
    cfg = dataclasses.replace(cfg, collect=dataclasses.replace(cfg.collect, paths=[str(logs)]))
    stages = {"collect": 0.0, "detect": 0.0, "sink": 0.0}
    t0 = time.perf_counter()
    collector = Collector(cfg, rules=RuleSet.load(()), template=compile_template(TEMPLATE))
    detector = DetectorMember(cfg)
    store = Store(cfg.sink.db)
    sink = SinkMember(cfg, store)
    s = time.perf_counter()
    collector.step(final=True)
    stages["collect"] += time.perf_counter() - s
    total = collector.published
    while sink.stats.events_inserted < total or detector.stats.events < total:
        s = time.perf_counter()
        detector.step()
        stages["detect"] += time.perf_counter() - s
        s = time.perf_counter()
        sink.step()
        stages["sink"] += time.perf_counter() - s
    elapsed = time.perf_counter() - t0
    for c in (collector, detector, sink):
        c.close()
    store.close()
    return elapsed, total, stages


def incident_lines(n: int, job: str) -> tuple[dict[str, str], str]:
    """The trial's lines per rank file: a save interrupted by SIGKILL on rank 1."""
    now = dt.datetime.now(dt.timezone.utc)
    iso = now.strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]
    glog = now.strftime("E%m%d %H:%M:%S.%f")
    start = f"{iso} INFO ckptwatch event=save_start step={n} path=/ckpt/{job}/step_{n}\n"
    fail = (f"{glog} 4240 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -9) "
            f"local_rank: 1 (pid: 4242) of binary: python3\n"
            'Traceback (most recent call last):\n  File "/usr/bin/torchrun", line 8, in <module>\n'
            "    sys.exit(main())\ntorch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
            f"{iso} INFO agent exiting\n")
    return {"rank0.log": start, "rank1.log": start}, fail


def _reader(proc: subprocess.Popen, seen: queue.Queue) -> None:
    for line in proc.stdout:  # type: ignore[union-attr]
        m = re.search(r"interrupted_save\s+job (\S+)", line)
        if m:
            seen.put((m.group(1), time.monotonic()))


def latency(procs: list[subprocess.Popen], printer: subprocess.Popen, logs: Path, trials: int, tag: str,
            warmup: float) -> list[float]:
    seen: queue.Queue = queue.Queue()
    threading.Thread(target=_reader, args=(printer, seen), daemon=True).start()
    time.sleep(warmup)
    out = []
    for n in range(trials):
        job = f"lat-{tag}-{n}"
        (logs / job).mkdir(parents=True)
        starts, fail = incident_lines(n, job)
        for name, text in starts.items():
            (logs / job / name).write_text(text)
        time.sleep(0.3)  # the save is under way ...
        t_append = time.monotonic()
        with open(logs / job / "rank1.log", "a") as f:  # ... when rank 1 is killed
            f.write(fail)
        while True:
            got, t = seen.get(timeout=60)
            if got == job:
                out.append(t - t_append)
                break
    for p in procs:
        p.terminate()
    for p in procs:
        p.communicate(timeout=60)
    return out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kafka", help="bootstrap of a running broker (default: start one)")
    ap.add_argument("--events", type=int, default=60_000)
    ap.add_argument("--trials", type=int, default=20)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ckptwatch-bench-"))
    local, state = kafka_local(), tmp / "broker"
    bootstrap = args.kafka or local.start(state, None, 180.0)
    try:
        logs = tmp / "throughput"
        make_logs(logs, args.events)
        emb_s, emb_n = throughput_embedded(logs, tmp)
        kaf_s, kaf_n, stages = throughput_kafka(logs, tmp, bootstrap)

        base = [sys.executable, "-m", "ckptwatch"]
        py_env = {"PYTHONUNBUFFERED": "1", "COLUMNS": "300"}
        elogs = tmp / "lat-embedded"
        elogs.mkdir()
        run = subprocess.Popen([*base, "run", "--logs", str(elogs), "--db", str(tmp / "lat-embedded.duckdb"),
                                "--interval", "0.1", "--path-template", TEMPLATE], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True, env={**os.environ, **py_env})
        emb_lat = latency([run], run, elogs, args.trials, "e", warmup=3.0)

        klogs = tmp / "lat-kafka"
        klogs.mkdir()
        cfg = fresh_config(bootstrap, tmp, partitions=4)
        env = {**cli_env(cfg, CKPTWATCH_COLLECT_PATH_TEMPLATE=TEMPLATE), **py_env}
        procs = [subprocess.Popen([*base, *cmd], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
                 for cmd in (["collect", str(klogs)], ["detect"], ["sink"])]
        kaf_lat = latency(procs, procs[2], klogs, args.trials, "k", warmup=8.0)
    finally:
        if not args.kafka:
            local.stop(state)

    print(f"ckptwatch fleet benchmark, {os.cpu_count()} cores, {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC")
    print(f"{'':34}{'embedded':>12}{'kafka':>12}{'kafka/emb':>11}")
    print(f"{'throughput, events/s':34}{emb_n / emb_s:12,.0f}{kaf_n / kaf_s:12,.0f}{(kaf_n / kaf_s) / (emb_n / emb_s):11.2f}")
    print(f"{'  events, wall s':34}{emb_n:8,} {emb_s:5.1f}s{kaf_n:8,} {kaf_s:5.1f}s")
    print("  kafka stage time, s: " + ", ".join(f"{k} {v:.1f}" for k, v in stages.items()))
    for name, q in (("latency p50, s", 0.5), ("latency p99, s", 0.99), ("latency max, s", 1.0)):
        e, k = pct(emb_lat, q), pct(kaf_lat, q)
        print(f"{name:34}{e:12.3f}{k:12.3f}{k / e:11.2f}")
    print(f"  ({args.trials} trials each: line appended -> incident row committed in DuckDB)")
    print(f"  targets: p99 <= 1 s embedded ({'met' if pct(emb_lat, .99) <= 1 else 'NOT met'}), "
          f"<= 2 s through Kafka ({'met' if pct(kaf_lat, .99) <= 2 else 'NOT met'})")
    print(f"  mean latency: embedded {statistics.mean(emb_lat):.3f} s, kafka {statistics.mean(kaf_lat):.3f} s")


if __name__ == "__main__":
    main()
