"""A training fleet's logs, with the ground truth of the failures injected into them.

``ckptwatch simulate OUT`` writes what a fleet of Megatron-LM jobs launched by torchrun
leaves on disk, in the exact formats of the bundled real runs (``examples/corpus``):

* per node, ``<job>/<host>/console.log``: the torchrun agent's glog lines (launch
  configuration with the ``run_id``, the rendezvous result mapping local to global ranks,
  ``Sending process … closing signal SIGTERM``, ``failed (exitcode: …) local_rank: …``,
  the ``ChildFailedError`` report), and with ``layout="console"`` the workers' lines under
  torchrun ``--tee`` prefixes (``[default3]:``); with ``layout="rank-files"`` each rank's
  lines go to ``<job>/<host>/rank<global rank>.log`` instead (read with the path template
  :data:`RANK_FILES_TEMPLATE`);
* workers' lines (torch/distributed/run.py and Megatron's ``training.py``
  ``training_log`` / ``save_checkpoint`` wording): an iteration line with the loss every
  step, ``saving checkpoint at iteration N to … in torch_dist format`` and
  ``successfully saved checkpoint from iteration N …`` around each save, NCCL INFO chatter;
* per host, ``kernel/<host>.log``: syslog-style kernel lines (the OOM killer's).

Each host's clock is off by up to ``skew_ms`` either way (drawn per host: two hosts of a job
may be up to twice that apart); ``truth.json`` records each host's offset. A share ``failures`` of the jobs gets one
injected failure in a save (never the first, so a good checkpoint exists), of one of
:data:`FAILURES`; the other ranks of the victim's node are SIGTERMed by their agent, and the
other nodes' ranks hit the NCCL watchdog 10 minutes later (collateral). ``truth.json``
holds, per job, the incidents a correct diagnosis reports, in the ground-truth shape of
:mod:`ckptwatch.groundtruth` (``kind``, ``step``, ``root_cause_class``, ``root_rank``),
and what it must not report; :func:`score` compares a diagnosis with it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckptwatch.groundtruth import SAVE_KINDS, matches, unmatched

#: the injected failures: kind -> (incident kind, root-cause class) a diagnosis must give
FAILURES = {
    "sigkill": ("interrupted_save", "signal"),
    "oom": ("interrupted_save", "oom_kill"),
    "enospc": ("storage_failure_during_save", "storage_error"),
}
#: the largest clock skew a spec may ask for, in milliseconds (a day)
MAX_SKEW_MS = 86_400_000
#: the path template of ``layout="rank-files"``
RANK_FILES_TEMPLATE = "{job}/{host}/rank{rank}.log"
_ITER = ("[{ts}] [INFO] [rank{rank}]  iteration {step:8d}/{total:8d} | consumed samples: {samples:12d} | "
         "elapsed time per iteration (ms): {ms:.1f} | learning rate: 1.000000E-03 | global batch size:  1024 | "
         "lm loss: {loss:.6E} | loss scale: 1.0 | grad norm: {gn:.3f} | number of skipped iterations:   0 | "
         "number of nan iterations:   0 |")
_SAVE = "[{ts}] [INFO] [rank{rank}] saving checkpoint at iteration {step:8d} to {ckpt} in torch_dist format"
_SAVED = ("[{ts}] [INFO] [rank{rank}]   successfully saved checkpoint from iteration {step:8d} to {ckpt} "
          "[ t 1/1, p 1/1 ]")
_NCCL = "{host}:{pid}:{tid} [{local}] NCCL INFO Channel {ch:02d}/0 : {local} -> {peer} via P2P/IPC/read"
_WATCHDOG = ("[rank{rank}]:[E{md} {hms}.{us:06d}000 ProcessGroupNCCL.cpp:629] [Rank {rank}] Watchdog caught "
             "collective operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLGATHER, NumelIn=1, NumelOut={world}, "
             "Timeout(ms)=600000) ran for 600{ms:03d} milliseconds before timing out.")


@dataclass(frozen=True)
class FleetSpec:
    """What to simulate. ``jobs`` jobs of ``nodes_per_job`` nodes x ``ranks_per_node``
    ranks, ``steps`` iterations each (one a second) with a save every ``save_every``;
    ``failures``: the share of jobs (0..1) with an injected failure, drawn from ``kinds``
    (names of :data:`FAILURES`); ``layout``: ``console`` or ``rank-files``; ``start``: the
    first job's start (UTC); jobs start ``stagger_s`` seconds apart; ``skew_ms``: each
    host's clock is off by up to this many milliseconds either way (0 to a day)."""

    jobs: int = 8
    nodes_per_job: int = 2
    ranks_per_node: int = 8
    steps: int = 120
    save_every: int = 40
    failures: float = 0.5
    kinds: tuple[str, ...] = tuple(FAILURES)
    layout: str = "console"
    seed: int = 1
    skew_ms: int = 500
    stagger_s: float = 7.0
    start: dt.datetime = dt.datetime(2026, 11, 30, 8, 0, tzinfo=dt.timezone.utc)

    def check(self) -> None:
        """Raises ValueError naming the field that is out of range."""
        if min(self.jobs, self.nodes_per_job, self.ranks_per_node) < 1:
            raise ValueError("jobs, nodes per job and ranks per node must be at least 1")
        if self.save_every < 2:
            raise ValueError(f"save_every must be at least 2 iterations, not {self.save_every}")
        if self.steps < 3 * self.save_every:
            raise ValueError(f"steps ({self.steps}) must cover at least 3 saves of every {self.save_every} "
                             "iterations (the first save is never the failing one: a good checkpoint exists)")
        if self.seed < 0:
            raise ValueError(f"seed must be 0 or more, not {self.seed}")
        if not 0 <= self.skew_ms <= MAX_SKEW_MS:
            raise ValueError(f"skew_ms must be between 0 and {MAX_SKEW_MS} (a day), not {self.skew_ms}")
        if not 0.0 <= self.failures <= 1.0:
            raise ValueError(f"failures must be a share between 0 and 1, not {self.failures}")
        if unknown := [k for k in self.kinds if k not in FAILURES]:
            raise ValueError(f"unknown failure kind(s) {', '.join(unknown)}; known: {', '.join(FAILURES)}")
        if self.layout not in ("console", "rank-files"):
            raise ValueError(f"layout must be console or rank-files, not {self.layout!r}")


@dataclass
class _Failure:
    kind: str
    step: int
    rank: int
    #: event time (ISO 8601, UTC, as the victim's host clock writes it) of its first line
    at: str | None = None
    #: the victim's host (its clock's offset is the job's ``skew_ms[host]``)
    host: str | None = None


def check_out(out: Path) -> None:
    """Raises ValueError if ``out/logs`` already holds files (two fleets would mix)."""
    logs = out / "logs"
    if logs.is_dir() and any(logs.iterdir()):
        raise ValueError(f"{logs} already holds logs (another fleet?): simulate into a new or empty directory")


def generate(out: Path, spec: FleetSpec, *, collect: list[tuple[dt.datetime, Path, str]] | None = None
             ) -> dict[str, Any]:
    """Write the fleet's logs under ``out/logs`` and ``out/truth.json``; returns the truth
    (``{"spec", "template", "files", "lines", "jobs": {job: {"incidents", "must_not",
    "failure", "skew_ms"}}}``; a failure's ``at`` is the event time of its first line, as
    its host's clock writes it; ``skew_ms`` maps each host of the job to its clock's offset in
    ms). With ``collect``, the lines are appended to it as ``(true time, file, text)``
    instead of written, the true time being when the line was written (its event time less
    its host's offset: :mod:`ckptwatch.simulate_live` writes them in that order, at a rate). Raises ValueError for a
    bad spec (see :meth:`FleetSpec.check`) or an ``out`` whose ``logs/`` already holds files
    (two fleets would mix)."""
    spec.check()
    rnd = random.Random(spec.seed)
    logs = out / "logs"
    check_out(out)
    logs.mkdir(parents=True, exist_ok=True)
    failing = set(rnd.sample(range(spec.jobs), round(spec.jobs * spec.failures)))
    jobs: dict[str, Any] = {}
    files = lines = 0
    for j in range(spec.jobs):
        job = f"sim-{spec.seed}-{j:04d}"
        failure = None
        if j in failing:
            saves = list(range(spec.save_every, spec.steps - spec.save_every + 1, spec.save_every))[1:]
            failure = _Failure(rnd.choice(spec.kinds), rnd.choice(saves),
                               rnd.randrange(spec.nodes_per_job * spec.ranks_per_node))
        t0 = spec.start + dt.timedelta(seconds=j * spec.stagger_s)
        written = _write_job(logs, job, t0, spec, failure, rnd, collect)
        files += written[0]
        lines += written[1]
        skews = written[2]
        incidents = []
        if failure is not None:
            kind, cls = FAILURES[failure.kind]
            incidents.append({"kind": kind, "step": failure.step, "root_cause_class": cls,
                              "root_rank": failure.rank})
        jobs[job] = {"incidents": incidents, "must_not": sorted(SAVE_KINDS - {i["kind"] for i in incidents}),
                     "failure": dataclasses.asdict(failure) if failure else None,
                     "skew_ms": skews}
    truth = {"spec": {k: (v.isoformat() if isinstance(v, dt.datetime) else v)
                      for k, v in dataclasses.asdict(spec).items()},
             "template": RANK_FILES_TEMPLATE if spec.layout == "rank-files" else None,
             "files": files, "lines": lines, "jobs": jobs}
    (out / "truth.json").write_text(json.dumps(truth, indent=1) + "\n")
    return truth


def failure_written(job: dict[str, Any]) -> dt.datetime | None:
    """When the injected failure of ``job`` (a job of the truth :func:`generate` returns) had
    its first line written (UTC, true time: its ``at`` less its host's clock offset); None
    for a job without one."""
    failure = job.get("failure")
    if not failure or not failure.get("at"):
        return None
    offset = job.get("skew_ms", {}).get(failure.get("host"), 0)
    return dt.datetime.fromisoformat(failure["at"]) - dt.timedelta(milliseconds=offset)


Lines = list[tuple[dt.datetime, str]]


@dataclass
class _Job:
    """One simulated job while it is written: its hosts (one per node) with their clock skew,
    each rank's pid, and the lines so far, as (time, text) in write order: each node's agent's
    and kernel's, each rank's."""

    name: str
    hosts: list[str]
    skew: list[dt.timedelta]
    pids: list[int]
    world: int
    agent: list[Lines] = field(default_factory=list)
    worker: list[Lines] = field(default_factory=list)
    kernel: list[Lines] = field(default_factory=list)


def _write_job(logs: Path, job: str, t0: dt.datetime, spec: FleetSpec, failure: _Failure | None,
               rnd: random.Random, collect: list | None = None) -> tuple[int, int, dict[str, int]]:
    """One job's files; returns (files, lines) written and each host's clock offset (ms)."""
    rpn, nodes = spec.ranks_per_node, spec.nodes_per_job
    world = rpn * nodes
    ckpt = f"/lustre/ckpt/{job}"
    hosts = [f"{job}-n{n:02d}" for n in range(nodes)]
    skew = [dt.timedelta(milliseconds=rnd.randint(-spec.skew_ms, spec.skew_ms)) for _ in hosts]
    agent_pid = [rnd.randint(2000, 60000) for _ in hosts]
    pids = [agent_pid[r // rpn] + 7 + r % rpn for r in range(world)]
    it = _Job(job, hosts, skew, pids, world, agent=[[] for _ in hosts], worker=[[] for _ in range(world)],
              kernel=[[] for _ in hosts])
    agent, worker = it.agent, it.worker
    for n, host in enumerate(hosts):
        agent[n] += _agent_start(t0 + skew[n], job, host, n, nodes, rpn, agent_pid[n])
    end = spec.steps if failure is None else failure.step
    t = t0 + dt.timedelta(seconds=5)
    for step in range(1, end + 1):
        t += dt.timedelta(milliseconds=rnd.randint(950, 1050))
        for r in range(world):
            n = r // rpn
            w = t + skew[n] + dt.timedelta(milliseconds=rnd.randint(0, 40))
            worker[r].append((w, _ITER.format(ts=_ms(w), rank=r, step=step, total=spec.steps, samples=step * 1024,
                                              ms=rnd.uniform(950, 1050), loss=3.0 * 0.999 ** step + rnd.uniform(0, .01),
                                              gn=rnd.uniform(0.1, 0.3))))
            if rpn > 1 and rnd.random() < 0.05:
                worker[r].append((w, _NCCL.format(host=hosts[n], pid=pids[r], tid=pids[r] + 100, local=r % rpn,
                                                  ch=rnd.randrange(16), peer=(r + 1) % rpn)))
        if step % spec.save_every:
            continue
        t_save = t + dt.timedelta(milliseconds=60)  # after every rank's iteration line (up to +40 ms)
        for r in range(world):
            w = t_save + skew[r // rpn] + dt.timedelta(milliseconds=rnd.randint(0, 6))
            worker[r].append((w, _SAVE.format(ts=_ms(w), rank=r, step=step, ckpt=ckpt)))
        if failure is not None and step == failure.step:
            _inject(failure, t_save, it, spec, rnd)
            break
        t = t_save + dt.timedelta(seconds=rnd.uniform(2.0, 4.0))
        for r in range(world):
            w = t + skew[r // rpn] + dt.timedelta(milliseconds=rnd.randint(0, 6))
            worker[r].append((w, _SAVED.format(ts=_ms(w), rank=r, step=step, ckpt=ckpt)))
    if failure is None:
        for n in range(nodes):
            done = t + skew[n] + dt.timedelta(seconds=2)
            agent[n].append((done, _glog(done, agent_pid[n], "I", "torch/distributed/elastic/agent/server/api.py:879",
                                         "[default] worker group successfully finished. Waiting 300 seconds for "
                                         "other agents to finish.")))
    files, lines = _write_files(logs, job, hosts, spec, agent, worker, it.kernel, skew, collect)
    return files, lines, {host: round(off / dt.timedelta(milliseconds=1)) for host, off in zip(hosts, skew)}


def _inject(failure: _Failure, t_save: dt.datetime, it: _Job, spec: FleetSpec, rnd: random.Random) -> None:
    """The failure of ``failure.rank`` in the save begun at ``t_save``, and what follows it:
    its agent SIGTERMs the node's other ranks and reports, the other nodes' ranks time out
    in the save's collective 10 minutes later and their agents report exitcode -6."""
    job, hosts, skew, pids, world = it.name, it.hosts, it.skew, it.pids, it.world
    agent, worker, kernel = it.agent, it.worker, it.kernel
    rpn = spec.ranks_per_node
    victim, vn = failure.rank, failure.rank // rpn
    hit = t_save + dt.timedelta(seconds=rnd.uniform(1.0, 2.5))
    local = skew[vn]
    failure.at = (hit + local).isoformat()
    failure.host = hosts[vn]
    exitcode = 1 if failure.kind == "enospc" else -9
    if failure.kind == "enospc":
        w = hit + local
        for text in ("Traceback (most recent call last):",
                     '  File "/workspace/Megatron-LM/pretrain_gpt.py", line 248, in <module>',
                     "    pretrain(",
                     '  File "/workspace/Megatron-LM/megatron/training/training.py", line 1210, '
                     "in save_checkpoint_and_time",
                     "    save_checkpoint(iteration, model, optimizer, opt_param_scheduler,",
                     '  File "/usr/local/lib/python3.10/dist-packages/torch/serialization.py", line 850, in save',
                     "    _save(obj, opened_zipfile, pickle_module, pickle_protocol, _disable_byteorder_record)",
                     '  File "/usr/local/lib/python3.10/dist-packages/torch/serialization.py", line 1114, in _save',
                     "    zip_file.write_record(name, storage, num_bytes)",
                     "OSError: [Errno 28] No space left on device"):
            worker[victim].append((w, text))
    if failure.kind == "oom":
        w = hit + local
        up = 86000 + rnd.uniform(0, 9000)
        host = hosts[vn]
        pid = pids[victim]
        for dtm, text in (
                (0.000, "python3 invoked oom-killer: gfp_mask=0x140dca(GFP_HIGHUSER_MOVABLE|__GFP_COMP|__GFP_ZERO), "
                        "order=0, oom_score_adj=0"),
                (0.038, f"oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0-1,global_oom,"
                        f"task_memcg=/system.slice/docker-{job}.scope,task=python3,pid={pid},uid=1001"),
                (0.040, f"Out of memory: Killed process {pid} (python3) total-vm:1101928004kB, "
                        "anon-rss:1027331808kB, file-rss:1187436kB, shmem-rss:8192kB, UID:1001 pgtables:2054663kB "
                        "oom_score_adj:0")):
            at = w + dt.timedelta(seconds=dtm)
            kernel[vn].append((at, f"{at.isoformat(timespec='microseconds')} {host} kernel: "
                                   f"[{up + dtm:12.6f}] {text}"))
    apid = pids[vn * rpn] - 7
    t_agent = hit + local + dt.timedelta(milliseconds=rnd.randint(150, 400))
    others = [r for r in range(vn * rpn, (vn + 1) * rpn) if r != victim]
    for r in others:
        agent[vn].append((t_agent, _glog(t_agent, apid, "W", "torch/distributed/elastic/multiprocessing/api.py:1028",
                                         f"Sending process {pids[r]} closing signal SIGTERM")))
    t_fail = t_agent + dt.timedelta(milliseconds=200)
    agent[vn].append((t_fail, _glog(t_fail, apid, "E", "torch/distributed/elastic/multiprocessing/api.py:1002",
                                    f"failed (exitcode: {exitcode}) local_rank: {victim % rpn} (pid: {pids[victim]}) "
                                    "of binary: /usr/bin/python3")))
    agent[vn] += _child_failed(t_fail, hosts[vn], victim, rpn, pids, exitcode, others)
    timeout = t_save + dt.timedelta(seconds=600)
    for n, host in enumerate(hosts):
        if n == vn:
            continue
        node_ranks = list(range(n * rpn, (n + 1) * rpn))
        for r in node_ranks:
            w = timeout + skew[n] + dt.timedelta(milliseconds=rnd.randint(0, 80))
            worker[r].append((w, _WATCHDOG.format(rank=r, md=w.strftime("%m%d"), hms=w.strftime("%H:%M:%S"),
                                                  us=w.microsecond, seq=40000 + failure.step, world=world,
                                                  ms=rnd.randint(10, 90))))
        t_n = timeout + skew[n] + dt.timedelta(seconds=1)
        napid = pids[n * rpn] - 7
        agent[n].append((t_n, _glog(t_n, napid, "E", "torch/distributed/elastic/multiprocessing/api.py:1002",
                                    f"failed (exitcode: -6) local_rank: 0 (pid: {pids[n * rpn]}) "
                                    "of binary: /usr/bin/python3")))


def _agent_start(t: dt.datetime, job: str, host: str, node: int, nodes: int, rpn: int,
                 pid: int) -> list[tuple[dt.datetime, str]]:
    """torchrun's launch configuration and rendezvous result (torch/distributed/launcher/api.py
    launch_agent; torch/distributed/elastic/agent/server/api.py _rendezvous)."""
    cfg = "torch/distributed/launcher/api.py:254"
    rdzv = "torch/distributed/elastic/agent/server/api.py:553"
    world = nodes * rpn
    ranks = list(range(node * rpn, (node + 1) * rpn))
    texts = [(cfg, "Starting elastic_operator with launch configs:"),
             (cfg, "  entrypoint               : /workspace/Megatron-LM/pretrain_gpt.py"),
             (cfg, f"  min_nodes                : {nodes}"), (cfg, f"  max_nodes                : {nodes}"),
             (cfg, f"  nproc_per_node           : {rpn}"), (cfg, f"  run_id                   : {job}"),
             (cfg, "  rdzv_backend             : c10d"),
             (rdzv, "[default] Rendezvous complete for workers. Result:"), (rdzv, "  restart_count=0"),
             (rdzv, f"  master_addr={job}-n00"), (rdzv, f"  group_rank={node}"),
             (rdzv, f"  group_world_size={nodes}"),
             (rdzv, f"  local_ranks={list(range(rpn))}"), (rdzv, f"  role_ranks={ranks}"),
             (rdzv, f"  global_ranks={ranks}"), (rdzv, f"  role_world_sizes={[world] * rpn}"),
             (rdzv, f"  global_world_sizes={[world] * rpn}")]
    return [(t, _glog(t, pid, "I", where, text)) for where, text in texts]


def _child_failed(t: dt.datetime, host: str, victim: int, rpn: int, pids: list[int], exitcode: int,
                  others: list[int]) -> list[tuple[dt.datetime, str]]:
    """torchrun's ChildFailedError report (torch/distributed/elastic/multiprocessing/errors)."""
    stamp = t.strftime("%Y-%m-%d_%H:%M:%S")

    def entry(i: int, r: int, code: int) -> list[str]:
        name = {-9: "  (SIGKILL)", -15: "  (SIGTERM)"}.get(code, "")
        return [f"[{i}]:", f"  time      : {stamp}", f"  host      : {host}",
                f"  rank      : {r} (local_rank: {r % rpn})", f"  exitcode  : {code} (pid: {pids[r]}){name}",
                "  error_file: <N/A>",
                f"  traceback : Signal {-code} ({name.strip()[1:-1]}) received by PID {pids[r]}" if code < 0 else
                "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"]

    out = ["torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
           "=" * 54, "/workspace/Megatron-LM/pretrain_gpt.py FAILED", "-" * 54, "Failures:"]
    for i, r in enumerate(others, start=1):
        out += entry(i, r, -15)
    if not others:
        out.append("  <NO_OTHER_FAILURES>")
    out += ["-" * 54, "Root Cause (first observed failure):", *entry(0, victim, exitcode), "=" * 54]
    return [(t, text) for text in out]


def _glog(t: dt.datetime, pid: int, level: str, where: str, text: str) -> str:
    return f"{level}{t.strftime('%m%d %H:%M:%S')}.{t.microsecond:06d} {pid} {where}] {text}"


def _ms(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%d %H:%M:%S.") + f"{t.microsecond // 1000:03d}"


def _write_files(logs: Path, job: str, hosts: list[str], spec: FleetSpec,
                 agent: list[list[tuple[dt.datetime, str]]], worker: list[list[tuple[dt.datetime, str]]],
                 kernel: list[list[tuple[dt.datetime, str]]], skew: list[dt.timedelta],
                 collect: list | None = None) -> tuple[int, int]:
    """Write one job's files in time order (or add their lines to ``collect`` with their true
    time: event time less the host's ``skew``); returns (files, lines)."""
    rpn = spec.ranks_per_node
    files = lines = 0
    for n, host in enumerate(hosts):
        d = logs / job / host
        if collect is None:
            d.mkdir(parents=True, exist_ok=True)
        console = list(agent[n])
        for r in range(n * rpn, (n + 1) * rpn):
            if spec.layout == "console":
                console += [(t, f"[default{r % rpn}]:{text}") for t, text in worker[r]]
            else:
                lines += _write(d / f"rank{r}.log", worker[r], collect, skew[n])
                files += 1
        lines += _write(d / "console.log", console, collect, skew[n])
        files += 1
        if kernel[n]:
            if collect is None:
                (logs / "kernel").mkdir(exist_ok=True)
            lines += _write(logs / "kernel" / f"{host}.log", kernel[n], collect, skew[n])
            files += 1
    return files, lines


def _write(path: Path, rows: Iterable[tuple[dt.datetime, str]], collect: list | None = None,
           skew: dt.timedelta = dt.timedelta(0)) -> int:
    ordered = sorted(rows, key=lambda row: row[0])  # stable: a record's lines stay together
    if collect is not None:
        collect += [(t - skew, path, text) for t, text in ordered]  # the true time: when it was written
    else:
        path.write_text("".join(text + "\n" for _, text in ordered))
    return len(ordered)


def score(truth: dict[str, Any], incidents: list[dict[str, Any]]) -> dict[str, Any]:
    """Compare a diagnosis (incidents in the ``diagnose --json`` shape) with ``truth``:
    per job, the expected incidents found (kind and step), found exactly (also root-cause
    class and rank), and false ones (a save incident matching none, or a ``must_not``
    kind). Returns the counts and the jobs that missed or got a false one. Raises
    ValueError when ``incidents`` are not incident objects, or name none of the truth's jobs."""
    by_job: dict[str, list[dict[str, Any]]] = {}
    for n, inc in enumerate(incidents):
        if not isinstance(inc, dict) or not isinstance(inc.get("kind"), str):
            raise ValueError(f"incident {n} is not an incident object with a kind (diagnose --json writes them)")
        by_job.setdefault(inc.get("job") or "", []).append(inc)
    if by_job and not set(by_job) & set(truth["jobs"]):
        raise ValueError("no job of the diagnosis is in the truth: the diagnosis of another fleet?")
    out = {"injected": 0, "found": 0, "exact": 0, "false": 0, "clean_jobs": 0, "clean_with_incident": 0,
           "missed": [], "wrong": [], "false_jobs": []}
    for job, want in truth["jobs"].items():
        got = by_job.pop(job, [])
        expected = want["incidents"]
        out["injected"] += len(expected)
        out["found"] += len(expected) - len(unmatched(expected, got, cause=False))
        exact = len(expected) - len(unmatched(expected, got))
        out["exact"] += exact
        if exact < len(expected):
            (out["missed"] if len(unmatched(expected, got, cause=False)) else out["wrong"]).append(job)
        false = [i for i in got if i["kind"] in want["must_not"]
                 or (i["kind"] in SAVE_KINDS and not any(matches(i, w, cause=False) for w in expected))]
        out["false"] += len(false)
        if not expected:
            out["clean_jobs"] += 1
            out["clean_with_incident"] += bool(false)
        if false:
            out["false_jobs"].append(job)
    stray = [i for incs in by_job.values() for i in incs if i["kind"] in SAVE_KINDS]
    out["false"] += len(stray)
    out["false_jobs"] += sorted({i.get("job") or "" for i in stray})
    return out
