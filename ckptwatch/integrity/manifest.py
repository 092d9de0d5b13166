"""SHA-256 manifests of checkpoint directories: write one after a save, compare before a resume.

A manifest is the JSON file ``ckptwatch-manifest.json`` inside the checkpoint directory
(never listed in itself)::

    {"ckptwatch_manifest": 1,                    # format version
     "created": "2026-11-30T10:21:21.123Z",      # UTC, ISO 8601
     "tool": "ckptwatch 0.1.0",
     "checkpoint": "checkpoint-60",              # the directory's name
     "step": 60, "world_size": 4,                # of the writer, null when unknown
     "world_size_source": "DCP shard files (__R_I.distcp)",
     "totals": {"files": 18, "bytes": 311744},
     "files": [{"path": "pytorch_model_fsdp_0/__0_0.distcp",   # relative, POSIX
                "size": 16246, "sha256": "<64 hex>", "format": "dcp_shard", "facts": {...}}, ...]}

``facts`` are the structural facts of the file's format (``formats.check_file``). The step
comes from the directory name (``checkpoint-40``, ``iter_0000040``, ``global_step40``,
``step_0000040``); the world size from the argument, else the writer ranks DCP ``.metadata``
names, else the ranks of DCP shard files ``__R_I.distcp``, DeepSpeed
``zero_pp_rank_D_mp_rank_M_*`` files or HF ``rng_state_R.pth`` files.

The file is written atomically (temporary file in the same directory, write, flush,
fsync, ``os.replace``, fsync of the directory): after a crash it is whole or absent, and a
previous manifest stays whole until the new one replaces it.

A manifest lies inside the checkpoint, so it is read as hostile input: at most
:data:`MAX_MANIFEST` bytes, its JSON structure counted before parsing
(:mod:`.formats.jsonlimits`, scaled to its size), and a ``path`` that is absolute, climbs out
with ``..`` or holds a NUL byte is refused (:class:`~.errors.ManifestPathEscape`).
"""

from __future__ import annotations

from ckptwatch import atomic

import datetime as dt
import json
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckptwatch import __version__
from ckptwatch.integrity.errors import ManifestError, ManifestPathEscape
from ckptwatch.integrity.formats.confine import PathEscape, join_inside
from ckptwatch.integrity.formats.jsonlimits import JsonLimitError, check_shape
from ckptwatch.integrity.limits import Budget, Limits
from ckptwatch.integrity.scan import Scan, scan
from ckptwatch.integrity.tree import Tree

#: Name of the manifest file inside a checkpoint directory.
MANIFEST_NAME = "ckptwatch-manifest.json"
#: Version written in ``ckptwatch_manifest``; readers refuse newer ones.
FORMAT_VERSION = 1
#: Largest manifest read (bytes): about four million files.
MAX_MANIFEST = 1 << 30

_TMP_PREFIX = "." + MANIFEST_NAME + "."
_HEX64 = re.compile(r"[0-9a-f]{64}")
_STEP = re.compile(r"(?:checkpoint-|iter_|global_step|step_|step-)(\d+)(?:\..*)?")
_DISTCP = re.compile(r"__(\d+)_\d+\.distcp")
_DEEPSPEED = re.compile(r"(?:bf16_|fp16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_(?:optim|model)_states\.pt")
_RNG = re.compile(r"rng_state_(\d+)\.pth")


def is_manifest_file(rel: str) -> bool:
    """True for the manifest and its temporary files (left by a crash mid-write): never part of a checkpoint."""
    return rel == MANIFEST_NAME or (rel.startswith(_TMP_PREFIX) and rel.endswith(".tmp"))


def manifest_path(directory: str | os.PathLike[str]) -> Path:
    """Where the manifest of checkpoint ``directory`` lives."""
    return Path(directory) / MANIFEST_NAME


def step_from_name(name: str) -> int | None:
    """The training step in a checkpoint directory name: ``checkpoint-40`` (HF Trainer),
    ``iter_0000040`` (Megatron-LM), ``global_step40`` (DeepSpeed), ``step_0000040`` /
    ``step-40``; a ``.suffix`` is allowed (``checkpoint-60.bak``). None otherwise."""
    m = _STEP.fullmatch(name)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class ManifestFile:
    """One file of a manifest: relative POSIX ``path``, ``size`` in bytes, ``sha256`` (lowercase
    hex), detected ``format`` and that format's structural ``facts`` (JSON values)."""

    path: str
    size: int
    sha256: str
    format: str = "unknown"
    facts: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "sha256": self.sha256, "format": self.format,
                "facts": self.facts}


@dataclass
class Manifest:
    """What a checkpoint directory held when its manifest was written (see the module docstring).

    ``created`` is an ISO 8601 UTC time; ``files`` maps relative path to :class:`ManifestFile`;
    ``step`` / ``world_size`` are None when unknown; ``world_size_source`` says where the
    world size came from.
    """

    checkpoint: str
    created: str
    files: dict[str, ManifestFile]
    step: int | None = None
    world_size: int | None = None
    world_size_source: str | None = None
    version: int = FORMAT_VERSION
    tool: str = f"ckptwatch {__version__}"

    @property
    def total_bytes(self) -> int:
        """Sum of the files' sizes, bytes."""
        return sum(f.size for f in self.files.values())

    def to_json(self) -> dict[str, Any]:
        """The manifest as the JSON document written to disk (files sorted by path)."""
        return {"ckptwatch_manifest": self.version, "created": self.created, "tool": self.tool,
                "checkpoint": self.checkpoint, "step": self.step, "world_size": self.world_size,
                "world_size_source": self.world_size_source,
                "totals": {"files": len(self.files), "bytes": self.total_bytes},
                "files": [self.files[p].to_json() for p in sorted(self.files)]}

    @classmethod
    def from_json(cls, doc: Any, source: str) -> Manifest:
        """Parse a manifest document; ``source`` names it in errors.

        Raises :class:`ManifestError` naming ``source`` and the field at fault.
        """
        def bad(where: str, why: str) -> ManifestError:
            return ManifestError(f"{source}: {where}: {why}")

        if not isinstance(doc, dict):
            raise bad("document", "not a JSON object")
        version = doc.get("ckptwatch_manifest")
        if not isinstance(version, int) or isinstance(version, bool):
            raise bad("ckptwatch_manifest", "missing or not an integer: not a ckptwatch manifest")
        if version > FORMAT_VERSION:
            raise bad("ckptwatch_manifest", f"version {version} was written by a newer ckptwatch; "
                      f"this one reads up to version {FORMAT_VERSION}")
        created = doc.get("created")
        if not isinstance(created, str):
            raise bad("created", "missing or not a string")
        try:
            dt.datetime.fromisoformat(created)
        except ValueError:
            raise bad("created", f"{created!r} is not an ISO 8601 time") from None
        checkpoint = doc.get("checkpoint")
        if not isinstance(checkpoint, str):
            raise bad("checkpoint", "missing or not a string")
        for key in ("step", "world_size"):
            v = doc.get(key)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise bad(key, f"{v!r} is not a non-negative integer or null")
        files_doc = doc.get("files")
        if not isinstance(files_doc, list):
            raise bad("files", "missing or not a list")
        files: dict[str, ManifestFile] = {}
        for i, f in enumerate(files_doc):
            where = f"files[{i}]"
            if not isinstance(f, dict):
                raise bad(where, "not an object")
            path, size, sha, fmt, facts = (f.get(k) for k in ("path", "size", "sha256", "format", "facts"))
            if not isinstance(path, str) or not path:
                raise bad(f"{where}.path", f"{path!r} is not a relative path inside the checkpoint")
            try:
                normal = join_inside("", path)
            except PathEscape as e:
                raise ManifestPathEscape(f"{source}: {where}.path: {path[:300]!r} is not a relative path inside "
                                         f"the checkpoint ({str(e)[:300]}); nothing compared") from None
            if normal != path:
                raise bad(f"{where}.path", f"{path!r} is not a normalized relative path (written {normal!r})")
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise bad(f"{where}.size", f"{size!r} is not a size in bytes ({path})")
            if not isinstance(sha, str) or not _HEX64.fullmatch(sha):
                raise bad(f"{where}.sha256", f"{sha!r} is not 64 lowercase hex digits ({path})")
            if fmt is not None and not isinstance(fmt, str):
                raise bad(f"{where}.format", f"{fmt!r} is not a string ({path})")
            if facts is not None and not isinstance(facts, dict):
                raise bad(f"{where}.facts", f"not an object ({path})")
            if path in files:
                raise bad(f"{where}.path", f"{path} is listed twice")
            files[path] = ManifestFile(path, size, sha, fmt or "unknown", facts or {})
        ws_source = doc.get("world_size_source")
        return cls(checkpoint=checkpoint, created=created, files=files, step=doc.get("step"),
                   world_size=doc.get("world_size"), world_size_source=ws_source if isinstance(ws_source, str) else None,
                   version=version, tool=str(doc.get("tool", "")))


def read_manifest(path: str | os.PathLike[str]) -> Manifest:
    """Read a manifest file (or the manifest inside a checkpoint directory).

    Raises :class:`ManifestError` naming the file: it does not exist, cannot be read, is
    larger than :data:`MAX_MANIFEST` or holds more JSON structure than its size explains, is
    not UTF-8 JSON (e.g. torn by a copy), or a field is missing or ill-typed (named, e.g.
    ``files[3].sha256``); :class:`~.errors.ManifestPathEscape` for a path leading outside.
    """
    given = Path(path)
    p = manifest_path(given) if given.is_dir() else given
    try:
        st = p.stat()
        if not stat.S_ISREG(st.st_mode):  # a FIFO would block the open forever (a training job's guard_resume too)
            raise ManifestError(f"{p}: not a regular file: not read")
        if st.st_size > MAX_MANIFEST:
            raise ManifestError(f"{p}: {st.st_size} bytes, larger than any manifest ({MAX_MANIFEST}): not read")
        with open(p, "rb") as f:
            raw = f.read(MAX_MANIFEST + 1)
    except FileNotFoundError:
        hint = f" (write one with: ckptwatch manifest {given})" if given.is_dir() else ""
        raise ManifestError(f"{p}: no manifest{hint}") from None
    except OSError as e:
        raise ManifestError(f"{p}: cannot read: {e.strerror or e}") from None
    d = Limits()  # a manifest holds about 3 containers and 12 values per 250-byte file entry
    scaled = Limits(max_json_bytes=MAX_MANIFEST, max_json_containers=max(d.max_json_containers, len(raw) // 64),
                    max_json_items=max(d.max_json_items, len(raw) // 8))
    try:
        check_shape(raw, scaled, "the manifest")
    except JsonLimitError as e:
        raise ManifestError(f"{p}: damaged: {e}") from None
    try:
        doc = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ManifestError(f"{p}: not a ckptwatch manifest (not UTF-8 at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise ManifestError(f"{p}: damaged: not valid JSON at line {e.lineno} column {e.colno} ({e.msg})") from None
    except RecursionError:
        raise ManifestError(f"{p}: damaged: JSON nested too deeply") from None
    except ValueError as e:  # e.g. an integer of more than 4300 digits (CPython's int_max_str_digits)
        raise ManifestError(f"{p}: damaged: not usable JSON: {str(e)[:200]}") from None
    return Manifest.from_json(doc, str(p))


def write_manifest(directory: str | os.PathLike[str], manifest: Manifest) -> Path:
    """Write ``manifest`` as ``directory/ckptwatch-manifest.json``, atomically; returns its path.

    A temporary file ``.ckptwatch-manifest.json.*.tmp`` in the same directory is written,
    fsynced and renamed over the manifest, then the directory is fsynced. On any failure the
    temporary file is removed and a previous manifest is left as it was.
    Raises :class:`ManifestError` naming the directory and the reason (e.g. read-only, ENOSPC).
    """
    d = Path(directory)
    target = manifest_path(d)
    data = (json.dumps(manifest.to_json(), indent=1, sort_keys=False) + "\n").encode("utf-8")
    try:
        atomic.replace_file(target, data, tmp_prefix=_TMP_PREFIX, mode=0o644)
    except OSError as e:
        raise ManifestError(f"{target}: cannot write the manifest: {e.strerror or e}") from None
    return target


def infer_world_size(files: dict[str, ManifestFile]) -> tuple[int | None, str | None]:
    """The writer's world size from a checkpoint's files, and where it came from.

    In order: the writer ranks DCP ``.metadata`` files name (their ``ranks`` fact: highest
    + 1, largest over files); the ranks R of DCP shard
    files ``__R_I.distcp`` (highest + 1, per directory, largest over directories); distinct
    (data-parallel, model-parallel) rank pairs of DeepSpeed ``zero_pp_rank_D_mp_rank_M_*``
    files; HF Trainer's ``rng_state_R.pth`` files (highest + 1). (None, None) when none applies.
    """
    from_metadata = [max(r) + 1 for f in files.values() if f.format == "dcp_metadata"
                     and isinstance(r := f.facts.get("ranks"), list) and r
                     and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in r)]
    if from_metadata:
        return max(from_metadata), "DCP .metadata"
    per_dir: dict[str, int] = {}
    pairs: set[tuple[int, int]] = set()
    rng: list[int] = []
    for path in files:
        parent, _, name = path.rpartition("/")
        if m := _DISTCP.fullmatch(name):
            per_dir[parent] = max(per_dir.get(parent, 0), int(m.group(1)) + 1)
        elif m := _DEEPSPEED.fullmatch(name):
            pairs.add((int(m.group(1)), int(m.group(2))))
        elif m := _RNG.fullmatch(name):
            rng.append(int(m.group(1)))
    if per_dir:
        return max(per_dir.values()), "DCP shard files (__R_I.distcp)"
    if pairs:
        return len(pairs), "DeepSpeed zero_pp_rank_*_mp_rank_* files"
    if rng:
        return max(rng) + 1, "HF rng_state_R.pth files"
    return None, None


def now_iso() -> str:
    """The current UTC time, ISO 8601 with milliseconds and ``Z``."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def from_scan(s: Scan, *, world_size: int | None = None, step: int | None = None) -> Manifest:
    """The manifest of a scanned directory (every file that could be hashed).

    ``world_size`` / ``step`` override what is inferred from the files and the directory name.
    """
    files = {rel: ManifestFile(rel, sc.hash.size or 0, sc.hash.sha256 or "", sc.check.format, sc.check.facts)
             for rel, sc in s.files.items() if sc.hash.ok}
    name = os.path.basename(os.path.abspath(s.root))
    ws, source = (world_size, "given") if world_size is not None else infer_world_size(files)
    return Manifest(checkpoint=name, created=now_iso(), files=files,
                    step=step if step is not None else step_from_name(name), world_size=ws, world_size_source=source)


def create_manifest(directory: str | os.PathLike[str], *, world_size: int | None = None, step: int | None = None,
                    workers: int | None = None, progress: Callable[[int], None] | None = None,
                    on_listed: Callable[[Tree], None] | None = None, write: bool = True,
                    limits: Limits | None = None) -> tuple[Manifest, Scan]:
    """Hash and check every file of ``directory`` and write its manifest (unless ``write=False``).

    Returns the manifest and the scan (whose structural findings the caller reports: a
    manifest records what is on disk, even a checkpoint that already fails a check).
    ``progress`` / ``on_listed`` / ``workers`` are those of :func:`~ckptwatch.integrity.scan.scan`;
    ``limits`` bound the structural checks (:class:`~ckptwatch.integrity.limits.Limits`).
    Raises :class:`~ckptwatch.integrity.errors.IntegrityError` when the directory cannot be
    listed, :class:`ManifestError` when a file could not be hashed (unreadable, changing while
    hashed: a manifest must only vouch for stable bytes) or the manifest cannot be written.
    """
    s = scan(directory, workers=workers, progress=progress, on_listed=on_listed, exclude=is_manifest_file,
             budget=Budget(limits))
    if not s.files and not s.tree.findings:
        raise ManifestError(f"{s.root}: no manifest written: the directory holds no file")
    bad = [f"{rel} ({sc.hash.detail})" for rel, sc in s.files.items() if not sc.hash.ok]
    bad += [f"{f.path} ({f.detail})" for f in s.tree.findings if f.problem == "unreadable"]
    if bad:
        more = f"; and {len(bad) - 3} more" if len(bad) > 3 else ""
        raise ManifestError(f"{s.root}: no manifest written: {len(bad)} file(s) could not be hashed: "
                            + "; ".join(bad[:3]) + more)
    m = from_scan(s, world_size=world_size, step=step)
    if write:
        write_manifest(s.root, m)
    return m, s


@dataclass
class ManifestDiff:
    """How manifest ``b`` differs from manifest ``a`` (paths sorted).

    ``added``: in b only; ``removed``: in a only; ``size_changed``: (path, size in a, size in b),
    bytes; ``hash_changed``: same size, different SHA-256.
    """

    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    size_changed: list[tuple[str, int, int]] = field(default_factory=list)
    hash_changed: list[str] = field(default_factory=list)

    @property
    def same(self) -> bool:
        """True when both list the same files with the same sizes and hashes."""
        return not (self.added or self.removed or self.size_changed or self.hash_changed)

    def to_json(self) -> dict[str, Any]:
        return {"same": self.same, "added": self.added, "removed": self.removed,
                "size_changed": [{"path": p, "a": x, "b": y} for p, x, y in self.size_changed],
                "hash_changed": self.hash_changed}


def diff(a: Manifest, b: Manifest) -> ManifestDiff:
    """Files added, removed, resized or rewritten between manifests ``a`` and ``b``.

    Two saves of the same model state that differ here are not byte-identical (the
    "checkpoint file hash differs after repeated saves of identical model state" fingerprint:
    nondeterministic serialization, or damage).
    """
    out = ManifestDiff(added=sorted(set(b.files) - set(a.files)), removed=sorted(set(a.files) - set(b.files)))
    for p in sorted(set(a.files) & set(b.files)):
        fa, fb = a.files[p], b.files[p]
        if fa.size != fb.size:
            out.size_changed.append((p, fa.size, fb.size))
        elif fa.sha256 != fb.sha256:
            out.hash_changed.append(p)
    return out
