#!/usr/bin/env python3
"""Soak: faults at random points of a live pipeline; after each round, every line once.

    .venv/bin/python benchmarks/soak.py --seed 1 --rounds 20 --mode both [--lines 1200] [--kafka HOST:PORT]

Each round writes ``--lines`` log lines, every one an event a rule matches (ckptwatch's own
save / integrity / resume lines plus one ENOSPC error), over three jobs: a storage failure
during a save (job ``a``), a checkpoint verified corrupt (job ``b``) and a later job resuming
from it (job ``c``), so each round has incidents that page. The lines go to per-rank files
while the pipeline tails them: ``ckptwatch run`` (embedded) or ``ckptwatch collect | detect |
sink`` linked by a real Kafka broker (fleet), all as subprocesses, alerting real HTTP
receivers on 127.0.0.1 (Slack, PagerDuty and webhook channels of an ``[alerts]`` config).

Faults, picked at random from the seed for each round (the plan is printed first):

* ``kill_run`` / ``kill_collect`` / ``kill_detect`` / ``kill_sink``: SIGKILL at a random moment;
  ``failpoint_collect`` / ``failpoint_detect`` / ``failpoint_sink``: SIGKILL inside the named
  window (``CKPTWATCH_FAILPOINTS``, :mod:`ckptwatch.failpoints`). A process that dies is
  restarted, as a supervisor would.
* ``broker_restart``: the ``scripts/kafka-local`` broker stopped and started again (same
  port, same data) while lines are written. Only with a broker this script started.
* ``rotate_rename`` / ``rotate_copytruncate``: logrotate of one file during the writes, two
  or three times, so older generations shift (``rotate N``: ``.1`` -> ``.2`` first).
* ``disk_full_db`` (the DuckDB file of ``run`` / ``sink``) and ``disk_full_checkpoint`` (the
  collector's offsets file): that file lives on a size-limited tmpfs (``mount -t tmpfs -o
  size=...``, as root) that is filled to ENOSPC for a few seconds, then freed. Without root,
  the process's ``RLIMIT_FSIZE`` is lowered to the file's size instead (writes fail with
  EFBIG: a simulated full disk).
* ``rx_slow`` / ``rx_429`` / ``rx_5xx`` / ``rx_drop``: one alert receiver sleeps before its
  200, answers 429 with ``Retry-After``, answers 5xx, or closes the connection without an
  answer, for its first few requests.

After the writes and the faults, once the live processes caught up (fleet: the collector's
offsets at the end of every file, the detector group's commits at the end of the events
topic, the sink group's at the end of both topics), they are stopped (SIGTERM). Embedded, a
final ``run --once`` follows (the end of input: it concludes what waits for late lines).
Fleet, what the live services stored is checked as it is; only when they did not catch up
within 90 s (noted, with what they had stored) does a final pass drain the rest, as a
restart would (``collect --once``, ``detect --until-idle``, ``sink --until-idle``). Each
run directory keeps the logs, the database, every process's output, ``receiver.jsonl``
(every alert request and its answer) and ``timeline.log`` (when each process started, was
killed or exited, and when each fault began and ended). Checks, per round:

* events: the ``line`` multiset of the DuckDB ``events`` table against the lines written
  (each line names its job, rank and time, so it says which file it came from): ``lost`` =
  written and not stored, ``dup`` = stored more often than written (or never written);
  ``mislabeled`` = stored with another job or rank than its file's;
* incidents: ``(id, kind, status, job, step, root cause class, root rank)`` of the current
  incidents equal those of the fault-free reference run of the same lines in the same mode
  (one per scenario: same writes and pacing, no fault, receivers that answer at once);
* alerts: every notification row of the ``alerts`` table (console aside) is ``sent`` and the
  receiver accepted it at least once; deliveries beyond one per (channel, incident, action)
  are duplicates; ``pages`` counts the PagerDuty triggers accepted.

One table row per round and a summary; exit 1 when a round lost or duplicated an event, got
another incident set than its reference, or left an alert undelivered. Processes that exited
on their own (not by a fault's design: ``crash``) are counted and explained in the notes.

Reproduce one round: ``--seed S --start N --rounds 1 --mode both`` (round N of seed S has the
same plan whatever rounds ran before it; its mode is ``embedded`` for even N with ``both``).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime as dt
import errno
import http.server
import json
import os
import random
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from kafka_support import cli_env, fresh_config, kafka_local  # noqa: E402

PY = sys.executable
TEMPLATE = "{job}/rank{rank}.log*"  # rotated generations (rank0.log.1) keep their labels
ROUTING_KEY = "soakR0UT1NGKEY0123456789abcdef01"
BASE_TS = dt.datetime(2026, 11, 30, 8, 0, tzinfo=dt.timezone.utc)
#: event-time seconds between two saves of a job: more than the detector's pre-save window
#: (60 s, failures that long before a save's start count for it), so the ENOSPC of one save
#: is never a candidate cause of the next (see the soak's report on batch boundaries)
GAP = 100.0

EMBEDDED_FAULTS = ("kill_run", "rotate_rename", "rotate_copytruncate", "disk_full_db",
                   "rx_slow", "rx_429", "rx_5xx", "rx_drop")
FLEET_FAULTS = ("kill_collect", "kill_detect", "kill_sink", "failpoint_collect", "failpoint_detect",
                "failpoint_sink", "broker_restart", "rotate_rename", "rotate_copytruncate", "disk_full_db",
                "disk_full_checkpoint", "rx_slow", "rx_429", "rx_5xx", "rx_drop")
FAILPOINTS = {"failpoint_collect": ("collect", "collect.after_publish"),
              "failpoint_detect": ("detect", "detect.after_publish"),
              "failpoint_sink": ("sink", "sink.after_write")}
CHANNEL_PATHS = {"oncall": "/slack", "pager": "/pd", "hook": "/hook"}
#: which processes write to the small disk of each full-disk fault
DISK_USERS = {"db": ("run", "sink"), "checkpoint": ("collect",)}
INCIDENT_COLS = "id, kind, status, job, step, root_cause_class, root_rank"


def say(msg: str) -> None:
    print(msg, flush=True)


# --------------------------------------------------------------------------------------------
# The lines


@dataclasses.dataclass
class Workload:
    """The lines of one scenario: ``order`` is the write order of ``(file, line)`` (file
    relative to the log dir), ``labels`` maps each line to the ``(job, rank)`` of its file."""

    name: str
    order: list[tuple[str, str]]
    labels: dict[str, tuple[str, int]]

    @property
    def files(self) -> list[str]:
        return sorted({f for f, _ in self.order})


def _ts(seconds: float) -> str:
    return (BASE_TS + dt.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.%f") + "Z"


def make_workload(rng: random.Random, lines: int, name: str, failure: str = "random") -> Workload:
    """About ``lines`` lines, every one an event: job ``a`` and ``b`` save every 10 steps on 2
    ranks; ``a`` has one save hit by ENOSPC on one rank (and verified incomplete 45 s later),
    ``b`` has one save verified corrupt, job ``c`` resumes from that save. ``failure``: where
    ``a``'s failed save is: ``middle`` (later saves resolve it), ``last`` (it stays open) or
    ``random`` (either)."""
    ja, jb, jc = f"{name}-a", f"{name}-b", f"{name}-c"
    steps = max(6, (lines - 5) // 8)
    middle, last = rng.randrange(2, steps - 1), steps - 1
    either = rng.choice([middle, last])
    fa = {"middle": middle, "last": last}.get(failure, either)
    fr = rng.randrange(2)
    fb = rng.randrange(2, steps - 1)
    rows: list[tuple[float, str, str, str, int]] = []  # (event time, file, line, job, rank)

    def add(t: float, job: str, rank: int, text: str) -> None:
        rows.append((t, f"{job}/rank{rank}.log", f"{_ts(t)} {text}", job, rank))

    for job in (ja, jb):
        for i in range(steps):
            step = 10 * (i + 1)
            t0 = GAP * (i + 1) + (0.5 if job == jb else 0.0)
            path = f"/ckpt/{job}/step_{step}"
            for r in (0, 1):
                add(t0 + 0.01 * r, job, r, f"ckptwatch event=save_start step={step} rank={r} world_size=2 path={path}")
                if job == ja and i == fa and r == fr:
                    add(t0 + 1.0, job, r, f"ERROR OSError: [Errno 28] No space left on device: '{path}/shard_{r}.pt'")
                    continue
                add(t0 + 2.0 + 0.01 * r, job, r,
                    f"ckptwatch event=save_end step={step} rank={r} world_size=2 files=2 bytes=4096 path={path}")
            if job == ja and i == fa:  # the torn save verified, past the detector's settle time (30 s)
                add(t0 + 46.0, job, 0, f"ckptwatch event=integrity step={step} rank=0 world_size=2 verdict=incomplete "
                                       f'files=1 bytes=2048 problems=1 manifest=yes detail="shard_{fr}.pt: missing" '
                                       f"path={path}")
            if job == jb and i == fb:
                add(t0 + 2.5, job, 0, f"ckptwatch event=integrity step={step} rank=0 world_size=2 verdict=corrupt "
                                      f'files=2 bytes=4096 problems=1 manifest=yes detail="shard_1.pt: hash_mismatch" '
                                      f"path={path}")
    end = GAP * (steps + 1)
    bstep = 10 * (fb + 1)
    add(end + 5.0, jc, 0, f"ckptwatch event=resume step={bstep} rank=0 world_size=2 path=/ckpt/{jb}/step_{bstep}")
    rows.sort(key=lambda r: (r[0], r[1]))
    return Workload(name, [(f, line) for _, f, line, _, _ in rows], {line: (job, rank) for _, _, line, job, rank in rows})


class Writer(threading.Thread):
    """Writes the workload into ``logs`` over ``duration`` seconds, rotating files as
    ``rotations`` say: ``(line index, file, style)`` with style ``rename`` (logrotate's
    default: the writer reopens the live name) or ``copytruncate`` (copy, truncate in place;
    the writer keeps its O_APPEND descriptor). Either first shifts older generations
    (``.2`` -> ``.3``, ``.1`` -> ``.2``), as logrotate's ``rotate N`` does."""

    def __init__(self, logs: Path, workload: Workload, duration: float,
                 rotations: list[tuple[int, str, str]]) -> None:
        super().__init__(daemon=True)
        self.logs, self.workload, self.duration = logs, workload, duration
        self.rotations = sorted(rotations)
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.rotated: list[str] = []

    def run(self) -> None:
        try:
            self._write()
        except BaseException as e:  # reported by the round
            self.error = e
        finally:
            self.done.set()

    def _rotate(self, handles: dict[str, Any], rel: str, style: str) -> None:
        live = self.logs / rel
        if not live.exists():
            return
        gens = sorted((int(p.name.rsplit(".", 1)[1]) for p in live.parent.glob(live.name + ".*")
                       if p.name.rsplit(".", 1)[1].isdigit()), reverse=True)
        for g in gens:  # rotate N: .2 -> .3, .1 -> .2 (nothing is deleted within a round)
            os.rename(f"{live}.{g}", f"{live}.{g + 1}")
        if style == "rename":
            os.rename(live, f"{live}.1")
            if rel in handles:
                handles.pop(rel).close()
        else:
            shutil.copyfile(live, f"{live}.1")
            with open(live, "r+") as f:
                f.truncate(0)
        self.rotated.append(f"{rel}:{style}")

    def _write(self) -> None:
        handles: dict[str, Any] = {}
        order = self.workload.order
        ticks = max(1, int(self.duration / 0.05))
        per_tick = max(1, -(-len(order) // ticks))
        rot = list(self.rotations)
        start = time.monotonic()
        i = 0
        try:
            while i < len(order):
                for rel, line in order[i:i + per_tick]:
                    while rot and rot[0][0] <= i:
                        _, rrel, style = rot.pop(0)
                        self._rotate(handles, rrel, style)
                    f = handles.get(rel)
                    if f is None:
                        (self.logs / rel).parent.mkdir(parents=True, exist_ok=True)
                        f = handles[rel] = open(self.logs / rel, "a")
                    f.write(line + "\n")
                    i += 1
                for f in handles.values():
                    f.flush()
                delay = start + 0.05 * (i // per_tick) - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
        finally:
            for f in handles.values():
                f.close()


# --------------------------------------------------------------------------------------------
# Alert receivers


def _notification_key(path: str, body: bytes) -> tuple[str, str, str, Any] | None:
    """``(channel, incident id, action on the wire, notification id)`` of a request body."""
    try:
        d = json.loads(body)
    except ValueError:
        return None
    if path == "/hook":
        return ("hook", d["incident"]["id"], d["action"], d.get("notification_id"))
    if path == "/pd":
        return ("pager", d.get("dedup_key", ""), d.get("event_action", ""), None)
    if path == "/slack":
        text = json.dumps(d.get("blocks", []))
        m = re.search(r"ckptwatch incident `([^`]+)`", text)
        header = next((b["text"]["text"] for b in d.get("blocks", []) if b.get("type") == "header"), None)
        if header is None:  # the short closing message: Resolved / Superseded / Withdrawn
            action = "resolve"
        else:
            action = next((a for p, a in (("ESCALATED ", "escalate"), ("STILL OPEN ", "realert"),
                                          ("UPDATED ", "update")) if header.startswith(p)), "trigger")
        return ("oncall", m.group(1) if m else "", action, None)
    return None


class Receiver:
    """Slack (``/slack``), PagerDuty (``/pd``) and webhook (``/hook``) stand-ins on one
    127.0.0.1 port. ``behaviors`` maps a path to how its first ``count`` requests are
    answered: ``slow`` (sleep ``delay`` s, then 200), ``429`` (with ``Retry-After``), ``5xx``,
    ``drop`` (the request is read, the connection closed without an answer); later
    requests get a 2xx at once. Every request is logged with its outcome."""

    def __init__(self, behaviors: dict[str, dict[str, Any]] | None = None, record: Path | None = None) -> None:
        self.behaviors = behaviors or {}
        self.record = open(record, "a") if record else None  # every request, as JSON lines
        self.lock = threading.Lock()
        self.log: list[dict[str, Any]] = []
        self.count: collections.Counter[str] = collections.Counter()
        rx = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                rx.handle(self, body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def handle(self, h: http.server.BaseHTTPRequestHandler, body: bytes) -> None:
        path = h.path
        with self.lock:
            n = self.count[path]
            self.count[path] += 1
        b = self.behaviors.get(path)
        kind = b["kind"] if b and n < b["count"] else "ok"
        entry = {"path": path, "t": time.monotonic(), "key": _notification_key(path, body), "behavior": kind}
        if kind == "drop":
            entry["outcome"] = "dropped"
            h.close_connection = True
        elif kind == "429":
            entry["outcome"] = 429
            self._answer(h, 429, b"rate limited", {"Retry-After": str(b["retry_after"])})
        elif kind == "5xx":
            code = (500, 502, 503)[n % 3]
            entry["outcome"] = code
            self._answer(h, code, b"upstream unavailable")
        else:
            if kind == "slow":
                time.sleep(b["delay"])
            entry["outcome"] = 202 if path == "/pd" else 200
            try:
                self._answer(h, entry["outcome"], b'{"status": "success"}' if path == "/pd" else b"ok")
            except OSError:  # the client gave up waiting: accepted here all the same
                entry["client_gone"] = True
        with self.lock:
            self.log.append(entry)
            if self.record is not None:
                self.record.write(json.dumps({**entry, "body": body.decode(errors="replace")[:4000]}) + "\n")
                self.record.flush()

    @staticmethod
    def _answer(h: http.server.BaseHTTPRequestHandler, code: int, body: bytes,
                headers: dict[str, str] | None = None) -> None:
        h.send_response(code)
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)
        h.wfile.flush()

    def accepted(self) -> collections.Counter:
        """Requests accepted (2xx decided), per ``(channel, incident, wire action)``."""
        with self.lock:
            return collections.Counter(e["key"][:3] for e in self.log
                                       if e["key"] and e["outcome"] in (200, 202))

    def retry_after_ignored(self) -> list[str]:
        """Requests that came sooner after a 429 than its ``Retry-After`` said (same path)."""
        out = []
        with self.lock:
            log = sorted(self.log, key=lambda e: e["t"])
        for i, e in enumerate(log):
            if e["outcome"] != 429:
                continue
            wait = self.behaviors[e["path"]]["retry_after"]
            # a request sent while the 429 was on its way back is not one that ignored it
            nxt = next((x for x in log[i + 1:] if x["path"] == e["path"] and x["t"] - e["t"] > 0.25), None)
            if nxt is not None and nxt["t"] - e["t"] < wait - 0.05:
                out.append(f"{e['path']}: next request {nxt['t'] - e['t']:.2f} s after a 429 with Retry-After {wait}")
        return out

    def requests(self) -> int:
        with self.lock:
            return len(self.log)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        if self.record is not None:
            self.record.close()


def alerts_toml(path: Path, rx: Receiver) -> None:
    path.write_text(f"""
[alerts]
retry_initial = 0.2
retry_max = 2.0

[alerts.channels.oncall]
type = "slack"
url = "{rx.url('/slack')}"

[alerts.channels.pager]
type = "pagerduty"
routing_key = "{ROUTING_KEY}"
url = "{rx.url('/pd')}"

[alerts.channels.hook]
type = "webhook"
url = "{rx.url('/hook')}"
""")


# --------------------------------------------------------------------------------------------
# Full disks


class SmallDisk:
    """A directory that can be filled to ENOSPC: a tmpfs of ``size`` mounted on it (root),
    else a plain directory whose writers get a lowered ``RLIMIT_FSIZE`` (EFBIG) while "full"."""

    #: False: never mount, always simulate (``--simulate-full-disk``)
    use_mount = True

    def __init__(self, where: Path, size: str = "48m") -> None:
        self.dir = where
        where.mkdir(parents=True, exist_ok=True)
        self.mounted = False
        self.filler = where / ".filler"
        self.full = False
        self.limited: list[int] = []
        if os.geteuid() == 0 and self.use_mount:
            res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                                 capture_output=True, text=True)
            self.mounted = res.returncode == 0
        self.how = "tmpfs" if self.mounted else "rlimit"

    def fill(self, pids: list[int]) -> None:
        """Make writes fail: fill the tmpfs, or lower the file size limit of ``pids``."""
        self.full = True
        if self.mounted:
            fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                for chunk in (1 << 20, 1 << 12, 1):
                    block = b"\0" * chunk
                    while True:
                        try:
                            os.write(fd, block)
                        except OSError as e:
                            if e.errno != errno.ENOSPC:
                                raise
                            break
            finally:
                os.close(fd)
            return
        for pid in pids:
            self.limit(pid)

    def limit(self, pid: int) -> None:
        """Simulated full disk for one process (no root): its files cannot grow."""
        size = max((p.stat().st_size for p in self.dir.iterdir() if p.is_file()), default=0)
        try:
            resource.prlimit(pid, resource.RLIMIT_FSIZE, (size, resource.RLIM_INFINITY))
            self.limited.append(pid)
        except (OSError, ValueError):
            pass

    def free(self) -> None:
        self.full = False
        if self.mounted:
            try:
                self.filler.unlink()
            except FileNotFoundError:
                pass
            return
        for pid in self.limited:
            try:
                resource.prlimit(pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
            except (OSError, ValueError):
                pass
        self.limited.clear()

    def close(self) -> None:
        self.free()
        if self.mounted:
            subprocess.run(["umount", str(self.dir)], capture_output=True)
            self.mounted = False


# --------------------------------------------------------------------------------------------
# The broker


class Broker:
    """``scripts/kafka-local`` in ``state`` (restartable), or an external ``bootstrap``."""

    def __init__(self, state: Path | None = None, bootstrap: str | None = None) -> None:
        self.state = state
        self.local = kafka_local() if state else None
        self.bootstrap = bootstrap or self.local.start(state, None, 180.0)
        self.restarts = 0

    @property
    def restartable(self) -> bool:
        return self.local is not None

    def restart(self, down: float) -> None:
        assert self.local is not None and self.state is not None
        self.local.stop(self.state, 30.0)
        time.sleep(down)
        self.local.start(self.state, None, 180.0)
        self.restarts += 1

    def stop(self) -> None:
        if self.local is not None and self.state is not None:
            self.local.stop(self.state, 30.0)


# --------------------------------------------------------------------------------------------
# Processes


class Role:
    """One ``ckptwatch`` service kept running: started again when it dies (as a supervisor
    would). ``failpoint``: armed in every incarnation until one dies by it."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], rundir: Path, notes: list[str]) -> None:
        self.name, self.args, self.env, self.rundir, self.notes = name, args, env, rundir, notes
        self.proc: subprocess.Popen | None = None
        self.failpoint: str | None = None
        self.fired = 0
        self.killed_by_us = False
        self.kills = 0
        self.crashes = 0
        self.starts = 0
        self.next_start = 0.0
        self.started = 0.0
        self.metrics_port = 0
        self.log: Any = lambda msg: None  # the run's timeline

    def start(self) -> None:
        env = dict(self.env)
        if self.failpoint:
            env["CKPTWATCH_FAILPOINTS"] = self.failpoint
        self.starts += 1
        out = open(self.rundir / f"{self.name}.out", "a")
        err = open(self.rundir / f"{self.name}.err", "a")
        err.write(f"--- start {self.starts} (failpoint {self.failpoint}) ---\n")
        err.flush()
        self.proc = subprocess.Popen([PY, "-m", "ckptwatch", *self.args], env=env, stdout=out, stderr=err,
                                     stdin=subprocess.DEVNULL, cwd=self.rundir)
        self.log(f"{self.name}: start {self.starts} (pid {self.proc.pid}, failpoint {self.failpoint})")
        out.close()
        err.close()
        self.killed_by_us = False
        self.started = time.monotonic()

    def kill9(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.killed_by_us = True
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
            self.kills += 1
            self.log(f"{self.name}: SIGKILL")

    def supervise(self, now: float, excuse: str = "") -> None:
        """Restart the process if it died; note why it died. ``excuse``: a fault that may
        make a process exit (a full disk): such an exit is expected, not a crash."""
        if self.proc is None:
            return
        rc = self.proc.poll()
        if rc is None:
            return
        if self.next_start == 0.0:
            self.log(f"{self.name}: exited {rc}")
            if rc == -signal.SIGKILL and not self.killed_by_us and self.failpoint:
                self.fired += 1
                self.notes.append(f"{self.name}: died at failpoint {self.failpoint}")
                self.failpoint = None
            elif not self.killed_by_us:
                if excuse:
                    self.notes.append(f"{self.name}: exited {rc} ({excuse}): {self.stderr_tail()}")
                else:
                    self.crashes += 1
                    self.notes.append(f"CRASH {self.name}: exited {rc}: {self.stderr_tail()}")
            self.next_start = now + (1.0 if excuse or not self.killed_by_us else 0.2)
        if now >= self.next_start:
            self.next_start = 0.0
            self.start()

    def stderr_tail(self) -> str:
        try:
            lines = [ln for ln in (self.rundir / f"{self.name}.err").read_text().splitlines() if ln.strip()]
        except OSError:
            return ""
        return " | ".join(lines[-2:])[-300:]

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM (a clean stop); SIGKILL after ``timeout`` s (noted: a stop must not hang)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        self.log(f"{self.name}: SIGTERM")
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.notes.append(f"CRASH {self.name}: did not stop within {timeout:.0f} s of SIGTERM; killed")
            self.killed_by_us = True
            self.proc.kill()
            self.proc.wait()
            return
        if rc != 0:
            self.notes.append(f"CRASH {self.name}: exited {rc} when stopped (SIGTERM): {self.stderr_tail()}")


def run_once(name: str, args: list[str], env: dict[str, str], rundir: Path, notes: list[str],
             timeout: float = 240.0, ok: tuple[int, ...] = (0,)) -> int:
    """Run a ``ckptwatch`` command to its end; a non-``ok`` exit is noted."""
    with open(rundir / f"{name}.out", "a") as out, open(rundir / f"{name}.err", "a") as err:
        p = subprocess.Popen([PY, "-m", "ckptwatch", *args], env=env, stdout=out, stderr=err,
                             stdin=subprocess.DEVNULL, cwd=rundir)
        try:
            rc = p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            rc = -999
    if rc not in ok:
        lines = [ln for ln in (rundir / f"{name}.err").read_text().splitlines() if ln.strip()]
        notes.append(f"CRASH {name}: exit {rc}: {' | '.join(lines[-2:])[-300:]}")
    return rc


# --------------------------------------------------------------------------------------------
# Plans


@dataclasses.dataclass
class Fault:
    kind: str
    at: float = 0.0  # seconds into the live phase
    params: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __str__(self) -> str:
        p = ",".join(f"{k}={v}" for k, v in self.params.items())
        when = f"@{self.at:.1f}s" if self.kind.startswith(("kill_", "disk_full", "broker_")) else ""
        return f"{self.kind}{when}" + (f"({p})" if p else "")


def make_plan(mode: str, rng: random.Random, workload: Workload, duration: float,
              broker_restartable: bool, only: frozenset[str] = frozenset()) -> list[Fault]:
    """Faults for one round: one or two process kills, then two to four more of any type
    (``only``: of these types only)."""
    catalog = [f for f in (EMBEDDED_FAULTS if mode == "embedded" else FLEET_FAULTS)
               if (broker_restartable or f != "broker_restart") and (not only or f in only)]
    kills = [f for f in catalog if f.startswith(("kill_", "failpoint_"))]
    kinds = [rng.choice(kills) for _ in range(rng.randint(1, 2))] if kills else []
    if len(kinds) == 2 and kinds[0] == kinds[1] and kinds[0].startswith("failpoint_"):
        kinds.pop()  # a failpoint kills once
    rest = [f for f in catalog if f not in kinds]
    kinds += rng.sample(rest, min(len(rest), rng.randint(2, 4)))
    plan = []
    used_paths: set[str] = set()
    for kind in kinds:
        at = round(rng.uniform(0.3, duration + 1.0), 1)
        params: dict[str, Any] = {}
        if kind.startswith("rotate_"):
            sizes = collections.Counter(f for f, _ in workload.order)
            f = rng.choice([f for f in workload.files if sizes[f] >= 20])  # not job c's one line
            n = len(workload.order)
            params = {"file": f, "at_lines": sorted(rng.sample(range(n // 10, n - n // 10), rng.randint(2, 3)))}
            at = 0.0
        elif kind.startswith("disk_full"):
            params = {"hold": round(rng.uniform(1.0, 3.0), 1)}
        elif kind == "broker_restart":
            params = {"down": round(rng.uniform(0.5, 3.0), 1)}
        elif kind.startswith("rx_"):
            free = [c for c in CHANNEL_PATHS if c not in used_paths] or list(CHANNEL_PATHS)
            ch = rng.choice(free)
            used_paths.add(ch)
            params = {"channel": ch, "count": rng.randint(1, 3)}
            if kind == "rx_slow":
                params["delay"] = round(rng.uniform(0.5, 3.0), 1)
            if kind == "rx_429":
                params["retry_after"] = rng.randint(1, 2)
            at = 0.0
        elif kind.startswith("failpoint_"):
            at = 0.0
        plan.append(Fault(kind, at, params))
    return plan


# --------------------------------------------------------------------------------------------
# A run: the live phase with its faults, the final pass, what is in DuckDB


@dataclasses.dataclass
class Outcome:
    lines: collections.Counter
    labels: list[tuple[str, str, int]]  # (line, job, rank) of every stored event
    incidents: set[tuple]
    alert_rows: list[tuple]  # (channel, incident, action, status)
    accepted: collections.Counter
    requests: int
    retry_after_ignored: list[str]
    notes: list[str]
    rotated: list[str]
    seconds: float

    @property
    def crashes(self) -> int:
        """Processes that exited on their own, not by a fault's design (see the notes)."""
        return sum(n.startswith("CRASH") for n in self.notes)


def read_db(db: Path) -> tuple[list[tuple[str, str, int]], set[tuple], list[tuple]]:
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        events = con.execute("SELECT line, job, rank FROM events").fetchall()
        incidents = set(con.execute(f"SELECT {INCIDENT_COLS} FROM incidents WHERE status <> 'superseded'").fetchall())
        have = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        rows = con.execute("SELECT channel, incident_id, action, status FROM alerts ORDER BY id").fetchall() \
            if "alerts" in have else []
    finally:
        con.close()
    return events, incidents, rows


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _consumer_lag(port: int) -> int | None:
    """``ckptwatch_kafka_consumer_lag_records`` summed, from a service's ``/metrics`` (None:
    not known yet)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
            text = resp.read().decode()
    except (OSError, ValueError):
        return None
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith("ckptwatch_kafka_consumer_lag_records{")]
    return int(sum(values)) if values else None


class Run:
    """One execution of a workload in one mode under a plan (empty plan: the reference)."""

    def __init__(self, mode: str, workload: Workload, plan: list[Fault], rundir: Path, *, duration: float,
                 broker: Broker | None, partitions: int = 2) -> None:
        self.mode, self.workload, self.plan, self.dir = mode, workload, plan, rundir
        self.duration, self.broker, self.partitions = duration, broker, partitions
        self.notes: list[str] = []
        self._lag_checked = 0.0
        self._t_start = time.monotonic()
        self._group_readers: dict[str, Any] = {}
        self.caught_up = True  # fleet: the live services did all the work (no final pass needed)
        self.phases = (0.0, 0.0, 0.0)  # seconds: start-up, live (writes, faults, catching up), stop + final pass

    def log(self, msg: str) -> None:
        """A line of the run's ``timeline.log`` (seconds since the run started)."""
        with open(self.dir / "timeline.log", "a") as f:
            f.write(f"{time.monotonic() - self._t_start:+8.2f}  {msg}\n")

    def behaviors(self) -> dict[str, dict[str, Any]]:
        out = {}
        for f in self.plan:
            if f.kind.startswith("rx_"):
                out[CHANNEL_PATHS[f.params["channel"]]] = {"kind": f.kind[3:], **f.params}
        return out

    def execute(self) -> Outcome:
        t_start = self._t_start = time.monotonic()
        self.dir.mkdir(parents=True)
        self.log("plan: " + "; ".join(map(str, self.plan)))
        logs = self.dir / "logs"
        logs.mkdir()
        rx = Receiver(self.behaviors(), record=self.dir / "receiver.jsonl")
        cfg_file = self.dir / "ckptwatch.toml"
        alerts_toml(cfg_file, rx)
        disks: dict[str, SmallDisk] = {}
        roles: dict[str, Role] = {}
        threads: list[threading.Thread] = []
        try:
            for f in self.plan:
                if f.kind == "disk_full_db":
                    disks["db"] = SmallDisk(self.dir / "dbdisk")
                elif f.kind == "disk_full_checkpoint":
                    disks["checkpoint"] = SmallDisk(self.dir / "ckptdisk")
            db_dir = disks["db"].dir if "db" in disks else self.dir
            db = db_dir / "soak.duckdb"
            if self.mode == "embedded":
                env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTWATCH_")}
                live = ["run", "--logs", str(logs), "--db", str(db), "--interval", "0.2", "--path-template", TEMPLATE,
                        "--config", str(cfg_file)]
                roles["run"] = Role("run", live, env, self.dir, self.notes)
                final_steps = [("run-final", ["run", "--logs", str(logs), "--db", str(db), "--once", "--path-template",
                                              TEMPLATE, "--config", str(cfg_file)], (0, 3))]
            else:
                assert self.broker is not None
                cfg = fresh_config(self.broker.bootstrap, self.dir, partitions=self.partitions)
                ckpt_dir = disks["checkpoint"].dir if "checkpoint" in disks else self.dir
                cfg = dataclasses.replace(cfg, collect=dataclasses.replace(cfg.collect, checkpoint=str(ckpt_dir / "collect.json")),
                                          sink=dataclasses.replace(cfg.sink, db=str(db)))
                env = cli_env(cfg, CKPTWATCH_CONFIG=str(cfg_file), CKPTWATCH_COLLECT_PATH_TEMPLATE=TEMPLATE)
                roles["collect"] = Role("collect", ["collect", str(logs)], env, self.dir, self.notes)
                ports = {r: free_port() for r in ("detect", "sink")}
                roles["detect"] = Role("detect", ["detect", "--metrics-port", str(ports["detect"])], env, self.dir,
                                       self.notes)
                roles["sink"] = Role("sink", ["sink", "--metrics-port", str(ports["sink"])], env, self.dir, self.notes)
                for r in ("detect", "sink"):
                    roles[r].metrics_port = ports[r]
                final_steps = [("collect-final", ["collect", str(logs), "--once"], (0,)),
                               ("detect-final", ["detect", "--until-idle", "3"], (0,)),
                               ("sink-final", ["sink", "--until-idle", "3"], (0,))]
            for f in self.plan:
                if f.kind in FAILPOINTS:
                    role, point = FAILPOINTS[f.kind]
                    roles[role].failpoint = point
            for r in roles.values():
                r.log = self.log
                r.start()
            ready = [db] if self.mode == "embedded" else [db, Path(env["CKPTWATCH_COLLECT_CHECKPOINT"])]
            deadline = time.monotonic() + 180
            while not all(p.exists() for p in ready):  # every service is up (its state file exists)
                if time.monotonic() > deadline:
                    raise RuntimeError(f"services did not start: {[r.stderr_tail() for r in roles.values()]}")
                for r in roles.values():
                    r.supervise(time.monotonic())
                time.sleep(0.1)
            rotations = [(i, f.params["file"], f.kind.split("_", 1)[1]) for f in self.plan
                         if f.kind.startswith("rotate_") for i in f.params["at_lines"]]
            writer = Writer(logs, self.workload, self.duration, rotations)
            t0 = time.monotonic()
            writer.start()
            self.log("writer: start")
            timed = sorted((f for f in self.plan if f.kind.startswith(("kill_", "disk_full", "broker_restart"))),
                           key=lambda f: f.at)
            busy: list[threading.Thread] = []
            excuse_until: dict[str, float] = {}  # role -> until when an exit is blamed on its full disk
            settled: float | None = None
            while True:
                now = time.monotonic()
                while timed and now - t0 >= timed[0].at:
                    f = timed.pop(0)
                    self.log(f"fault: {f}")
                    if f.kind.startswith("kill_"):
                        roles[f.kind[5:]].kill9()
                    elif f.kind.startswith("disk_full"):
                        which = "db" if f.kind == "disk_full_db" else "checkpoint"
                        t = threading.Thread(target=self._disk_full, args=(disks[which], f.params["hold"], roles, which),
                                             daemon=True)
                        t.start()
                        busy.append(t)
                    elif f.kind == "broker_restart":
                        assert self.broker is not None
                        t = threading.Thread(target=self._broker_restart, args=(f.params["down"],), daemon=True)
                        t.start()
                        busy.append(t)
                for which, d in disks.items():
                    if not d.full:
                        continue
                    for name in DISK_USERS[which]:
                        excuse_until[name] = now + 3.0  # and a little after: the exit may come late
                        r = roles.get(name)
                        if not d.mounted and r and r.proc and r.proc.poll() is None and r.proc.pid not in d.limited:
                            d.limit(r.proc.pid)  # simulated: a restarted process is limited too
                for name, r in roles.items():
                    r.supervise(now, "disk full" if now < excuse_until.get(name, 0.0) else "")
                if writer.done.is_set() and not timed and not any(t.is_alive() for t in busy):
                    settled = settled or now
                    if self._caught_up(now - settled, roles, env):
                        break
                time.sleep(0.05)
            threads = busy
            t_live = time.monotonic()
            self.log(f"writer done ({len(writer.rotated)} rotations); live phase over, caught up: {self.caught_up}")
            if self.mode == "fleet":
                # stopped upstream first; the sink takes what the detector published last
                roles["collect"].stop()
                roles["detect"].stop()
                self.caught_up = self.caught_up and self._sink_drained(roles["sink"])
            for r in roles.values():
                r.stop()
            if writer.error:
                self.notes.append(f"writer: {writer.error!r}")
            live_incidents: set[tuple] | None = None
            if self.mode == "fleet":
                if self.caught_up:  # the live services did all the work: what they left is what is checked
                    final_steps = []
                else:
                    try:
                        live_incidents = read_db(db)[1]
                    except Exception:  # noqa: BLE001  (no database yet)
                        live_incidents = set()
            for name, args, ok in final_steps:
                self.log(f"final: {name}")
                run_once(name, args, env, self.dir, self.notes, ok=ok)
            self.log("final pass done")
            if self.mode == "fleet":  # alerts still queued (a receiver's Retry-After): the sink again
                for _ in range(3):
                    _, _, rows = read_db(db)
                    if not any(s == "pending" for c, _, _, s in rows if c != "console"):
                        break
                    run_once("sink-final", ["sink", "--until-idle", "4"], env, self.dir, self.notes)
            events, incidents, rows = read_db(db)
            if live_incidents is not None and live_incidents != incidents:
                self.notes.append(f"the live services, not caught up, had stored {len(live_incidents)} of the "
                                  f"{len(incidents)} incidents the final pass left: missing "
                                  f"{sorted(i[1] + '/' + i[3] for i in incidents - live_incidents)}")
            self.phases = (t0 - t_start, t_live - t0, time.monotonic() - t_live)
            accepted, requests, ignored = rx.accepted(), rx.requests(), rx.retry_after_ignored()
            for r in roles.values():
                if r.failpoint:
                    self.notes.append(f"{r.name}: failpoint {r.failpoint} never hit")
            return Outcome(lines=collections.Counter(line for line, _, _ in events), labels=events, incidents=incidents,
                           alert_rows=rows, accepted=accepted, requests=requests,
                           retry_after_ignored=ignored, notes=self.notes,
                           rotated=writer.rotated, seconds=time.monotonic() - t_start)
        finally:
            for r in roles.values():
                if r.proc and r.proc.poll() is None:
                    r.proc.kill()
                    r.proc.wait()
            for t in threads:
                t.join(timeout=240)
            self._close_group_reader()
            rx.stop()
            if "db" in disks:  # kept for a post-mortem: the tmpfs goes with the round
                for f in disks["db"].dir.glob("soak.duckdb*"):
                    shutil.copyfile(f, self.dir / f.name)
            for d in disks.values():
                d.close()

    def _caught_up(self, waited: float, roles: dict[str, Role], env: dict[str, str]) -> bool:
        """Whether the live processes have done their work, so that they are stopped with
        nothing left for them: every process up for a few seconds; fleet: the collector's
        offsets at the end of every file, the detector group's committed offsets at the end of
        the events topic, the sink group's at the end of both topics (or, for a sink up for 25 s,
        its lag gauge at 0). Gives up (noted) after
        90 s. (The workload's jobs never depend on wall time passing: each failure is
        followed, in event time, by a line past the detector's settle time.)"""
        if waited > 90.0:
            self.notes.append("the live pipeline did not catch up within 90 s; stopped anyway (then a final pass)")
            self.caught_up = False
            return True
        if waited < 1.0 or not all(r.proc and r.proc.poll() is None and time.monotonic() - r.started > 6.0
                                   for r in roles.values()):
            return False
        if self.mode == "embedded":
            return waited >= 2.0
        if waited < 3.0 or time.monotonic() - self._lag_checked < 1.0:
            return False
        self._lag_checked = time.monotonic()
        events, incidents = env["CKPTWATCH_KAFKA_EVENTS_TOPIC"], env["CKPTWATCH_KAFKA_INCIDENTS_TOPIC"]
        # committed offsets, not the services' lag gauges: a member reports lag 0 until it
        # is assigned partitions, which can take the session timeout (10 s) after a SIGKILL.
        # A sink killed between its DuckDB commit and its group commit resumes from the
        # database and commits nothing until new records come: then its gauge, once it has
        # been up well past the session timeout, is believed instead.
        sink = roles["sink"]
        return (self._collected(env) and self._committed_to_end(env, env["CKPTWATCH_DETECT_GROUP"], [events])
                and (self._committed_to_end(env, env["CKPTWATCH_SINK_GROUP"], [events, incidents])
                     or (time.monotonic() - sink.started > 25.0 and _consumer_lag(sink.metrics_port) == 0)))

    def _committed_to_end(self, env: dict[str, str], group: str, topics: list[str]) -> bool:
        """``group`` committed the end of every partition of ``topics`` (the detector commits
        once the incidents of what it read are acknowledged, the sink once they are in DuckDB)."""
        from kafka import KafkaConsumer, TopicPartition

        try:
            if group not in self._group_readers:  # never joins the group: reads its committed offsets only
                self._group_readers[group] = KafkaConsumer(
                    bootstrap_servers=env["CKPTWATCH_KAFKA_BOOTSTRAP_SERVERS"], group_id=group,
                    client_id="soak-check", enable_auto_commit=False)
            c = self._group_readers[group]
            tps = [TopicPartition(t, p) for t in topics for p in (c.partitions_for_topic(t) or ())]
            end = c.end_offsets(tps)
            return bool(tps) and all((c.committed(tp) or 0) >= end[tp] for tp in tps)
        except Exception:  # noqa: BLE001  (the broker restarting: ask again later)
            self._close_group_reader()
            return False

    def _close_group_reader(self) -> None:
        for c in self._group_readers.values():
            try:
                c.close()
            except Exception:  # noqa: BLE001
                pass
        self._group_readers = {}

    def _sink_drained(self, sink: Role) -> bool:
        """The sink's consumer lag read 0 twice, a second apart, within 15 s."""
        deadline, zeros = time.monotonic() + 15.0, 0
        while time.monotonic() < deadline and zeros < 2:
            time.sleep(1.0)
            zeros = zeros + 1 if _consumer_lag(sink.metrics_port) == 0 else 0
        return zeros >= 2

    def _collected(self, env: dict[str, str]) -> bool:
        """Every file under the log dir is in the collector's offsets file, read to its end."""
        try:
            doc = json.loads(Path(env["CKPTWATCH_COLLECT_CHECKPOINT"]).read_text())
            have = {src["path"]: src["offset"] for src in doc["sources"]}
        except (OSError, ValueError, KeyError, TypeError):
            return False
        return all(have.get(str(p)) == p.stat().st_size for p in (self.dir / "logs").rglob("*") if p.is_file())

    def _disk_full(self, disk: SmallDisk, hold: float, roles: dict[str, Role], which: str) -> None:
        pids = [r.proc.pid for name, r in roles.items() if name in DISK_USERS[which] and r.proc and r.proc.poll() is None]
        try:
            disk.fill(pids)
            self.log(f"disk {disk.dir.name}: full ({disk.how})")
            time.sleep(hold)
        except OSError as e:
            self.notes.append(f"disk full: could not fill {disk.dir}: {e}")
        finally:
            disk.free()
            self.log(f"disk {disk.dir.name}: freed")

    def _broker_restart(self, down: float) -> None:
        assert self.broker is not None
        try:
            self.log("broker: stopping")
            self.broker.restart(down)
            self.log("broker: started again")
        except (SystemExit, Exception) as e:  # noqa: BLE001
            self.notes.append(f"broker restart failed: {e}")


# --------------------------------------------------------------------------------------------
# A round and its checks


@dataclasses.dataclass
class RoundResult:
    index: int
    mode: str
    plan: list[Fault]
    written: int
    stored: int
    lost: int
    duplicated: int
    mislabeled: int
    incidents_equal: bool
    incidents: int
    paged: int  # incidents with at least one PagerDuty trigger accepted
    unpaged: int  # incidents the reference paged and this run did not
    pages: int
    duplicate_pages: int
    duplicate_alerts: int
    undelivered: int
    transient: int  # incidents alerted that are not among the final ones (withdrawn, superseded)
    crashes: int
    notes: list[str]
    seconds: float

    @property
    def ok(self) -> bool:
        """No event lost or stored twice, the reference's incidents, every alert delivered.
        (Crashes are reported, not failed: a supervisor restarts the process, as here.)"""
        return not (self.lost or self.duplicated or not self.incidents_equal or self.undelivered)


def _wire(channel: str, action: str) -> str:
    return ("resolve" if action == "resolve" else "trigger") if channel == "pager" else action


def check(index: int, mode: str, plan: list[Fault], workload: Workload, ref: Outcome, got: Outcome) -> RoundResult:
    expected = collections.Counter(line for _, line in workload.order)
    lost = sum((expected - got.lines).values())
    duplicated = sum((got.lines - expected).values())
    mislabeled = sum(1 for line, job, rank in got.labels if line in workload.labels and workload.labels[line] != (job, rank))
    notes = list(got.notes)
    notes += [f"Retry-After not obeyed (a restart in between may explain it): {x}" for x in got.retry_after_ignored]
    if ref.crashes:
        notes.append(f"the reference run had {ref.crashes} crash(es): its incident set is not to be trusted")
    if ref.incidents != got.incidents:
        for inc in sorted(ref.incidents - got.incidents, key=str):
            notes.append(f"incident of the reference missing: {inc}")
        for inc in sorted(got.incidents - ref.incidents, key=str):
            notes.append(f"incident not in the reference: {inc}")
    for what, n in (("lost", lost), ("duplicated", duplicated)):
        if n:
            diff = (expected - got.lines) if what == "lost" else (got.lines - expected)
            notes.append(f"{what}: e.g. {sorted(diff)[:3]}")
    rows = collections.Counter((c, i, _wire(c, a)) for c, i, a, s in got.alert_rows if c != "console")
    undelivered = sum(1 for c, i, a, s in got.alert_rows if c != "console" and s != "sent")
    undelivered += sum(max(0, n - got.accepted.get(k, 0)) for k, n in rows.items()
                       if all(s == "sent" for c, i, a, s in got.alert_rows if (c, i, _wire(c, a)) == k))
    if undelivered:
        notes.append("undelivered: " + ", ".join(f"{c}/{i}/{a}:{s}" for c, i, a, s in got.alert_rows
                                                    if c != "console" and (s != "sent" or not got.accepted.get((c, i, _wire(c, a))))))
    dup_alerts = sum(max(0, n - rows.get(k, 0)) for k, n in got.accepted.items())
    dups = [f"{c}/{i}/{a} x{n}" for (c, i, a), n in sorted(got.accepted.items()) if n > rows.get((c, i, a), 0)]
    if dups:
        notes.append("accepted more than once (at least once delivery): " + ", ".join(dups))
    pages = sum(n for (c, _, a), n in got.accepted.items() if c == "pager" and a == "trigger")
    dup_pages = sum(max(0, n - rows.get(k, 0)) for k, n in got.accepted.items() if k[0] == "pager")
    final_ids = {inc[0] for inc in got.incidents}
    transient = sorted({i for (c, i, a) in got.accepted if a != "resolve"} - final_ids)
    if transient:
        notes.append(f"alerted, then withdrawn or superseded (not among the final incidents): {len(transient)} "
                     f"incident(s), e.g. {transient[:3]}")
    paged_ids = {i for (c, i, a) in got.accepted if c == "pager" and a == "trigger"}
    ref_paged = {i for (c, i, a) in ref.accepted if c == "pager" and a == "trigger"}
    if ref_paged - paged_ids:
        notes.append(f"not paged (the reference paged them): {sorted(ref_paged - paged_ids)}")
    return RoundResult(index, mode, plan, sum(expected.values()), sum(got.lines.values()), lost, duplicated, mislabeled,
                       ref.incidents == got.incidents, len(got.incidents), len(paged_ids), len(ref_paged - paged_ids), pages, dup_pages, dup_alerts,
                       undelivered, len(transient), got.crashes + ref.crashes, notes, got.seconds)


SHORT = {"kill_run": "k-run", "kill_collect": "k-col", "kill_detect": "k-det", "kill_sink": "k-snk",
         "failpoint_collect": "fp-col", "failpoint_detect": "fp-det", "failpoint_sink": "fp-snk",
         "broker_restart": "broker", "rotate_rename": "rot-mv", "rotate_copytruncate": "rot-ct",
         "disk_full_db": "full-db", "disk_full_checkpoint": "full-ckpt", "rx_slow": "rx-slow", "rx_429": "rx-429",
         "rx_5xx": "rx-5xx", "rx_drop": "rx-drop"}
HEADER = (f"{'round':>5} {'mode':8} {'faults':44} {'lines':>6} {'events':>6} {'lost':>4} {'dup':>4} {'inc=':>5} "
          f"{'pages':>5} {'dupPg':>5} {'dupAl':>5} {'undlv':>5} {'crash':>5} {'secs':>5}")


def row(r: RoundResult) -> str:
    faults = " ".join(SHORT[f.kind] for f in r.plan)
    return (f"{r.index:>5} {r.mode:8} {faults:44.44} {r.written:>6} {r.stored:>6} {r.lost:>4} {r.duplicated:>4} "
            f"{'yes' if r.incidents_equal else 'NO':>5} {r.pages:>5} {r.duplicate_pages:>5} {r.duplicate_alerts:>5} "
            f"{r.undelivered:>5} {r.crashes:>5} {r.seconds:>5.0f}")


class Soak:
    """Rounds over one work directory; references cached per (mode, scenario)."""

    def __init__(self, seed: int, lines: int, workdir: Path, *, broker: Broker | None, duration: float | None = None,
                 scenarios: int = 1, failure: str = "random", only: frozenset[str] = frozenset(),
                 reference_mode: str | None = None) -> None:
        self.only = only
        self.reference_mode = reference_mode  # None: each mode its own reference; "embedded": that one for both
        self.seed, self.lines, self.workdir, self.broker, self.failure = seed, lines, workdir, broker, failure
        self.duration = duration or max(3.0, lines / 250)
        self.scenarios = scenarios
        self.refs: dict[tuple[str, int], tuple[Workload, Outcome]] = {}
        self.differences: list[str] = []  # fault-free fleet vs embedded

    def reference(self, mode: str, scenario: int) -> tuple[Workload, Outcome]:
        key = (mode, scenario)
        if key not in self.refs:
            wl = make_workload(random.Random(f"{self.seed}/workload/{scenario}"), self.lines, f"s{self.seed}x{scenario}",
                               self.failure)
            say(f"reference: {mode}, scenario {scenario}: {len(wl.order)} lines, no fault")
            out = Run(mode, wl, [], self.workdir / f"ref-{mode}-{scenario}", duration=self.duration,
                      broker=self.broker).execute()
            for n in out.notes:
                say(f"  reference note: {n}")
            say(f"  reference: {sum(out.lines.values())} events, incidents: "
                + ", ".join(f"{i[1]}/{i[2]}" for i in sorted(out.incidents, key=str)) + f"; PagerDuty triggers {sum(n for (c, _, a), n in out.accepted.items() if c == 'pager' and a == 'trigger')}"
                + f" ({out.seconds:.0f} s)")
            self.refs[key] = (wl, out)
            emb, flt = self.refs.get(("embedded", scenario)), self.refs.get(("fleet", scenario))
            if emb and flt and emb[1].incidents != flt[1].incidents:
                only_e = sorted(emb[1].incidents - flt[1].incidents, key=str)
                only_f = sorted(flt[1].incidents - emb[1].incidents, key=str)
                self.differences.append(f"scenario {scenario}: the fault-free embedded and fleet runs differ: "
                                        f"only embedded {only_e}, only fleet {only_f}")
                say("  " + self.differences[-1])
        return self.refs[key]

    def round(self, index: int, mode: str) -> RoundResult:
        rng = random.Random(f"{self.seed}/round/{index}")
        scenario = rng.randrange(self.scenarios)
        wl, ref = self.reference(self.reference_mode or mode, scenario)
        plan = make_plan(mode, rng, wl, self.duration, bool(self.broker and self.broker.restartable), self.only)
        say(f"round {index} ({mode}, scenario {scenario}) plan: " + "; ".join(map(str, plan)))
        run = Run(mode, wl, plan, self.workdir / f"round-{index:03d}-{mode}", duration=self.duration,
                  broker=self.broker)
        got = run.execute()
        res = check(index, mode, plan, wl, ref, got)
        say("  phases: start-up {:.0f} s, live {:.0f} s, stop and final pass {:.0f} s".format(*run.phases))
        say(HEADER)
        say(row(res))
        for n in res.notes:
            say(f"      note: {n}")
        return res


def summary(results: list[RoundResult], differences: list[str] | None = None) -> str:
    faults = collections.Counter(f.kind for r in results for f in r.plan)
    crit = sum(r.paged for r in results)
    pages = sum(r.pages for r in results)
    lines = [
        "",
        HEADER,
        *(row(r) for r in results),
        "",
        f"rounds: {len(results)} ({sum(r.mode == 'embedded' for r in results)} embedded, "
        f"{sum(r.mode == 'fleet' for r in results)} fleet); failed: {sum(not r.ok for r in results)}",
        "faults injected: " + ", ".join(f"{k} {n}" for k, n in sorted(faults.items())),
        f"lines written: {sum(r.written for r in results)}; events stored: {sum(r.stored for r in results)}; "
        f"lost: {sum(r.lost for r in results)}; duplicated: {sum(r.duplicated for r in results)}; "
        f"mislabeled: {sum(r.mislabeled for r in results)}; crashes: {sum(r.crashes for r in results)}",
        f"incident sets equal to the reference: {sum(r.incidents_equal for r in results)}/{len(results)}",
        f"pages (PagerDuty triggers accepted): {pages} for {crit} incidents paged = "
        f"{pages / crit if crit else 0:.2f} per incident; duplicate pages {sum(r.duplicate_pages for r in results)}; "
        f"duplicate alerts (all channels) {sum(r.duplicate_alerts for r in results)}; "
        f"undelivered {sum(r.undelivered for r in results)}; "
        f"incidents the reference paged and a round did not {sum(r.unpaged for r in results)}; "
        f"incidents alerted and later withdrawn or superseded {sum(r.transient for r in results)}",
        *(differences or []),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--start", type=int, default=0, help="first round's number (to replay round N of a seed: "
                                                          "--start N --rounds 1)")
    ap.add_argument("--mode", choices=["embedded", "fleet", "both"], default="both")
    ap.add_argument("--lines", type=int, default=1200, help="lines written per round (every one an event)")
    ap.add_argument("--duration", type=float, default=None, help="seconds over which a round's lines are written "
                                                                  "(default: lines / 250, at least 3)")
    ap.add_argument("--scenarios", type=int, default=1, help="distinct workloads per mode (each gets a reference run)")
    ap.add_argument("--storage-failure", choices=["random", "middle", "last"], default="random",
                    help="where job a's ENOSPC save is: resolved by later saves (middle), open (last), either")
    ap.add_argument("--shared-reference", action="store_true",
                    help="fleet rounds compare with the embedded reference run (one fleet run less per scenario)")
    ap.add_argument("--simulate-full-disk", action="store_true",
                    help="a full disk by RLIMIT_FSIZE even as root (what runs without root)")
    ap.add_argument("--only", default="", help="comma-separated fault types to pick from (default: all)")
    ap.add_argument("--kafka", default=None, help="use this broker (HOST:PORT) instead of starting one "
                                                  "(no broker_restart faults then)")
    ap.add_argument("--workdir", default=None, help="keep every round's logs, databases and process output here")
    args = ap.parse_args(argv)
    SmallDisk.use_mount = not args.simulate_full_disk
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="ckptwatch-soak-")).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    say(f"soak: seed {args.seed}, {args.rounds} rounds, mode {args.mode}, {args.lines} lines per round; "
        f"work dir {workdir}")
    modes = ["embedded", "fleet"] if args.mode == "both" else [args.mode]
    broker = None
    soak: Soak | None = None
    results: list[RoundResult] = []
    try:
        if "fleet" in modes:
            broker = Broker(bootstrap=args.kafka) if args.kafka else Broker(state=workdir / "broker")
            say(f"broker: {broker.bootstrap}{' (restartable)' if broker.restartable else ''}")
        soak = Soak(args.seed, args.lines, workdir, broker=broker, duration=args.duration, scenarios=args.scenarios,
                    failure=args.storage_failure, only=frozenset(filter(None, args.only.split(","))),
                    reference_mode="embedded" if args.shared_reference else None)
        for i in range(args.start, args.start + args.rounds):
            results.append(soak.round(i, modes[i % len(modes)]))
    finally:
        if broker is not None:
            broker.stop()
        print(summary(results, soak.differences if soak else None), flush=True)
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
