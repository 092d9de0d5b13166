"""Labels from line prefixes, vectorized.

* ``[default2]:`` is torchrun's ``--tee`` prefix on its console: ``[<role><local_rank>]:``.
* ``[rank3]:`` is added by ``torch.distributed``'s excepthook to each line of an uncaught
  exception after ``init_process_group`` (on the console: ``[default3]:[rank3]: …``).

Both are removed from the record text, so the same worker line read from the console
and from the per-rank file under ``--log-dir`` is the same text.
"""

from __future__ import annotations

import polars as pl

TEE_RE = r"^\[(?P<role>[A-Za-z_][A-Za-z_-]*?)(?P<local_rank>\d+)\]:"
RANK_RE = r"^\[rank(?P<rank>\d+)\]:[ ]?"


def split_prefixes(df: pl.DataFrame, text_col: str = "line") -> pl.DataFrame:
    """Add ``prefix_local_rank``, ``prefix_rank`` (Int32, null when absent) and strip both
    prefixes from ``text_col``."""
    tee = pl.col(text_col).str.extract_groups(TEE_RE)
    is_tee = tee.struct.field("role").is_not_null() & (tee.struct.field("role") != "rank")
    out = df.with_columns(
        pl.when(is_tee).then(tee.struct.field("local_rank").cast(pl.Int32, strict=False)).alias("prefix_local_rank"),
        pl.when(is_tee).then(pl.col(text_col).str.replace(TEE_RE, "")).otherwise(pl.col(text_col)).alias(text_col),
    )
    return out.with_columns(
        pl.col(text_col).str.extract(RANK_RE, 1).cast(pl.Int32, strict=False).alias("prefix_rank"),
        pl.col(text_col).str.replace(RANK_RE, "").alias(text_col),
    )


INLINE_RANK_RE = r"\[rank(?P<rank>\d+)(?:/(?P<world>\d+))?\]"


def inline_rank(text: pl.Expr) -> pl.Expr:
    """Rank named by a logger format inside the first 96 characters (``[rank2]``, ``[rank1/4]``)."""
    return text.str.slice(0, 96).str.extract(INLINE_RANK_RE, 1).cast(pl.Int32, strict=False)
