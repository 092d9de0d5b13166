"""Root cause: which failure initiated the others.

One rank's death makes every peer report a collective timeout or error, and the launcher
then sends SIGTERM to the rest of the group. Attribution, in order:

1. **Hard failures** are initiating. Precedence (the earliest wins; on equal times this
   order breaks the tie):

   ``oom_kill``
       the kernel's (or Slurm's, Kubernetes') OOM killer killed one of the job's
       processes; a SIGKILL death with OOM evidence for the same pid is this class;
   ``cuda_oom``
       a rank ran out of GPU memory (``torch.OutOfMemoryError``);
   ``host_memory``
       a process ran out of host memory without the OOM killer (``MemoryError``,
       ``std::bad_alloc``, ``Cannot allocate memory``);
   ``gpu_xid``
       an NVIDIA Xid on a host of the job;
   ``storage_error``
       ENOSPC, EDQUOT, EIO, NFS, a failed upload, a torch stream writer failure;
   ``node_lost``
       a host of the job stopped (rendezvous keep-alive, Slurm node failure);
   ``signal``
       the job or a rank was sent a signal from outside (``job_signal``: a scheduler's
       time limit or preemption, scancel, an eviction, torchrun's "death signal",
       Lightning's SIGTERM notice; ``sender`` says who when the line does), or a rank died
       by a signal its launcher did not send (torchrun, a shell's "Killed", srun,
       mpirun, DeepSpeed's launcher);
   ``native_crash``
       a segmentation fault, bus error, ``Fatal Python error`` or an abort from C++ code
       (``terminate called after throwing``);
   ``exception``
       the save (or load) code raised an exception of its own that none of the above
       explains (a traceback through save code; ``unknown`` when the paste cuts it off
       before its exception line).

   A signal a rank died of *after* it had itself reported a collective timeout (the NCCL
   watchdog aborts with SIGABRT) is a consequence, not a cause; so is a death by a signal
   the launcher sent while tearing the group down (torchrun's "closing signal", srun's
   "Terminating job step"). A hard failure that names no rank takes the rank of a report of
   the same class that does (srun's "task 5: Out Of Memory" for the kernel's OOM line), else
   the one expected rank that never finished the save.
2. With **collective timeouts only**, the rank the others waited for is the suspect:
   the rank with the lowest collective sequence number when the reports carry one
   (NCCL's ``SeqNum``, "last completed work"), else the expected rank that did *not*
   report a timeout. Only when every rank timed out alike does the earliest reporter
   stand in (``note`` says so).
3. With **collective errors only**: when they name a peer host of the job (NCCL's IB
   completion error or socket error) and no rank on that host reported anything, that
   node was lost (``node_lost``); else, when a rank that never finished the save reported
   nothing, that rank died without a traceback, as a process killed by a signal does:
   class ``signal``, no signal known.
4. Otherwise the earliest failing exit (exit code > 0) or error, class ``unknown``.

A rank named by the failure's own rank list (DCP's ``CheckpointException ranks:dict_keys([3])``)
is preferred over clock order: a few hundred ms of skew between hosts never decides.
Everything else that failed is **collateral**: downstream reports. torchrun's own
"Root Cause (first observed failure)" is evidence like any other line: it names the
first rank *torchrun saw* fail, which after a timeout is often a victim, not the cause.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

from ckptwatch.detectors.events import Ev, task_ranks
from ckptwatch.detectors.incident import OWN_TIME, RootCause
from ckptwatch.detectors.jobstate import JobState

_HARD_ORDER = {"oom_kill": 0, "cuda_oom": 1, "host_memory": 2, "gpu_xid": 3, "storage_error": 4, "node_lost": 5,
               "native_crash": 6, "signal": 7, "exception": 8, "unknown": 9}
#: how far apart (seconds) two reports of one hard failure may be (a kernel line and srun's report)
_SAME_FAILURE_S = 300.0
#: who sent a job-wide signal, in words
_SENDERS = {"scheduler_time_limit": "the scheduler (time limit)", "scheduler_preemption": "the scheduler (preemption)",
            "scancel": "scancel (an operator)", "kubelet_eviction": "the kubelet (node pressure eviction)",
            "external": "a process outside the job (scheduler or operator)"}
#: Signals a process raises on itself when it crashes in native code (torchrun's exitcode -11).
NATIVE_SIGNALS = frozenset({"SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE"})
#: Signals torchrun's agent sends when tearing a worker group down.
AGENT_SIGNALS = {"SIGTERM", "SIGKILL", "SIGINT", "SIGHUP", "SIGQUIT"}
#: The class of a traceback cut before its exception line whose header still names the
#: exception (IPython's ``OutOfMemoryError   Traceback (most recent call last)``): errors of
#: memory and of the file system say the cause by their name alone; any other name is the save
#: code's own exception.
CUT_EXCEPTION_CLASSES = {
    "OutOfMemoryError": "cuda_oom", "MemoryError": "host_memory",
    **dict.fromkeys(("OSError", "IOError", "PermissionError", "FileNotFoundError", "IsADirectoryError",
                     "NotADirectoryError", "FileExistsError", "BlockingIOError"), "storage_error"),
}


@dataclass
class Attribution:
    """Result of :func:`attribute`: the root cause, the collateral ranks (sorted) and the
    events that support them (root first)."""

    root: RootCause
    collateral: list[int]
    root_events: list[Ev]
    collateral_events: list[Ev]


def _root_from(ev: Ev, cls: str, rank: int | None, state: JobState, note: str = "",
               signal: str | None = None, sender: str | None = None) -> RootCause:
    pid = ev.pid if ev.pid is not None and ev.kind != "job_signal" else (
        state.rank_pid.get(rank) if rank is not None else None)
    host = ev.host if ev.source_kind == "log" and ev.host else state.host_of(rank) or ev.host
    return RootCause(cls=cls, rank=rank, host=host, pid=pid, ts=ev.ts, rule_id=ev.rule_id,
                     line=ev.first_line(), signal=signal, note=note, sender=sender)


def _named_ranks(failures: list[Ev]) -> set[int]:
    """Ranks a failure's own rank list names (DCP's ``CheckpointException ranks:...``)."""
    out: set[int] = set()
    for e in failures:
        v = e.attrs.get("failed_ranks")
        if isinstance(v, int):
            out.add(v)
        elif isinstance(v, str):
            out |= {int(x) for x in v.replace(",", " ").split() if x.isdigit()}
    return out


def attribute(failures: list[Ev], state: JobState, expected: set[int],
              unfinished: set[int] | None = None) -> Attribution | None:
    """Attribute ``failures`` (events of FAILURE_KINDS around one save, in time order) to
    a root cause. ``expected`` are the ranks that should have taken part, ``unfinished``
    those of them that never finished the save. Returns None when there is no failure."""
    if not failures:
        return None
    unfinished = set(unfinished or ()) - {-1}
    agent_pids = {e.pid for e in failures if e.kind == "agent_signal" and e.pid is not None}
    teardowns = [e for e in failures if e.kind == "agent_signal" and e.pid is None]
    teardown = min(teardowns, key=lambda e: (e.ts, e.offset)) if teardowns else None

    def after_teardown(e: Ev) -> bool:
        """The launcher's teardown came first (in one file at one second: the line before it)."""
        if teardown is None or teardown.ts > e.ts:
            return False
        return teardown.ts < e.ts or teardown.source_id != e.source_id or teardown.offset < e.offset
    reported_timeout: dict[int, Ev] = {}
    for e in failures:
        r = state.rank_of(e)
        if e.kind in ("collective_timeout", "collective_error") and r is not None:
            reported_timeout.setdefault(r, e)

    oom_pids = {e.pid: e for e in failures if e.kind == "oom_kill" and e.pid is not None}
    agent_reported = {e.pid for e in failures if e.kind == "process_exit" and e.attrs.get("reporter") == "agent"}
    named = _named_ranks(failures)
    first_other = next((e for e in failures if e.kind not in ("job_signal", "agent_signal")), None)
    hard: list[tuple[dt.datetime, int, Ev, str, int | None, str | None]] = []
    for e in failures:
        rank = state.rank_of(e)
        if e.kind == "oom_kill":
            hard.append((e.ts, _HARD_ORDER["oom_kill"], e, "oom_kill", rank, "SIGKILL"))
        elif e.kind in ("cuda_oom", "gpu_xid", "storage_error", "node_lost", "host_memory", "native_crash"):
            hard.append((e.ts, _HARD_ORDER[e.kind], e, e.kind, rank, e.attrs.get("signal") or None))
        elif e.kind == "exception":  # a traceback through save / load code, maybe cut before its last line
            cls = _cut_class(e) if e.attrs.get("cut") else "exception"
            # a cut traceback naming nothing is the weakest evidence there is: any other failure wins
            order = _HARD_ORDER["unknown"] if e.attrs.get("cut") and not e.attrs.get("exception") else _HARD_ORDER[cls]
            hard.append((e.ts, order, e, cls, rank, None))
        elif e.kind == "save_error":  # the saver's own word that its save failed: its error, not an unknown
            hard.append((e.ts, _HARD_ORDER["exception"], e, "exception", rank, None))
        elif e.kind == "job_signal":
            if first_other is not None and first_other.ts < e.ts:
                continue  # the job was already failing: a cancellation now is its teardown, not its cause
            hard.append((e.ts, _HARD_ORDER["signal"], e, "signal", rank, e.signal))
        elif e.died_of_signal:
            sent_by_agent = e.pid in agent_pids and e.signal in AGENT_SIGNALS
            torn_down = after_teardown(e) and e.attrs.get("reporter") in ("srun", "launcher")
            own_timeout = rank in reported_timeout and reported_timeout[rank].ts <= e.ts
            # ProcessGroupNCCL's watchdog takes a process down with std::abort after a collective
            # timed out ("To avoid data inconsistency, we are taking the entire process down"):
            # a SIGABRT death after a reported timeout is the timeout's teardown, whoever reports it
            watchdog_abort = e.signal == "SIGABRT" and any(
                t.kind == "collective_timeout" and t.ts <= e.ts for t in failures)
            if sent_by_agent or own_timeout or torn_down or watchdog_abort:
                continue
            if e.pid in oom_pids or _oom_explains(e, failures, state):
                continue  # the kernel's OOM line is the better evidence for this death
            if e.attrs.get("reporter") == "torchrun_summary" and e.pid in agent_reported:
                continue  # the agent's own "failed (exitcode: …)" line is the more precise report
            # a death by SIGSEGV / SIGBUS / SIGILL / SIGFPE is the process crashing, not being killed
            cls = "native_crash" if e.signal in NATIVE_SIGNALS else "signal"
            hard.append((e.ts, _HARD_ORDER[cls], e, cls, rank, e.signal))

    root_events: list[Ev]
    if hard:
        if len(named) == 1:  # the failure's own rank list beats clock order
            ranked = [h for h in hard if h[4] in named]
            hard = ranked or hard
        hard.sort(key=lambda h: (h[0], h[1], h[2].source_id, h[2].offset))
        # in one file at one time (lines that inherit a time), the earlier line is the cause: a
        # writer's complaint after a crash is the crash's consequence, not a storage failure
        first = hard[0]
        earlier = [h for h in hard if h[0] == first[0] and h[2].source_id == first[2].source_id
                   and h[2].offset < first[2].offset]
        earlier = [h for h in earlier if h[3] in ("native_crash", "cuda_oom", "host_memory", "gpu_xid", "signal",
                                                  "oom_kill", "node_lost")]
        if earlier and first[3] in ("storage_error", "exception"):
            hard.insert(0, hard.pop(hard.index(min(earlier, key=lambda h: h[2].offset))))
        ts, _, ev, cls, rank, sig = hard[0]
        if len(named) == 1 and rank not in named and ev.attrs.get("failed_ranks") is not None:
            rank = next(iter(named))  # DCP's coordinator (rank 0) raises for the rank its list names
        if rank is None and ev.kind != "job_signal":  # another report of the same failure may name the rank
            # (not of a scheduler's cancel: every rank receives it, the first to say so is no root), a
            # rank on the failure's host when it names one (a pod OOMKilled is not a rank of another pod)
            def fits(r: int) -> bool:
                return not ev.host or state.host_of(r) in (None, ev.host)
            same = [h for h in hard[1:] if h[3] == cls and h[4] is not None and fits(h[4])
                    and abs((h[0] - ts).total_seconds()) <= _SAME_FAILURE_S]
            if same:
                rank = same[0][4]
            elif cls == "oom_kill" and (r := _oom_victim_rank(ev, failures, state)) is not None:
                rank = r
            elif cls != "signal" and len(failed := {r for r in _failed_workers(failures, state) if fits(r)}) == 1:
                rank = failed.pop()  # a rank-less traceback: the one worker the launcher saw fail
            elif len(unfinished) == 1 and len(expected) > 1 and fits(next(iter(unfinished))):
                rank = next(iter(unfinished))
        sender = ev.attrs.get("sender") if cls == "signal" else None
        note = _hard_note(cls, sig, sender, ev)
        root = _root_from(ev, cls, rank, state, note=note, signal=sig, sender=sender)
        if rank is not None and root.pid is None:
            root.pid = state.rank_pid.get(rank)
        root_events = [ev]
    else:
        timeouts = [e for e in failures if e.kind == "collective_timeout"]
        errors = [e for e in failures if e.kind == "collective_error"]
        reporters = {r for e in failures if (r := state.rank_of(e)) is not None}
        silent = sorted(unfinished - reporters)
        if timeouts:
            root, root_events = _timeout_suspect(timeouts, state, expected)
        elif (lost := _lost_peer(errors, state, reporters)) is not None:
            host, first = lost
            on = sorted(r for r, h in state.rank_host.items() if h == host)
            rank = on[0] if len(on) == 1 else None  # a node, not one of its ranks
            note = (f"peers lost their transport connection to host {host} ({first.attrs.get('transport', 'network')}: "
                    f"'{first.first_line(120)}') and no rank on {host} reported anything after: the node (or its "
                    f"network) went away")
            root = _root_from(first, "node_lost", rank, state, note=note)
            root.host, root.pid = host, state.rank_pid.get(rank) if rank is not None else None
            root_events = [first]
        elif errors and silent:
            rank = silent[0]
            first = errors[0]
            note = (f"rank {rank} stopped in the middle of the save without a word, and its peers then lost their "
                    f"connection to it: a process that dies without a traceback was killed by a signal (SIGKILL, "
                    f"the OOM killer). The line shown is the first peer's report")
            root = _root_from(first, "signal", rank, state, note=note)
            root.pid, root.host = state.rank_pid.get(rank), state.host_of(rank)
            root_events = []
        else:
            exits = [e for e in failures if e.kind in ("process_exit", "collective_error", "save_error")
                     and not (e.kind == "process_exit" and e.pid in agent_pids)]
            if len(named) == 1:
                exits = [e for e in exits if state.rank_of(e) in named] or exits
            first = exits[0] if exits else failures[0]
            rank = state.rank_of(first)
            code = first.exitcode
            note = f"exit code {code}" if code is not None else "no initiating event found in the logs read"
            root = _root_from(first, "unknown", rank, state, note=note, signal=first.signal)
            root_events = [first]

    collateral_events = [e for e in failures if e not in root_events]
    signalled = signalled_ranks(failures, state)
    collateral = sorted(({r for e in collateral_events
                          if (r := state.rank_of(e) if e.pid not in signalled else signalled[e.pid]) is not None}
                         | {r for e in collateral_events for r in task_ranks(e.attrs.get("tasks"))})
                        - {root.rank} - _ranks_on(root, state))
    return Attribution(root=root, collateral=collateral, root_events=root_events,
                       collateral_events=collateral_events)


def _ranks_on(root: RootCause, state: JobState) -> set[int]:
    """The ranks of a root cause that is a whole host (no one rank: a node lost, a pod
    OOMKilled): those the job places there. They failed with it, not because of it. Not of
    a signal: a scheduler's cancel names the host it printed on, and reaches every rank."""
    if root.rank is not None or not root.host or root.cls not in ("node_lost", "oom_kill", "gpu_xid"):
        return set()
    return {r for r in range(state.max_rank + 1) if state.host_of(r) == root.host}


#: seconds a kernel's clock may run ahead of the line reporting the death its OOM kill caused
_OOM_SKEW_S = 5.0


def _oom_explains(death: Ev, failures: list[Ev], state: JobState) -> bool:
    """A SIGKILL death without a pid the kernel named (srun's ``task 2: Killed``) is the OOM
    kill of its host around it, unless that kill came after the death could have happened:
    after the death's own time, or, for a line that carries none (dated by the line before
    it), after the next dated line of its file (slurmstepd's ``CANCELLED AT ...``): an OOM
    kill 49 s after the step was cancelled is another job's."""
    if death.signal != "SIGKILL":
        return False
    host = death.host or state.host_of(state.rank_of(death))
    if death.ts_source in OWN_TIME:
        latest: dt.datetime | None = death.ts
    else:
        latest = min((f.ts for f in failures if f.source_id == death.source_id and f.offset > death.offset
                      and f.ts_source in OWN_TIME), default=None)
    skew = dt.timedelta(seconds=_OOM_SKEW_S)
    return any(o.kind == "oom_kill" and (not o.host or not host or o.host == host)
               and abs((o.ts - death.ts).total_seconds()) <= _SAME_FAILURE_S
               and (latest is None or o.ts <= latest + skew) for o in failures)


_SLURM_TASK = re.compile(r"/slurm/[^,\s]*?/task_(\d+)\b")


def _oom_victim_rank(ev: Ev, failures: list[Ev], state: JobState) -> int | None:
    """The rank of a kernel OOM kill that names none: a Slurm task cgroup in the kernel's
    summary (``task_memcg=/slurm/uid_1000/job_77120/step_0/task_2``: the task id is the rank
    under srun), else a SIGKILL death with a rank reported on the same host around it
    (srun's ``task 2: Killed``), else the one worker Ray reports dead on that host around it
    (``ActorDiedError`` naming the pid of a worker whose lines name its rank: the raylet's
    memory monitor counts the workers it killed, it does not name them)."""
    for e in failures:
        if e.kind == "oom_kill" and abs((e.ts - ev.ts).total_seconds()) <= _SAME_FAILURE_S:
            m = _SLURM_TASK.search(str(e.attrs.get("task_memcg") or ""))
            if m:
                return int(m.group(1))
    for e in failures:
        r = state.rank_of(e)
        if (r is not None and e.died_of_signal and e.signal == "SIGKILL"
                and (not ev.host or not e.host or e.host == ev.host)
                and abs((e.ts - ev.ts).total_seconds()) <= _SAME_FAILURE_S):
            return r
    if state.single_process and not state.pid_rank and ev.pid is not None:
        return 0  # a one-process job whose lines name no pid: the kill joined it from its own files (Keras under nohup)
    if ev.attrs.get("reporter") == "ray":
        dead = {r for e in failures if e.kind == "process_exit" and e.attrs.get("reporter") == "ray"
                and (not ev.host or not e.host or e.host == ev.host)
                and abs((e.ts - ev.ts).total_seconds()) <= _SAME_FAILURE_S and (r := state.rank_of(e)) is not None}
        if len(dead) == 1:
            return dead.pop()
    return None


def _failed_workers(failures: list[Ev], state: JobState) -> set[int]:
    """Ranks the launcher reported failing with an error exit (not a signal): torchrun's
    ``failed (exitcode: 1) local_rank: 2`` and its failure summary."""
    return {r for e in failures if e.kind == "process_exit" and e.attrs.get("reporter") in ("agent", "torchrun_summary")
            and (e.exitcode or 0) > 0 and (r := state.rank_of(e)) is not None}


def _lost_peer(errors: list[Ev], state: JobState, reporters: set[int]) -> tuple[str, Ev] | None:
    """``(host, first report)`` when collective errors name a peer host (NCCL's IB completion
    error or socket error, ``peer_host``) that is a host of the job and none of whose ranks
    reported a failure: that host went silent."""
    for e in errors:
        peer = e.attrs.get("peer_host")
        if not isinstance(peer, str):
            continue
        on = {r for r, h in state.rank_host.items() if h == peer}
        if on and not on & reporters:
            return peer, e
    return None


def _cut_class(e: Ev) -> str:
    """The class of a traceback cut before its exception line: from the exception its header
    names (:data:`CUT_EXCEPTION_CLASSES`, ``exception`` for another name), else ``exception``:
    CPython prints a traceback only for an exception that propagated, so the save code raised
    one, though which one the paste does not show (the note and the advice say so)."""
    name = str(e.attrs.get("exception") or "")
    if not name:
        return "exception"
    return CUT_EXCEPTION_CLASSES.get(name.rsplit(".", 1)[-1], "exception")


def _hard_note(cls: str, sig: str | None, sender: str | None, ev: Ev) -> str:
    if ev.kind == "exception" and ev.attrs.get("cut") and ev.attrs.get("exception"):
        return (f"the traceback is cut off before its exception line; its header names "
                f"{ev.attrs.get('exception')}, whose message is not in the paste")
    if cls == "signal" and sender:
        return f"{sig or 'a signal'} sent by {_SENDERS.get(sender, sender)}"
    if cls == "signal":
        return (f"killed by {sig} with no kernel OOM-killer line for {'pid ' + str(ev.pid) if ev.pid else 'it'} in the logs read; "
                "the OOM killer is the usual sender of SIGKILL: check the kernel log (dmesg, journalctl -k) "
                "of the host, or the scheduler (preemption)") if sig == "SIGKILL" else f"killed by {sig}"
    if cls == "oom_kill":
        return "the OOM killer killed this rank's process (SIGKILL)"
    if cls == "cuda_oom":
        return "the rank ran out of GPU memory (torch.OutOfMemoryError)"
    if cls == "host_memory":
        return "the process ran out of host memory (an allocation failed; no OOM killer line)"
    if cls == "native_crash":
        return f"the process crashed in native code{f' ({sig})' if sig else ''}"
    if ev.kind == "exception" and ev.attrs.get("cut"):
        return "the save code raised an exception, but the traceback is cut off before its exception line: which one is not in the paste"
    if cls == "exception":
        exc = ev.attrs.get("exception")
        return f"the save code raised {exc}" if exc else "the save code raised an exception"
    return ""


def _timeout_suspect(timeouts: list[Ev], state: JobState, expected: set[int]) -> tuple[RootCause, list[Ev]]:
    by_rank: dict[int, Ev] = {}
    for e in timeouts:
        r = state.rank_of(e)
        if r is not None:
            by_rank.setdefault(r, e)
    seqs = {r: e.attrs.get("seq") for r, e in by_rank.items() if isinstance(e.attrs.get("seq"), int)}
    first = timeouts[0]
    if len(set(seqs.values())) > 1:
        rank = min(seqs, key=lambda r: (seqs[r], r))
        note = (f"rank {rank} is behind in the collective sequence (SeqNum {seqs[rank]} vs up to "
                f"{max(seqs.values())} on other ranks): the others were waiting for it")
        return _root_from(by_rank[rank], "collective_timeout", rank, state, note=note), [by_rank[rank]]
    # a rank is silent only where the logs show it: one of its own lines, or a stated world size
    # (a rank-less save line taken as rank 0's does not show rank 0 was there to time out)
    every = (set(expected) & state.labelled_ranks) | (set(range(state.world_size)) if state.world_size else set())
    silent = sorted(every - set(by_rank) - {-1})
    if silent and by_rank:
        rank = silent[0]
        reporters = ", ".join(str(r) for r in sorted(by_rank))
        others = f" (also silent: {', '.join(map(str, silent[1:]))})" if len(silent) > 1 else ""
        who_first = state.rank_of(first)
        note = (f"ranks {reporters} timed out in a collective while rank {rank} did not: it is the rank "
                f"they were waiting for{others}. The line shown is rank {who_first}'s timeout report; "
                f"its time is that of the last line rank {who_first} logged before it (tracebacks carry no time)")
        root = _root_from(first, "collective_timeout", rank, state, note=note)
        root.pid = state.rank_pid.get(rank)
        root.host = state.host_of(rank)
        return root, []
    rank = state.rank_of(first)
    note = ("every rank timed out alike; the lagging rank cannot be told from these logs (earliest reporter shown)"
            if len(by_rank) > 1 else
            "only this rank's timeout is in the logs read: the rank it waited for cannot be told from them")
    return _root_from(first, "collective_timeout", rank, state, note=note), [first]


def signalled_ranks(failures: list[Ev], state: JobState) -> dict[int, int]:
    """The ranks of the workers a launcher signalled by pid alone (torchrun's "Sending
    process 140122 closing signal SIGTERM", ``torch/distributed/elastic/multiprocessing/api.py``
    ``SubprocessContext._close``), where the logs map no pid of theirs to a rank: pid ->
    rank. torchrun starts a node's workers one after another in local-rank order, so their
    pids rise with the rank; the pids of one launcher's file (those it signalled and those
    its failure report names with their rank, "rank : 1 (local_rank: 1) exitcode : -9
    (pid: 140123)") sorted give consecutive ranks. Only when every known pid sits where its
    rank says (one offset for all) and the ranks fit the world size; else nothing."""
    out: dict[int, int] = {}
    by_source: dict[str, set[int]] = {}
    for e in failures:
        if e.kind == "agent_signal" and e.pid is not None and e.pid not in state.pid_rank:
            by_source.setdefault(e.source_id, set()).add(e.pid)
    for source, unknown in by_source.items():
        known = {e.pid: r for e in failures if e.source_id == source and e.pid is not None
                 and e.pid not in unknown and (r := state.rank_of(e)) is not None}
        place = {pid: i for i, pid in enumerate(sorted(unknown | set(known)))}
        offsets = {r - place[pid] for pid, r in known.items()}
        if len(offsets) != 1:
            continue
        first = offsets.pop()
        last = first + len(place) - 1
        if first < 0 or (state.world_size and last >= state.world_size):
            continue
        out.update((pid, first + place[pid]) for pid in unknown)
    return out

