"""ckptwatch.frames.detached: rows kept from a batch do not keep the batch's text alive."""

from __future__ import annotations

import datetime as dt

import polars as pl

from ckptwatch.frames import detached


def text_bytes(frame: pl.DataFrame) -> int:
    """Bytes of the Arrow buffers behind ``frame``'s ``line`` column, as polars holds it (views)."""
    arr = frame["line"].to_arrow(compat_level=pl.CompatLevel.newest())
    return sum(b.size for b in arr.buffers() if b is not None)


def test_a_few_rows_kept_from_a_big_batch_hold_only_their_own_text():
    big = pl.DataFrame({"line": [f"{i:08d} " + "x" * 1000 for i in range(20_000)], "n": range(20_000),
                        "ts": [dt.datetime(2026, 11, 30, tzinfo=dt.timezone.utc)] * 20_000})
    kept = big.filter(pl.col("n").is_in([5, 17_000]))
    assert text_bytes(kept) > 10_000_000  # views into every buffer of the batch
    alone = detached(kept)
    assert text_bytes(alone) < 10_000
    assert alone.equals(kept) and alone.schema == kept.schema
    assert detached(kept.clear()).schema == kept.schema
