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
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field
from typing import BinaryIO

from ckptwatch.integrity.findings import Finding, Verdict

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


def scan_item_end(f: BinaryIO, start: int, end: int) -> Eocd | None:
    """Find the EOCD that closes an archive beginning at ``start``, reading forward (for
    archives written back to back, as DCP does); None when none does before ``end``."""
    pos = start
    carry = b""
    base = start
    while pos < end:
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
            e = read_eocd_at(f, base + i, end)
            if e is not None and e.archive_start == start and e.cd_start >= start:
                return e
            i += 1
        pos += len(chunk)
        carry = buf[-3:]
        base = pos - len(carry)
    return None


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


def read_central(f: BinaryIO, eocd: Eocd) -> list[_Entry]:
    """The central directory's entries, parsed record by record (memory grows with the entry
    count, never with data size). Raises :class:`CentralDirectoryError` when a record is
    damaged, runs past the directory, or the count differs from the EOCD's."""
    entries: list[_Entry] = []
    f.seek(eocd.cd_start)
    pos = eocd.cd_start
    while pos < eocd.cd_end:
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
    """Entry names of the archive (``CentralDirectoryError`` when its directory is damaged)."""
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
                  keep_names: bool = False) -> ZipResult:
    """Check the archive that ``eocd`` closes and that begins at ``start``.

    Checks: the central directory holds exactly the entry count the EOCD records; every
    entry's local header is where the directory says, has the local header signature and the
    same name; the data lies before the central directory; the CRC-32 and uncompressed size
    recomputed by streaming match the directory. ``label`` prefixes details (e.g. which DCP
    storage entry the archive is). Findings: ``bad_central_directory``, ``bad_local_header``,
    ``bad_entry`` (all corrupt), ``crc_mismatch`` / ``size_mismatch`` (corrupt, naming the
    member), ``unsupported_entry`` (unverifiable: encrypted or a method other than 0/8).
    I/O errors propagate (``OSError``).
    """
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
        entries = read_central(f, eocd)
    except CentralDirectoryError as e:
        bad("corrupt", "bad_central_directory", str(e))
        return r
    names = [e.name.decode("utf-8", "replace") for e in entries]
    r.entries = len(entries)
    r.uncompressed_bytes = sum(e.usize for e in entries)
    r.top_folder = _top_folder(names)
    if keep_names:
        r.names = names
    for e, name in sorted(zip(entries, names), key=lambda x: x[0].local_offset):
        _check_entry(f, e, name, start, eocd.cd_start, bad)
    return r


def _check_entry(f: BinaryIO, e: _Entry, name: str, start: int, cd_start: int, bad) -> None:
    lh_pos = start + e.local_offset
    raw = _read_at(f, lh_pos, _LOCAL.size) if lh_pos + _LOCAL.size <= cd_start else b""
    if len(raw) < _LOCAL.size or raw[:4] != LOCAL_SIG:
        bad("corrupt", "bad_local_header", f"member {name}: no local file header at byte {lh_pos}")
        return
    _s, _v, _fl, _m, _t, _d, _crc, _cs, _us, nlen, elen = _LOCAL.unpack(raw)
    if f.read(nlen) != e.name:
        bad("corrupt", "bad_local_header", f"member {name}: the local header at byte {lh_pos} names another file")
        return
    data_start = lh_pos + _LOCAL.size + nlen + elen
    data_end = data_start + e.csize
    if data_end > cd_start:
        bad("corrupt", "bad_entry", f"member {name}: its {e.csize} bytes at byte {data_start} run into the "
            f"central directory at byte {cd_start}")
        return
    if e.flags & 0x1:
        bad("unverifiable", "unsupported_entry", f"member {name} is encrypted: its CRC cannot be checked")
        return
    if e.method not in (0, 8):
        bad("unverifiable", "unsupported_entry", f"member {name} uses compression method {e.method}: "
            "its CRC cannot be checked")
        return
    if e.method == 0 and e.csize != e.usize:
        bad("corrupt", "bad_entry", f"member {name} is stored but its sizes differ ({e.csize} vs {e.usize})")
        return
    f.seek(data_start)
    crc, total = _stream_crc(f, e.csize, e.method, e.usize)
    if total is None:
        bad("corrupt", "bad_entry", f"member {name}: its DEFLATE data at byte {data_start} is damaged")
    elif total != e.usize:
        bad("corrupt", "size_mismatch", f"member {name}: {total} bytes of data, the central directory says "
            f"{e.usize}")
    elif crc != e.crc:
        bad("corrupt", "crc_mismatch", f"member {name}: CRC-32 of its {e.usize} bytes at byte {data_start} is "
            f"{crc:08x}, the central directory says {e.crc:08x} (bytes changed after writing)")


def _stream_crc(f: BinaryIO, csize: int, method: int, usize: int) -> tuple[int, int | None]:
    """CRC-32 and byte count of an entry's uncompressed data; (crc, None) for bad DEFLATE data."""
    crc = 0
    total = 0
    left = csize
    d = zlib.decompressobj(-15) if method == 8 else None
    try:
        while left:
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
