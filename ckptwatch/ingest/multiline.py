"""Multiline grouping: Python tracebacks and torchrun failure blocks become one record.

Grouping is vectorized: each line gets a "continues the previous line" flag computed from
itself and the previous line of the same stream, and a record is a run of lines that
starts at a line without the flag. Blank lines carry nothing and are dropped first.

A line continues the previous one when it

* is indented (space or tab): traceback frames, ``\\tsize mismatch for …`` details,
  torchrun's ``  time : …`` / ``  rank : …`` fields;
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
"""

from __future__ import annotations

import polars as pl

_EXC_LINE = (
    r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Interrupt|Exit|Failure|Warning|Abort)\b"
    r"|^(?:[a-z_]\w*\.)+[A-Z]\w*\b"
)
_SECTION = r"^(?:Failures:|Root Cause \(first observed failure\):)\s*$"


def continues_previous(line: pl.Expr, prev: pl.Expr) -> pl.Expr:
    """Boolean expression: ``line`` belongs to the record that ``prev`` is in."""
    indented = line.str.contains(r"^[ \t]")
    prev_indented = prev.str.contains(r"^[ \t]|^Traceback \(most recent call last\)").fill_null(False)
    prev_chain = prev.str.contains(r"^(?:During handling of the above|The above exception was)").fill_null(False)
    return (
        indented
        | line.str.starts_with("Traceback (most recent call last): (RANK")
        | (prev_chain & line.str.starts_with("Traceback (most recent call last)"))
        | line.str.starts_with("During handling of the above exception")
        | line.str.starts_with("The above exception was the direct cause")
        | (prev_indented & line.str.contains(_EXC_LINE))
        | (line.str.contains(r"^\[\d+\]:\s*$") & prev.str.contains(_SECTION).fill_null(False))
    )


def group_lines(lines: pl.DataFrame, *, final: bool) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Group lines into records.

    Args:
        lines: one row per line in file order, with ``stream_key`` (Utf8), ``offset``
            (Int64), ``line`` (Utf8, prefixes removed) and any other per-line columns
            (their first value in a record is kept).
        final: no more lines will come; otherwise the last record of each stream is
            held back because its next line may continue it.

    Returns:
        ``(records, held_back_lines)``: records with ``line`` joined by ``"\\n"`` and
        ``offset`` of their first line, in offset order; and the lines held back (same
        columns as ``lines``) to put in front of the next batch.
    """
    if lines.is_empty():
        return lines, lines
    lines = lines.filter(pl.col("line").str.strip_chars() != "")
    prev = pl.col("line").shift(1).over("stream_key")
    marked = lines.with_columns(
        (~continues_previous(pl.col("line"), prev)).cast(pl.Int32).cum_sum().over("stream_key").alias("_gid")
    )
    if final:
        held = marked.clear()
    else:
        is_last = pl.col("_gid") == pl.col("_gid").max().over("stream_key")
        held = marked.filter(is_last)
        marked = marked.filter(~is_last)
    other = [c for c in lines.columns if c not in ("stream_key", "line", "_gid")]
    records = (
        marked.group_by(["stream_key", "_gid"], maintain_order=True)
        .agg([pl.col(c).first() for c in other] + [pl.col("line").str.join("\n")])
        .drop("_gid")
        .sort("offset")
        .select(lines.columns)
    )
    return records, held.drop("_gid")
