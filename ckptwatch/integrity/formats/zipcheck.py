"""Structural check of a zip archive (a ``torch.save`` file, or one item inside a DCP shard).

Format: PKWARE APPNOTE.TXT 6.3.x (https://pkware.cachefly.net/webdocs/casestudies/APPNOTE.TXT):
local file headers (4.3.7) each followed by the entry's data, then the central directory
(4.3.12), the ZIP64 end of central directory record and locator (4.3.14, 4.3.15) and the end
of central directory record, EOCD (4.3.16). ``torch.save`` writes every entry STORED
(method 0, with a data descriptor, names under one top folder such as ``checkpoint-40/`` or
``archive/``) and always writes the ZIP64 records; DEFLATE (method 8) is checked too.

The check never holds more than one chunk (:data:`CHUNK` bytes) of entry data: the central
directory is parsed entry by entry, then each entry's local header is read and its data
streamed through ``zlib.crc32`` (and ``zlib.decompressobj`` for DEFLATE) and compared with
the CRC-32 and sizes of the central directory. That catches a flipped bit anywhere in an
entry's data, which ``torch.load`` does not (it never checks CRCs).

An archive may sit inside a larger file (``start``..``end``, byte offsets); its own
offsets are relative to ``start``.

Bounded work (issue 14, :mod:`ckptwatch.integrity.limits`): a zip bomb lists one
well-compressed member many times (several central-directory entries, one local header),
or hides members inside other members' data. Members are checked in local-header order and
a member whose bytes begin inside the previous member's (``zip_overlap``) or whose name is
listed twice (``zip_duplicate_member``) is a finding, corrupt, and is not read again, so
every byte of the file is read at most once (twice for the archive's own scan). At most
``max_zip_entries`` entries are examined, and DEFLATE output is capped per member, per file
(``max(inflate_floor, inflate_ratio x file size)``) and per checkpoint (``limit_exceeded``,
unverifiable, naming the setting). The ``stop`` event of the :class:`~..limits.Budget` is
checked between members and chunks.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field
from typing import BinaryIO

from ckptwatch.integrity.findings import Finding, Verdict
from ckptwatch.integrity.limits import Budget, Limits

CHUNK = 1 << 20
LOCAL_SIG = b"PK\x03\x04"
CENTRAL_SIG = b"PK\x01\x02"
EOCD_SIG = b"PK\x05\x06"
ZIP64_EOCD_SIG = b"PK\x06\x06"
ZIP64_LOCATOR_SIG = b"PK\x06\x07"

_EOCD = struct.Struct("<4sHHHHIIH")               # 22 bytes
_LOCATOR = struct.Struct("<4sIQI")                # 20 bytes
_ZIP64_EOCD = struct.Struct("<4sQHHIIQQQQ")       # 56 bytes
_CENTRAL = struct.Struct("<4sHHHHHHIIIHHHHHII")   # 46 bytes
_LOCAL = struct.Struct("<4sHHHHHIIIHH")           # 30 bytes
_MAX_COMMENT = 0xFFFF


@dataclass
class Eocd:
    """Where an archive's central directory is, in absolute file offsets.

    ``archive_start`` is where the archive must begin for the central directory offset it
    records to be right (``cd_end - cd_size - cd_offset``); ``end`` is one past the EOCD
    record (and its comment); ``entries`` the entry count it records.
    """

    eocd_pos: int
    end: int
    cd_start: int
    cd_end: int
    entries: int
    archive_start: int
    zip64: bool


@dataclass
class ZipResult:
    """The outcome of :func:`check_archive`: ``findings`` (empty when the archive is sound)
    and the facts ``entries``, ``uncompressed_bytes`` (sum of entry sizes) and ``top_folder``
    (the first path component shared by every entry name, or None)."""

    findings: list[Finding] = field(default_factory=list)
    entries: int = 0
    uncompressed_bytes: int = 0
    top_folder: str | None = None
    names: list[str] = field(default_factory=list)
    sound: list[Sound] = field(default_factory=list)


@dataclass(frozen=True)
class Sound:
    """A member whose local header, sizes and CRC-32 all checked out: ``name``, ``method``
    (0 stored, 8 DEFLATE), absolute ``data_start``, ``csize`` / ``usize`` in bytes."""

    name: str
    method: int
    data_start: int
    csize: int
    usize: int


class Inflate:
    """DEFLATE output still allowed for one file (bytes): :meth:`Limits.inflate_allowance` of its size."""

    def __init__(self, file_size: int, limits: Limits) -> None:
        self.allowance = limits.inflate_allowance(file_size)
        self.remaining = self.allowance
        self.file_size = file_size


def _read_at(f: BinaryIO, pos: int, n: int) -> bytes:
    f.seek(pos)
    return f.read(n)


def read_eocd_at(f: BinaryIO, pos: int, limit_end: int) -> Eocd | None:
    """Parse the EOCD record at absolute ``pos`` (and the ZIP64 records before it, when present).

    ``limit_end`` is the end of the byte range the archive must fit in. Returns None when
    the bytes at ``pos`` are not a usable EOCD record.
    """
    raw = _read_at(f, pos, _EOCD.size)
    if len(raw) < _EOCD.size:
        return None
    sig, disk, cd_disk, _n_disk, n, cd_size, cd_offset, comment = _EOCD.unpack(raw)
    if sig != EOCD_SIG or pos + _EOCD.size + comment > limit_end:
        return None
    cd_end = pos
    zip64 = False
    if pos >= _LOCATOR.size + _ZIP64_EOCD.size:
        loc = _read_at(f, pos - _LOCATOR.size, _LOCATOR.size)
        if len(loc) == _LOCATOR.size and loc[:4] == ZIP64_LOCATOR_SIG:
            rec_pos = pos - _LOCATOR.size - _ZIP64_EOCD.size
            rec = _read_at(f, rec_pos, _ZIP64_EOCD.size)
            if len(rec) < _ZIP64_EOCD.size or rec[:4] != ZIP64_EOCD_SIG:
                return None
            (_s, _rsize, _vm, _vn, disk, cd_disk, _n_disk, n, cd_size, cd_offset) = _ZIP64_EOCD.unpack(rec)
            cd_end = rec_pos
            zip64 = True
    if disk != 0 or cd_disk != 0:
        return None  # multi-disk archives are not checkpoints
    cd_start = cd_end - cd_size
    archive_start = cd_start - cd_offset
    if cd_start < 0 or archive_start < 0:
        return None
    return Eocd(pos, pos + _EOCD.size + comment, cd_start, cd_end, n, archive_start, zip64)


def find_tail_eocd(f: BinaryIO, start: int, end: int) -> Eocd | None:
    """The EOCD closing the archive that should span ``start``..``end``: searched backwards
    from ``end`` over the last 64 KiB (its comment can be up to 65535 bytes). Prefers a
    record whose archive begins exactly at ``start``."""
    lo = max(start, end - _EOCD.size - _MAX_COMMENT)
    tail = _read_at(f, lo, end - lo)
    i = len(tail)
    fallback: Eocd | None = None
    while True:
        i = tail.rfind(EOCD_SIG, 0, i)
        if i < 0:
            return fallback
        e = read_eocd_at(f, lo + i, end)
        if e is not None:
            if e.archive_start == start:
                return e
            fallback = fallback or e


def scan_item_end(f: BinaryIO, start: int, end: int, budget: Budget | None = None) -> Eocd | None:
    """Find the EOCD that closes an archive beginning at ``start``, reading forward (for
    archives written back to back, as DCP does); None when none does before ``end``.

    A candidate signature whose record (read from the buffer, no I/O) puts the archive
    anywhere but ``start`` is skipped at once, so bytes full of fake signatures cost a
    microsecond each, not a read each; past ``max_zip_entries / 4`` candidates
    :class:`TooManyEntries` is raised (real data holds one in about 4 GB). ``budget``'s stop
    event is checked every chunk."""
    cap = (budget or Budget()).limits.max_zip_entries // 4
    false = 0
    pos = start
    carry = b""
    base = start
    while pos < end:
        if budget is not None:
            budget.check()
        f.seek(pos)
        chunk = f.read(min(CHUNK, end - pos))
        if not chunk:
            return None
        buf = carry + chunk
        i = 0
        while True:
            i = buf.find(EOCD_SIG, i)
            if i < 0:
                break
            false += 1
            if false > cap:
                raise TooManyEntries(f"more than {cap} byte sequences looking like an end-of-archive record after "
                                     f"byte {start} (max_zip_entries={cap * 4} / 4): the archive's end was not "
                                     "searched further")
            if i + _EOCD.size <= len(buf):
                *_, cd_size, cd_offset, _comment = _EOCD.unpack_from(buf, i)
                plain = cd_size != 0xFFFFFFFF and cd_offset != 0xFFFFFFFF
                if plain and base + i - cd_size - cd_offset != start and not _zip64_locator_before(buf, i):
                    i += 1
                    continue
            e = read_eocd_at(f, base + i, end)
            if e is not None and e.archive_start == start and e.cd_start >= start:
                return e
            i += 1
        pos += len(chunk)
        carry = buf[-(_EOCD.size + _LOCATOR.size):]
        base = pos - len(carry)
    return None


def _zip64_locator_before(buf: bytes, i: int) -> bool:
    """True unless ``buf`` shows there is no ZIP64 locator just before offset ``i`` (then the
    EOCD's own fields are the real ones)."""
    j = i - _LOCATOR.size
    return j < 0 or buf[j:j + 4] == ZIP64_LOCATOR_SIG


@dataclass
class _Entry:
    name: bytes
    flags: int
    method: int
    crc: int
    csize: int
    usize: int
    local_offset: int


def _zip64_extra(extra: bytes, usize: int, csize: int, offset: int) -> tuple[int, int, int]:
    i = 0
    while i + 4 <= len(extra):
        hid, size = struct.unpack_from("<HH", extra, i)
        body = extra[i + 4:i + 4 + size]
        if hid == 0x0001:
            vals = [struct.unpack_from("<Q", body, j)[0] for j in range(0, len(body) - 7, 8)]
            k = 0
            if usize == 0xFFFFFFFF and k < len(vals):
                usize, k = vals[k], k + 1
            if csize == 0xFFFFFFFF and k < len(vals):
                csize, k = vals[k], k + 1
            if offset == 0xFFFFFFFF and k < len(vals):
                offset = vals[k]
            break
        i += 4 + size
    return usize, csize, offset


class CentralDirectoryError(Exception):
    """The central directory cannot be parsed (the message says where)."""


class TooManyEntries(CentralDirectoryError):
    """The archive has more entries than ``max_zip_entries`` (the message says how many)."""


def read_central(f: BinaryIO, eocd: Eocd, max_entries: int | None = None) -> list[_Entry]:
    """The central directory's entries, parsed record by record (memory grows with the entry
    count, never with data size). Raises :class:`CentralDirectoryError` when a record is
    damaged, runs past the directory, or the count differs from the EOCD's;
    :class:`TooManyEntries` past ``max_entries`` (default :attr:`Limits.max_zip_entries`),
    before reading them."""
    cap = Limits().max_zip_entries if max_entries is None else max_entries
    if eocd.entries > cap:
        raise TooManyEntries(f"the end record lists {eocd.entries} entries, more than the limit "
                             f"max_zip_entries={cap}: not checked")
    entries: list[_Entry] = []
    f.seek(eocd.cd_start)
    pos = eocd.cd_start
    while pos < eocd.cd_end:
        if len(entries) >= cap:
            raise TooManyEntries(f"the central directory holds more than {cap} entries (the end record says "
                                 f"{eocd.entries}), more than the limit max_zip_entries={cap}: not checked")
        raw = f.read(_CENTRAL.size)
        if len(raw) < _CENTRAL.size or raw[:4] != CENTRAL_SIG:
            raise CentralDirectoryError(f"central directory record {len(entries)} at byte {pos} is damaged "
                                        "(no PK\\1\\2 signature)")
        (_s, _vm, _vn, flags, method, _t, _d, crc, csize, usize, nlen, elen, clen, _disk, _ia, _ea,
         lho) = _CENTRAL.unpack(raw)
        n = nlen + elen + clen
        rest = f.read(n)
        if len(rest) < n or pos + _CENTRAL.size + n > eocd.cd_end:
            raise CentralDirectoryError(f"central directory record {len(entries)} at byte {pos} runs past the "
                                        "end of the central directory")
        usize, csize, lho = _zip64_extra(rest[nlen:nlen + elen], usize, csize, lho)
        entries.append(_Entry(rest[:nlen], flags, method, crc, csize, usize, lho))
        pos += _CENTRAL.size + n
    if len(entries) != eocd.entries:
        raise CentralDirectoryError(f"the central directory holds {len(entries)} entries, the end record says "
                                    f"{eocd.entries}")
    return entries


def member_names(f: BinaryIO, eocd: Eocd) -> list[str]:
    """Entry names of the archive (``CentralDirectoryError`` when its directory is damaged or
    holds more than the default ``max_zip_entries``)."""
    return [e.name.decode("utf-8", "replace") for e in read_central(f, eocd)]


def locate_member(f: BinaryIO, eocd: Eocd, basename: str) -> tuple[int, int] | None:
    """(absolute data offset, size in bytes) of the first STORED member named ``basename`` or
    ``<folder>/<basename>``, or None (absent, compressed, or its local header damaged)."""
    want = basename.encode()
    try:
        entries = read_central(f, eocd)
    except CentralDirectoryError:
        return None
    for e in entries:
        if (e.name == want or e.name.endswith(b"/" + want)) and e.method == 0 and not e.flags & 1:
            lh = _read_at(f, eocd.archive_start + e.local_offset, _LOCAL.size)
            if len(lh) < _LOCAL.size or lh[:4] != LOCAL_SIG:
                return None
            nlen, elen = _LOCAL.unpack(lh)[-2:]
            return eocd.archive_start + e.local_offset + _LOCAL.size + nlen + elen, e.csize
    return None


def _top_folder(names: list[str]) -> str | None:
    tops = {n.split("/", 1)[0] for n in names if "/" in n}
    return tops.pop() if len(tops) == 1 and all("/" in n for n in names) else None


def check_archive(f: BinaryIO, eocd: Eocd, *, path: str, label: str = "", start: int = 0,
                  keep_names: bool = False, budget: Budget | None = None, inflate: Inflate | None = None
                  ) -> ZipResult:
    """Check the archive that ``eocd`` closes and that begins at ``start``.

    Checks: the central directory holds exactly the entry count the EOCD records; every
    entry's local header is where the directory says, has the local header signature and the
    same name; the data lies before the central directory; the CRC-32 and uncompressed size
    recomputed by streaming match the directory. ``label`` prefixes details (e.g. which DCP
    storage entry the archive is). Findings: ``bad_central_directory``, ``bad_local_header``,
    ``bad_entry`` (all corrupt), ``crc_mismatch`` / ``size_mismatch`` (corrupt, naming the
    member), ``zip_duplicate_member`` / ``zip_overlap`` (corrupt: a name listed twice, a
    member whose bytes begin inside another's; not read again), ``unsupported_entry``
    (unverifiable: encrypted or a method other than 0/8), ``limit_exceeded`` (unverifiable:
    more than ``max_zip_entries`` entries, or DEFLATE output over a limit).

    ``budget`` (default: fresh :class:`~..limits.Budget`) gives the limits and the stop
    event (:class:`~..limits.Cancelled` is raised once it is set); ``inflate`` the file's
    DEFLATE allowance (default: from the archive's own size). I/O errors propagate (``OSError``).
    The members that checked out are listed in ``ZipResult.sound``.
    """
    budget = budget or Budget()
    inflate = inflate or Inflate(eocd.end - start, budget.limits)
    r = ZipResult()
    pre = f"{label}: " if label else ""

    def bad(verdict: Verdict, problem: str, detail: str) -> None:
        r.findings.append(Finding(path, verdict, problem, pre + detail))

    if eocd.archive_start != start:
        bad("corrupt", "bad_central_directory",
            f"the end-of-central-directory record at byte {eocd.eocd_pos} puts the archive start at byte "
            f"{eocd.archive_start}, not {start}")
        return r
    try:
        entries = read_central(f, eocd, budget.limits.max_zip_entries)
    except TooManyEntries as e:
        bad("unverifiable", "limit_exceeded", str(e))
        return r
    except CentralDirectoryError as e:
        bad("corrupt", "bad_central_directory", str(e))
        return r
    names = [e.name.decode("utf-8", "replace") for e in entries]
    r.entries = len(entries)
    r.uncompressed_bytes = sum(e.usize for e in entries)
    r.top_folder = _top_folder(names)
    if keep_names:
        r.names = names
    _duplicates(names, bad)
    overlaps: list[str] = []
    limited: list[str] = []
    prev_end, prev_name = -1, ""
    for e, name in sorted(zip(entries, names), key=lambda x: x[0].local_offset):
        budget.check()
        lh_pos = start + e.local_offset
        if lh_pos < prev_end:
            overlaps.append(f"member {name} (local header at byte {lh_pos}) begins inside member {prev_name} "
                            f"(which ends at byte {prev_end})")
            continue
        end = _check_entry(f, e, name, start, eocd.cd_start, bad, budget, inflate, limited, r.sound)
        prev_end, prev_name = max(end, lh_pos + 1), name
    if overlaps:
        more = f"; and {len(overlaps) - 1} more" if len(overlaps) > 1 else ""
        bad("corrupt", "zip_overlap", f"{len(overlaps)} central-directory entries point into bytes another member "
            f"already uses (a zip bomb's trick; torch.save never does this): {overlaps[0]}{more}; each byte is "
            "checked once")
    if limited:
        more = f" (and {len(limited) - 1} more members)" if len(limited) > 1 else ""
        bad("unverifiable", "limit_exceeded", f"{limited[0]}{more}: not inflated, CRC not checked")
    return r


def _duplicates(names: list[str], bad) -> None:
    seen: dict[str, int] = {}
    for n in names:
        seen[n] = seen.get(n, 0) + 1
    repeated = [(n, k) for n, k in seen.items() if k > 1]
    if repeated:
        n, k = repeated[0]
        more = f"; {len(repeated) - 1} other names are repeated too" if len(repeated) > 1 else ""
        bad("corrupt", "zip_duplicate_member", f"member {n} is listed {k} times in the central directory{more} "
            "(a reader takes one of them; a zip bomb lists one member many times)")


def _check_entry(f: BinaryIO, e: _Entry, name: str, start: int, cd_start: int, bad, budget: Budget,
                 inflate: Inflate, limited: list[str], sound: list[Sound]) -> int:
    """Check one member; returns the absolute end of what it occupies (its local header when
    that is unreadable), for the overlap test."""
    lh_pos = start + e.local_offset
    raw = _read_at(f, lh_pos, _LOCAL.size) if lh_pos + _LOCAL.size <= cd_start else b""
    if len(raw) < _LOCAL.size or raw[:4] != LOCAL_SIG:
        bad("corrupt", "bad_local_header", f"member {name}: no local file header at byte {lh_pos}")
        return lh_pos + _LOCAL.size
    _s, _v, _fl, _m, _t, _d, _crc, _cs, _us, nlen, elen = _LOCAL.unpack(raw)
    if f.read(nlen) != e.name:
        bad("corrupt", "bad_local_header", f"member {name}: the local header at byte {lh_pos} names another file")
        return lh_pos + _LOCAL.size + nlen
    data_start = lh_pos + _LOCAL.size + nlen + elen
    data_end = data_start + e.csize
    if data_end > cd_start:
        bad("corrupt", "bad_entry", f"member {name}: its {e.csize} bytes at byte {data_start} run into the "
            f"central directory at byte {cd_start}")
        return data_end
    if e.flags & 0x1:
        bad("unverifiable", "unsupported_entry", f"member {name} is encrypted: its CRC cannot be checked")
        return data_end
    if e.method not in (0, 8):
        bad("unverifiable", "unsupported_entry", f"member {name} uses compression method {e.method}: "
            "its CRC cannot be checked")
        return data_end
    if e.method == 0 and e.csize != e.usize:
        bad("corrupt", "bad_entry", f"member {name} is stored but its sizes differ ({e.csize} vs {e.usize})")
        return data_end
    if e.method == 8:
        over = _inflate_limit(e, name, budget, inflate)
        if over:
            limited.append(over)
            return data_end
    f.seek(data_start)
    crc, total = _stream_crc(f, e.csize, e.method, e.usize, budget)
    if e.method == 8:
        inflate.remaining -= total or 0
        budget.charge_inflated(total or 0)
    if total is None:
        bad("corrupt", "bad_entry", f"member {name}: its DEFLATE data at byte {data_start} is damaged")
    elif total != e.usize:
        bad("corrupt", "size_mismatch", f"member {name}: {total} bytes of data, the central directory says "
            f"{e.usize}")
    elif crc != e.crc:
        bad("corrupt", "crc_mismatch", f"member {name}: CRC-32 of its {e.usize} bytes at byte {data_start} is "
            f"{crc:08x}, the central directory says {e.crc:08x} (bytes changed after writing)")
    else:
        sound.append(Sound(name, e.method, data_start, e.csize, e.usize))
    return data_end


def _inflate_limit(e: _Entry, name: str, budget: Budget, inflate: Inflate) -> str | None:
    """Why the DEFLATE member ``e`` may not be inflated (None: it may): its declared size
    (decompression never goes past it) against the member, file and checkpoint caps."""
    lim = budget.limits
    what = f"member {name} declares {e.usize} bytes from {e.csize} compressed"
    if e.usize > lim.max_member_inflated:
        return f"{what}, more than the limit max_member_inflated={lim.max_member_inflated}"
    if e.usize > inflate.remaining:
        return (f"{what}, more than the {inflate.remaining} bytes of DEFLATE output left of this file's "
                f"allowance, max(inflate_floor={lim.inflate_floor}, inflate_ratio={lim.inflate_ratio} x "
                f"{inflate.file_size} bytes)")
    if e.usize > budget.inflate_left():
        return (f"{what}, more than the {budget.inflate_left()} bytes of DEFLATE output left of the checkpoint's "
                f"limit max_total_inflated={lim.max_total_inflated}")
    return None


def _stream_crc(f: BinaryIO, csize: int, method: int, usize: int, budget: Budget) -> tuple[int, int | None]:
    """CRC-32 and byte count of an entry's uncompressed data; (crc, None) for bad DEFLATE data.
    Raises :class:`~..limits.Cancelled` (checked every chunk) once the budget's stop is set."""
    crc = 0
    total = 0
    left = csize
    d = zlib.decompressobj(-15) if method == 8 else None
    try:
        while left:
            budget.check()
            chunk = f.read(min(CHUNK, left))
            if not chunk:
                return crc, total
            left -= len(chunk)
            if d is None:
                crc = zlib.crc32(chunk, crc)
                total += len(chunk)
                continue
            buf = chunk
            while buf:
                budget.check()  # one input chunk of a bomb inflates to a gigabyte
                out = d.decompress(buf, CHUNK)
                crc = zlib.crc32(out, crc)
                total += len(out)
                if total > usize:  # more than declared: stop (a decompression bomb never inflates fully)
                    return crc, total
                buf = d.unconsumed_tail
        if d is not None:
            out = d.flush()  # all input consumed: at most a window's worth is still pending
            crc = zlib.crc32(out, crc)
            total += len(out)
            if not d.eof:
                return crc, None
    except zlib.error:
        return crc, None
    return crc, total
