"""Data contracts shared by every stage (see DESIGN.md, "Contracts").

Two tabular schemas travel between stages as polars DataFrames:

* ``RECORD_SCHEMA``: one row per *source record* (a log line, or a multiline group such
  as a Python traceback joined with ``"\\n"``), produced by :mod:`ckptwatch.ingest`.
* ``EVENT_SCHEMA``: one row per *event*, produced by :mod:`ckptwatch.rules` from the
  records that match a rule. ``(source_id, offset)`` identifies an event: a record gives
  at most one event, and re-reading the same bytes gives the same key.

Timestamps are ``Datetime("ns", "UTC")``: event time in UTC with nanosecond precision.
``ts_source`` says where the time came from: ``line`` (parsed from the record itself),
``inherited`` (the previous record of the same stream), ``mtime`` (the file's
modification time, when nothing earlier in the stream had a time) or ``rule`` (a
timestamp captured by the rule, e.g. torchrun's ``time : 2026-11-30_10:21:21``).
"""

from __future__ import annotations

import polars as pl

TS = pl.Datetime("ns", "UTC")

RECORD_SCHEMA: dict[str, pl.DataType] = {
    "source_id": pl.Utf8,  # stable id of the file (see ingest.identity)
    "source_kind": pl.Utf8,  # console | worker | kernel | log
    "file": pl.Utf8,  # file path as read
    "stream": pl.Utf8,  # sub-stream inside the file, e.g. "default2" on a torchrun console
    "offset": pl.Int64,  # byte offset of the record's first line in the file
    "job": pl.Utf8,
    "host": pl.Utf8,
    "rank": pl.Int32,
    "local_rank": pl.Int32,
    "pid": pl.Int64,  # from a label (Ray's ``(Actor pid=N)``, a JSON field); rules may capture one too
    "ts": TS,
    "ts_source": pl.Utf8,
    "ts_year_guessed": pl.Boolean,  # a year-less stamp dated with the year of the file's mtime
    "ingest_ts": TS,
    "line": pl.Utf8,  # the record text, prefixes ([default2]:, [rank2]:) removed
}

EVENT_SCHEMA: dict[str, pl.DataType] = {
    "ts": TS,
    "ts_source": pl.Utf8,
    "job": pl.Utf8,
    "host": pl.Utf8,
    "rank": pl.Int32,
    "local_rank": pl.Int32,
    "pid": pl.Int64,
    "kind": pl.Utf8,
    "step": pl.Int64,
    "path": pl.Utf8,
    "rule_id": pl.Utf8,
    "attrs": pl.Utf8,  # JSON object: every other named group of the rule, plus the rule's static attrs
    "source_id": pl.Utf8,
    "source_kind": pl.Utf8,
    "offset": pl.Int64,
    "line": pl.Utf8,
    "dedup_key": pl.Utf8,  # equal for the same worker line seen twice (console --tee + per-rank file)
}

#: Event kinds (DESIGN.md). Rules may only emit these.
EVENT_KINDS = frozenset(
    {
        "save_start",
        "save_end",
        "save_error",
        "load_start",
        "load_end",
        "resume",
        "process_exit",
        "agent_signal",  # torchrun sends a signal to a worker while tearing the group down
        "job_signal",  # the job (launcher or a rank) got a signal from outside: scheduler, operator
        "cuda_oom",  # a rank ran out of GPU memory (torch.OutOfMemoryError)
        "host_memory",  # host memory ran out inside a process (MemoryError, std::bad_alloc, ENOMEM)
        "native_crash",  # a native crash: SIGSEGV, SIGBUS, Fatal Python error, an abort from C++
        "exception",  # an uncaught exception raised by save or load code (a traceback through it)
        "oom_kill",
        "collective_timeout",
        "collective_error",
        "node_lost",
        "storage_error",
        "gpu_xid",
        "load_error",
        "metric",
        "integrity",
        "world_size",
        "job_failed",  # torchrun's ChildFailedError summary: the job ended in failure
        "job_end",  # a job ended normally (training finished)
        "retry",  # a client retried (botocore): not a failure, kept as context
    }
)

#: Named groups that become event columns; every other named group goes into ``attrs``.
EVENT_COLUMNS_FROM_GROUPS = ("job", "host", "rank", "local_rank", "pid", "step", "path", "ts")


def empty_records() -> pl.DataFrame:
    """An empty DataFrame with :data:`RECORD_SCHEMA`."""
    return pl.DataFrame(schema=RECORD_SCHEMA)


def empty_events() -> pl.DataFrame:
    """An empty DataFrame with :data:`EVENT_SCHEMA`."""
    return pl.DataFrame(schema=EVENT_SCHEMA)
