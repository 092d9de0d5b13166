"""Root cause: which failure initiated the others.

One rank's death makes every peer report a collective timeout or error, and torchrun then
sends SIGTERM to the rest of the group. Attribution, in order:

1. **Hard failures** are initiating: a kernel OOM kill of one of the job's pids
   (``oom_kill``), a death by signal that torchrun did not send (``signal``; SIGKILL
   with OOM evidence for the same pid becomes ``oom_kill``), an NVIDIA Xid on a host of
   the job (``gpu_xid``), a storage error (``storage_error``), a lost node
   (``node_lost``). The earliest wins; on equal times the order above breaks the tie.
   A signal a rank died of *after* it had itself reported a collective timeout (the NCCL
   watchdog aborts with SIGABRT) is a consequence, not a cause.
2. With **collective timeouts only**, the rank the others waited for is the suspect:
   the rank with the lowest collective sequence number when the reports carry one
   (NCCL's ``SeqNum``), else the expected rank that did *not* report a timeout. Only when
   every rank timed out alike does the earliest reporter stand in (``note`` says so).
3. Otherwise the earliest failing exit (exit code > 0) or error, class ``unknown``.

Everything else that failed is **collateral**: downstream reports. torchrun's own
"Root Cause (first observed failure)" is evidence like any other line: it names the
first rank *torchrun saw* fail, which after a timeout is often a victim, not the cause.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from ckptwatch.detectors.events import Ev
from ckptwatch.detectors.incident import RootCause
from ckptwatch.detectors.jobstate import JobState

_HARD_ORDER = {"oom_kill": 0, "gpu_xid": 1, "storage_error": 2, "node_lost": 3, "signal": 4}
#: Signals torchrun's agent sends when tearing a worker group down.
AGENT_SIGNALS = {"SIGTERM", "SIGKILL", "SIGINT", "SIGHUP", "SIGQUIT"}


@dataclass
class Attribution:
    """Result of :func:`attribute`: the root cause, the collateral ranks (sorted) and the
    events that support them (root first)."""

    root: RootCause
    collateral: list[int]
    root_events: list[Ev]
    collateral_events: list[Ev]


def _root_from(ev: Ev, cls: str, rank: int | None, state: JobState, note: str = "",
               signal: str | None = None) -> RootCause:
    pid = ev.pid if ev.pid is not None else (state.rank_pid.get(rank) if rank is not None else None)
    host = ev.host if ev.source_kind == "log" and ev.host else state.host_of(rank) or ev.host
    return RootCause(cls=cls, rank=rank, host=host, pid=pid, ts=ev.ts, rule_id=ev.rule_id,
                     line=ev.first_line(), signal=signal, note=note)


def attribute(failures: list[Ev], state: JobState, expected: set[int]) -> Attribution | None:
    """Attribute ``failures`` (events of FAILURE_KINDS around one save, in time order) to
    a root cause. ``expected`` are the ranks that should have taken part. Returns None when
    there is no failure at all."""
    if not failures:
        return None
    agent_pids = {e.pid for e in failures if e.kind == "agent_signal" and e.pid is not None}
    reported_timeout: dict[int, Ev] = {}
    for e in failures:
        r = state.rank_of(e)
        if e.kind in ("collective_timeout", "collective_error") and r is not None:
            reported_timeout.setdefault(r, e)

    oom_pids = {e.pid: e for e in failures if e.kind == "oom_kill" and e.pid is not None}
    agent_reported = {e.pid for e in failures if e.kind == "process_exit" and e.attrs.get("reporter") == "agent"}
    hard: list[tuple[dt.datetime, int, Ev, str, int | None, str | None]] = []
    for e in failures:
        rank = state.rank_of(e)
        if e.kind == "oom_kill":
            hard.append((e.ts, _HARD_ORDER["oom_kill"], e, "oom_kill", rank, "SIGKILL"))
        elif e.kind in ("gpu_xid", "storage_error", "node_lost"):
            hard.append((e.ts, _HARD_ORDER[e.kind], e, e.kind, rank, None))
        elif e.kind == "process_exit" and e.signal and (e.exitcode or 0) < 0:
            sent_by_agent = e.pid in agent_pids and e.signal in AGENT_SIGNALS
            own_timeout = rank in reported_timeout and reported_timeout[rank].ts <= e.ts
            if sent_by_agent or own_timeout:
                continue
            if e.pid in oom_pids:
                continue  # the kernel's OOM line is the better evidence for this death
            if e.attrs.get("reporter") == "torchrun_summary" and e.pid in agent_reported:
                continue  # the agent's own "failed (exitcode: …)" line is the more precise report
            hard.append((e.ts, _HARD_ORDER["signal"], e, "signal", rank, e.signal))

    root_events: list[Ev]
    if hard:
        hard.sort(key=lambda h: (h[0], h[1], h[2].source_id, h[2].offset))
        ts, _, ev, cls, rank, sig = hard[0]
        note = ""
        if cls == "signal":
            note = (f"killed by {sig} with no kernel OOM-killer line for pid {ev.pid} in the logs read; "
                    "the OOM killer is the usual sender of SIGKILL: check the kernel log (dmesg, journalctl -k) "
                    "of the host, or the scheduler (preemption)") if sig == "SIGKILL" else f"killed by {sig}"
        elif cls == "oom_kill":
            note = "the kernel OOM killer killed this rank's process (SIGKILL)"
        root = _root_from(ev, cls, rank, state, note=note, signal=sig)
        root_events = [ev]
    else:
        timeouts = [e for e in failures if e.kind == "collective_timeout"]
        if timeouts:
            root, root_events = _timeout_suspect(timeouts, state, expected)
        else:
            exits = [e for e in failures if e.kind in ("process_exit", "collective_error", "save_error")
                     and not (e.kind == "process_exit" and e.pid in agent_pids)]
            first = exits[0] if exits else failures[0]
            rank = state.rank_of(first)
            code = first.exitcode
            note = f"exit code {code}" if code is not None else "no initiating event found in the logs read"
            root = _root_from(first, "unknown", rank, state, note=note, signal=first.signal)
            root_events = [first]

    collateral_events = [e for e in failures if e not in root_events]
    collateral = sorted({r for e in collateral_events if (r := state.rank_of(e)) is not None} - {root.rank})
    return Attribution(root=root, collateral=collateral, root_events=root_events,
                       collateral_events=collateral_events)


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
    silent = sorted(expected - set(by_rank) - {-1})
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
    note = "every rank timed out alike; the lagging rank cannot be told from these logs (earliest reporter shown)"
    return _root_from(first, "collective_timeout", rank, state, note=note), [first]
