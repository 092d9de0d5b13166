"""The reader's bulk split (one polars pass per read) gives what the per-line loop gives.

``read_lines(..., bulk_bytes=1)`` tries the bulk split on every read; ``bulk_bytes`` larger
than any read never does. On the same bytes both must return the same lines, offsets,
skips, next offset and invalid-UTF-8 count, and a read the bulk split cannot take (a lone
``\\r``, invalid UTF-8, a JSON-escaped ``\\r``) must fall back to the loop.
"""

from __future__ import annotations

import io

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptwatch.ingest import reader

NEVER = 1 << 40


def both(data: bytes, start: int = 0, **kw) -> tuple[reader.ReadResult, reader.ReadResult]:
    bulk = reader.read_lines(io.BytesIO(data), start, bulk_bytes=1, **kw)
    loop = reader.read_lines(io.BytesIO(data), start, bulk_bytes=NEVER, **kw)
    assert loop.block is None
    return bulk, loop


def same(bulk: reader.ReadResult, loop: reader.ReadResult) -> None:
    assert bulk.lines == loop.lines
    assert bulk.count == loop.count
    assert (bulk.next_offset, bulk.skipped, bulk.invalid_utf8) == (loop.next_offset, loop.skipped, loop.invalid_utf8)
    assert bulk.frame().to_dicts() == loop.frame().to_dicts()


def test_plain_lines_are_split_in_bulk_with_their_byte_offsets():
    data = "[rank0]: a\n\n[rank1]: é中\r\n[rank2]: last".encode()
    bulk, loop = both(data)
    assert bulk.block is not None
    assert bulk.lines == [(0, "[rank0]: a"), (11, ""), (12, "[rank1]: é中")]
    assert bulk.next_offset == 28  # the unterminated last line waits
    same(bulk, loop)
    bulk, loop = both(data, final=True)
    assert bulk.lines[-1] == (28, "[rank2]: last") and bulk.next_offset == len(data)
    same(bulk, loop)


def test_long_lines_are_skipped_and_the_rest_kept():
    data = b"short\n" + b"x" * 50 + b"\nafter\n"
    bulk, loop = both(data, max_line_bytes=20)
    assert bulk.block is not None
    assert bulk.lines == [(0, "short"), (57, "after")]
    assert bulk.skipped == [("line_too_long", 6, 50)]
    same(bulk, loop)


def test_reads_the_bulk_split_cannot_take_go_line_by_line():
    for data in (b"10%|##  \r20%|####\rdone\n", b"ok\n\xff\xfe bad\n", b'{"log": "a\\rb"}\n'):
        bulk, loop = both(data)
        assert bulk.block is None, data
        same(bulk, loop)


def test_ansi_escapes_are_removed_in_bulk_too():
    data = b"\x1b[32mINFO\x1b[0m saved\nplain\n"
    bulk, loop = both(data)
    assert bulk.block is not None
    assert bulk.lines == [(0, "INFO saved"), (20, "plain")]
    same(bulk, loop)


parts = st.one_of(st.text(max_size=40).map(str.encode), st.binary(max_size=30),
                  st.sampled_from([b"\r\n", b"\n", b"\r", b"\x1b[1m", b"\\u001b[2m", b"\xc3", b"\x00", b"{",
                                   b"x" * 70]))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.lists(parts, max_size=60).map(b"".join), start=st.integers(0, 400), final=st.booleans(),
       max_line=st.integers(1, 120), chunk=st.integers(1, 600))
def test_bulk_and_loop_agree_on_any_bytes(data, start, final, max_line, chunk):
    start = min(start, len(data))
    bulk, loop = both(data, start, final=final, max_line_bytes=max_line, chunk_bytes=chunk)
    same(bulk, loop)
