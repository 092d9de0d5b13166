"""The detectors' view of an event: a frozen dataclass built from an EVENT_SCHEMA row."""

from __future__ import annotations

import datetime as dt
import json
import re
import sys
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from ckptwatch.naming import names_checkpoint

#: Kinds that are evidence of something going wrong (candidates for root cause or collateral).
FAILURE_KINDS = frozenset(
    {"process_exit", "agent_signal", "oom_kill", "collective_timeout", "collective_error", "storage_error",
     "gpu_xid", "node_lost", "job_failed", "save_error", "job_signal", "cuda_oom", "host_memory", "native_crash",
     "exception"}
)
#: Kinds of a job loading a checkpoint: what the resume detectors read.
LOAD_KINDS = frozenset({"load_start", "resume", "load_end"})
LOADING_KINDS = LOAD_KINDS | {"load_error"}
#: Kinds reported by a host rather than a job (kernel, storage); joined to jobs by host and pid.
HOST_KINDS = frozenset({"oom_kill", "gpu_xid", "storage_error", "node_lost"})


def is_host_event(kind: str, rank: int | None, local_rank: int | None) -> bool:
    """A kernel / storage line, whatever file it came from: it names no rank, so it is joined
    to jobs by host and pid rather than routed by its own job."""
    return kind in HOST_KINDS and rank is None and local_rank is None


def host_event_expr() -> pl.Expr:
    """:func:`is_host_event` over a frame of events (``kind``, ``rank``, ``local_rank``): Boolean."""
    return pl.col("kind").is_in(list(HOST_KINDS)) & pl.col("rank").is_null() & pl.col("local_rank").is_null()

_SIGNALS = {1: "SIGHUP", 2: "SIGINT", 3: "SIGQUIT", 4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE",
            9: "SIGKILL", 11: "SIGSEGV", 13: "SIGPIPE", 15: "SIGTERM"}


#: A shell's or srun's description of a death by signal (bash ``strsignal``, srun task states).
_SIGWORDS = {"Killed": "SIGKILL", "Terminated": "SIGTERM", "Aborted": "SIGABRT", "Segmentation fault": "SIGSEGV",
             "Bus error": "SIGBUS", "Hangup": "SIGHUP", "Interrupt": "SIGINT"}


def signal_name(exitcode: int | None) -> str | None:
    """torchrun reports death by signal N as exit code -N: ``-9`` -> ``"SIGKILL"``."""
    if exitcode is None or exitcode >= 0:
        return None
    return _SIGNALS.get(-exitcode, f"signal {-exitcode}")


def _interned(value: str | None) -> str | None:
    return None if value is None else sys.intern(value)


#: the lines Python puts between the tracebacks of chained exceptions
_CHAINED = ("During handling of the above exception", "The above exception was the direct cause")


@dataclass(frozen=True, slots=True)
class Ev:
    """One event. ``ts`` is UTC; ``attrs`` is the decoded JSON object."""

    ts: dt.datetime
    kind: str
    job: str | None
    host: str | None
    rank: int | None
    local_rank: int | None
    pid: int | None
    step: int | None
    path: str | None
    rule_id: str
    source_id: str
    offset: int
    line: str
    dedup_key: str
    ts_source: str = "line"
    source_kind: str = "log"
    attrs: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Ev:
        """Build from a dict with EVENT_SCHEMA keys (``attrs`` as a JSON string).

        A job keeps its save lines as events for as long as it runs, so the labels every
        event of a job repeats (kind, rule, job, host, source, attribute names) are interned:
        one string each, not one per event (about a third of an event's memory)."""
        attrs = row.get("attrs") or "{}"
        attrs = json.loads(attrs) if isinstance(attrs, str) else dict(attrs)
        return cls(
            ts=row["ts"], kind=sys.intern(row["kind"]), job=_interned(row.get("job")), host=_interned(row.get("host")),
            rank=row.get("rank"), local_rank=row.get("local_rank"), pid=row.get("pid"), step=row.get("step"),
            path=row.get("path"), rule_id=sys.intern(row["rule_id"]), source_id=sys.intern(row["source_id"]),
            offset=row["offset"], line=row["line"],
            dedup_key=row.get("dedup_key") or f"{row['source_id']}:{row['offset']}",
            ts_source=sys.intern(row.get("ts_source") or "line"),
            source_kind=sys.intern(row.get("source_kind") or "log"),
            attrs={sys.intern(k): v for k, v in attrs.items()},
        )

    @property
    def ref(self) -> tuple[str, int]:
        """``(source_id, offset)``: the event's identity."""
        return (self.source_id, self.offset)

    @property
    def exitcode(self) -> int | None:
        """The ``exitcode`` attribute as an int; None when absent or not a whole number
        (an event from elsewhere may carry any JSON value there)."""
        v = self.attrs.get("exitcode")
        if isinstance(v, bool) or v is None:
            return None
        try:
            return int(v)
        except (TypeError, ValueError, OverflowError):
            return None

    @property
    def signal(self) -> str | None:
        """The signal the event's process died of or received: named in the line, as a
        signal number, as a shell's word for it ("Killed"), as torchrun's negative exit
        code, or as a launcher's or shell's exit status 128+N."""
        a = self.attrs
        if a.get("signal"):
            return str(a["signal"])
        sig = a.get("sig")
        if isinstance(sig, str) and sig.startswith("SIG"):
            return sig
        if isinstance(sig, int):
            return signal_name(-sig)
        if a.get("sigword") in _SIGWORDS:
            return _SIGWORDS[a["sigword"]]
        if isinstance(a.get("signum"), int):
            return signal_name(-a["signum"])
        code = self.exitcode
        if code is not None and code > 128 and a.get("reporter") in ("shell", "launcher", "srun"):
            # 128+N for N a signal number (1..64); above that a program's own status (ssh's 255
            # for its own errors, pdsh passing on 250): no signal
            return signal_name(128 - code) if code <= 128 + 64 else None
        return signal_name(code)

    @property
    def died_of_signal(self) -> bool:
        """A process_exit that reports a death by signal (not a normal exit)."""
        return self.kind == "process_exit" and self.signal is not None and (self.exitcode is None or self.exitcode < 0
                                                                            or self.exitcode > 128)

    def first_line(self, limit: int = 240) -> str:
        """The most telling line of the record: for a traceback, its last exception line;
        cut after about ``limit`` characters (:func:`cut`)."""
        at = self.attrs.get("at_line")
        if isinstance(at, int) and 0 < at < len(self.line.splitlines()):  # the line the rule matched
            return cut(self.line.splitlines()[at].strip(), limit)
        lines = [x for x in self.line.splitlines() if x.strip()]
        if not lines:
            return ""
        pick = lines[0]
        # a traceback, or the chained part of one read as its own record ("During handling of
        # the above exception, another exception occurred:" ... "OSError: [Errno 28] ...")
        if pick.startswith(("Traceback", "Failures:", "Root Cause", "[", *_CHAINED)):
            for x in reversed(lines[1:]):  # none fits: the first line stays
                if x.startswith(_CHAINED):
                    continue  # the separator a chained exception's record ends with says nothing
                if not x.startswith((" ", "\t")) or "exitcode" in x:
                    pick = x.strip()
                    break
        return cut(pick, limit)


#: a run of non-space characters a cut does not split (a URL, a token): at most this long
_WORD = re.compile(r"\S{0,4096}")


def cut(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, but never inside a run of non-space
    characters (up to 4 KiB of it): a URL or token crossing the cut is kept whole, so
    redaction downstream still sees all of it (``s3://u:pw@host`` cut before its ``@``
    would show the password)."""
    if len(text) <= limit:
        return text
    m = _WORD.match(text, limit)
    return text[:limit + (len(m.group()) if m else 0)]


#: storage errors only a write raises (the storage rules' ``class``): out of space, over
#: quota, a read-only file system, a write that failed outright
WRITE_ERROR_CLASSES = frozenset({"no_space", "quota", "read_only", "write_failed"})


def in_save(e: Ev) -> bool:
    """``e`` says a save was under way: a failure whose traceback ran through save code
    (``attrs.during == "save"``), or an error only a write raises on a path named like a
    checkpoint or one of its files (``[Errno 28] No space left on device: '/ckpt/global_step40/
    …_optim_states.pt'``: the save of global_step40 failed, whether or not its save line was
    printed; wandb's on ``/tmp/wandb/…/output.log`` says nothing of a save)."""
    if e.kind not in FAILURE_KINDS:
        return False
    if e.attrs.get("during") == "save":
        return True
    return (e.kind == "storage_error" and e.attrs.get("class") in WRITE_ERROR_CLASSES
            and e.path is not None and names_checkpoint(e.path))


def task_ranks(tasks: object) -> set[int]:
    """The ranks of a launcher's task list (srun's ``0-3``, ``0,2-5``, ``[4-7]``, torchrun's
    ``4, 5, 6, 7``); empty for anything else. A list longer than 100,000 ranks is not expanded."""
    out: set[int] = set()
    if not isinstance(tasks, str):
        return out
    for part in tasks.strip("[]").split(","):
        lo, _, hi = part.strip().partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            return set()
        first, last = int(lo), int(hi or lo)
        if last < first or last - first > 100_000:
            return set()
        out.update(range(first, last + 1))
    return out
