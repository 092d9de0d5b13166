"""``read_lines(size_hint=...)``: asking for about what a stat found reads the same lines.

A tail passes the size its ``fstat`` just gave, so a read of a few new lines asks for a few
KiB rather than the 8 MiB chunk (allocating it cost 20 us a file, 10,000 files a poll).
The bytes written after that stat must still be read (up to 64 KiB past it), and a final
read must end the last line without newline only when the file really ended there.
"""

from __future__ import annotations

import io

import pytest

from ckptwatch.ingest import reader

LINES = b"".join(b"[2026-12-01 08:00:%02d] step %d\n" % (i, i) for i in range(40))


@pytest.mark.parametrize("final", [False, True])
def test_a_hint_gives_the_lines_a_full_chunk_gives(final: bool) -> None:
    data = LINES + b"partial last line"
    for start in (0, 27, len(LINES) // 2):
        hinted = reader.read_lines(io.BytesIO(data), start, final=final, size_hint=len(data))
        full = reader.read_lines(io.BytesIO(data), start, final=final)
        assert hinted.lines == full.lines
        assert hinted.next_offset == full.next_offset
    ended = reader.read_lines(io.BytesIO(data), 0, final=True, size_hint=len(data))
    assert ended.lines[-1] == (len(LINES), "partial last line")


def test_bytes_written_after_the_stat_are_read_too() -> None:
    stale = len(LINES) // 4  # the file grew since it was stat'ed
    res = reader.read_lines(io.BytesIO(LINES), 0, size_hint=stale)
    assert res.count == 40
    assert res.next_offset == len(LINES)


def test_a_stale_hint_never_ends_a_line_the_file_goes_on_with() -> None:
    # 200 KiB written since the stat: the read stops 64 KiB past the hint, in the middle
    # of a line, and a final read must not take that piece for the file's last line
    line = b"x" * 999 + b"\n"
    data = line * 200
    res = reader.read_lines(io.BytesIO(data), 0, final=True, size_hint=0, bulk_bytes=1 << 40)
    assert res.next_offset == 65 * len(line)  # 64 KiB = 65 whole lines and a piece
    assert all(text == "x" * 999 for _, text in res.lines)
    assert res.count == 65
