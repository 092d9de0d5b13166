#!/usr/bin/env python3
"""Tailing many growing rank files: start time, throughput kept up with, and lag (issue 15).

    .venv/bin/python benchmarks/tail.py [--files 10000] [--backlog 55] [--rate 2000] [--seconds 30]

1. Writes ``--files`` rank logs (``job-NNNN/nodeNNNN/rankN.log``, 8 ranks a node, 4 nodes a
   job) of ``--backlog`` lines each, then times the first poll of a
   :class:`~ckptwatch.ingest.watcher.SourceWatcher` over them plus the rules (what
   ``ckptwatch run`` or ``collect`` does at start), and its peak RSS.
2. A writer process appends ``--rate`` lines/s in total, spread round-robin over every
   file (each line a metric event carrying its write time, microseconds), for
   ``--seconds``; this process polls, applies the rules and takes each event's lag: the
   time it left the rules (what a collector publishes, or ``run`` stores) minus the time
   written in its line. Also reported: the poll of an idle fleet (nothing written).

Prints the figures next to the writer's rate: kept up means lines read = lines written and
the lag does not grow over the run. ``--compare`` runs the same fleet again with inotify off
(every poll lists and stats every file, as before issue 15's tenth session), interleaved. Target (issue 15): 10,000 files at 100,000 lines/s,
lag p99 <= 2 s, start in seconds.
"""

from __future__ import annotations

import argparse
import datetime as dt
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ckptwatch.ingest.layout import compile_template  # noqa: E402
from ckptwatch.ingest.watcher import SourceWatcher  # noqa: E402
from ckptwatch.rules import RuleSet  # noqa: E402

WRITER = r'''
import datetime as dt, sys, time
paths, rate, seconds = open(sys.argv[1]).read().split("\n"), float(sys.argv[2]), float(sys.argv[3])
files = [open(p, "a", buffering=1 << 16) for p in paths]
tick, n, i, start = 0.05, 0, 0, time.monotonic()
while (now := time.monotonic()) - start < seconds:
    due = int((now - start) * rate) - n
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")
    touched = set()
    for _ in range(due):
        f = files[i % len(files)]
        f.write(f"[{stamp}] [INFO]  iteration {n:8d}/ 1000000 | consumed samples: {n * 1024:12d} | "
                f"lm loss: 2.{n % 1000:03d}E+00 | grad norm: 1.0 |\n")
        touched.add(i % len(files))
        i += 1
        n += 1
    for k in touched:
        files[k].flush()
    time.sleep(tick)
print(n)
'''


def write_fleet(root: Path, files: int, backlog: int) -> list[Path]:
    """``files`` rank logs of ``backlog`` lines each (a save every 20 lines)."""
    t0 = dt.datetime(2026, 12, 1, 8, 0, tzinfo=dt.timezone.utc)
    out = []
    for f in range(files):
        node, rank = divmod(f, 8)
        p = root / f"job-{node // 4:04d}" / f"node{node:04d}" / f"rank{f % 32}.log"
        p.parent.mkdir(parents=True, exist_ok=True)
        lines = []
        for i in range(backlog):
            ts = (t0 + dt.timedelta(seconds=i)).strftime("%Y-%m-%d %H:%M:%S.%f")
            if i % 20 == 10:
                lines.append(f"[{ts}] [INFO] saving checkpoint at iteration {i:8d} to /ckpt/job/iter_{i:07d} in torch format")
            elif i % 20 == 11:
                lines.append(f"[{ts}] [INFO]   successfully saved checkpoint from iteration {i:8d} to "
                             f"/ckpt/job/iter_{i:07d} [ t 1/1, p 1/1 ]")
            else:
                lines.append(f"[{ts}] [INFO]  iteration {i:8d}/ 1000000 | consumed samples: {i * 1024:12d} | "
                             f"lm loss: 2.{i:03d}E+00 | grad norm: 1.0 |")
        p.write_text("\n".join(lines) + "\n")
        out.append(p)
    return out


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(files: int, backlog: int, rate: float, seconds: float, interval: float = 0.5, *,
            echo: bool = True, watch_changes: bool = True) -> dict[str, float]:
    """Steps 1 and 2 of the module docstring for one fleet; returns the figures: ``start_s``,
    ``start_lines_per_s``, ``idle_poll_s``, ``written``, ``read``, ``lag_p50``/``lag_p99``/
    ``lag_max`` (seconds), ``poll_p50``/``poll_max`` (seconds), ``rss_mb``, ``lag_first_half``
    and ``lag_second_half`` (medians, seconds)."""
    say = print if echo else (lambda *_a, **_k: None)
    work = Path(tempfile.mkdtemp(prefix="ckptwatch-tail-"))
    try:
        paths = write_fleet(work / "logs", files, backlog)
        rules = RuleSet.load()
        watcher = SourceWatcher([str(work / "logs")], template=compile_template("{job}/{host}/rank{rank}.log"),
                                watch_changes=watch_changes)
        t0 = time.perf_counter()
        events = 0
        while True:  # the start: every existing file read once
            events += rules.apply(watcher.poll()).height
            if not watcher.backlog:
                break
        start = time.perf_counter() - t0
        say(f"start: {files:,} files x {backlog} lines read in {start:.1f} s "
            f"({files * backlog / start:,.0f} lines/s), {events:,} events, peak RSS {rss_mb():.0f} MB", flush=True)
        idles = []
        for _ in range(3):  # the first live poll lists everything once (it starts the inotify feed)
            t0 = time.perf_counter()
            rules.apply(watcher.poll())
            idles.append(time.perf_counter() - t0)
        idle = idles[-1]
        say(f"idle poll (nothing written): {idle:.3f} s; polls find changes by {watcher.watching}", flush=True)

        (work / "paths.txt").write_text("\n".join(map(str, paths)))
        began = dt.datetime.now(dt.timezone.utc)  # the writer's lines are dated from now on (the backlog's are not)
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(work / "paths.txt"), str(rate),
                                   str(seconds)], stdout=subprocess.PIPE, text=True)
        lags: list[float] = []
        polls: list[float] = []
        read = 0
        lines_before, listings_before = watcher.stats.lines, watcher.listings
        quiet_since = None
        while True:
            t0 = time.perf_counter()
            ev = rules.apply(watcher.poll())
            done = dt.datetime.now(dt.timezone.utc)
            polls.append(time.perf_counter() - t0)
            ev = ev.filter((ev["kind"] == "metric") & (ev["ts"] >= began))  # a file's held last backlog line aside
            read += ev.height
            if ev.height:
                lags += ((done - ev["ts"]).dt.total_microseconds() / 1e6).to_list()
                quiet_since = None
            elif writer.poll() is not None:
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since > 3.0:
                    break
            if not watcher.backlog:
                time.sleep(max(0.0, interval - polls[-1]))
        written = int(writer.communicate()[0])
        lines_read = watcher.stats.lines - lines_before
        listings = watcher.listings - listings_before
        watcher.close()
        ordered = list(lags)  # in arrival order: does the lag grow over the run?
        lags.sort()
        q = statistics.quantiles(lags, n=100) if len(lags) > 1 else [0.0] * 99
        half = len(lags) // 2
        return {"start_s": start, "start_lines_per_s": files * backlog / start, "idle_poll_s": idle,
                "written": written, "read": read, "lines_read": lines_read, "lag_p50": q[49], "lag_p99": q[98],
                "lag_max": lags[-1] if lags else 0.0, "poll_p50": statistics.median(polls), "poll_max": max(polls),
                "rss_mb": rss_mb(), "lag_first_half": statistics.median(ordered[:half] or [0]),
                "lag_second_half": statistics.median(ordered[half:] or [0]), "polls": len(polls),
                "listings": listings}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--backlog", type=int, default=55)
    ap.add_argument("--rate", type=float, default=2000.0, help="lines/s written in total")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--interval", type=float, default=0.5, help="seconds between polls when idle")
    ap.add_argument("--compare", action="store_true", help="run again with inotify off (listing every poll)")
    a = ap.parse_args()
    modes = [True, False] if a.compare else [True]
    runs = {mode: measure(a.files, a.backlog, a.rate, a.seconds, a.interval, watch_changes=mode) for mode in modes}
    cols = " | ".join("inotify" if mode else "listing every poll" for mode in modes)
    print(f"\n| {a.files:,} files, writer {a.rate:,.0f} lines/s for {a.seconds:.0f} s | {cols} |")
    print("|---|" + "---:|" * len(modes))

    def row(label: str, fmt) -> None:
        print(f"| {label} | " + " | ".join(fmt(runs[mode]) for mode in modes) + " |")

    row("start, s", lambda m: f"{m['start_s']:.1f}")
    row("idle poll, s", lambda m: f"{m['idle_poll_s']:.3f}")
    row("lines written / read", lambda m: f"{m['written']:,} / {m['lines_read']:,}")
    row("lag p50 / p99 / max, s", lambda m: f"{m['lag_p50']:.2f} / {m['lag_p99']:.2f} / {m['lag_max']:.2f}")
    row("poll + rules, s: p50 / max", lambda m: f"{m['poll_p50']:.2f} / {m['poll_max']:.2f}")
    row("polls that listed / polls", lambda m: f"{m['listings']} / {m['polls']}")
    row("lag median, first / second half, s", lambda m: f"{m['lag_first_half']:.2f} / {m['lag_second_half']:.2f}")
    row("peak RSS, MB (the process's, so far)", lambda m: f"{m['rss_mb']:.0f}")


if __name__ == "__main__":
    main()
