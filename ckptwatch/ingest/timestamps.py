"""Event-time extraction for batches of records, vectorized with polars.

Formats recognised at the start of a record (after console prefixes are removed; up to
three non-word characters such as ``[`` may come first):

============  ==========================================  ==============================
name          example                                     notes
============  ==========================================  ==============================
iso           ``2026-11-30 10:22:47,875`` /               ISO 8601, ``T``, space or ``_``
              ``2026-11-30T10:21:21.415Z`` /              between date and time; ``,`` or
              ``[2026-11-30 10:21:09.728]``               ``.`` before the fraction; a zone
                                                          (``Z``, ``+02:00``) if present
mdy           ``11/30/2026 10:20:43``                     transformers example scripts
glog          ``I1130 10:12:27.123456``                   torchrun / c10d; no year
syslog        ``Nov 30 10:12:27``                         no year
kernel        ``[ 1234.567890]``                          seconds since boot; needs a boot
                                                          time, else the record inherits
============  ==========================================  ==============================

All results are UTC. A timestamp without a zone is taken as UTC (the corpus' machines
ran in UTC; say otherwise with ``assume_utc_offset_minutes``).

Year-less formats (glog, syslog) take their year from context: the nearest full
timestamp in the same stream (earlier first, then later), else the file's mtime. The
candidate year among (context year - 1, context year, context year + 1) closest to the
context wins, so a log crossing New Year is dated right. Today's date is never used.

A record without its own time inherits the previous record's time in the same stream
(``ts_source = "inherited"``), then the carried time from the previous batch of that
stream, then the file's mtime (``ts_source = "mtime"``).
"""

from __future__ import annotations

import datetime as dt

import polars as pl

from ckptwatch.schema import TS

_LEAD = r"^\W{0,3}"
ISO_RE = (
    _LEAD + r"(?P<date>\d{4}-\d{2}-\d{2})[T _](?P<time>\d{2}:\d{2}:\d{2})"
    r"(?:[.,](?P<frac>\d{1,9}))?(?P<tz>Z|[+-]\d{2}:?\d{2})?"
)
MDY_RE = _LEAD + r"(?P<mon>\d{2})/(?P<day>\d{2})/(?P<year>\d{4}) (?P<time>\d{2}:\d{2}:\d{2})(?:[.,](?P<frac>\d{1,9}))?"
GLOG_RE = r"^[IWEF](?P<mon>\d{2})(?P<day>\d{2}) (?P<time>\d{2}:\d{2}:\d{2})(?:\.(?P<frac>\d{1,9}))?\s"
SYSLOG_RE = (
    r"^(?P<mon>Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) +(?P<day>\d{1,2}) "
    r"(?P<time>\d{2}:\d{2}:\d{2})(?:\.(?P<frac>\d{1,9}))?\s"
)
KERNEL_RE = r"^\[\s*(?P<up>\d+\.\d+)\]"

_MONTHS = {m: f"{i:02d}" for i, m in enumerate(
    ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"], start=1)}
_HALF_YEAR = dt.timedelta(days=183)


def _frac_ns(frac: pl.Expr) -> pl.Expr:
    """Fraction-of-second digits (``"875"``) -> nanoseconds as a duration."""
    return pl.duration(nanoseconds=frac.fill_null("0").str.pad_end(9, "0").str.slice(0, 9).cast(pl.Int64))


def _parse(date: pl.Expr, time: pl.Expr, frac: pl.Expr) -> pl.Expr:
    base = pl.concat_str([date, pl.lit(" "), time]).str.to_datetime(
        "%Y-%m-%d %H:%M:%S", time_unit="ns", time_zone="UTC", strict=False
    )
    return base + _frac_ns(frac)


def _tz_offset(tz: pl.Expr) -> pl.Expr:
    """``Z`` / ``+02:00`` / ``-0530`` -> offset as a duration (null zone -> 0)."""
    digits = tz.str.replace_all(r"[^0-9]", "")
    hours = digits.str.slice(0, 2).cast(pl.Int64, strict=False).fill_null(0)
    mins = digits.str.slice(2, 2).cast(pl.Int64, strict=False).fill_null(0)
    sign = pl.when(tz.str.starts_with("-")).then(-1).otherwise(1)
    return pl.duration(minutes=sign * (hours * 60 + mins))


def _closest_year(mon: pl.Expr, day: pl.Expr, time: pl.Expr, frac: pl.Expr, ctx: pl.Expr) -> pl.Expr:
    """A year-less date made whole with the year (of ctx-1, ctx, ctx+1) closest to ``ctx``."""
    year = ctx.dt.year()
    cands = [
        _parse(pl.concat_str([(year + d).cast(pl.Utf8), pl.lit("-"), mon, pl.lit("-"), day]), time, frac)
        for d in (-1, 0, 1)
    ]
    prev, same, nxt = cands
    return (
        pl.when((same - ctx) > pl.lit(_HALF_YEAR))
        .then(prev)
        .when((ctx - same) > pl.lit(_HALF_YEAR))
        .then(nxt)
        .otherwise(same)
    )


def add_event_time(
    df: pl.DataFrame,
    *,
    text_col: str = "line",
    stream_col: str = "stream_key",
    mtime_col: str = "mtime",
    carry: dict[str, dt.datetime] | None = None,
    boot_time: dt.datetime | None = None,
    assume_utc_offset_minutes: int = 0,
) -> pl.DataFrame:
    """Add ``ts`` (Datetime ns UTC) and ``ts_source`` to a batch of records.

    Args:
        df: records in stream order; needs ``text_col`` (the record text, prefixes
            removed), ``stream_col`` (rows with equal values form one stream) and
            ``mtime_col`` (the file's mtime, Datetime UTC).
        carry: last known time per stream from an earlier batch (tailing).
        boot_time: the host's boot time (UTC) for kernel ``[ seconds]`` stamps.
        assume_utc_offset_minutes: offset of zone-less timestamps from UTC.

    Returns:
        ``df`` with ``ts`` and ``ts_source`` added; the helper columns are dropped.
    """
    first = pl.col(text_col).str.slice(0, 64)
    out = df.with_columns(
        first.str.extract_groups(ISO_RE).alias("_iso"),
        first.str.extract_groups(MDY_RE).alias("_mdy"),
        first.str.extract_groups(GLOG_RE).alias("_glog"),
        first.str.extract_groups(SYSLOG_RE).alias("_sys"),
        first.str.extract(KERNEL_RE, 1).cast(pl.Float64, strict=False).alias("_up"),
    )
    local = pl.duration(minutes=assume_utc_offset_minutes)
    iso = pl.col("_iso").struct
    iso_ts = _parse(iso.field("date"), iso.field("time"), iso.field("frac"))
    iso_ts = pl.when(iso.field("tz").is_not_null()).then(iso_ts - _tz_offset(iso.field("tz"))).otherwise(iso_ts - local)
    mdy = pl.col("_mdy").struct
    mdy_ts = _parse(
        pl.concat_str([mdy.field("year"), pl.lit("-"), mdy.field("mon"), pl.lit("-"), mdy.field("day")]),
        mdy.field("time"),
        mdy.field("frac"),
    ) - local
    out = out.with_columns(pl.coalesce(iso_ts, mdy_ts).alias("_full"))
    # Context for year-less stamps: nearest full timestamp in the stream, else mtime.
    out = out.with_columns(
        pl.col("_full").forward_fill().over(stream_col).alias("_ctx_prev"),
        pl.col("_full").backward_fill().over(stream_col).alias("_ctx_next"),
    )
    if carry:
        carry_df = pl.DataFrame(
            {stream_col: list(carry), "_carry": list(carry.values())},
            schema={stream_col: pl.Utf8, "_carry": TS},
        )
        out = out.join(carry_df, on=stream_col, how="left", maintain_order="left")
    else:
        out = out.with_columns(pl.lit(None, dtype=TS).alias("_carry"))
    ctx = pl.coalesce(pl.col("_ctx_prev"), pl.col("_carry"), pl.col("_ctx_next"), pl.col(mtime_col))
    glog = pl.col("_glog").struct
    sysl = pl.col("_sys").struct
    glog_ts = _closest_year(glog.field("mon"), glog.field("day"), glog.field("time"), glog.field("frac"), ctx) - local
    sys_day = sysl.field("day").str.pad_start(2, "0")
    sys_mon = sysl.field("mon").replace_strict(_MONTHS, default=None)
    sys_ts = _closest_year(sys_mon, sys_day, sysl.field("time"), sysl.field("frac"), ctx) - local
    parts = [pl.col("_full"), glog_ts, sys_ts]
    if boot_time is not None:
        boot = boot_time.astimezone(dt.timezone.utc)
        parts.append(pl.lit(boot).cast(TS) + pl.duration(microseconds=(pl.col("_up") * 1e6).cast(pl.Int64)))
    out = out.with_columns(pl.coalesce(parts).alias("_own"))
    inherited = pl.col("_own").forward_fill().over(stream_col)
    out = out.with_columns(
        pl.coalesce(pl.col("_own"), inherited, pl.col("_carry"), pl.col(mtime_col)).alias("ts"),
        pl.when(pl.col("_own").is_not_null())
        .then(pl.lit("line"))
        .when(inherited.is_not_null() | pl.col("_carry").is_not_null())
        .then(pl.lit("inherited"))
        .otherwise(pl.lit("mtime"))
        .alias("ts_source"),
    )
    return out.drop(["_iso", "_mdy", "_glog", "_sys", "_up", "_full", "_ctx_prev", "_ctx_next", "_carry", "_own"])


def parse_one(text: str, *, context: dt.datetime | None = None) -> dt.datetime | None:
    """Parse one timestamp string with the batch parser (for rule-captured ``ts`` groups and tests).

    ``context`` (UTC) gives the year for year-less formats. Returns a UTC datetime or None.
    """
    ctx = context or dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
    df = pl.DataFrame(
        {"line": [text], "stream_key": ["_"], "mtime": [ctx]},
        schema={"line": pl.Utf8, "stream_key": pl.Utf8, "mtime": TS},
    )
    out = add_event_time(df)
    if out["ts_source"][0] != "line":
        return None
    return out["ts"][0]
