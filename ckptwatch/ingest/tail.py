"""Per-file tailing state: read new complete lines, label them, group them, date them.

:class:`FileTail` is the only stateful piece of ingest. One instance follows one file:

* ``offset``: the next byte to read;
* ``held``: lines read but not yet emitted (the last, possibly unfinished, record of
  each stream); ``committed_offset`` never passes the first of them, so a restart from
  ``committed_offset`` re-reads them and nothing is lost;
* ``carry``: the last event time of each stream, for records without their own time;
* ``job``: the job of a console file, once a line has named it.

``poll()`` returns a records DataFrame with :data:`ckptwatch.schema.RECORD_SCHEMA`.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from dataclasses import dataclass, field

import polars as pl

from ckptwatch.ingest import identity, layout, multiline, prefix, reader, timestamps
from ckptwatch.schema import RECORD_SCHEMA, TS

_JOB_MENTION = r"(?:run_id\s*:\s*|job_id=|job id )(?P<job>[A-Za-z0-9][\w.:-]*)"


@dataclass
class TailStats:
    """Counters for one file; ``skipped`` maps reason -> count."""

    lines: int = 0
    records: int = 0
    invalid_utf8: int = 0
    skipped: dict[str, int] = field(default_factory=dict)

    def skip(self, reason: str, n: int = 1) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + n


class InputError(Exception):
    """A file that cannot be read as a log; the message names the file and the reason."""


class FileTail:
    """Follows one log file. Not thread-safe; one owner at a time."""

    def __init__(
        self,
        path: str,
        *,
        template: re.Pattern[str] | None = None,
        offset: int = 0,
        boot_time: dt.datetime | None = None,
        max_line_bytes: int = reader.DEFAULT_MAX_LINE_BYTES,
        flush_after: float = 2.0,
        job: str | None = None,
    ) -> None:
        self.path = path
        self.labels = layout.labels_for(path, template)
        self.job = self.labels.job or job  # ``job``: learned from the file's lines before a restart
        self.offset = offset
        self.source_id: str | None = None
        self.boot_time = boot_time
        self.max_line_bytes = max_line_bytes
        self.held = pl.DataFrame()
        self.carry: dict[str, dt.datetime] = {}
        self.stats = TailStats()
        self.flush_after = flush_after
        self._last_growth: dt.datetime | None = None

    @property
    def committed_offset(self) -> int:
        """The offset from which a restart loses nothing: the first held-back line, else ``offset``."""
        if self.held.is_empty():
            return self.offset
        return int(self.held["offset"].min())

    def poll(self, *, final: bool = False, ingest_ts: dt.datetime | None = None) -> pl.DataFrame:
        """Read what was appended since the last poll and return its complete records.

        Args:
            final: the file will not grow (``diagnose``, ``run --once``): emit everything,
                including a last line without newline and the last record of each stream.
                Without it, the last record of each stream is held back until the next
                line, or until the file has not grown for ``flush_after`` seconds.
            ingest_ts: wall-clock time of this read (UTC); defaults to now.

        Raises:
            InputError: the file is binary or cannot be read (message names the file).
        """
        try:
            if self.source_id is None:
                if reader.looks_binary(self.path):
                    raise InputError(f"{self.path}: binary data (NUL bytes in the first 8 KiB), not a text log; skipped")
                self.source_id = identity.source_id(self.path, final=final)
                if self.source_id is None:
                    return pl.DataFrame(schema=RECORD_SCHEMA)
            st = os.stat(self.path)
            if st.st_size < self.offset:  # truncated in place: start over
                self.offset = 0
                self.held = pl.DataFrame()
            res = reader.read_lines(self.path, self.offset, final=final, max_line_bytes=self.max_line_bytes)
        except OSError as e:
            raise InputError(f"{self.path}: cannot read: {e.strerror or e}") from None
        self.offset = res.next_offset
        self.stats.lines += len(res.lines)
        self.stats.invalid_utf8 += res.invalid_utf8
        for reason, _off, _n in res.skipped:
            self.stats.skip(reason)
        now = ingest_ts or dt.datetime.now(dt.timezone.utc)
        mtime = dt.datetime.fromtimestamp(st.st_mtime, dt.timezone.utc)
        new = pl.DataFrame(
            {"offset": [o for o, _ in res.lines], "line": [t for _, t in res.lines]},
            schema={"offset": pl.Int64, "line": pl.Utf8},
        )
        new = prefix.split_prefixes(new)
        new = new.with_columns(
            pl.concat_str(
                [pl.lit(self.source_id + ":"), pl.col("prefix_local_rank").cast(pl.Utf8).fill_null("-")]
            ).alias("stream_key")
        )
        if res.lines or self._last_growth is None:
            self._last_growth = now
        idle = (now - self._last_growth).total_seconds() >= self.flush_after
        lines = pl.concat([self.held, new], how="diagonal_relaxed") if not self.held.is_empty() else new
        records, self.held = multiline.group_lines(lines, final=final or idle)
        if records.is_empty():
            return pl.DataFrame(schema=RECORD_SCHEMA)
        records = records.with_columns(pl.lit(mtime).cast(TS).alias("mtime"))
        records = timestamps.add_event_time(records, carry=self.carry, boot_time=self.boot_time)
        last = records.group_by("stream_key").agg(pl.col("ts").last())
        self.carry.update(dict(zip(last["stream_key"].to_list(), last["ts"].to_list(), strict=True)))
        if self.job is None and self.labels.source_kind != "worker":
            found = records["line"].str.extract(_JOB_MENTION, 1).drop_nulls()
            if len(found):
                self.job = found[0]
        lab = self.labels
        out = records.select(
            pl.lit(self.source_id).alias("source_id"),
            pl.lit(lab.source_kind).alias("source_kind"),
            pl.lit(self.path).alias("file"),
            pl.col("stream_key").str.split(":").list.get(1).alias("stream"),
            pl.col("offset"),
            pl.lit(self.job, dtype=pl.Utf8).alias("job"),
            pl.lit(lab.host, dtype=pl.Utf8).alias("host"),
            pl.coalesce(pl.col("prefix_rank"), prefix.inline_rank(pl.col("line")), pl.lit(lab.rank, dtype=pl.Int32))
            .cast(pl.Int32)
            .alias("rank"),
            pl.coalesce(pl.col("prefix_local_rank"), pl.lit(lab.local_rank, dtype=pl.Int32)).cast(pl.Int32).alias("local_rank"),
            pl.col("ts"),
            pl.col("ts_source"),
            pl.lit(now).cast(TS).alias("ingest_ts"),
            pl.col("line"),
        )
        self.stats.records += out.height
        return out.cast(RECORD_SCHEMA)  # type: ignore[arg-type]
