"""Polars frame helpers shared by the stages."""

from __future__ import annotations

import polars as pl


def detached(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` with its strings copied into buffers of its own (same schema and rows).

    A polars string column made by a filter, slice or gather is views into the buffers of
    the frame it came from, so a few rows kept from each batch keep every batch's text
    alive. Keep what outlives a batch (a detector's progress payload, a file's held-back
    lines) detached: on a 359 MB simulated fleet, 13 MB of kept rows held 412 MB of buffers.
    Costs one copy of ``frame``'s data."""
    if frame.is_empty():
        return frame.clear()
    return pl.DataFrame(pl.from_arrow(frame.to_arrow(compat_level=pl.CompatLevel.oldest()))).cast(frame.schema)
