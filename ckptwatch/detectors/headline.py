"""One line per incident that names its most important fact: the headline of every page.

:func:`headline` is what a Slack ``text``, a PagerDuty ``summary``, an Alertmanager
``summary`` annotation and the console heading say: ``<kind>: job <job>: <fact>``, where the
fact is, per kind,

* ``interrupted_save`` / ``storage_failure_during_save``: the checkpoint whose save was cut
  off, what cut it off (the root cause, its rank and host; the errno of a storage error),
  and the last good checkpoint;
* ``partial_checkpoint``: the checkpoint, the ranks whose shards were never finished, and
  the last good checkpoint;
* ``stalled_save``: the checkpoint and the ranks still writing it;
* ``corrupt_checkpoint``: the checkpoint and what verification found;
* ``poisoned_resume``: the bad checkpoint loaded, what broke it (the save incident's root
  cause, or the ranks that never finished it), and the last good checkpoint;
* ``load_failure``: the checkpoint, the error classes, and what broke the checkpoint when a
  save incident is known;
* ``world_size_mismatch``: the checkpoint, the world size it was saved at and the one it
  was loaded at;
* ``post_resume_regression``: the checkpoint resumed from and the loss before and after.

A fact the logs do not hold is said in words ("path not logged"), never as ``None``; a
cause is "not in the logs read" only when no rule named one. :func:`why` is the fact alone
(the root-cause field of a page), :func:`where` the checkpoint phrase.
"""

from __future__ import annotations

import re
from typing import Any

from ckptwatch.detectors.incident import Incident, RootCause

#: errno names a storage error line may carry, and the words that stand for them
_ERRNO = (("ENOSPC", r"ENOSPC|No space left on device"), ("EDQUOT", r"EDQUOT|Disk quota exceeded"),
          ("EIO", r"\bEIO\b|Input/output error"), ("ESTALE", r"ESTALE|Stale file handle"),
          ("EROFS", r"EROFS|Read-only file system"), ("ETIMEDOUT", r"ETIMEDOUT|Connection timed out"),
          ("EACCES", r"EACCES|Permission denied"))
#: other storage faults a root-cause line names, in words (torch's zip writer: caffe2
#: serialize/inline_container.cc, PyTorchStreamWriter; S3 throttling: botocore ClientError codes)
_FAULT = (("a short write in torch.save, as on a full disk", r"unexpected pos \d+ vs \d+"),
          ("a failed write in torch.save", r"PytorchStreamWriter failed writing|file write failed"),
          ("S3 throttling (SlowDown)", r"\(SlowDown\)"), ("S3 access denied", r"\(AccessDenied\)"),
          ("an incomplete upload", r"IncompleteRead|incomplete upload|partial upload"))
_NFS_SERVER = re.compile(r"nfs: server (\S+) not responding")
_SENDER = {"scheduler_time_limit": "the scheduler's time limit", "scheduler_preemption": "a scheduler preemption",
           "scancel": "scancel", "kubelet_eviction": "a kubelet eviction", "external": "a signal from outside the job"}


def errno_of(line: str | None) -> str | None:
    """The errno name (ENOSPC, EDQUOT, EIO, ESTALE, EROFS, ETIMEDOUT, EACCES) a storage error
    line names, by symbol or by its strerror text; ``nfs`` for an NFS server not responding;
    None when it names none."""
    if not line:
        return None
    for name, pattern in _ERRNO:
        if re.search(pattern, line):
            return name
    return "nfs" if _NFS_SERVER.search(line) else None


def nfs_server(line: str | None) -> str | None:
    """The NFS server of a kernel ``nfs: server X not responding`` line, else None."""
    m = _NFS_SERVER.search(line or "")
    return m.group(1) if m else None


def _on(rank: int | None, host: str | None) -> str:
    parts = [f"rank {rank}" if rank is not None else "", f"host {host}" if host else ""]
    text = ", ".join(p for p in parts if p)
    return f" ({text})" if text else ""


def cause_phrase(cls: str | None, rank: int | None = None, host: str | None = None, signal: str | None = None,
                 sender: str | None = None, line: str | None = None) -> str:
    """What a root cause of class ``cls`` was, in a few words with its rank and host:
    ``the OOM killer (rank 5, host gpu-3)``, ``SIGTERM from the scheduler's time limit``,
    ``ENOSPC (rank 0)``."""
    on = _on(rank, host)
    if cls == "oom_kill":
        return f"the OOM killer{on}"
    if cls == "cuda_oom":
        return f"CUDA out of memory{on}"
    if cls == "signal":
        if sender in _SENDER:
            return f"{signal or 'a signal'} from {_SENDER[sender]}{on}"
        if signal:
            return f"{signal}{on}"
        return f"a rank dying without a traceback, as under SIGKILL{on}"
    if cls == "collective_timeout":
        return f"a collective timeout: rank {rank} stopped taking part" + (f" (host {host})" if host else "") \
            if rank is not None else f"a collective timeout{on}"
    if cls == "storage_error":
        name = errno_of(line) or next((w for w, p in _FAULT if re.search(p, line or "")), None)
        server = nfs_server(line)
        what = f"NFS server {server} not responding" if server else (name or "a storage error")
        return f"{what}{on}"
    if cls == "node_lost":
        return f"the loss of a node{on}"
    if cls == "gpu_xid":
        return f"a GPU Xid error{on}"
    if cls == "save_error":
        return f"a save error{on}"
    if cls == "host_memory":
        return f"host memory running out{on}"
    if cls == "native_crash":
        return f"a native crash{' (' + signal + ')' if signal else ''}{on}"
    if cls == "exception":
        exc = re.match(r"\s*([A-Za-z_][\w.]*)", (line or "").strip().splitlines()[-1] if line else "")
        return f"{exc.group(1) if exc else 'an exception'} raised by the save code{on}"
    return f"a failure not named in the logs read{on}"


def _cause(rc: RootCause | None, lines: list[str] | None = None) -> str | None:
    """The root cause in words; a storage error whose own line names no errno (a
    traceback's "During handling ..." line) takes it from ``lines``, the incident's other
    root-cause evidence."""
    if rc is None:
        return None
    line = rc.line
    if rc.cls == "storage_error" and not errno_of(line) and not nfs_server(line):
        line = next((x for x in lines or [] if errno_of(x)), line)
    return cause_phrase(rc.cls, rc.rank, rc.host, rc.signal, rc.sender, line)


def _ranks(rs: Any) -> str:
    rs = sorted(rs or [])
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(map(str, rs))


def where(inc: Incident) -> str:
    """The checkpoint of ``inc`` in words: ``step 40 (/ckpt/iter_0000040)``, ``step 40 (path
    not logged)``, the path alone, or ``a checkpoint whose step and path were not logged``."""
    if inc.step is None and not inc.checkpoint_path:
        return "a checkpoint whose step and path were not logged"
    if inc.step is None:
        return inc.checkpoint_path or ""
    return f"step {inc.step} ({inc.checkpoint_path or 'path not logged'})"


def last_good(lg: dict | None) -> str:
    """``last good: step 20 (/ckpt/iter_0000020)`` or ``no earlier good checkpoint seen``."""
    if not lg or lg.get("step") is None:
        return "no earlier good checkpoint seen"
    return f"last good: step {lg['step']}" + (f" ({lg['path']})" if lg.get("path") else "")


def why(inc: Incident) -> str:
    """The fact that explains ``inc``, without the checkpoint: the root cause of a save
    incident, what broke a resumed checkpoint, the error classes of a failed load, the two
    world sizes, what verification found, the loss before and after."""
    cs = inc.checkpoint_state or {}
    kind = inc.kind
    if kind in ("interrupted_save", "storage_failure_during_save"):
        rank = inc.root_cause.rank if inc.root_cause else None
        # the root's own chained exceptions may be separate records ("OSError: [Errno 28] ..."
        # after "During handling of the above exception"): the same rank's lines count too
        roots = [e.line for e in inc.evidence if e.role == "root_cause" or (e.role == "collateral" and e.rank == rank)]
        return _cause(inc.root_cause, roots) or "a failure not named in the logs read"
    if kind == "partial_checkpoint":
        missing = sorted(set(cs.get("started_not_finished", [])) | set(cs.get("not_started", [])) |
                         set(cs.get("failed", [])))
        text = f"{_ranks(missing)} never finished writing" if missing else "not every rank finished writing"
        cause = _cause(inc.root_cause)
        return f"{text}; {cause}" if cause else text
    if kind == "stalled_save":
        late = sorted(set(cs.get("started_not_finished", [])) | set(cs.get("not_started", [])))
        return f"no end of save from {_ranks(late)}" if late else "no end of save from every rank"
    if kind == "corrupt_checkpoint":
        detail = f": {cs['detail']}" if cs.get("detail") else ""
        counts = (f" ({cs.get('problems')} problem(s) in {cs.get('files')} files)"
                  if cs.get("problems") is not None and cs.get("files") is not None else "")
        return f"verification found it {cs.get('verdict') or 'bad'}{detail}{counts}"
    if kind == "poisoned_resume":
        return _broken_by(cs)
    if kind == "world_size_mismatch":
        saved, current = cs.get("saved_world_size"), cs.get("current_world_size")
        if saved and current:
            return f"saved at world size {saved}, loaded at world size {current}"
        return f"loaded at another world size than it was saved at ({', '.join(cs.get('errors', [])) or 'size mismatch'})"
    if kind == "load_failure" and cs.get("probe"):
        return _probe(cs["probe"])
    if kind == "load_failure":
        errors = ", ".join(cs.get("errors", [])) or "a load error"
        broken = f"; {_broken_by(cs)}" if cs.get("save_incident") else ""
        return f"{errors}{broken}"
    if kind == "post_resume_regression":
        return _regression(cs)
    return _cause(inc.root_cause) or kind


#: ckptwatch.probe's reasons (:data:`ckptwatch.probe.REASONS`) in words
PROBE_WORDS = {"constant": "constant", "not_finite": "not finite (NaN or inf)",
               "collapsed": "the same for every input", "flat": "flat (one value across each row's outputs)", "empty": "empty"}


def _probe(p: dict) -> str:
    """ckptwatch.probe's verdict in words: ``constant (std 0 over 8 rows, ckptwatch probe)``."""
    reason = str(p.get("reason"))
    if reason == "collapsed":
        detail = f"{p.get('distinct_rows')} distinct row(s) of {p.get('rows')}"
    elif reason == "not_finite":
        detail = f"{p.get('finite')} of the values finite"
    elif reason == "constant":
        detail = f"std {p.get('std')} over {p.get('rows')} rows"
    else:
        detail = f"{p.get('rows')} rows"
    return f"{PROBE_WORDS.get(reason, 'degenerate')} ({detail}, ckptwatch probe)"


def _broken_by(cs: dict) -> str:
    """What made a resumed or loaded checkpoint bad, from the ``checkpoint_state`` of a
    ``poisoned_resume`` or ``load_failure`` (see :mod:`.resume_incidents`)."""
    if cs.get("reason") == "never_finished":
        missing = cs.get("missing_ranks") or []
        who = f" on {_ranks(missing)}" if missing else ""
        return f"its save by job {cs.get('saved_by')} never finished{who}"
    bad_kind = cs.get("bad_kind") or cs.get("save_kind")
    bc = cs.get("bad_cause")
    cause = cause_phrase(bc.get("class"), bc.get("rank"), bc.get("host"), bc.get("signal"), bc.get("sender"),
                         bc.get("line")) if bc else None
    if bad_kind in ("interrupted_save", "storage_failure_during_save"):
        return f"its save was interrupted by {cause}" if cause else "its save was interrupted"
    if bad_kind == "partial_checkpoint":
        return "its save left it partial" + (f" ({cause})" if cause else "")
    if bad_kind == "stalled_save":
        return "its save stalled and never finished"
    if bad_kind == "corrupt_checkpoint":
        return "verification found it corrupt"
    return f"{bad_kind or 'an earlier incident'} marked it bad"


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _regression(cs: dict) -> str:
    before = cs.get("before_median")
    if cs.get("reason") == "not_finite":
        steps = cs.get("after_steps") or []
        at = f" from step {steps[0]}" if steps else ""
        return f"the loss became NaN/inf{at} (median {_fmt(before)} before)"
    if cs.get("reason") == "constant":
        return f"the loss stayed at {_fmt(cs.get('after_median'))} (it moved before, median {_fmt(before)})"
    return f"median loss {_fmt(before)} before, {_fmt(cs.get('after_median'))} after"


#: the fact of each kind: ``{at}`` the checkpoint (:func:`where`), ``{why}`` (:func:`why`),
#: ``{good}`` the last good checkpoint (:func:`last_good`)
_FACT = {
    "interrupted_save": "save of {at} cut off by {why}; {good}",
    "storage_failure_during_save": "save of {at} failed on storage: {why}; {good}",
    "partial_checkpoint": "checkpoint {at} is partial: {why}; {good}",
    "stalled_save": "save of {at} has stalled: {why}",
    "corrupt_checkpoint": "checkpoint {at}: {why}; {good}",
    "poisoned_resume": "resumed from a bad checkpoint, {at}: {why}; {good}",
    "load_failure": "loading {at} failed: {why}",
    "world_size_mismatch": "{at} {why}",
    "post_resume_regression": "after resuming from {at}, {why}",
}
_AFTER_LOAD = "after loading {at}, the first use failed: {why}"
_PROBED = "after loading {at}, the outputs are {why}; {good}"


def headline(inc: Incident) -> str:
    """``<kind>: job <job>: <fact>`` (see the module docstring); no ``None`` in it."""
    fmt = _FACT.get(inc.kind, "{at}: {why}")
    cs = inc.checkpoint_state or {}
    if inc.kind == "load_failure" and cs.get("probe"):
        fmt = _PROBED
    elif inc.kind == "load_failure" and cs.get("after_load"):
        fmt = _AFTER_LOAD
    if inc.kind == "load_failure" and "{good}" not in fmt and (inc.last_good_checkpoint or {}).get("step") is not None:
        fmt += "; {good}"  # where to resume from, when it is known
    fact = fmt.format(at=where(inc), why=why(inc), good=last_good(inc.last_good_checkpoint))
    return f"{inc.kind}: job {inc.job or '(unnamed)'}: {fact}"
