"""``torch.save`` files (the zip format) and the archives inside DCP shards: the zip container
and every pickle in it, read without running it.

Format (``torch/serialization.py``: ``_save`` / ``_load`` through ``PyTorchFileWriter`` /
``PyTorchFileReader``): a zip archive (PKWARE APPNOTE, checked by :mod:`.zipcheck`), every
member STORED, under one top folder (``archive/`` or the file's stem): ``data.pkl`` (the
object, a pickle whose tensors refer to storages by persistent id ``('storage',
storage_type, key, location, numel)``), ``byteorder``, ``data/<key>`` (each storage's raw
bytes), ``version``, ``.data/serialization_id``.

``torch.load`` unpickles ``data.pkl`` (with ``weights_only=False``, the default before
torch 2.6 and still common, it runs whatever the pickle calls: ``os.system``...). So every
member named ``*.pkl`` whose CRC checked out is read here with the restricted unpickler
(:func:`.safe_pickle.load_inert`, policy ``TORCH_PICKLE``: nothing is imported or run):
a global that runs code is ``unsafe_pickle`` (corrupt), a stream that is not a pickle is
``bad_pickle`` (corrupt; its CRC matched, so it was written that way), other globals (user
classes, inert) are listed in the fact ``foreign_globals``. A member whose CRC failed is not
unpickled: the CRC finding says it all. A DEFLATEd pickle is inflated into memory within
``max_pickle_bytes`` and the inflate budgets (:mod:`ckptwatch.integrity.limits`).
"""

from __future__ import annotations

import io
import zlib
from typing import Any, BinaryIO

from ckptwatch.integrity.findings import Finding
from ckptwatch.integrity.formats import zipcheck
from ckptwatch.integrity.formats.safe_pickle import TORCH_PICKLE, PickleLimitError, UnsafePickleError, load_inert
from ckptwatch.integrity.limits import Budget


def check_file(f: BinaryIO, size: int, rel: str, budget: Budget | None = None) -> tuple[list[Finding], dict[str, Any]]:
    """A whole-file zip archive (``torch.save``): :func:`check_archive`, plus ``truncated``
    (incomplete: no end record, the file begins like a zip), ``bad_magic`` (corrupt:
    neither), ``trailing_data`` (corrupt: bytes after the end record). Facts: ``entries``,
    ``uncompressed_bytes`` (sum of declared sizes), ``top_folder``, and ``foreign_globals``
    when a pickle names any."""
    budget = budget or Budget()
    eocd = zipcheck.find_tail_eocd(f, 0, size)
    if eocd is None:
        f.seek(0)
        if f.read(4) == zipcheck.LOCAL_SIG:
            return [Finding(rel, "incomplete", "truncated", f"{size} bytes and no zip end-of-central-directory "
                            "record: the archive was cut short (a complete torch.save file ends with one)")], {}
        return [Finding(rel, "corrupt", "bad_magic", "neither a zip archive (no local header at byte 0, no end "
                        "record) nor torch's legacy format")], {}
    r, foreign = check_archive(f, eocd, path=rel, start=0, budget=budget,
                               inflate=zipcheck.Inflate(size, budget.limits))
    if eocd.end < size:
        r.findings.append(Finding(rel, "corrupt", "trailing_data", f"{size - eocd.end} bytes after the archive's end "
                                  f"record at byte {eocd.end}"))
    facts: dict[str, Any] = {"entries": r.entries, "uncompressed_bytes": r.uncompressed_bytes,
                             "top_folder": r.top_folder}
    if foreign:
        facts["foreign_globals"] = sorted(foreign)
    return r.findings, facts


def check_archive(f: BinaryIO, eocd: zipcheck.Eocd, *, path: str, label: str = "", start: int = 0,
                  budget: Budget, inflate: zipcheck.Inflate) -> tuple[zipcheck.ZipResult, set[str]]:
    """:func:`.zipcheck.check_archive` (same arguments), then every sound ``*.pkl`` member read
    inertly (findings added to the result). Returns the result and the foreign globals the
    pickles name."""
    r = zipcheck.check_archive(f, eocd, path=path, label=label, start=start, budget=budget, inflate=inflate)
    foreign: set[str] = set()
    pre = f"{label}: " if label else ""
    for m in r.sound:
        if m.name.endswith(".pkl"):
            budget.check()
            problem = _check_pickle(f, m, budget, inflate, foreign)
            if problem is not None:
                verdict, code, detail = problem
                r.findings.append(Finding(path, verdict, code, f"{pre}member {m.name}: {detail}"))  # type: ignore[arg-type]
    return r, foreign


def _check_pickle(f: BinaryIO, m: zipcheck.Sound, budget: Budget, inflate: zipcheck.Inflate,
                  foreign: set[str]) -> tuple[str, str, str] | None:
    """(verdict, problem, detail) for the pickle member ``m``, or None when it reads cleanly."""
    lim = budget.limits
    if m.usize > lim.max_pickle_bytes:
        return ("unverifiable", "limit_exceeded", f"a {m.usize}-byte pickle, more than the limit "
                f"max_pickle_bytes={lim.max_pickle_bytes}: not read")
    if m.method == 0:
        src: BinaryIO = f
        f.seek(m.data_start)
    else:
        if m.usize > inflate.remaining or m.usize > budget.inflate_left():
            return ("unverifiable", "limit_exceeded", f"a DEFLATEd {m.usize}-byte pickle, more than the DEFLATE "
                    "output left of the file's or the checkpoint's allowance (inflate_ratio, max_total_inflated): "
                    "not read")
        f.seek(m.data_start)
        data = zlib.decompressobj(-15).decompress(f.read(m.csize), m.usize)  # its CRC pass proved it fits
        inflate.remaining -= len(data)
        budget.charge_inflated(len(data))
        src = io.BytesIO(data)
    try:
        _, u = load_inert(src, source=m.name, policy=TORCH_PICKLE, limit=m.usize, keep_persistent=True,
                          max_bytes=lim.max_pickle_bytes)
    except UnsafePickleError as e:
        return ("corrupt", "unsafe_pickle", f"the pickle refers to {e.global_name}: refused, nothing was run "
                "(torch.load without weights_only would run it)")
    except PickleLimitError as e:
        return ("unverifiable", "limit_exceeded", str(e))
    except OSError:
        raise
    except Exception as e:  # whatever a malformed pickle raises (UnpicklingError, EOFError, ValueError, ...)
        return ("corrupt", "bad_pickle", f"not a valid pickle although its CRC matches: {type(e).__name__}: "
                f"{e}"[:300])
    foreign |= u.foreign
    return None
