"""A linear walk over a pickle's opcodes, before anything is unpickled: what CPython's C
unpickler would allocate or grind on is refused first.

Found by fuzzing (issue 14): a 14-byte pickle ``\\x80\\x02}r<uint32 4e8>.`` made the restricted
unpickler spend 12 s and 6 GB: ``LONG_BINPUT`` (and ``PUT``) store into a C array indexed by
the memo key, which the unpickler grows to twice the index and zero-fills. Likewise
``BINBYTES8`` / ``BINUNICODE8`` / ``BYTEARRAY8`` allocate their declared length before
reading it, and dict keys that are integers of 2^61 or more can all share one hash
(``n`` and ``n + k(2^61 - 1)``), making each insertion linear: 50,000 such keys take over a
minute. So :func:`scan` walks the opcodes (``Lib/pickletools.py`` gives each one's argument
layout) without building anything, and raises

* :class:`PickleTruncated` when a declared length or a line runs past the end (the file
  was cut short, or the length is a lie),
* ``pickle.UnpicklingError`` for an unknown opcode, a negative length, or a memo index
  larger than the pickle itself (a real pickle numbers its memo entries 0, 1, 2...),
* :class:`PickleLimitError` for more than :data:`MAX_BIG_INTS` integers of 2^61 or more.

It returns where the pickle ends (one past its ``STOP``). Cost: one pass, about half a
microsecond per opcode; memory: none beyond the input.
"""

from __future__ import annotations

import pickle
import pickletools
import struct

#: Integers of 2^61 or more a pickle may hold (a legitimate checkpoint has a handful: torch's
#: magic number); more could be a hash-collision bomb (quadratic dict building).
MAX_BIG_INTS = 4096


class PickleTruncated(pickle.UnpicklingError):
    """The pickle ends (or its data does) before an opcode's argument does."""


class PickleLimitError(pickle.UnpicklingError):
    """The pickle is over a bound of :mod:`.pickle_scan` (the message names it)."""


# Argument layouts, from pickletools: per opcode byte, FIXED[op] = bytes to skip (opcode
# included) when the argument has a fixed size, else -1 and KIND[op] / WIDTH[op] say how to read it.
_BAD, _COUNTED, _LINE, _TWO_LINES, _STOP, _PUT_LINE, _PUT4, _BIG_LINE, _LONG, _FRAME = range(10)
FIXED = [-1] * 256
KIND = [_BAD] * 256
WIDTH = [0] * 256
_LEN = {1: struct.Struct("<B"), -4: struct.Struct("<i"), 4: struct.Struct("<I"), 8: struct.Struct("<Q")}


def _build() -> None:
    counted = {pickletools.TAKEN_FROM_ARGUMENT1: 1, pickletools.TAKEN_FROM_ARGUMENT4: -4,
               pickletools.TAKEN_FROM_ARGUMENT4U: 4, pickletools.TAKEN_FROM_ARGUMENT8U: 8}
    special = {"STOP": (_STOP, 0), "PUT": (_PUT_LINE, 0), "LONG_BINPUT": (_PUT4, 4), "INT": (_BIG_LINE, 0),
               "LONG": (_BIG_LINE, 0), "LONG1": (_LONG, 1), "LONG4": (_LONG, -4), "FRAME": (_FRAME, 8)}
    for op in pickletools.opcodes:
        code = ord(op.code.encode("latin-1"))
        arg = op.arg
        if op.name in special:
            KIND[code], WIDTH[code] = special[op.name]
        elif arg is None:
            FIXED[code] = 1
        elif arg.name == "stringnl_noescape_pair":
            KIND[code] = _TWO_LINES
        elif arg.n == pickletools.UP_TO_NEWLINE:
            KIND[code] = _LINE
        elif arg.n in counted:
            KIND[code], WIDTH[code] = _COUNTED, counted[arg.n]
        else:
            FIXED[code] = 1 + arg.n


_build()


def scan(buf: bytes, start: int = 0, end: int | None = None) -> int:
    """Walk the pickle in ``buf[start:end]`` (``bytes``); return the offset one past
    its ``STOP`` opcode. Raises :class:`PickleTruncated`, :class:`PickleLimitError` or
    ``pickle.UnpicklingError`` (see the module docstring; messages give the byte offset)."""
    end = len(buf) if end is None else end
    size = end - start
    pos = start
    big = 0
    fixed, kinds, widths, lens = FIXED, KIND, WIDTH, _LEN
    while pos < end:
        op = buf[pos]
        skip = fixed[op]
        if skip > 0:
            pos += skip
            continue
        kind = kinds[op]
        pos += 1
        if kind == _COUNTED or kind == _LONG:
            width = widths[op]
            w = 4 if width == -4 else width
            if pos + w > end:
                raise PickleTruncated(f"the pickle ends inside a length at byte {pos - start}")
            length = lens[width].unpack_from(buf, pos)[0]
            if length < 0:
                raise pickle.UnpicklingError(f"negative length {length} at byte {pos - start}")
            pos += w + length
            if kind == _LONG and length > 8:
                big += 1
                if big > MAX_BIG_INTS:
                    raise PickleLimitError(f"more than {MAX_BIG_INTS} integers of 2^61 or more (they can share "
                                           "one hash and make building a dict quadratic): not unpickled")
        elif kind == _STOP:
            return pos
        elif kind == _PUT4:
            if pos + 4 > end:
                raise PickleTruncated(f"the pickle ends inside a memo index at byte {pos - start}")
            index = lens[4].unpack_from(buf, pos)[0]
            if index > size:
                raise pickle.UnpicklingError(f"memo index {index} at byte {pos - start} is larger than the "
                                             f"{size}-byte pickle (a memo bomb: the unpickler would allocate "
                                             f"{16 * index:,} bytes)")
            pos += 4
        elif kind == _LINE or kind == _PUT_LINE or kind == _BIG_LINE:
            nl = buf.find(b"\n", pos, end)
            if nl < 0:
                raise PickleTruncated(f"the pickle ends inside a text argument at byte {pos - start}")
            if kind == _PUT_LINE:
                _memo_index(buf[pos:nl], size, pos - start)
            elif kind == _BIG_LINE and nl - pos > 18:
                big += 1
                if big > MAX_BIG_INTS:
                    raise PickleLimitError(f"more than {MAX_BIG_INTS} integers of 2^61 or more (they can share "
                                           "one hash and make building a dict quadratic): not unpickled")
            pos = nl + 1
        elif kind == _TWO_LINES:
            for _ in range(2):
                nl = buf.find(b"\n", pos, end)
                if nl < 0:
                    raise PickleTruncated(f"the pickle ends inside a global's name at byte {pos - start}")
                pos = nl + 1
        elif kind == _FRAME:  # a size hint; the opcodes inside are walked like any others
            if pos + 8 > end:
                raise PickleTruncated(f"the pickle ends inside a frame header at byte {pos - start}")
            if pos + 8 + lens[8].unpack_from(buf, pos)[0] > end:
                raise PickleTruncated(f"a frame at byte {pos - start - 1} runs past the end of the pickle")
            pos += 8
        else:
            raise pickle.UnpicklingError(f"invalid opcode 0x{op:02x} at byte {pos - 1 - start}")
    if pos > end:
        raise PickleTruncated(f"an argument runs {pos - end} bytes past the end of the pickle")
    raise PickleTruncated("the pickle ends before its STOP opcode")


def _memo_index(text: bytes, size: int, at: int) -> None:
    try:
        index = int(text)
    except ValueError:
        raise pickle.UnpicklingError(f"memo index {text[:20]!r} at byte {at} is not a number") from None
    if index < 0 or index > size:
        raise pickle.UnpicklingError(f"memo index {index} at byte {at} is larger than the {size}-byte pickle "
                                     "(a memo bomb)")
