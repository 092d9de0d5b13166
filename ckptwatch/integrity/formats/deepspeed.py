"""DeepSpeed checkpoints: a ``latest`` file naming the tag directory, and per-rank files in it.

Layout (DeepSpeed ``runtime/engine.py`` ``save_checkpoint`` / ``_get_ckpt_name`` /
``_get_zero_ckpt_name``, ``checkpoint/constants.py``; https://deepspeed.readthedocs.io
"Model Checkpointing"): ``save_checkpoint(save_dir, tag)`` writes ``save_dir/<tag>/`` and then
``save_dir/latest`` holding the tag (e.g. ``global_step1200``). In the tag directory:

* ``mp_rank_{MM:02d}_model_states.pt``: model states, one per model-parallel rank MM
  (ZeRO stage 3 instead writes ``zero_pp_rank_{R}_mp_rank_{MM:02d}_model_states.pt`` per
  data-parallel rank R);
* ``[bf16_|fp16_]zero_pp_rank_{R}_mp_rank_{MM:02d}_optim_states.pt``: ZeRO optimizer
  partitions, one per data-parallel rank R and MM (older releases: ``..._mp_rank_00optim_states.pt``).

The data-parallel world size is what ``mp_rank_00_model_states.pt`` records as
``dp_world_size`` when that can be read (its ``data.pkl`` read inertly), else inferred as the
largest rank number present + 1, which cannot see missing ranks above the highest present.

The tag is a single directory name (no ``/``, not ``.`` / ``..``), so it never leads out of
the checkpoint; files are opened through :func:`.confine.open_inside`. Each rank file's own
structure, its pickles included (``unsafe_pickle``), is ``check_file``'s job (:mod:`.torch_zip`).
"""

from __future__ import annotations

import os
import posixpath
import re
from pathlib import Path
from typing import Any, BinaryIO

from ckptwatch.integrity.findings import Finding
from ckptwatch.integrity.formats import zipcheck
from ckptwatch.integrity.formats.confine import PathEscape, join_inside, open_inside
from ckptwatch.integrity.formats.pointer import check_pointer
from ckptwatch.integrity.formats.safe_pickle import TORCH_PICKLE, load_inert
from ckptwatch.integrity.limits import Budget, Limits

LATEST_NAME = "latest"
MODEL_RE = re.compile(r"^mp_rank_(\d+)_model_states\.pt$")
ZERO3_MODEL_RE = re.compile(r"^(?:bf16_|fp16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_model_states\.pt$")
OPTIM_RE = re.compile(r"^(bf16_|fp16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_?optim_states\.pt$")
_TAG_RE = re.compile(r"^[^/\\\x00]+$")


def read_tag(f: BinaryIO, size: int) -> str:
    """The tag in a ``latest`` file (stripped); ``ValueError`` when empty, too long or a path."""
    if size > 4096:
        raise ValueError(f"{size} bytes: too long for a tag")
    try:
        tag = f.read(size).decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ValueError("not UTF-8 text") from None
    if not tag:
        raise ValueError("empty: names no tag")
    if not _TAG_RE.match(tag) or tag in (".", ".."):
        raise ValueError(f"{tag[:80]!r} is not a directory name")
    return tag


def check_latest(f: BinaryIO, size: int, path: str) -> tuple[list[Finding], dict[str, Any]]:
    """``check_file`` for ``latest``: ``empty`` (incomplete) or ``bad_tag`` (corrupt); fact ``tag``."""
    return check_pointer(f, size, path, read=read_tag, fact="tag", names="no tag")


def recorded_dp_world_size(root: Path, rel: str, limits: Limits | None = None) -> int | None:
    """``dp_world_size`` recorded in the DeepSpeed model-states file ``root/rel`` (a torch zip
    whose STORED ``*/data.pkl`` is read inertly), or None when it cannot be read (damaged,
    refused, over ``max_pickle_bytes``, outside the checkpoint)."""
    limits = limits or Limits()
    try:
        with open_inside(root, rel) as f:
            f.seek(0, 2)
            size = f.tell()
            eocd = zipcheck.find_tail_eocd(f, 0, size)
            if eocd is None:
                return None
            loc = zipcheck.locate_member(f, eocd, "data.pkl")
            if loc is None or loc[1] > limits.max_pickle_bytes:
                return None
            f.seek(loc[0])
            obj, _ = load_inert(f, source=rel, policy=TORCH_PICKLE, limit=loc[1], keep_persistent=True)
    except Exception:  # unreadable, damaged, refused: the caller falls back to the rank numbers
        return None
    v = obj.get("dp_world_size") if isinstance(obj, dict) else None
    return v if type(v) is int and 0 < v < 1 << 20 else None


def tree_findings(root: Path, files: list[str], budget: Budget | None = None) -> list[Finding]:
    """For each ``latest`` in ``files``: its tag must name a directory with files
    (``missing``, incomplete), holding the model-states file of every model-parallel rank and
    the optimizer file of every (data-parallel, model-parallel) rank pair (``missing``,
    incomplete, naming the expected file and how the world size was found). Unreadable or
    malformed ``latest`` files add nothing (``check_file`` reports them)."""
    out: list[Finding] = []
    for rel in sorted(r for r in files if posixpath.basename(r) == LATEST_NAME):
        try:
            with open_inside(root, rel) as f:
                tag = read_tag(f, os.fstat(f.fileno()).st_size)
            tag_dir = join_inside(posixpath.dirname(rel), tag)
        except (OSError, ValueError, PathEscape):
            continue
        names = [r[len(tag_dir) + 1:] for r in files if r.startswith(tag_dir + "/") and "/" not in r[len(tag_dir) + 1:]]
        if not names:
            out.append(Finding(tag_dir + "/", "incomplete", "missing", f"{rel} names tag {tag!r} but there is no "
                               f"{tag_dir}/ with files (the save never finished, or was deleted)"))
            continue
        out.extend(_rank_files(root, rel, tag_dir, names, (budget or Budget()).limits))
    return out


def _rank_files(root: Path, latest: str, tag_dir: str, names: list[str], limits: Limits) -> list[Finding]:
    model_mp = {int(m.group(1)) for n in names if (m := MODEL_RE.match(n))}
    zero3 = {(int(m.group(1)), int(m.group(2))) for n in names if (m := ZERO3_MODEL_RE.match(n))}
    optim = {(int(m.group(2)), int(m.group(3))): m.group(1) or "" for n in names if (m := OPTIM_RE.match(n))}
    if not (model_mp or zero3 or optim):
        return [Finding(tag_dir + "/", "incomplete", "missing", f"{tag_dir}/ (named by {latest}) holds no DeepSpeed "
                        "model or optimizer states (mp_rank_XX_model_states.pt, *zero_pp_rank_R_mp_rank_XX_*)")]
    mp_world = max(model_mp | {mp for _, mp in zero3} | {mp for _, mp in optim}) + 1
    dp_seen = {dp for dp, _ in zero3} | {dp for dp, _ in optim}
    recorded = (recorded_dp_world_size(root, posixpath.join(tag_dir, "mp_rank_00_model_states.pt"), limits)
                if 0 in model_mp else None)
    inferred = max(dp_seen) + 1 if dp_seen else 1
    dp_world = max(recorded or 0, inferred)
    how = (f"data-parallel world size {dp_world}, recorded in mp_rank_00_model_states.pt" if recorded
           and recorded >= inferred else f"data-parallel world size {dp_world}, inferred from the highest rank file")
    out: list[Finding] = []

    def missing(name: str, why: str) -> None:
        out.append(Finding(posixpath.join(tag_dir, name), "incomplete", "missing", f"{why} ({how}; tag named by "
                           f"{latest}) but not on disk"))

    for mp in range(mp_world):
        if zero3:
            for dp in range(dp_world):
                if (dp, mp) not in zero3:
                    missing(f"zero_pp_rank_{dp}_mp_rank_{mp:02d}_model_states.pt",
                            f"ZeRO-3 model states of data-parallel rank {dp}, model-parallel rank {mp}")
        elif mp not in model_mp:
            missing(f"mp_rank_{mp:02d}_model_states.pt", f"model states of model-parallel rank {mp}")
        if optim:
            prefix = next(iter(optim.values()))
            for dp in range(dp_world):
                if (dp, mp) not in optim:
                    missing(f"{prefix}zero_pp_rank_{dp}_mp_rank_{mp:02d}_optim_states.pt",
                            f"ZeRO optimizer states of data-parallel rank {dp}, model-parallel rank {mp}")
    return out
