"""``torch.distributed.checkpoint`` (DCP) checkpoints: ``.metadata`` and ``__R_I.distcp`` shards.

Layout (``torch/distributed/checkpoint/filesystem.py`` and ``metadata.py``): every rank R
writes its items to ``__R_I.distcp`` files (I counts the files of a rank); each item is
``torch.save``'d into the stream (a tensor, or the bytes of a ``torch.save``'d object), so a
shard is zip archives back to back (checked against the corpus: 01-clean's
``__0_0.distcp`` holds six ``archive/`` zips). After every rank has written, the
coordinator writes ``.metadata``: a pickle of ``Metadata(state_dict_metadata,
planner_data, storage_data, storage_meta, version)`` where ``storage_data`` maps each
``MetadataIndex(fqn, offset, index)`` to ``_StorageInfo(relative_path, offset, length)``,
the item's byte range in a shard. No ``.metadata``: the save never committed.

``.metadata`` is read with :class:`~.safe_pickle.InertUnpickler` (policy ``DCP_METADATA``):
torch is never imported and nothing in the file runs; any global outside DCP's own classes,
``torch.Size``, dtypes and a few containers is ``unsafe_pickle``.

What can be checked where:

* :func:`check_shard` (one shard, via ``check_file``): with a readable sibling
  ``.metadata``, each storage entry's byte range must hold exactly one zip archive whose
  CRC-32s match (a flipped bit is found and named by tensor fqn); without one, the shard
  is walked archive by archive (each archive's end record tells where the next begins).
* :func:`tree_findings` (``check_tree``): ``no_metadata``, shards ``.metadata`` names but
  that are absent (``missing``) or shorter than its entries need (``truncated``), shards it
  does not name (``unreferenced``, a note).

Hostile metadata (issue 14): a ``relative_path`` that is absolute or climbs out with ``..``
is ``path_escape`` (corrupt) and nothing it names is looked at; storage entries whose byte
ranges overlap (10,000 entries naming one archive) are ``overlapping_entries`` (corrupt) and
each range is checked once; the sibling ``.metadata`` is only read when it resolves inside
the checkpoint (:mod:`.confine`: a symlink to another checkpoint's is never followed); every
``data.pkl`` in the shard's archives is read inertly (:mod:`.torch_zip`), and so is an entry
that is not an archive but begins like a pickle (torch's legacy format, which ``torch.load``
unpickles before checking anything).

Not detectable structurally: entries that are not zip archives (writers with stream
transforms / compression extensions, or a raw-bytes serialization format) carry no
checksum, so a flipped bit in them is invisible here; only the manifest's SHA-256 catches it.
"""

from __future__ import annotations

import os
import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from ckptwatch.integrity.findings import Finding
from ckptwatch.integrity.formats import torch_legacy, torch_zip, zipcheck
from ckptwatch.integrity.formats.confine import PathEscape, join_inside, open_inside, stat_inside
from ckptwatch.integrity.formats.pickle_file import looks_like_pickle
from ckptwatch.integrity.formats.safe_pickle import (DCP_METADATA, PickleLimitError, UnsafePickleError, is_record,
                                                    load_inert)
from ckptwatch.integrity.limits import Budget, Limits

METADATA_NAME = ".metadata"
SHARD_RE = re.compile(r"^__(\d+)_(\d+)\.distcp$")
_META_MODULE = "torch.distributed.checkpoint.metadata"


class MetadataError(Exception):
    """``.metadata`` is unusable: ``verdict``, ``problem`` (``truncated``, ``bad_pickle``,
    ``bad_metadata``, ``unsafe_pickle``) and a detail."""

    def __init__(self, verdict: str, problem: str, detail: str):
        self.verdict, self.problem = verdict, problem
        super().__init__(detail)


@dataclass(frozen=True)
class StorageEntry:
    """One ``storage_data`` entry: the item ``fqn`` (with its chunk ``chunk_offset`` when the
    tensor is sharded) stored at ``offset``..``offset + length`` (bytes) of ``relative_path``."""

    fqn: str
    chunk_offset: tuple[int, ...] | None
    relative_path: str
    offset: int
    length: int
    transformed: bool = False

    def label(self) -> str:
        chunk = f" chunk {list(self.chunk_offset)}" if self.chunk_offset else ""
        return f"storage entry {self.fqn}{chunk} at bytes {self.offset}..{self.offset + self.length}"


@dataclass
class DcpMetadata:
    """What ``.metadata`` says: ``entries`` (every storage entry), ``tensors`` /
    ``bytes_items`` (``state_dict_metadata`` counts), ``version``."""

    entries: list[StorageEntry] = field(default_factory=list)
    tensors: int = 0
    bytes_items: int = 0
    version: str | None = None

    def by_file(self) -> dict[str, list[StorageEntry]]:
        out: dict[str, list[StorageEntry]] = {}
        for e in self.entries:
            out.setdefault(e.relative_path, []).append(e)
        return out

    def facts(self) -> dict[str, Any]:
        """JSON facts: entry and tensor counts, shard files, bytes needed per shard, writer ranks."""
        need: dict[str, int] = {}
        for e in self.entries:
            need[e.relative_path] = max(need.get(e.relative_path, 0), e.offset + e.length)
        ranks = sorted({int(m.group(1)) for p in need if (m := SHARD_RE.match(posixpath.basename(p)))})
        return {"storage_entries": len(self.entries), "tensors": self.tensors, "bytes_items": self.bytes_items,
                "shard_files": sorted(need), "shard_bytes_needed": dict(sorted(need.items())),
                "ranks": ranks, "writer_ranks": len(ranks), "version": self.version,
                "entries_with_transforms": sum(e.transformed for e in self.entries)}


def _size_tuple(v: Any) -> tuple[int, ...] | None:
    if is_record(v, "Size", "torch") and v.args and isinstance(v.args[0], (tuple, list)):
        dims = tuple(v.args[0])
        if all(type(d) is int for d in dims):
            return dims
    return None


def parse_metadata(f: BinaryIO, size: int, source: str, limits: Limits | None = None) -> DcpMetadata:
    """Read ``.metadata`` from ``f`` (``size`` bytes) inertly and pull out its storage entries.

    Raises :class:`MetadataError` (``unsafe_pickle`` for a refused global, ``truncated`` when
    the pickle stops at end of file, ``path_escape`` for a ``relative_path`` leading out of
    the checkpoint, ``limit_exceeded`` over ``max_pickle_bytes``, ``bad_pickle`` /
    ``bad_metadata`` otherwise).
    """
    limits = limits or Limits()
    if size == 0:
        raise MetadataError("incomplete", "empty", "empty file (0 bytes): the metadata was never written out")
    if size > limits.max_pickle_bytes:
        raise MetadataError("unverifiable", "limit_exceeded", f"{size} bytes of pickle, more than the limit "
                            f"max_pickle_bytes={limits.max_pickle_bytes}: not read")
    try:
        obj, _ = load_inert(f, source=source, policy=DCP_METADATA, limit=size, max_bytes=limits.max_pickle_bytes)
    except UnsafePickleError as e:
        raise MetadataError("corrupt", "unsafe_pickle", f"the pickle refers to {e.global_name}: refused (DCP "
                            "metadata holds only DCP's dataclasses, torch.Size and dtypes); nothing was run") from None
    except PickleLimitError as e:
        raise MetadataError("unverifiable", "limit_exceeded", str(e)) from None
    except OSError:
        raise
    except Exception as e:  # whatever a malformed pickle raises (UnpicklingError, EOFError, TypeError, ...)
        if f.tell() >= size:
            raise MetadataError("incomplete", "truncated", f"the pickle stops at the end of the file ({size} bytes): "
                                "cut short") from None
        raise MetadataError("corrupt", "bad_pickle", f"not a valid pickle: {type(e).__name__}: {e}"[:300]) from None
    if f.tell() != size:
        raise MetadataError("corrupt", "trailing_data", f"{size - f.tell()} bytes after the pickle's end")
    if not is_record(obj, "Metadata", _META_MODULE):
        raise MetadataError("corrupt", "bad_metadata", "the pickle is not a torch.distributed.checkpoint Metadata")
    fields = obj.fields()
    md = DcpMetadata(version=fields.get("version") if isinstance(fields.get("version"), str) else None)
    sdm = fields.get("state_dict_metadata")
    if isinstance(sdm, dict):
        md.tensors = sum(is_record(v, "TensorStorageMetadata") for v in sdm.values())
        md.bytes_items = sum(is_record(v, "BytesStorageMetadata") for v in sdm.values())
    storage = fields.get("storage_data")
    if not isinstance(storage, dict):
        raise MetadataError("corrupt", "bad_metadata", "storage_data is not a mapping (not a FileSystemWriter "
                            "checkpoint?)")
    for key, info in storage.items():
        kf = key.fields() if is_record(key, "MetadataIndex") else {}
        fqn = kf.get("fqn")
        vf = info.fields() if is_record(info, "_StorageInfo") else {}
        rel, off, length = vf.get("relative_path"), vf.get("offset"), vf.get("length")
        if (not isinstance(fqn, str) or not isinstance(rel, str) or not rel or type(off) is not int
                or type(length) is not int or off < 0 or length < 0):
            raise MetadataError("corrupt", "bad_metadata", f"storage entry {len(md.entries)} is not "
                                "MetadataIndex(fqn) -> _StorageInfo(relative_path, offset >= 0, length >= 0)")
        try:
            join_inside("", rel)
        except PathEscape as e:
            raise MetadataError("corrupt", "path_escape", f"storage entry {fqn[:200]} names the file "
                                f"{rel[:200]!r}: {e}; nothing it names was looked at") from None
        md.entries.append(StorageEntry(fqn, _size_tuple(kf.get("offset")), rel, off, length,
                                       bool(vf.get("transform_descriptors"))))
    return md


def _parse_at(root: Path, rel: str, limits: Limits) -> DcpMetadata | MetadataError | None:
    try:
        with open_inside(root, rel) as f:
            return parse_metadata(f, os.fstat(f.fileno()).st_size, rel, limits)
    except MetadataError as e:
        return e
    except (OSError, PathEscape):
        return None


def load_metadata(root: Path, rel: str, budget: Budget | None = None) -> DcpMetadata | MetadataError | None:
    """The parsed ``.metadata`` at ``root/rel`` (parsed once per ``budget``, i.e. per
    verification: its shards share it); the :class:`MetadataError` when it is unusable; None
    when it cannot be read (absent, no permission, or a symlink leading out of the
    checkpoint: never followed)."""
    budget = budget or Budget()
    return budget.memo(("dcp_metadata", str(root), rel), lambda: _parse_at(root, rel, budget.limits))


def check_metadata(f: BinaryIO, size: int, path: str, budget: Budget | None = None
                   ) -> tuple[list[Finding], dict[str, Any]]:
    """``check_file`` for ``.metadata``: findings from :func:`parse_metadata`, facts from
    :meth:`DcpMetadata.facts`."""
    try:
        md = parse_metadata(f, size, path, (budget or Budget()).limits)
    except MetadataError as e:
        return [Finding(path, e.verdict, e.problem, str(e))], {}  # type: ignore[arg-type]
    return [], md.facts()


# --- one shard ---------------------------------------------------------------------------------

def check_shard(root: Path, rel: str, f: BinaryIO, size: int, budget: Budget | None = None
                ) -> tuple[list[Finding], dict[str, Any], bool]:
    """``check_file`` for a ``.distcp`` shard: (findings, facts, checked).

    With the sibling ``.metadata`` readable (and inside the checkpoint): every storage
    entry in this shard must lie inside the file (else ``truncated``, incomplete) and, when
    it is a zip archive, be exactly one archive whose CRCs match and whose pickles are safe
    (``crc_mismatch`` / ``unsafe_pickle`` naming the tensor, ``entry_mismatch`` when the range
    does not hold one archive, ``overlapping_entries`` when ranges overlap: corrupt).
    Otherwise :func:`walk_shard`.
    """
    budget = budget or Budget()
    md = load_metadata(root, posixpath.join(posixpath.dirname(rel), METADATA_NAME), budget)
    name = posixpath.basename(rel)
    if isinstance(md, DcpMetadata):
        entries = md.by_file().get(name)
        if entries:
            findings, facts = _check_entries(f, size, rel, sorted(entries, key=lambda e: e.offset), budget)
            return findings, facts, True
        findings, facts, checked = walk_shard(f, size, rel, budget)
        facts["referenced"] = False
        return findings, facts, checked
    return walk_shard(f, size, rel, budget)


def _check_entries(f: BinaryIO, size: int, rel: str, entries: list[StorageEntry], budget: Budget
                   ) -> tuple[list[Finding], dict[str, Any]]:
    out: list[Finding] = []
    need = max(e.offset + e.length for e in entries)
    facts: dict[str, Any] = {"storage_entries": len(entries), "bytes_needed": need, "from_metadata": True}
    inside = [e for e in entries if e.offset + e.length <= size]
    cut = len(entries) - len(inside)
    if cut:
        first = next(e for e in entries if e.offset + e.length > size)
        out.append(Finding(rel, "incomplete", "truncated", f"{size} bytes, but .metadata needs {need}: {cut} of "
                           f"{len(entries)} storage entries lie past the end (first: {first.label()})"))
    inside, overlapping = _disjoint(inside)
    if overlapping:
        out.append(Finding(rel, "corrupt", "overlapping_entries", f"{len(overlapping)} storage entries overlap the "
                           f"bytes of another entry (first: {overlapping[0].label()}): DCP never writes that; each "
                           "byte range is checked once"))
    heads = []
    for e in inside:
        budget.check()
        f.seek(e.offset)
        heads.append(f.read(4) == zipcheck.LOCAL_SIG)
    zipped = any(heads)
    checked = opaque = 0
    inflate = zipcheck.Inflate(size, budget.limits)
    for e, is_zip in zip(inside, heads):
        if not is_zip:
            out.extend(_opaque_pickles(f, rel, e, budget))
            if zipped and not e.transformed and e.length > 0:
                out.append(Finding(rel, "corrupt", "entry_mismatch", f"{e.label()}: no zip archive starts there "
                                   "(the shard's other entries are torch.save archives)"))
            else:
                opaque += 1
            continue
        end = e.offset + e.length
        eocd = zipcheck.find_tail_eocd(f, e.offset, end)
        if eocd is None or eocd.archive_start != e.offset or eocd.end != end:
            out.append(Finding(rel, "corrupt", "entry_mismatch", f"{e.label()}: the range does not hold exactly "
                               "one zip archive (its end record is missing or elsewhere)"))
            continue
        r, _ = torch_zip.check_archive(f, eocd, path=rel, label=e.label(), start=e.offset, budget=budget,
                                       inflate=inflate)
        out.extend(r.findings)
        checked += 1
    facts.update(archives_checked=checked, opaque_entries=opaque)
    return out, facts


def _opaque_pickles(f: BinaryIO, rel: str, e: StorageEntry, budget: Budget) -> list[Finding]:
    """An entry that is not a zip archive but begins like a pickle is what ``torch.load`` reads
    in torch's legacy format, unpickling before it checks anything: read it inertly
    (:mod:`.torch_legacy`) and keep what says it is unsafe (or over a limit). Entries with a
    stream transform (compressed bytes) are left alone."""
    if e.transformed or e.length < 3:
        return []
    f.seek(e.offset)
    if not looks_like_pickle(f.read(3)):
        return []
    f.seek(e.offset)
    found, _ = torch_legacy.check(f, e.offset + e.length, rel, budget)
    return [Finding(rel, x.verdict, x.problem, f"{e.label()}: {x.detail}") for x in found
            if x.problem in ("unsafe_pickle", "limit_exceeded")]


def _disjoint(entries: list[StorageEntry]) -> tuple[list[StorageEntry], list[StorageEntry]]:
    """Entries (sorted by offset) split into those whose bytes no earlier entry used, and the
    rest. Empty entries never overlap."""
    keep: list[StorageEntry] = []
    dropped: list[StorageEntry] = []
    end = -1
    for e in entries:
        if e.length > 0 and e.offset < end:
            dropped.append(e)
            continue
        keep.append(e)
        end = max(end, e.offset + e.length)
    return keep, dropped


def walk_shard(f: BinaryIO, size: int, rel: str, budget: Budget | None = None
               ) -> tuple[list[Finding], dict[str, Any], bool]:
    """Check a shard without ``.metadata``: zip archives back to back from byte 0.

    Each archive's end record gives where the next must begin; every archive's CRCs are
    checked. An archive without an end record before end of file is ``truncated``
    (incomplete); bytes that do not start an archive where one must are ``bad_entry``
    (corrupt). A shard that does not start with a zip archive is not one this can walk:
    ``checked`` False (unverifiable), fact ``encoding: unknown``. Reads the data twice (find
    the end, then CRC); a shard ending exactly between two archives looks complete here
    (``check_tree`` still reports the missing ``.metadata``).
    """
    budget = budget or Budget()
    inflate = zipcheck.Inflate(size, budget.limits)
    facts: dict[str, Any] = {"from_metadata": False}
    out: list[Finding] = []
    pos = 0
    items = 0
    while pos < size:
        budget.check()
        f.seek(pos)
        if f.read(4) != zipcheck.LOCAL_SIG:
            if pos == 0:
                facts["encoding"] = "unknown"
                return out, facts, False
            out.append(Finding(rel, "corrupt", "bad_entry", f"bytes {pos}..{size} after archive {items} are not "
                               "another zip archive"))
            break
        try:
            eocd = zipcheck.scan_item_end(f, pos, size, budget)
        except zipcheck.TooManyEntries as e:
            out.append(Finding(rel, "unverifiable", "limit_exceeded", f"archive {items + 1} at byte {pos}: {e}"))
            break
        if eocd is None:
            out.append(Finding(rel, "incomplete", "truncated", f"archive {items + 1} begins at byte {pos} but the "
                               f"file ends ({size} bytes) before its end record: cut short after {items} complete "
                               "archives"))
            break
        r, _ = torch_zip.check_archive(f, eocd, path=rel, label=f"archive {items + 1} at bytes {pos}..{eocd.end}",
                                       start=pos, budget=budget, inflate=inflate)
        out.extend(r.findings)
        items += 1
        pos = eocd.end
    facts["archives"] = items
    return out, facts, True


# --- the directory ----------------------------------------------------------------------------

def tree_findings(root: Path, files: list[str], budget: Budget | None = None) -> list[Finding]:
    """Directory-level DCP findings for the relative POSIX paths ``files`` under ``root``.

    * a directory with ``*.distcp`` files and no ``.metadata``: ``no_metadata`` on its
      ``.metadata`` path (incomplete: the save never committed), and ``missing`` for each rank
      number below the highest present that wrote no shard (inferred: DCP ranks count from 0);
    * with ``.metadata``: each shard it names must be in ``files`` (``missing``, incomplete)
      and at least as long as its entries need (``truncated``, incomplete); a ``.distcp`` it
      does not name gets ``unreferenced`` (verdict ok: DCP ignores it).

    An unreadable or damaged ``.metadata`` adds nothing here (``check_file`` reports it).
    """
    present = set(files)
    dirs: dict[str, list[str]] = {}
    metas: set[str] = set()
    for rel in files:
        d, name = posixpath.split(rel)
        if name.endswith(".distcp"):
            dirs.setdefault(d, []).append(name)
        elif name == METADATA_NAME:
            metas.add(d)
    out: list[Finding] = []
    for d in sorted(set(dirs) | metas):
        shards = sorted(dirs.get(d, []))
        meta_rel = posixpath.join(d, METADATA_NAME)
        if d not in metas:
            out.append(Finding(meta_rel, "incomplete", "no_metadata", f"{d or '.'} holds {len(shards)} .distcp "
                               "shard files but no .metadata: the save never committed (DCP writes .metadata last)"))
            out.extend(_rank_gaps(d, shards))
            continue
        md = load_metadata(root, meta_rel, budget)
        if not isinstance(md, DcpMetadata):
            continue
        by_file = md.by_file()
        for name, entries in sorted(by_file.items()):
            rel = posixpath.join(d, name)
            need = max(e.offset + e.length for e in entries)
            if rel not in present:
                out.append(Finding(rel, "incomplete", "missing", f"named by {meta_rel} ({len(entries)} storage "
                                   f"entries, {need} bytes, e.g. {entries[0].fqn}) but not on disk"))
                continue
            try:
                size = stat_inside(root, rel).st_size
            except (OSError, PathEscape):
                continue  # check_file reports it
            if size < need:
                out.append(Finding(rel, "incomplete", "truncated", f"{size} bytes, but {meta_rel} has storage "
                                   f"entries up to byte {need}: {need - size} bytes cut off"))
        for name in shards:
            if name not in by_file:
                out.append(Finding(posixpath.join(d, name), "ok", "unreferenced", f"not named by {meta_rel}: DCP "
                                   "ignores it (left over from another save?)"))
    return out


def _rank_gaps(d: str, shards: list[str]) -> list[Finding]:
    ranks = {int(m.group(1)) for n in shards if (m := SHARD_RE.match(n))}
    if not ranks:
        return []
    return [Finding(posixpath.join(d, f"__{r}_0.distcp"), "incomplete", "missing",
                    f"ranks {_ranges(ranks)} wrote shards in {d or '.'} but rank {r} did not (inferred from the rank "
                    "numbers; without .metadata the full list is unknown)")
            for r in range(max(ranks)) if r not in ranks]


def _ranges(ranks: set[int]) -> str:
    return ", ".join(str(r) for r in sorted(ranks))
