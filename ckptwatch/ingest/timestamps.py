"""Event-time extraction for batches of records, vectorized with polars.

Formats recognised (after console and label prefixes are removed):

==========  ==============================================  ==================================
name        example                                         notes
==========  ==============================================  ==================================
iso         ``2026-11-30 10:22:47,875`` /                   ISO 8601 anywhere in the first 96
            ``2026-11-30T10:21:21.415Z`` /                  characters, so it is found behind
            ``[INFO|trainer.py:3984] 2026-12-01 10:08:25,000``  a logger's level, a ``[titan]``
            ``[titan] 2026-12-01 10:08:25,000 - root``      tag or a label; ``T``, space or
                                                            ``_`` between date and time; ``,``
                                                            or ``.`` before the fraction; a
                                                            zone (``Z``, ``+02:00``) if present;
                                                            ``2024/06/01 10:12:01`` (mmengine)
                                                            with slashes
md          ``05/22 10:10:00``                              mmengine's and detectron2's datefmt:
                                                            no year (taken from context)
mdy         ``11/30/2026 10:20:43``                         transformers example scripts
ctime       ``[Wed Jun 18 15:56:56 2025]``                  ``dmesg -T``
glog        ``I1130 10:12:27.123456`` /                     torchrun, c10d, NCCL; no year; the
            ``[E1201 10:18:25.123456789 PGNCCL.cpp:632]`` / month may be unpadded (``E117``);
            ``[E117 10:18:25.123 …]``                       up to 9 fraction digits
syslog      ``Nov 30 10:12:27``                             no year
kernel      ``[ 1234.567890]``                              seconds since boot; needs a boot
                                                            time, else the record inherits
==========  ==============================================  ==================================

All results are UTC. A timestamp without a zone is taken as UTC (the corpus' machines
ran in UTC; say otherwise with ``assume_utc_offset_minutes``).

**Sane range.** A stamp dated before 1970 or more than a day after ``now`` (a host clock
far ahead, a line dated 2100) is not believed: the record is treated as having no time
of its own (it inherits) and ``ts_rejected`` is set so the caller can count it. Years
are checked before conversion, so nothing wraps into another year.

**Year-less formats** (glog, syslog) take their year from context: the nearest earlier
full timestamp in the same stream, else the time carried from the stream's previous
batch, else the nearest later full timestamp in the stream, else any full timestamp in
the batch (the same file), else the file's mtime, in which case ``ts_year_guessed`` is
set, as on every record that takes its time from such a record (inherited in the stream
or in file order). The caller may re-date those from other files of the same job or
host (:func:`shift_to_year_of`), and must not carry a guessed time into the next batch
as a known one (see :meth:`ckptwatch.ingest.watcher.SourceWatcher.poll`). The candidate
year among (context year - 1, context year, context year + 1) closest to the context
wins, so a log crossing New Year is dated right. Today's date is never used.

**Records without a time** inherit the previous record's time in the same stream
(``ts_source = "inherited"``), then the carried time from the previous batch of that
stream, then the previous time in the file (a worker that only ``print()``s, on a console
whose agent lines are dated: file order), then the next time in the file (lines before
its first dated line), then the file's mtime at this read (``ts_source = "mtime"``). Callers carry only
times read from lines, so a stream that never prints a time moves on with its file's
mtime from one read to the next instead of freezing at the first.
"""

from __future__ import annotations

import datetime as dt

import polars as pl

from ckptwatch.schema import TS

_LEAD = r"^\W{0,3}"
ISO_RE = (
    r"(?:^|[^\d\w])(?P<date>(?P<year>\d{4})(?:-\d{2}-\d{2}|/\d{2}/\d{2}))[T _](?P<time>\d{2}:\d{2}:\d{2})"
    r"(?:[.,](?P<frac>\d{1,9}))?(?P<tz>Z|[+-]\d{2}:?\d{2})?"
)
MDY_RE = _LEAD + r"(?P<mon>\d{2})/(?P<day>\d{2})/(?P<year>\d{4}) (?P<time>\d{2}:\d{2}:\d{2})(?:[.,](?P<frac>\d{1,9}))?"
_MON = r"(?P<mon>Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
CTIME_RE = (
    r"^\[?(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) " + _MON + r" +(?P<day>\d{1,2}) (?P<time>\d{2}:\d{2}:\d{2})"
    r"(?:\.(?P<frac>\d{1,9}))? (?P<year>\d{4})\b"
)
GLOG_RE = r"^\[?[IWEF](?P<mon>\d{1,2})(?P<day>\d{2}) (?P<time>\d{2}:\d{2}:\d{2})(?:\.(?P<frac>\d{1,9}))?\s"
#: mmengine's MMLogger (datefmt '%m/%d %H:%M:%S': '05/22 10:10:00 - mmengine - INFO - …') and
#: detectron2's setup_logger ('[05/22 10:10:00 d2.engine.hooks]: …'): month and day, no year
MD_RE = r"^\W{0,3}(?P<mon>\d{2})/(?P<day>\d{2}) (?P<time>\d{2}:\d{2}:\d{2})(?:[.,](?P<frac>\d{1,9}))?\s"
SYSLOG_RE = "^" + _MON + r" +(?P<day>\d{1,2}) (?P<time>\d{2}:\d{2}:\d{2})(?:\.(?P<frac>\d{1,9}))?\s"
KERNEL_RE = r"^\[\s*(?P<up>\d+\.\d+)\]"

_MONTHS = {m: f"{i:02d}" for i, m in enumerate(
    ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"], start=1)}
_HALF_YEAR = dt.timedelta(days=183)
MIN_YEAR = 1970
#: how far past the wall clock a stamp may be before it is not believed
MAX_AHEAD = dt.timedelta(days=1)
#: the longest uptime a kernel ``[ seconds]`` stamp may claim (100 years); longer ones are
#: not times and leave the record to inherit its time
MAX_UPTIME_S = 100 * 365.25 * 86400



def _frac_ns(frac: pl.Expr) -> pl.Expr:
    """Fraction-of-second digits (``"875"``) -> nanoseconds as a duration."""
    return pl.duration(nanoseconds=frac.fill_null("0").str.pad_end(9, "0").str.slice(0, 9).cast(pl.Int64))


def _parse(date: pl.Expr, time: pl.Expr, frac: pl.Expr) -> pl.Expr:
    base = pl.concat_str([date, pl.lit(" "), time]).str.to_datetime(
        "%Y-%m-%d %H:%M:%S", time_unit="ns", time_zone="UTC", strict=False
    )
    return base + _frac_ns(frac)


def _year_ok(year: pl.Expr, max_year: int) -> pl.Expr:
    y = year.cast(pl.Int32, strict=False)
    return (y >= MIN_YEAR) & (y <= max_year)


def _tz_offset(tz: pl.Expr) -> pl.Expr:
    """``Z`` / ``+02:00`` / ``-0530`` -> offset as a duration (null zone -> 0)."""
    digits = tz.str.replace_all(r"[^0-9]", "")
    hours = digits.str.slice(0, 2).cast(pl.Int64, strict=False).fill_null(0)
    mins = digits.str.slice(2, 2).cast(pl.Int64, strict=False).fill_null(0)
    sign = pl.when(tz.str.starts_with("-")).then(-1).otherwise(1)
    return pl.duration(minutes=sign * (hours * 60 + mins))


def _closest_year(mon: pl.Expr, day: pl.Expr, time: pl.Expr, frac: pl.Expr, ctx: pl.Expr,
                  latest: dt.datetime) -> pl.Expr:
    """A year-less date made whole with the year (of ctx-1, ctx, ctx+1) closest to ``ctx``
    that is not after ``latest``."""
    year = ctx.dt.year()
    cands = [
        _parse(pl.concat_str([(year + d).cast(pl.Utf8), pl.lit("-"), mon, pl.lit("-"), day]), time, frac)
        for d in (-1, 0, 1)
    ]
    prev, same, nxt = cands
    last = pl.lit(latest).cast(TS)
    return (
        pl.when(((same - ctx) > pl.lit(_HALF_YEAR)) | (same > last))
        .then(prev)
        .when(((ctx - same) > pl.lit(_HALF_YEAR)) & (nxt <= last))
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
    now: dt.datetime | None = None,
    file_carry: dt.datetime | None = None,
    file_col: str | None = None,
    file_carry_col: str | None = None,
) -> pl.DataFrame:
    """Add ``ts`` (Datetime ns UTC), ``ts_source``, ``ts_rejected`` and ``ts_year_guessed``
    (Boolean) to a batch of records.

    Args:
        df: records in stream order; needs ``text_col`` (the record text, prefixes
            removed), ``stream_col`` (rows with equal values form one stream) and
            ``mtime_col`` (the file's mtime, Datetime UTC).
        carry: last known time per stream from an earlier batch (tailing).
        boot_time: the host's boot time (UTC) for kernel ``[ seconds]`` stamps.
        assume_utc_offset_minutes: offset of zone-less timestamps from UTC.
        file_carry: the file's last time read from a line in an earlier batch (UTC).
        file_col: a column telling files apart, for the records of many files in one
            batch (each file's rows contiguous): what is inherited "in file order" stays
            within a file.
        file_carry_col: ``file_carry`` per row (a column), for such a batch.
        now: wall-clock time of the read (UTC; default: now); stamps more than
            :data:`MAX_AHEAD` past it are not believed (``ts_rejected``).

    Returns:
        ``df`` with the four columns added; the helper columns are dropped.
    """
    now = now or dt.datetime.now(dt.timezone.utc)

    def per_file(e: pl.Expr) -> pl.Expr:
        return e.over(file_col) if file_col else e

    latest = now + MAX_AHEAD
    max_year = latest.year
    first = pl.col(text_col).str.slice(0, 96)
    out = df.with_columns(
        first.str.extract_groups(ISO_RE).alias("_iso"),
        first.str.extract_groups(MDY_RE).alias("_mdy"),
        first.str.extract_groups(CTIME_RE).alias("_ctime"),
        first.str.extract_groups(GLOG_RE).alias("_glog"),
        first.str.extract_groups(SYSLOG_RE).alias("_sys"),
        first.str.extract_groups(MD_RE).alias("_md"),
        first.str.extract(KERNEL_RE, 1).cast(pl.Float64, strict=False).alias("_up"),
    )
    # an ISO stamp behind a prefix counts unless a stamp of another format starts the record
    out = out.with_columns(
        (pl.col("_glog").struct.field("time").is_not_null() | pl.col("_sys").struct.field("time").is_not_null()
         | pl.col("_md").struct.field("time").is_not_null() | pl.col("_up").is_not_null()).alias("_other_lead")
    )
    local = pl.duration(minutes=assume_utc_offset_minutes)
    iso = pl.col("_iso").struct
    iso_ts = _parse(iso.field("date").str.replace_all("/", "-", literal=True), iso.field("time"), iso.field("frac"))
    iso_ts = pl.when(iso.field("tz").is_not_null()).then(iso_ts - _tz_offset(iso.field("tz"))).otherwise(iso_ts - local)
    mdy = pl.col("_mdy").struct
    mdy_ts = _parse(
        pl.concat_str([mdy.field("year"), pl.lit("-"), mdy.field("mon"), pl.lit("-"), mdy.field("day")]),
        mdy.field("time"),
        mdy.field("frac"),
    ) - local
    ct = pl.col("_ctime").struct
    ct_ts = _parse(
        pl.concat_str([ct.field("year"), pl.lit("-"), ct.field("mon").replace_strict(_MONTHS, default=None),
                       pl.lit("-"), ct.field("day").str.pad_start(2, "0")]),
        ct.field("time"), ct.field("frac"),
    ) - local
    iso_ok = first.str.contains(_LEAD + r"\d{4}(?:-\d{2}-\d{2}|/\d{2}/\d{2})[T _]") | ~pl.col("_other_lead")
    # only the formats this batch holds are parsed (a batch is mostly one file: one format)
    present = out.select(
        *(pl.col(c).struct.field(f).is_not_null().any().alias(c)
          for c, f in (("_iso", "date"), ("_mdy", "year"), ("_ctime", "year"), ("_glog", "time"), ("_sys", "time"),
                       ("_md", "time")))
    ).row(0, named=True)
    full_parts = [pl.lit(None, dtype=TS)]
    any_full = pl.lit(False)
    if present["_iso"]:
        full_parts.append(pl.when(_year_ok(iso.field("year"), max_year) & iso_ok).then(iso_ts))
        any_full = any_full | (iso.field("date").is_not_null() & iso_ok)
    if present["_mdy"]:
        full_parts.append(pl.when(_year_ok(mdy.field("year"), max_year)).then(mdy_ts))
        any_full = any_full | mdy.field("year").is_not_null()
    if present["_ctime"]:
        full_parts.append(pl.when(_year_ok(ct.field("year"), max_year)).then(ct_ts))
        any_full = any_full | ct.field("year").is_not_null()
    # each step materialized as a column: polars plans an expression per call (per file and
    # poll), and one tree repeating the parsers costs ~10x the parse of a small batch
    out = out.with_columns(pl.coalesce(full_parts).alias("_full0"), any_full.alias("_any_full"))
    full = pl.col("_full0")
    sane = (full >= pl.lit(dt.datetime(MIN_YEAR, 1, 1, tzinfo=dt.timezone.utc)).cast(TS)) & (
        full <= pl.lit(latest).cast(TS))
    out = out.with_columns(
        pl.when(sane).then(full).alias("_full"),
        (pl.col("_any_full") & ~sane.fill_null(False)).alias("_full_bad"),
    )
    # Context for year-less stamps: nearest full timestamp in the stream, else in the batch, else mtime.
    out = out.with_columns(
        pl.col("_full").forward_fill().over(stream_col).alias("_ctx_prev"),
        pl.col("_full").backward_fill().over(stream_col).alias("_ctx_next"),
        per_file(pl.col("_full").forward_fill().backward_fill()).alias("_ctx_any"),
    )
    if carry:
        carry_df = pl.DataFrame(
            {stream_col: list(carry), "_carry": list(carry.values())},
            schema={stream_col: pl.Utf8, "_carry": TS},
        )
        out = out.join(carry_df, on=stream_col, how="left", maintain_order="left")
    else:
        out = out.with_columns(pl.lit(None, dtype=TS).alias("_carry"))
    out = out.with_columns(
        pl.coalesce(pl.col("_ctx_prev"), pl.col("_carry"), pl.col("_ctx_next"), pl.col("_ctx_any")).alias("_known_ctx"))
    out = out.with_columns(pl.coalesce(pl.col("_known_ctx"), pl.col(mtime_col)).alias("_ctx"))
    known_ctx, ctx = pl.col("_known_ctx"), pl.col("_ctx")
    glog = pl.col("_glog").struct
    sysl = pl.col("_sys").struct
    yearless_parts = [pl.lit(None, dtype=TS)]
    if present["_glog"]:
        yearless_parts.append(_closest_year(glog.field("mon").str.pad_start(2, "0"), glog.field("day"),
                                            glog.field("time"), glog.field("frac"), ctx, latest) - local)
    if present["_sys"]:
        sys_day = sysl.field("day").str.pad_start(2, "0")
        sys_mon = sysl.field("mon").replace_strict(_MONTHS, default=None)
        yearless_parts.append(_closest_year(sys_mon, sys_day, sysl.field("time"), sysl.field("frac"), ctx, latest)
                              - local)
    if present["_md"]:
        md = pl.col("_md").struct
        yearless_parts.append(_closest_year(md.field("mon"), md.field("day"), md.field("time"), md.field("frac"), ctx,
                                            latest) - local)
    out = out.with_columns(pl.coalesce(yearless_parts).alias("_yearless"))
    yearless = pl.col("_yearless")
    parts = [pl.col("_full"), yearless]
    if boot_time is not None:
        boot = boot_time.astimezone(dt.timezone.utc)
        # an uptime past a century is not believable (and overflows microseconds past 9.2e12 s)
        up = pl.when(pl.col("_up") < MAX_UPTIME_S).then(pl.col("_up"))
        parts.append(pl.lit(boot).cast(TS) + pl.duration(microseconds=(up * 1e6).cast(pl.Int64, strict=False)))
    out = out.with_columns(
        pl.coalesce(parts).alias("_own0"),
        (pl.col("_full").is_null() & yearless.is_not_null() & known_ctx.is_null()).alias("_guess0"),
    )
    own_sane = pl.col("_own0") <= pl.lit(latest).cast(TS)
    out = out.with_columns(
        pl.when(own_sane).then(pl.col("_own0")).alias("_own"),
        (pl.col("_full_bad") | (pl.col("_own0").is_not_null() & ~own_sane.fill_null(False))).alias("ts_rejected"),
        pl.when(own_sane).then(pl.col("_guess0")).alias("_guess"),
    )
    inherited = pl.col("_own").forward_fill().over(stream_col)
    in_file = per_file(pl.col("_own").forward_fill())  # a stream that never prints a time: file order
    # whether the time a record takes came from a year guessed from the mtime, along the same
    # path as the time itself (carried times are the caller's: taken as known)
    guess = pl.col("_guess")
    guess_in_file = per_file(guess.forward_fill())
    if file_carry is not None:
        in_file = in_file.fill_null(pl.lit(file_carry.astimezone(dt.timezone.utc)).cast(TS))
        guess_in_file = guess_in_file.fill_null(False)
    if file_carry_col is not None:
        guess_in_file = guess_in_file.fill_null(pl.when(pl.col(file_carry_col).is_not_null()).then(False))
        in_file = in_file.fill_null(pl.col(file_carry_col))
    ahead = per_file(pl.col("_own").backward_fill())  # lines before the file's first time: the next time, file order kept
    base = pl.coalesce(inherited, pl.col("_carry"), in_file, ahead, pl.col(mtime_col))
    guessed = pl.coalesce(guess, guess.forward_fill().over(stream_col),
                          pl.when(pl.col("_carry").is_not_null()).then(False), guess_in_file,
                          per_file(guess.backward_fill()), pl.lit(False))
    out = out.with_columns(
        pl.coalesce(pl.col("_own"), base).alias("ts"),
        pl.when(pl.col("_own").is_not_null())
        .then(pl.lit("line"))
        .when(inherited.is_not_null() | pl.col("_carry").is_not_null() | in_file.is_not_null() | ahead.is_not_null())
        .then(pl.lit("inherited"))
        .otherwise(pl.lit("mtime"))
        .alias("ts_source"),
        guessed.alias("ts_year_guessed"),
    )
    return out.drop(["_iso", "_mdy", "_ctime", "_glog", "_sys", "_md", "_up", "_full0", "_any_full", "_known_ctx", "_ctx",
                     "_yearless",
                     "_full", "_full_bad", "_ctx_prev",
                     "_ctx_next", "_ctx_any", "_carry", "_other_lead", "_own0", "_guess0", "_own", "_guess"])


def shift_to_year_of(ts: pl.Expr, ctx: pl.Expr) -> pl.Expr:
    """``ts`` moved into the year before, of or after ``ctx``'s, whichever lands closest to
    ``ctx`` (null ``ctx``: unchanged): re-dates a year-less stamp whose year was guessed from
    a file's mtime once a dated line of the same job or host is known (a paste of 2024 logs
    read in 2026 moves by two years)."""
    years = ctx.dt.year() - ts.dt.year()
    cands = [ts.dt.offset_by(pl.format("{}y", years + d)) for d in (-1, 0, 1)]
    dist = [(c - ctx).abs() for c in cands]
    best = (
        pl.when((dist[0] < dist[1]) & (dist[0] < dist[2])).then(cands[0])
        .when(dist[2] < dist[1]).then(cands[2])
        .otherwise(cands[1])
    )
    return pl.when(ctx.is_null()).then(ts).otherwise(best)


def parse_one(text: str, *, context: dt.datetime | None = None) -> dt.datetime | None:
    """Parse one timestamp string with the batch parser (for rule-captured ``ts`` groups and tests).

    ``context`` (UTC) gives the year for year-less formats; the sane range ends a day past
    the later of ``context`` and the wall clock. Returns a UTC datetime or None.
    """
    ctx = context or dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
    wall = max(dt.datetime.now(dt.timezone.utc), ctx)
    df = pl.DataFrame(
        {"line": [text], "stream_key": ["_"], "mtime": [ctx]},
        schema={"line": pl.Utf8, "stream_key": pl.Utf8, "mtime": TS},
    )
    out = add_event_time(df, now=wall)
    if out["ts_source"][0] != "line":
        return None
    return out["ts"][0]
