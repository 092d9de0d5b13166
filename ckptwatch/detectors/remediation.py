"""Concrete remediation text for save incidents."""

from __future__ import annotations

import re

from ckptwatch.detectors.incident import RootCause

#: A root line that is only CPython's traceback header: the paste ends before the exception line.
_TRACEBACK_HEADER = re.compile(r"\s*Traceback \(most recent call last\):?\s*$")


def _where(path: str | None, step: int | None) -> str:
    if step is None:
        return path or "the checkpoint this save was writing (its step and path were not logged)"
    return f"step {step} ({path})" if path else f"step {step}"


def _cause_advice(root: RootCause | None) -> str:
    if root is None:
        return ""
    host = f" on host {root.host}" if root.host else ""
    who = f"rank {root.rank}" if root.rank is not None else "the failing process"
    pid = f" (pid {root.pid})" if root.pid is not None else ""
    if root.cls == "oom_kill":
        return (f"The kernel OOM killer killed {who}{pid}{host}: lower host-memory use during "
                "saves (smaller per-rank state, async/staged save with bounded buffers, fewer dataloader "
                "workers) or give the job more memory before relaunching.")
    if root.cls == "cuda_oom":
        return (f"{who}{host} ran out of GPU memory during the save (torch.OutOfMemoryError). This is not a "
                "timeout: a longer process-group timeout will not help. Free GPU memory before saving "
                "(empty the cache, offload or gather the state dict to CPU, e.g. "
                "StateDictOptions(cpu_offload=True)), save with a smaller per-rank footprint, or set "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation.")
    if root.cls == "signal" and root.sender in ("scheduler_time_limit", "scheduler_preemption", "scancel",
                                               "kubelet_eviction", "external"):
        what = {"scheduler_time_limit": "the job reached its scheduler time limit",
                "scheduler_preemption": "the scheduler preempted the job",
                "scancel": "the job was cancelled (scancel)",
                "kubelet_eviction": "the kubelet evicted the pod (node under memory or disk pressure)",
                "external": f"a process outside the job sent {root.signal or 'a signal'}"}[root.sender]
        return (f"The save was cut short because {what}. Save before the deadline (a save on SIGTERM or a "
                "time-based save interval shorter than the time limit's grace), make saves atomic (write to a "
                "temporary name, rename when every rank is done), or ask for a longer time limit / grace period.")
    if root.cls == "signal":
        if root.signal is None:
            return (f"{who}{host} died in the middle of the save without a traceback, the way a process killed "
                    "by SIGKILL dies: check the host's kernel log (dmesg -T, journalctl -k) for the OOM killer and "
                    "the scheduler for preemption before relaunching.")
        if root.signal == "SIGKILL":
            return (f"{who}{pid}{host} was killed by SIGKILL. No OOM-killer line was found in the "
                    "logs read; the OOM killer is the usual sender of SIGKILL, so check `dmesg -T` / "
                    "`journalctl -k` on that host around the time, then the scheduler (preemption, "
                    "time limit) before relaunching.")
        return f"{who}{pid}{host} was killed by {root.signal}: find who sent it (scheduler, operator)."
    if root.cls == "collective_timeout":
        return (f"{who}{host} stopped participating in a collective while the others waited. Look at what it "
                "was doing (its own log, py-spy dump, slow or hung storage on its host) and consider a "
                "longer process-group timeout for saves on slow storage.")
    if root.cls == "storage_error":
        return (f"The storage under the checkpoint failed ({root.line}). Fix it (free space, quota, "
                "remount NFS, retry the upload) before the next save.")
    if root.cls == "host_memory":
        return (f"{who}{pid}{host} ran out of host memory during the save: gather or stage the state dict with "
                "bounded buffers (shard it, save per rank, offload in pieces), lower other host-memory use, or give "
                "the job more memory before relaunching.")
    if root.cls == "native_crash":
        return (f"{who}{pid}{host} crashed in native code during the save: look at the crash's frames (a core "
                "dump, faulthandler's stack), the library versions of the writer, and the storage it wrote to; "
                "relaunch from the last good checkpoint.")
    if root.cls == "exception" and _TRACEBACK_HEADER.match(root.line or ""):  # cut before its exception line
        return ("The save code raised an exception whose name and message the logs read cut off: find the "
                "traceback's last line in the full log (or rerun with the full console kept) and fix what it names.")
    if root.cls == "exception":
        return (f"The save code raised an error of its own ({root.line}): fix what it names (an object the "
                "serializer cannot write, a wrong argument or path) before the next save.")
    if root.cls == "gpu_xid":
        return f"A GPU error (NVIDIA Xid){host} killed the save: drain the node and run GPU diagnostics."
    if root.cls == "node_lost":
        return f"A node{host} was lost mid-save: drain it and relaunch on healthy nodes."
    return "The initiating failure is not in the logs read: add the kernel log and every rank's log."


def for_save(kind: str, step: int | None, path: str | None, root: RootCause | None,
             last_good: dict | None, *, presumed: bool = False) -> str:
    """What to do about an interrupted / partial / stalled save, concretely. ``presumed``:
    no line of the logs announced the save (:mod:`ckptwatch.detectors.save_points`)."""
    if last_good:
        resume = (f"Resume from the last good checkpoint, {_where(last_good.get('path'), last_good['step'])}; "
                  f"pass it explicitly (do not rely on 'latest' discovery).")
    else:
        resume = "No complete earlier checkpoint of this job was seen: restart from scratch or from a verified external checkpoint."
    bad = (f"Do not resume from {_where(path, step)}: not every rank finished writing it. Move it aside "
           "(e.g. rename with a .partial suffix) so that 'newest checkpoint' logic cannot pick it up.")
    if presumed:
        bad = (f"If a checkpoint of {_where(path, step)} exists, it was most likely being written when the job "
               "died: verify it (ckptwatch verify PATH) or move it aside before resuming; the logs do not say "
               "that the save began, only that the job died where it saves.")
    if kind == "stalled_save":
        bad = (f"The save of {_where(path, step)} started but has not finished past the deadline: check the "
               "ranks that have not finished (py-spy dump, storage health). Until it finishes, it is not a "
               "checkpoint to resume from.")
    return " ".join(x for x in (bad, resume, _cause_advice(root)) if x)
