"""Reading complete lines from a byte offset, safely.

* Only complete lines (ending in ``\\n``) are returned, unless ``final`` is set (the
  file is not expected to grow, as in ``diagnose``): then a last line without a newline
  is returned too.
* A line longer than ``max_line_bytes`` is skipped and reported (reason
  ``line_too_long``) with its offset; the lines around it are read as usual.
* Invalid UTF-8 is decoded with U+FFFD replacement characters and counted
  (``invalid_utf8``); the line is kept.
* ``\\r\\n`` endings lose the ``\\r``; a lone ``\\r`` inside a line (a progress bar
  redrawn in place, a log written with CR separators) separates lines too, each with
  its own offset.
* ANSI escape sequences (terminal colours, cursor moves, hyperlinks: CSI ``ESC [ … final``,
  OSC ``ESC ] … BEL`` or ``ESC ] … ESC \\``, and two-byte ``ESC x`` escapes; also a CSI
  JSON-escaped as ``\\u001b[…`` inside a JSON log line) are removed from the text, so no
  rule, path or incident id sees them; offsets stay the byte offsets of the file.
  Vectorized per read (one polars ``str.replace_all`` over the batch) and only when the
  bytes read hold an ESC at all.

A read of at least :data:`BULK_BYTES` whose bytes are valid UTF-8 with no lone ``\\r`` is
split into lines by polars in one pass (:attr:`ReadResult.block`), with no Python string
per line; any other read goes line by line. Both give the same lines, offsets and skips
(``tests/test_reader_bulk.py`` compares them on random bytes).
"""

from __future__ import annotations

import json

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import BinaryIO

import polars as pl

DEFAULT_MAX_LINE_BYTES = 1 << 20  # 1 MiB
DEFAULT_CHUNK_BYTES = 8 << 20  # how much one call reads at most (plus one huge line)


@dataclass
class ReadResult:
    """What one read produced.

    Attributes:
        pairs: ``(offset, text)`` of the lines read one by one; ``offset`` is the byte
            offset of the line start.
        next_offset: where the next read starts (after the last complete line consumed).
        skipped: ``(reason, offset, n_bytes)`` for each line not returned.
        invalid_utf8: how many returned lines had bytes that are not UTF-8.
        block: the lines of a read split in bulk, as a frame (``offset`` Int64, ``line``
            Utf8), or None; a read has its lines in ``pairs`` or in ``block``, never both.
        raw: the bytes read from ``offset`` on, as read: they hold ``[offset,
            next_offset)`` unless a line too long was skipped (read past without keeping it).
    """

    pairs: list[tuple[int, str]] = field(default_factory=list)
    next_offset: int = 0
    skipped: list[tuple[str, int, int]] = field(default_factory=list)
    invalid_utf8: int = 0
    block: pl.DataFrame | None = None
    raw: bytes = field(default=b"", repr=False, compare=False)
    _ansi: bool = field(default=False, repr=False, compare=False)  # the bytes read hold an ESC

    @property
    def count(self) -> int:
        """How many lines were read."""
        return self.block.height if self.block is not None else len(self.pairs)

    @property
    def lines(self) -> list[tuple[int, str]]:
        """Every line as ``(offset, text)``, in file order: ``pairs``, or ``block`` made
        into a Python object per line (the pipeline takes ``pairs`` and ``block`` as they are)."""
        if self.block is None:
            return self.pairs
        return list(zip(self.block["offset"].to_list(), self.block["line"].to_list(), strict=True))

    def frame(self) -> pl.DataFrame:
        """The lines as a frame: ``offset`` (Int64), ``line`` (Utf8), in file order (either path)."""
        if self.block is not None:
            return self.block
        return pl.DataFrame({"offset": [o for o, _ in self.pairs], "line": [x for _, x in self.pairs]},
                            schema=LINE_SCHEMA)


#: the columns of :meth:`ReadResult.frame`
LINE_SCHEMA = {"offset": pl.Int64, "line": pl.Utf8}

#: a read of at least this many bytes is split into lines by polars in one pass; below it
#: the per-line loop costs less than polars' fixed cost per call (a live tail's few lines)
BULK_BYTES = 32 << 10


#: one ANSI escape sequence (ECMA-48): CSI ``ESC [ params intermediates final``, OSC ``ESC ] …``
#: ended by BEL or ST (``ESC \\``) or the line's end, any other ``ESC`` + intermediates + final
#: (``ESC ( B``, ``ESC 7``, ``ESC M``), a lone ESC; and a CSI written JSON-escaped
#: (``\\u001b[32m`` in a container runtime's ``{"log": …}`` line).
ANSI_ESCAPE = (r"\x1b\[[0-?]*[ -/]*[@-~]"
               r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\|$)"
               r"|\x1b[ -/]*[0-~]"
               r"|\x1b"
               r"|\\u001[bB]\[[0-?]*[ -/]*[@-~]")


def strip_ansi(texts: pl.Series) -> pl.Series:
    """``texts`` without ANSI escape sequences (see :data:`ANSI_ESCAPE`); vectorized."""
    return texts.str.replace_all(ANSI_ESCAPE, "")


def _decode(raw: bytes, res: ReadResult) -> str:
    if raw.endswith(b"\r"):
        raw = raw[:-1]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        res.invalid_utf8 += 1
        return raw.decode("utf-8", errors="replace")


_JSON_TEXT_KEYS = ("log", "message", "msg")


def _split_json_cr(raw: bytes, start: int, res: ReadResult) -> bool:
    """A JSON log line (a container runtime's ``{"log": "...", "stream", "time"}``) whose text
    holds progress-bar redraws (``\\r``): one JSON line per non-blank part, same other
    fields, each at its own offset (the line's start plus the part's index). False when the
    line is not such a line (it is then read as it is)."""
    try:
        doc = json.loads(raw)
    except ValueError:
        return False
    key = next((k for k in _JSON_TEXT_KEYS if isinstance(doc, dict) and isinstance(doc.get(k), str)), None)
    if key is None or "\r" not in doc[key].rstrip("\r\n"):
        return False
    for i, part in enumerate(doc[key].split("\r")):
        if part.strip():
            res.pairs.append((start + i, json.dumps({**doc, key: part}, ensure_ascii=False)))
    return True


def _split_cr(raw: bytes, start: int, res: ReadResult) -> None:
    """Append the non-blank ``\\r``-separated parts of one line, each at its own offset."""
    pos = 0
    for part in raw.split(b"\r"):
        if part.strip():
            res.pairs.append((start + pos, _decode(part, res)))
        pos += len(part) + 1


def read_lines(
    source: str | BinaryIO,
    offset: int,
    *,
    final: bool = False,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    bulk_bytes: int = BULK_BYTES,
    size_hint: int | None = None,
) -> ReadResult:
    """Read the complete lines of ``source`` (a path, or a file open in binary mode that
    stays open) from byte ``offset``; at most about ``chunk_bytes`` bytes per call. A read
    of ``bulk_bytes`` or more is split in bulk when it can be (see the module's docstring).
    ``size_hint``: the file's size as just stat'ed, if known: a read asks for about what is
    there, not ``chunk_bytes`` (an 8 MiB request costs 20 us of allocation, ten times a
    small one: 10,000 files a poll); bytes written since are read all the same, up to 64 KiB.

    Raises OSError if the file cannot be opened or read.
    """
    res = _read_lines(source, offset, final=final, max_line_bytes=max_line_bytes, chunk_bytes=chunk_bytes,
                      bulk_bytes=bulk_bytes, size_hint=size_hint)
    if res._ansi and res.block is not None:
        res.block = res.block.with_columns(strip_ansi(res.block["line"]))
    elif res._ansi and res.pairs:
        # only the lines that hold an escape go through polars (building a Series of every
        # line costs more than the regex itself); one replace_all over them all
        lines = res.pairs
        hit = [i for i, (_, t) in enumerate(lines) if "\x1b" in t or "\\u001" in t]
        if hit:
            clean = strip_ansi(pl.Series([lines[i][1] for i in hit], dtype=pl.Utf8)).to_list()
            for i, text in zip(hit, clean, strict=True):
                lines[i] = (lines[i][0], text)
    return res


def _bulk(buf: bytes, offset: int, end: int, res: ReadResult, max_line_bytes: int) -> bool:
    """Split ``buf[:end]`` (starting at file offset ``offset``) into ``res.block`` in one
    polars pass, as the per-line loop would: ``\\r\\n`` endings lose the ``\\r``, lines
    over ``max_line_bytes`` are skipped, a trailing newline ends the last line. False (and
    ``res`` untouched) when the bytes need the loop: invalid UTF-8, a ``\\r`` not before a
    newline (progress bars), a JSON-escaped ``\\r``."""
    slab = buf[:end] if end < len(buf) else buf
    crs = slab.count(b"\r")
    if (crs and crs != slab.count(b"\r\n")) or b"\\r" in slab:
        return False
    try:
        text = slab.decode("utf-8")
    except UnicodeDecodeError:
        return False
    lines = pl.Series("line", [text], dtype=pl.Utf8).str.split("\n").explode()
    if slab.endswith(b"\n"):  # the empty string after the last newline is no line
        lines = lines.head(len(lines) - 1)
    size = lines.str.len_bytes().cast(pl.Int64)
    block = pl.DataFrame({"offset": (size + 1).cum_sum() - (size + 1) + offset, "line": lines})
    if crs:
        block = block.with_columns(pl.col("line").str.strip_suffix("\r"))
    too_long = size > max_line_bytes
    if too_long.any():
        res.skipped.extend(("line_too_long", o, n) for o, n in zip(block["offset"].filter(too_long).to_list(),
                                                                 size.filter(too_long).to_list(), strict=True))
        block = block.filter(~too_long)
    res.block = block
    res.next_offset = offset + end
    return True


def _read_lines(source: str | BinaryIO, offset: int, *, final: bool, max_line_bytes: int,
                chunk_bytes: int, bulk_bytes: int = BULK_BYTES, size_hint: int | None = None) -> ReadResult:
    """:func:`read_lines` without removing ANSI escapes (it sets ``_ansi`` when there may be some)."""
    res = ReadResult(next_offset=offset)
    want = chunk_bytes if size_hint is None else min(chunk_bytes, max(0, size_hint - offset) + (64 << 10))
    with _opened(source) as f:
        f.seek(offset)
        buf = f.read(want)
        res.raw = buf
        res._ansi = b"\x1b" in buf or b"\\u001" in buf
        # in bulk: every complete line, and the last one too when the file ends in this read
        end = buf.rfind(b"\n") + 1
        if final and len(buf) < want:
            end = len(buf)
        if end and end >= bulk_bytes and len(buf) - end <= max_line_bytes and _bulk(buf, offset, end, res, max_line_bytes):
            return res
        pos = 0
        while True:
            nl = buf.find(b"\n", pos)
            if nl < 0:
                rest = len(buf) - pos
                if rest > max_line_bytes:
                    # Inside a huge line: find its end without holding it in memory.
                    start = offset + pos
                    f.seek(start + rest)
                    n = rest
                    while True:
                        block = f.read(1 << 20)
                        if not block:
                            if final:
                                res.skipped.append(("line_too_long", start, n))
                                res.next_offset = start + n
                            return res
                        k = block.find(b"\n")
                        if k >= 0:
                            n += k
                            res.skipped.append(("line_too_long", start, n))
                            res.next_offset = start + n + 1
                            # continue with a fresh chunk after the huge line
                            more = _read_lines(f, res.next_offset, final=final, max_line_bytes=max_line_bytes,
                                               chunk_bytes=chunk_bytes, bulk_bytes=bulk_bytes)
                            res._ansi = res._ansi or more._ansi
                            res.pairs.extend(more.lines)
                            res.skipped.extend(more.skipped)
                            res.invalid_utf8 += more.invalid_utf8
                            res.next_offset = more.next_offset
                            return res
                        n += len(block)
                if final and rest > 0 and len(buf) < want:
                    if b"\r" in buf[pos:].rstrip(b"\r"):
                        _split_cr(buf[pos:], offset + pos, res)
                    else:
                        res.pairs.append((offset + pos, _decode(buf[pos:], res)))
                    res.next_offset = offset + len(buf)
                return res
            raw = buf[pos:nl]
            if len(raw) > max_line_bytes:
                res.skipped.append(("line_too_long", offset + pos, len(raw)))
            elif b"\r" in raw.rstrip(b"\r"):
                _split_cr(raw, offset + pos, res)
            elif raw[:1] == b"{" and b"\\r" in raw and _split_json_cr(raw, offset + pos, res):
                pass
            else:
                res.pairs.append((offset + pos, _decode(raw, res)))
            pos = nl + 1
            res.next_offset = offset + pos


#: bytes of text a log holds before a NUL, other than ASCII controls (tab, newlines, ESC of colours)
_TEXT_CONTROLS = bytes(c for c in range(32) if c not in (9, 10, 13, 27)) + b"\x7f"


def looks_binary(source: str | BinaryIO, sniff_bytes: int = 8192) -> bool:
    """True if the first ``sniff_bytes`` bytes of the file (a path or an open binary file)
    hold a NUL byte (not a text log), unless what comes before the first NUL is lines of
    text: a log whose tail a crash left as NULs (the size reached the disk, the data did
    not: ext4, XFS and NFS do this) is still a log, and so is one that starts with a run of
    NULs (a writer without ``O_APPEND`` going on at its old offset after logrotate's
    ``copytruncate``). Text here: at least one newline, valid
    UTF-8 (a character cut at the NUL aside), no control bytes but tab, CR, LF and ESC.

    Raises OSError if the file cannot be read.
    """
    with _opened(source) as f:
        f.seek(0)
        head = f.read(sniff_bytes)
    hole = head.startswith(b"\x00")  # copytruncate under a writer without O_APPEND: a hole, then its lines
    if hole:
        head = head.lstrip(b"\x00")
    nul = head.find(b"\x00")
    if nul < 0 and not hole:
        return False
    text = head[:nul] if nul >= 0 else head
    if b"\n" not in text or text.translate(None, _TEXT_CONTROLS) != text:
        return True
    try:
        text.decode("utf-8")
    except UnicodeDecodeError as e:
        return e.start < len(text) - 3  # only a character cut short by the NULs is allowed
    return False


def _opened(source: str | BinaryIO) -> AbstractContextManager[BinaryIO]:
    """``source`` opened for reading if it is a path (closed on exit), else as it is (left open)."""
    if isinstance(source, str):
        return open(source, "rb")
    return nullcontext(source)
