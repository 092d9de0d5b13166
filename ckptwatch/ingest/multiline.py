"""Multiline grouping: Python tracebacks and torchrun failure blocks become one record.

Grouping is vectorized: each line gets a "continues the previous line" flag computed from
itself and the previous line of the same stream, and a record is a run of lines that
starts at a line without the flag. Blank lines carry nothing and are dropped first.

A line continues the previous one when it

* is indented (space or tab): traceback frames, ``\\tsize mismatch for …`` details,
  torchrun's ``  time : …`` / ``  rank : …`` fields; except the messages Megatron-LM prints
  indented (``  successfully saved checkpoint from iteration …``), which stand alone;
* is a DCP per-rank sub-traceback header ``Traceback (most recent call last): (RANK n)``;
* is a chained-exception separator (``During handling of the above exception…``,
  ``The above exception was the direct cause…``), or the traceback right after one;
* is an exception line (``FileNotFoundError: …``, ``torch…CheckpointException: …``)
  right after an indented line;
* is a torchrun failure entry ``[N]:`` right after ``Failures:`` or
  ``Root Cause (first observed failure):``.

Any other ``Traceback (most recent call last):`` starts a record. The last record of
each stream may still grow while a file is being written; callers hold it back (see
:func:`group_lines` ``final``).

Two processes writing one console interleave: a single line of another process that
lands inside a traceback (between a frame and the next ``File "…"`` line, or between a
frame and its code line) is a record of its own, and the traceback goes on past it.

Text pasted from a terminal may be hard-wrapped at the terminal's width: :func:`unwrap`
joins such pieces back into one line before prefixes are read.
"""

from __future__ import annotations

import polars as pl

_EXC_LINE = (
    r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Interrupt|Exit|Failure|Warning|Abort)\b"
    r"|^(?:[a-z_]\w*\.)+[A-Z]\w*\b"
)
_SECTION = r"^(?:Failures:|Root Cause \(first observed failure\):)\s*$"


#: indented lines that are messages of their own: Megatron-LM prints these with leading spaces
#: (megatron/training/checkpointing.py save_checkpoint / load_checkpoint, print_rank_0('  successfully …'))
_OWN_INDENTED = (r"^\s+(?:successfully (?:saved|loaded) checkpoint|scheduled an async checkpoint save"
                 r"|will not load any checkpoints|loading (?:distributed )?checkpoint from|saving checkpoint at"
                 r"|iteration\s+\d+/\s*\d+ \||\[\d{4}-\d{2}-\d{2}[ T]\d"
                 # Rich's log handler leaves the time column blank within one second
                 r"|\s{8,}(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s{2,}\S"
                 # tqdm pads its percentage to three places: ' 50%|█████     | 501/1000 [...]'
                 r"|\d{1,2}%\|"
                 # Keras pads its bar's count to the total's width: '   1/1563   42s 27ms/step - loss'
                 r"|\d+/\d+\s+(?:[━\[]|\d+m?s\s))")  # a dated line is never a continuation


#: a frame line that lost its indentation (a paste outside a code block: markdown strips it)
_BARE_FRAME = r'^File "[^"\n]+", line \d+'


def continues_previous(line: pl.Expr, prev: pl.Expr, prev2: pl.Expr | None = None) -> pl.Expr:
    """Boolean expression: ``line`` belongs to the record that ``prev`` is in (``prev2``:
    the line before that, for tracebacks that lost their indentation)."""
    indented = line.str.contains(r"^[ \t]") & ~line.str.contains(_OWN_INDENTED)
    bare = pl.lit(False)
    if prev2 is not None:  # File "…", line N / code / File … / code / Exception: all at column 0
        prev_frame = prev.str.contains(_BARE_FRAME).fill_null(False)
        prev2_frame = prev2.str.contains(_BARE_FRAME).fill_null(False)
        after_header = prev.str.contains(r"^Traceback \(most recent call last\)").fill_null(False)
        bare = ((line.str.contains(_BARE_FRAME) & (after_header | prev_frame | prev2_frame))
                | (prev_frame & ~line.str.contains(_BARE_FRAME))
                | (prev2_frame & line.str.contains(_EXC_LINE)))
    prev_indented = prev.str.contains(r"^[ \t]|^Traceback \(most recent call last\)").fill_null(False)
    prev_chain = prev.str.contains(r"^(?:During handling of the above|The above exception was)").fill_null(False)
    return (
        indented
        | bare
        | line.str.starts_with("Traceback (most recent call last): (RANK")
        | (prev_chain & line.str.starts_with("Traceback (most recent call last)"))
        | line.str.starts_with("During handling of the above exception")
        | (line == "stack traceback:")  # Lua's error report: the message, then its frames
        | line.str.starts_with("The above exception was the direct cause")
        | (prev_indented & line.str.contains(_EXC_LINE))
        | (line.str.contains(r"^\[\d+\]:\s*$") & prev.str.contains(_SECTION).fill_null(False))
    )


#: how a line that starts a record of its own begins (a time, a label, a bracket, a traceback);
#: srun --label pads task ids to the widest one (`` 0: `` among 16 tasks: Slurm's step I/O
#: ``_build_label``, format ``"%*d: "``), so a label may start with spaces
_STARTS_RECORD = (r"^(?: *\[| *\(|\{|\d{4}-\d{2}-\d{2}|\d{1,2}/\d{1,2}/\d{4}|[IWEF]\d{3,4} |Traceback"
                  r"|[A-Z][a-z]{2} +\d|[A-Za-z0-9][\w.-]*(?::\d+)?: | +\d+: )")


def unwrap(lines: pl.DataFrame, *, by: str | None = None, min_width: int = 60, max_width: int = 512,
           min_wrapped: int = 3) -> pl.DataFrame:
    """Join lines hard-wrapped by a terminal: when at least ``min_wrapped`` lines of the
    batch have exactly the batch's longest length W (``min_width`` to ``max_width``
    characters: a terminal's width), a line of length W is continued by the next line,
    glued without a separator (the wrap falls mid-word), unless that next line starts a
    record of its own (a time, a label, a bracket, a traceback). A batch where most lines of
    width W are followed by a line that starts a record is no terminal's: its lines are
    records that happen to be of one length (four 201-character save lines), and nothing is
    joined. ``lines``:
    ``offset``, ``line`` in file order (raw, prefixes not removed); the joined line keeps
    the offset of its first piece. ``by``: a column telling files apart (rows of one file
    contiguous): each file's lines are a batch of their own."""
    if lines.height < 2:
        return lines

    def per_file(e: pl.Expr) -> pl.Expr:
        return e.over(by) if by else e

    width = pl.col("line").str.len_chars()
    marks = lines.select(*([pl.col(by)] if by else []), width.alias("_width"), per_file(width.max()).alias("_top"))
    at_top = pl.col("_width") == pl.col("_top")
    marks = marks.with_columns(
        (pl.col("_top").is_between(min_width, max_width) & (per_file(at_top.sum()) >= min_wrapped)).alias("_terminal"),
        per_file(at_top.shift(1)).fill_null(False).alias("_after_top"))
    if not marks["_terminal"].any():
        return lines  # the common case: no terminal width at all, no line read for records
    # a terminal's wrap leaves a piece after most lines of its width; lines of one length that
    # are each followed by a line starting a record of its own are records of equal length
    marks = marks.with_columns(lines["line"].str.contains(_STARTS_RECORD).alias("_record"))
    after, piece = pl.col("_after_top"), pl.col("_after_top") & ~pl.col("_record")
    marks = marks.with_columns((pl.col("_terminal") & (per_file(piece.sum()) * 2 >= per_file(after.sum())))
                               .alias("_terminal"))
    wrapped = (marks["_terminal"] & marks["_after_top"] & ~marks["_record"]).alias("_wr")
    if not wrapped.any():
        return lines
    return (
        lines.with_columns((~wrapped).cum_sum().alias("_w"))
        .group_by("_w", maintain_order=True)
        .agg([pl.col(c).first() for c in lines.columns if c != "line"] + [pl.col("line").str.join("")])
        .drop("_w")
        .select(lines.columns)
    )


_FRAME = r"^[ \t]+File \""

#: a last line after which the record may go on: indented (a traceback's frame, a torchrun
#: failure's field), a traceback's header or a chained-exception separator, a line that
#: ends with ":" (``Failures:``, ``Root Cause (first observed failure):``, ``[0]:``)
_OPEN_ENDED = (r"^[ \t]|^Traceback \(most recent call last\)|^During handling of the above"
               r"|^The above exception was|:\s*$")


def may_go_on(line: pl.Expr) -> pl.Expr:
    """Boolean expression: a record whose last line is ``line`` may still be continued by
    the lines that follow it (see :data:`_OPEN_ENDED`); any record may be, in principle (an
    indented line continues anything), but a writer prints the rest of a traceback or a
    failure block at once, so only these wait out a file's full idle time."""
    return line.str.contains(_OPEN_ENDED)


def group_lines(lines: pl.DataFrame, *, final: bool, flush_col: str | None = None,
                settle_col: str | None = None,
                order: tuple[str, ...] = ("offset",)) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Group lines into records.

    Args:
        lines: one row per line in file order, with ``stream_key`` (Utf8), ``offset``
            (Int64), ``line`` (Utf8, prefixes removed) and any other per-line columns
            (their first value in a record is kept).
        final: no more lines will come; otherwise the last record of each stream is
            held back because its next line may continue it.
        flush_col: a Boolean column: its rows' streams hold nothing back (their file
            ended or went idle), whatever ``final`` says.
        settle_col: a Boolean column: its rows' streams (their file went quiet for a
            moment) hold their last record back only if it may go on (:func:`may_go_on`).
        order: the columns the records are sorted by (``("_t", "offset")`` for the
            lines of many files).

    Returns:
        ``(records, held_back_lines)``: records with ``line`` joined by ``"\\n"`` and
        ``offset`` of their first line, in offset order; and the lines held back (same
        columns as ``lines``) to put in front of the next batch.
    """
    if lines.is_empty():
        return lines, lines
    lines = lines.filter(pl.col("line").str.strip_chars() != "")
    line = pl.col("line")
    prev = line.shift(1).over("stream_key")
    nxt = line.shift(-1).over("stream_key")
    # one line of another writer inside a traceback: its own record; the traceback goes on past it
    prev2 = line.shift(2).over("stream_key")
    intruder = (
        ~continues_previous(line, prev, prev2)
        & ~line.str.starts_with("Traceback (most recent call last)")  # a traceback's own header never intrudes
        & prev.str.contains(r"^[ \t]").fill_null(False)
        & (nxt.str.contains(_FRAME) | (nxt.str.contains(r"^[ \t]") & prev.str.contains(_FRAME))).fill_null(False)
    )
    # an intruder follows an indented line: a batch without one (most) has none to look for
    indented = lines.select(line.str.contains(r"^[ \t]").any()).item()
    lines = lines.with_columns((intruder if indented else pl.lit(False)).alias("_intruder"))
    kept = lines.filter(~pl.col("_intruder"))
    kept = kept.with_columns(
        (~continues_previous(line, line.shift(1).over("stream_key"), line.shift(2).over("stream_key")))
        .cast(pl.Int32).cum_sum().over("stream_key")
        .alias("_gid")
    )
    intruders = lines.filter(pl.col("_intruder")).with_columns(
        (-pl.int_range(1, pl.len() + 1, dtype=pl.Int32)).alias("_gid"))
    marked = pl.concat([kept, intruders]).sort(list(order)).drop("_intruder")
    if final:
        held = marked.clear()
    else:
        is_last = pl.col("_gid") == pl.col("_gid").max().over("stream_key")
        if flush_col is not None:
            is_last = is_last & ~pl.col(flush_col)
        if settle_col is not None:  # the stream's last line (file order) tells if it may go on
            is_last = is_last & ~(pl.col(settle_col) & ~may_go_on(line.last().over("stream_key")))
        held = marked.filter(is_last)
        marked = marked.filter(~is_last)
    other = [c for c in lines.columns if c not in ("stream_key", "line", "_gid", "_intruder")]
    records = (
        marked.group_by(["stream_key", "_gid"], maintain_order=True)
        .agg([pl.col(c).first() for c in other] + [pl.col("line").str.join("\n")])
        .drop("_gid")
        .sort(list(order))
        .select([c for c in lines.columns if c != "_intruder"])
    )
    return records, held.drop("_gid")
