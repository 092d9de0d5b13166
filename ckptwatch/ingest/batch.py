"""One pipeline per poll: the new lines of many files -> records, in a fixed number of
vectorized passes however many files changed.

A poll used to run the whole pipeline (unwrap, prefixes, grouping, timestamps, labels)
once per file: ~25 polars passes of fixed cost each, so 10,000 files of a few new lines
took minutes. Here every file's lines are one frame with a ``_t`` column (the file's
index in the poll), per-file settings and state are columns joined from a small table
(one row per file), and what depends on a file's order is computed ``over("_t")``. The
per-file state (:class:`~ckptwatch.ingest.tail.FileTail`'s ``held``, ``carry``,
``file_carry``, ``job``, ``layout``, ``rank_map``, ``stats``) is read before and updated
after, once per file, in plain Python.

:class:`Read` is what one file contributes; :func:`emit` turns a poll's reads into
records (:data:`ckptwatch.schema.RECORD_SCHEMA`), in file order within each file and
the reads' order across files.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import polars as pl

from ckptwatch.frames import detached
from ckptwatch.ingest import glued, multiline, prefix, timestamps, tracebacks
from ckptwatch.schema import RECORD_SCHEMA, TS

if TYPE_CHECKING:
    from ckptwatch.ingest.tail import FileTail

_JOB_MENTION = r"(?:run_id\s*:\s*|job_id=|job id )(?P<job>[A-Za-z0-9][\w.:-]*)"
# a torchrun agent's glog line: its pid, and a worker's local rank it reports on
# (torch/distributed/elastic/multiprocessing/api.py: "failed (exitcode: -9) local_rank: 2 (pid: …)")
_AGENT_LOCAL = r"\blocal_rank: (?P<lr>\d+)"


@dataclass
class Read:
    """One file's part of a poll: ``lines`` (``(offset, text)``, file order) read now,
    to be put after the file's held-back lines, or ``block`` (the same as a frame:
    ``offset``, ``line``; a read split in bulk, see :mod:`ckptwatch.ingest.reader`);
    ``flush``: emit the last record of each stream too (the file ended, or was idle
    ``flush_after``); ``settled``: the file went quiet for ``settle_after``: emit the last
    record of each stream unless it may go on (:func:`.multiline.may_go_on`); ``mtime``:
    the file's mtime (UTC); ``emitted``: records already made
    during the read (the held-back lines of a generation the file's truncation ended)."""

    tail: FileTail
    lines: list[tuple[int, str]]
    flush: bool
    mtime: dt.datetime
    emitted: list[pl.DataFrame] = field(default_factory=list)
    block: pl.DataFrame | None = None
    settled: bool = False

    @property
    def count(self) -> int:
        """How many lines were read."""
        return self.block.height if self.block is not None else len(self.lines)

    def texts(self) -> list[str] | pl.Series:
        """The lines' text, file order (a Series for a read split in bulk)."""
        return self.block["line"] if self.block is not None else [x for _, x in self.lines]


def emit(reads: Sequence[Read], *, now: dt.datetime) -> pl.DataFrame:
    """Records of ``reads`` (RECORD_SCHEMA): every read's new lines split into prefixes and
    streams, put after its file's held-back lines, grouped into records (holding back
    the last of each stream unless ``flush``), dated and labelled; updates each file's
    state. ``now``: wall-clock time of the poll (UTC)."""
    frames = [f for r in reads for f in r.emitted]
    active = [r for r in reads if r.tail.source_id is not None and (r.count or not r.tail.held.is_empty())]
    if active:
        lines = _with_held(active, _split(active))
        frames.append(records_of([r.tail for r in active], lines, [r.flush for r in active],
                                 [r.mtime for r in active], now=now, settled=[r.settled for r in active]))
    frames = [f for f in frames if not f.is_empty()]
    return pl.concat(frames) if frames else pl.DataFrame(schema=RECORD_SCHEMA)


#: lines one sniff looks at; lines of a file after which "no label prefix" is final; its
#: newest lines kept while undecided
SNIFF_LINES, SNIFF_UNTIL, SNIFF_KEEP = 500, 5_000, 64
_TASK_START = re.compile(prefix.TASK_PREFIX_RE)


def _undecided(t: FileTail) -> bool:
    """The file's label prefixes are still to be sniffed (see :func:`_sniff`)."""
    return t.layout is None or (not prefix.labelled(t.layout) and t.sniffed < SNIFF_UNTIL)


def _sniff(t: FileTail, lines: list[str] | pl.Series, *, candidates: bool) -> None:
    """Decide the file's label prefixes (:func:`prefix.sniff`) from its first lines; while
    none is found (for its first :data:`SNIFF_UNTIL` lines), again from the first line that
    looks labelled by srun (``N: ``) whenever new ones come (``candidates``: ``lines`` hold
    one): a Slurm output file starts with the batch script's unlabelled banner, ``pip
    freeze`` or an environment dump, and a live tail's first read may hold nothing else.
    Once found, a layout stays."""
    if t.layout is None:
        t.layout = dataclasses.replace(prefix.sniff(_listed(lines[:SNIFF_LINES])), template=t.line_prefix)
        if prefix.labelled(t.layout):
            return
    t.sniffed += len(lines)
    if not candidates and not t.sniff_buf:
        # no line srun may have labelled so far: the next sniff starts at one in lines to come,
        # so nothing need be kept (6,080 unlabelled files kept 64 lines each: 70 MB)
        return
    pool = lines if len(lines) >= SNIFF_LINES else (t.sniff_buf + _listed(lines))[-SNIFF_LINES:]
    t.sniff_buf = _listed(pool[-SNIFF_KEEP:]) if t.sniffed < SNIFF_UNTIL else []
    if not candidates:
        return
    if isinstance(pool, pl.Series):
        first = pool.str.contains(f"^(?:{prefix.TASK_PREFIX_RE})").arg_true()
        start = int(first[0]) if len(first) else 0
    else:
        start = next((i for i, x in enumerate(pool) if _TASK_START.match(x)), 0)
    again = prefix.sniff(_listed(pool[start:start + SNIFF_LINES]))
    if prefix.labelled(again):
        t.layout = dataclasses.replace(again, template=t.line_prefix)
        t.sniff_buf = []


def _listed(lines: list[str] | pl.Series) -> list[str]:
    return lines.to_list() if isinstance(lines, pl.Series) else lines


def _split(reads: Sequence[Read]) -> pl.DataFrame:
    """The reads' new lines (``_t``, ``offset``, ``line``), each file's hard-wrapped lines
    joined, prefixes split by the file's layout, with ``stream_key``; learns each file's
    layout (first lines) and rank map (torchrun's rendezvous lines)."""
    n = [len(r.lines) for r in reads]
    raw = pl.DataFrame(
        {"_t": [i for i, k in enumerate(n) for _ in range(k)],
         "offset": [o for r in reads for o, _ in r.lines],
         "line": [x for r in reads for _, x in r.lines]},
        schema={"_t": pl.Int32, "offset": pl.Int64, "line": pl.Utf8},
    )
    blocks = [r.block.select(pl.lit(i, dtype=pl.Int32).alias("_t"), "offset", "line")
              for i, r in enumerate(reads) if r.block is not None]
    if blocks:  # reads split in bulk; a file's lines stay together, files in the reads' order
        mixed = not raw.is_empty()
        raw = pl.concat([raw, *blocks])
        if mixed:
            raw = raw.sort("_t", maintain_order=True)
    undecided = [i for i, r in enumerate(reads) if r.count and _undecided(r.tail)]
    if undecided:  # which of them hold a line srun may have labelled: one pass over the batch
        labelled = _files_with(raw.filter(pl.col("_t").is_in(undecided)), prefix.TASK_PREFIX_RE, literal=False)
        for i in undecided:
            _sniff(reads[i].tail, reads[i].texts(), candidates=i in labelled)
    if raw.is_empty():
        return raw.with_columns(stream_key=pl.lit(None, dtype=pl.Utf8))
    raw = glued.split_glued(raw, by="_t")  # a record pasted behind a progress bar (its \r lost)
    _learn_outer(reads, raw)
    raw = multiline.unwrap(raw, by="_t")
    # a file whose agent runs a node whose local ranks are not the global ones: a lone
    # ``[rankN]:`` prefix is ``--tee`` with ``--role rank``, a local rank
    rendezvous = _files_with(raw, "global_ranks=")
    multi = {i for i, r in enumerate(reads) if r.tail.multi_node(raw.filter(pl.col("_t") == i)
                                                                 if i in rendezvous else None)}
    groups: dict[tuple[prefix.PrefixLayout, bool], list[int]] = {}
    for i, r in enumerate(reads):
        groups.setdefault((r.tail.layout or prefix.PrefixLayout(), i in multi), []).append(i)
    if len(groups) == 1:
        ((layout, local),) = groups
        split = prefix.split_prefixes(raw, layout=layout, rank_prefix_is_local=local)
    else:
        parts = [prefix.split_prefixes(raw.filter(pl.col("_t").is_in(idx)), layout=layout, rank_prefix_is_local=local)
                 for (layout, local), idx in groups.items()]
        split = pl.concat(parts).sort("_t", "offset", maintain_order=True)
    for i in _files_with(raw, "_ranks="):  # local_ranks= and global_ranks= (a poll may end between them)
        reads[i].tail.learn_rank_map(split.filter(pl.col("_t") == i))
    split = tracebacks.normalize(split, by="_t")  # IPython, Colab and Rich tracebacks in CPython's shape
    sids = pl.Series([r.tail.source_id for r in reads], dtype=pl.Utf8)
    return split.with_columns(
        pl.concat_str([pl.lit(sids).gather(pl.col("_t")), pl.lit(":"), pl.col("prefix_stream")]).alias("stream_key"))


#: a traceback's header, a frame or a rank label behind something else on its line
_WRAPPED_ANCHOR = r'\S[^\n]*?(?:Traceback \(most recent call last\)|\sFile "[^"\n]+", line \d|\[(?:rank|default|trainer)\d+\]:)'


def _learn_outer(reads: Sequence[Read], raw: pl.DataFrame) -> None:
    """Learn the wrappers nobody registered (:func:`prefix.learn_outer`) of the files whose
    new lines show a traceback or a rank label behind something else, until one is learned."""
    # a file labelled by a registered launcher (pdsh, srun, a template) is read by its labels
    want = [i for i, r in enumerate(reads) if r.count and r.tail.layout is not None and not r.tail.layout.outer
            and not prefix.labelled(r.tail.layout) and not r.tail.layout.template]
    if not want:
        return
    cand = raw.filter(pl.col("_t").is_in(want))
    for i in _files_with(cand.filter(pl.col("line").str.contains_any(["Traceback", 'File "', "]:"])),
                         _WRAPPED_ANCHOR, literal=False):
        learned = prefix.learn_outer(cand.filter(pl.col("_t") == i)["line"])
        if learned:
            reads[i].tail.layout = dataclasses.replace(reads[i].tail.layout, outer=learned)


def _files_with(frame: pl.DataFrame, pattern: str, *, literal: bool = True) -> set[int]:
    """The ``_t`` of the files with a line containing ``pattern`` (a regex unless ``literal``)."""
    hit = frame.filter(pl.col("line").str.contains(pattern, literal=literal))
    return set(hit["_t"].unique().to_list()) if hit.height else set()


def _with_held(reads: Sequence[Read], new: pl.DataFrame) -> pl.DataFrame:
    """Each file's held-back lines, then the new lines (a stream's older lines first)."""
    held = [(i, r.tail.held) for i, r in enumerate(reads) if not r.tail.held.is_empty()]
    if not held:
        return new
    frames = [h for _, h in held]
    try:  # one schema (most polls): a vertical concat, 10x the diagonal one over 10,000 files
        old = pl.concat(frames, how="vertical", rechunk=False)
    except (pl.exceptions.SchemaError, pl.exceptions.ShapeError, pl.exceptions.ColumnNotFoundError):
        old = pl.concat(frames, how="diagonal_relaxed")
    old = old.with_columns(pl.Series("_t", [i for i, h in held for _ in range(h.height)], dtype=pl.Int32))
    return pl.concat([old, new], how="diagonal_relaxed")


def records_of(tails: Sequence[FileTail], lines: pl.DataFrame, flush: Sequence[bool],
               mtimes: Sequence[dt.datetime], *, now: dt.datetime,
               settled: Sequence[bool] | None = None) -> pl.DataFrame:
    """Group ``lines`` (split lines with ``_t``: an index into ``tails``; a file's
    held-back lines first) into records, date and label them; sets each file's
    ``held`` (and carries, job, counters). ``settled``: per file, see :attr:`Read.settled`."""
    info = _info(tails, flush, mtimes, settled or [False] * len(tails))
    lines = lines.join(info.select("_t", "_flush", "_settled"), on="_t", how="left", maintain_order="left")
    records, held = multiline.group_lines(lines, final=all(flush), flush_col="_flush", settle_col="_settled",
                                          order=("_t", "offset"))
    keep = [c for c in held.columns if c not in ("_t", "_flush", "_settled")]
    # held lines outlive the poll: copied out of its buffers (a few lines of an idle file
    # would otherwise keep the whole poll's text, see ckptwatch.frames.detached)
    # (one partition in Rust, then no per-file polars call: 10,000 files' ``select`` took 1.2 s)
    by_file = (detached(held.select(["_t", *keep])).partition_by("_t", as_dict=True, include_key=False)
               if held.height else {})
    nothing = pl.DataFrame()
    for i, tail in enumerate(tails):
        tail.held = by_file.get((i,), nothing)
    if records.is_empty():
        return pl.DataFrame(schema=RECORD_SCHEMA)
    records = records.drop("_flush", "_settled").join(info.drop("_settled"), on="_t", how="left", maintain_order="left")
    boot_time = tails[0].boot_time
    carry = {k: v for t in tails for k, v in t.carry.items()}
    records = _dated(records, held, carry=carry, boot_time=boot_time, now=now)
    _learn_times(tails, records, count_uptime=boot_time is None)
    records = _with_jobs(records)
    rank = [pl.col("prefix_rank"), prefix.inline_rank(pl.col("line"))]
    local = pl.coalesce(pl.col("_lab_local"), pl.col("prefix_local_rank"))
    rank_map = {f"{i}|{k}": v for i, t in enumerate(tails) for k, v in t.rank_map.items()}
    if rank_map:  # a worker's local rank, or the one an agent's line reports on, mapped
        agent_pid = pl.col("line").str.extract(prefix.AGENT_PID, 1)
        agent_local = pl.when(agent_pid.is_not_null()).then(pl.col("line").str.extract(_AGENT_LOCAL, 1))
        node = prefix.node_key(pl.col("_lab_host"))
        keys = [pl.format("{}|pid:{}|{}", pl.col("_t"), agent_pid, agent_local),  # the agent's own pid first
                pl.format("{}|{}|{}", pl.col("_t"), node, pl.coalesce(local.cast(pl.Utf8), agent_local))]
        rank += [k.replace_strict(rank_map, default=None, return_dtype=pl.Int32) for k in keys]
    out = records.select(
        pl.col("_sid").alias("source_id"),
        pl.col("_kind").alias("source_kind"),
        pl.col("_file").alias("file"),
        pl.col("stream_key").str.split_exact(":", 1).struct.field("field_1").alias("stream"),
        pl.col("offset"),
        pl.col("job"),
        # a user's path template says what the path means: its labels win over prefixes
        pl.coalesce(pl.col("_lab_host"), pl.col("prefix_host")).alias("host"),
        pl.coalesce(pl.col("_lab_rank"), pl.coalesce(rank)).cast(pl.Int32).alias("rank"),
        local.cast(pl.Int32).alias("local_rank"),
        pl.col("prefix_pid").alias("pid"),
        pl.col("ts"),
        pl.col("ts_source"),
        pl.col("ts_year_guessed"),
        pl.lit(now).cast(TS).alias("ingest_ts"),
        pl.col("line"),
        pl.col("_t"),
        pl.col("_named"),
    )
    last_job = out.filter(pl.col("_named").is_not_null()).group_by("_t").agg(pl.col("_named").last())
    for i, j in last_job.iter_rows():
        tails[i].job = j
    for i, n in out.group_by("_t").len().iter_rows():
        tails[i].stats.records += n
    return out.drop("_t", "_named").cast(RECORD_SCHEMA)  # type: ignore[arg-type]


def _info(tails: Sequence[FileTail], flush: Sequence[bool], mtimes: Sequence[dt.datetime],
          settled: Sequence[bool]) -> pl.DataFrame:
    """One row per file: its index ``_t``, settings, labels and the state the records need."""
    labs = [t.labels for t in tails]
    return pl.DataFrame({
        "_t": list(range(len(tails))),
        "_flush": list(flush),
        "_settled": list(settled),
        "_sid": [t.source_id for t in tails],
        "_kind": [lab.source_kind for lab in labs],
        "_file": [t.path for t in tails],
        "_mtime": [m.astimezone(dt.timezone.utc) for m in mtimes],
        "_fcarry": [t.file_carry for t in tails],
        "_lab_host": [lab.host for lab in labs],
        "_lab_rank": [lab.rank for lab in labs],
        "_lab_local": [lab.local_rank for lab in labs],
        # a path label or a worker's file: the job is known, lines do not name it
        "_labelled": [lab.job is not None or lab.source_kind == "worker" for lab in labs],
        "_job": [t.job or t.family_job() for t in tails],
        "_fallback": [lab.fallback_job for lab in labs],
        "_fam": [id(t.family) for t in tails],  # the watcher's rotation families (a lone file: its own)
    }, schema={"_t": pl.Int32, "_flush": pl.Boolean, "_settled": pl.Boolean, "_sid": pl.Utf8, "_kind": pl.Utf8, "_file": pl.Utf8,
               "_mtime": TS, "_fcarry": TS, "_lab_host": pl.Utf8, "_lab_rank": pl.Int32, "_lab_local": pl.Int32,
               "_labelled": pl.Boolean, "_job": pl.Utf8, "_fallback": pl.Utf8, "_fam": pl.Int64})


def _dated(records: pl.DataFrame, held: pl.DataFrame, *, carry: dict[str, dt.datetime],
           boot_time: dt.datetime | None, now: dt.datetime) -> pl.DataFrame:
    """``records`` (in ``(_t, offset)`` order) with their event time
    (:func:`~ckptwatch.ingest.timestamps.add_event_time`). The lines held back for the next
    poll (each stream's last record) take part as context only: a record of a stream that
    prints no time is dated by the file's previous time, and that may be a held line's (an
    ``srun --label`` console: ``srun: error: task 5: Killed`` after the ranks' last, held,
    lines; without them it took a time 8 s older, as no single read of the file would). A
    wrapper learned from the file (:attr:`prefix.PrefixLayout.outer`: a container runtime's
    time) dates the record as if it were still in front of the line."""
    text = "line"  # what the time is read from
    if "prefix_outer" in records.columns and records["prefix_outer"].is_not_null().any():
        text = "_time_text"
        in_front = pl.concat_str([pl.col("prefix_outer").fill_null(""), pl.col("line")]).alias(text)
        records = records.with_columns(in_front)
        if {"prefix_outer", "line"} <= set(held.columns):
            held = held.with_columns(in_front)
        elif "line" in held.columns:
            held = held.with_columns(pl.col("line").alias(text))
    helpers = [text] if text != "line" else []
    if held.is_empty() or "offset" not in held.columns or text not in held.columns:
        return timestamps.add_event_time(records, text_col=text, carry=carry, boot_time=boot_time, now=now,
                                         mtime_col="_mtime", file_col="_t", file_carry_col="_fcarry").drop(helpers)
    context = (held.select("_t", "offset", text)
               .join(records.select("_t", "_mtime", "_fcarry").unique("_t"), on="_t", how="inner")
               .with_columns(pl.format("\x00held:{}", pl.col("offset")).alias("stream_key"),  # a stream of its own
                             pl.lit(True).alias("_context")))
    if context.is_empty():
        return timestamps.add_event_time(records, text_col=text, carry=carry, boot_time=boot_time, now=now,
                                         mtime_col="_mtime", file_col="_t", file_carry_col="_fcarry").drop(helpers)
    # dated on the few columns it reads (the records' others would be copied by the concat
    # and the sort), then put back beside the records by row number
    cols = ["_t", "offset", text, "stream_key", "_mtime", "_fcarry"]
    narrow = records.select(cols).with_columns(pl.lit(False).alias("_context"),
                                               pl.int_range(pl.len(), dtype=pl.UInt32).alias("_row"))
    both = pl.concat([narrow, context.select(*cols, "_context")], how="diagonal_relaxed")
    dated = timestamps.add_event_time(both.sort("_t", "offset", maintain_order=True), text_col=text, carry=carry,
                                      boot_time=boot_time, now=now, mtime_col="_mtime", file_col="_t",
                                      file_carry_col="_fcarry")
    times = dated.filter(~pl.col("_context")).sort("_row").drop(*cols, "_context", "_row")
    return records.hstack(times).drop(helpers)


def _learn_times(tails: Sequence[FileTail], records: pl.DataFrame, *, count_uptime: bool) -> None:
    """Each file's counters (stamps rejected, kernel stamps without a boot time) and what
    the next poll continues from: the last time read from a line, per stream and per file
    (a stream that never prints one moves on with the mtime)."""
    counts = records.group_by("_t").agg(
        pl.col("ts_rejected").sum().alias("rejected"),
        (pl.col("line").str.contains(timestamps.KERNEL_RE).sum() if count_uptime else pl.lit(0)).alias("uptime"))
    for i, rejected, uptime in counts.iter_rows():
        tails[i].stats.ts_rejected += int(rejected)
        tails[i].stats.uptime_no_boot += int(uptime)
    # times read from lines only: a time a record inherited (from its file's order, or the
    # next line) carried as its stream's would date that stream's next record, in a later
    # read, before the file's newer times (one read of the whole file dates it after them)
    dated = records.filter(pl.col("ts_source") == "line")
    if dated.is_empty():
        return
    for i, key, ts in dated.group_by("_t", "stream_key").agg(pl.col("ts").last()).iter_rows():
        tails[i].carry[key] = ts
    for i, ts in dated.group_by("_t").agg(pl.col("ts").last()).iter_rows():
        tails[i].file_carry = ts


def _with_jobs(records: pl.DataFrame) -> pl.DataFrame:
    """``records`` with ``job``, and ``_named``: what the file's lines say the job is.

    The job is a path label; else a JSON field; else the last line of the file that named
    one (``run_id : …``, ``job_id=…``; lines before the file's first such line take it
    too), carried across polls in the file's ``job``; else the file name's (Slurm's
    ``slurm-<jobid>.out``). ``_named`` (null for labelled files) gives each file's ``job``
    for the next poll: its last non-null value."""
    if records["_labelled"].all():
        return records.with_columns(pl.coalesce(pl.col("prefix_job"), pl.col("_job")).alias("job"),
                                    pl.lit(None, dtype=pl.Utf8).alias("_named"))
    mention = pl.col("line").str.extract(_JOB_MENTION, 1)
    records = records.with_columns(
        pl.when(~pl.col("_labelled") & (mention != "none")).then(mention)  # torchrun's default run id names no job
        .forward_fill().over("_t").alias("_named"))
    named = (pl.when(pl.col("_job").is_not_null()).then(pl.col("_named").fill_null(pl.col("_job")))
             .otherwise(pl.col("_named").backward_fill().over("_t")).fill_null(pl.col("_fallback")))
    records = records.with_columns(pl.when(~pl.col("_labelled")).then(named).alias("_named"))
    # a new generation of a rotated file read in the same poll as the one that names the job
    records = records.with_columns(pl.when(~pl.col("_labelled")).then(
        pl.col("_named").fill_null(pl.col("_named").drop_nulls().first().over("_fam"))).alias("_named"))
    return records.with_columns(
        pl.coalesce(pl.col("prefix_job"), pl.when(pl.col("_labelled")).then(pl.col("_job")).otherwise(pl.col("_named")))
        .alias("job"))
