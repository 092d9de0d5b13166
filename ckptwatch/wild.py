"""The wild corpus: real log text pasted into public issue threads, with the truth the thread gives.

A case is a folder ``tests/wild/<split>/<id>/`` holding ``logs/`` (the text as pasted: cut
where the paste was cut, personal names replaced) and ``expected.json`` (in the held-back
split both are gzipped, ``pasted.log.gz`` and ``expected.json.gz``, so that nobody who writes
rules reads them by accident)::

    {"thread": "owner/repo#123",               # or a forum post's address (see thread_key)
     "url": "https://github.com/owner/repo/issues/123",
     "framework": "transformers",              # the stack that printed the failure
     "family": "hf",                           # one of FAMILIES, for the report
     "stack": ["deepspeed", "slurm"],          # launchers, schedulers, other layers in the paste
     "completeness": "traceback",              # one of COMPLETENESS
     "truth": "how the thread settles it: the reporter's follow-up, a maintainer's answer",
     "incidents": [{"kind": ..., "step": ..., "root_cause_class": ..., "root_rank": ...}],
     "must_not": []}

``incidents`` is empty for a **clean** case (failure-looking text, no checkpoint incident).
``tests/wild/LABELING.md`` is the labelling guide.

**Split.** A case's split is fixed by its thread alone, before anyone labels it
(:func:`split_of`): the SHA-256 of :func:`thread_key`, a third held back. **Reserved threads**
(``shared/holdout/excluded-threads.sha256``: evaluation sets kept outside the project) are
refused (:func:`reserved`).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptwatch.groundtruth import Case

SPLITS = ("dev", "heldback")
#: Framework families of the accuracy report (``family`` of a case).
FAMILIES = ("torch", "hf", "lightning", "deepspeed", "megatron", "finetune", "rl", "diffusion", "vision",
            "tf", "jax", "paddle", "colossalai", "speech", "scheduler", "other")
#: How much of the failure the paste shows.
COMPLETENESS = ("full", "tail", "traceback", "excerpt", "cut")
INCIDENT_KINDS = ("interrupted_save", "storage_failure_during_save", "stalled_save", "partial_checkpoint",
                  "load_failure", "world_size_mismatch", "poisoned_resume", "corrupt_checkpoint")
CAUSE_CLASSES = ("signal", "oom_kill", "host_memory", "cuda_oom", "native_crash", "storage_error", "node_lost",
                 "gpu_xid", "collective_timeout", "exception", "unknown")

_GH = re.compile(r"^(?:https?://)?(?:www\.)?github\.com/([^/\s]+)/([^/\s]+)/(?:issues|pull|discussions)/(\d+)", re.I)
_SHORT = re.compile(r"^([\w.-]+)/([\w.-]+)#(\d+)$")


def thread_key(address: str) -> str:
    """The normal form of a thread's address: ``owner/repo#N`` (lower case) for a GitHub
    issue, pull request or discussion (its URL or the short form); for any other page its
    URL lower-cased without scheme, ``www.``, query, fragment or trailing slash.

    Raises ValueError for an empty address."""
    a = address.strip()
    if not a:
        raise ValueError("empty thread address")
    m = _GH.match(a) or _SHORT.match(a)
    if m:
        return f"{m.group(1)}/{m.group(2)}#{m.group(3)}".lower()
    a = re.sub(r"^[a-z]+://", "", a, flags=re.I)
    a = re.sub(r"^www\.", "", a, flags=re.I)
    a = a.split("#")[0].split("?")[0].rstrip("/")
    return a.lower()


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def split_of(address: str) -> str:
    """``"heldback"`` for a third of threads, ``"dev"`` for the rest: the first 32 bits of
    the SHA-256 of :func:`thread_key`, modulo 3, are 0 for the held-back third."""
    return "heldback" if int(_sha(thread_key(address))[:8], 16) % 3 == 0 else "dev"


def shared_dir(root: Path) -> Path:
    """Where the steering repository's ``shared/`` is: ``$CKPTWATCH_SHARED``, else beside the
    checkout (``root/../shared``, as a session and CI lay it), else ``/work/shared``; the
    first that holds ``holdout/excluded-threads.sha256`` (the one beside the checkout when
    none does)."""


    candidates = [Path(p) for p in (os.environ.get("CKPTWATCH_SHARED"),) if p]
    candidates += [root.parent / "shared", Path("/work/shared")]
    return next((c for c in candidates if (c / "holdout" / "excluded-threads.sha256").is_file()), root.parent / "shared")


def reserved_digests(shared: Path) -> frozenset[str]:
    """The digests of ``shared/holdout/excluded-threads.sha256`` (lowercase hex, one a line;
    an empty set when the file is absent)."""
    f = shared / "holdout" / "excluded-threads.sha256"
    if not f.is_file():
        return frozenset()
    return frozenset(w.lower() for line in f.read_text().splitlines() for w in line.split()[:1] if w)


def reserved(address: str, digests: frozenset[str]) -> bool:
    """The thread is reserved for evaluation outside the project: the SHA-256 of
    ``owner/repo#N`` or of ``repo#N`` (both lower case, as ``shared/holdout/README.md`` says)
    is listed; for another page, that of its :func:`thread_key`."""
    key = thread_key(address)
    forms = {key}
    if "#" in key and "/" in key.split("#")[0]:
        forms.add(key.split("/", 1)[1])
    return any(_sha(f) in digests for f in forms)


@dataclass(frozen=True)
class WildCase:
    """One wild case: the :class:`~ckptwatch.groundtruth.Case` to score, and its metadata."""

    case: Case
    split: str
    thread: str
    url: str
    framework: str
    family: str
    completeness: str
    stack: tuple[str, ...]


def read_spec(folder: Path) -> dict[str, Any]:
    """``expected.json`` (or ``expected.json.gz``) of a case folder.

    Raises FileNotFoundError when neither exists, ValueError when it is not a JSON object."""
    plain, packed = folder / "expected.json", folder / "expected.json.gz"
    text = plain.read_text() if plain.is_file() else gzip.decompress(packed.read_bytes()).decode()
    spec = json.loads(text)
    if not isinstance(spec, dict):
        raise ValueError(f"{folder}: expected.json is not an object")
    return spec


def spec_problems(spec: dict[str, Any]) -> list[str]:
    """What is wrong with a case's ``expected.json`` (empty when nothing is)."""
    out = []
    for k in ("thread", "url", "framework", "family", "completeness", "truth"):
        if not isinstance(spec.get(k), str) or not spec[k].strip():
            out.append(f"'{k}' must be a non-empty string")
    if spec.get("family") not in FAMILIES:
        out.append(f"'family' must be one of {', '.join(FAMILIES)}")
    if spec.get("completeness") not in COMPLETENESS:
        out.append(f"'completeness' must be one of {', '.join(COMPLETENESS)}")
    if not isinstance(spec.get("incidents"), list):
        out.append("'incidents' must be a list (empty for a clean case)")
    for i, inc in enumerate(spec.get("incidents") or []):
        if not isinstance(inc, dict):
            out.append(f"incidents[{i}] must be an object")
            continue
        if inc.get("kind") not in INCIDENT_KINDS:
            out.append(f"incidents[{i}].kind must be one of {', '.join(INCIDENT_KINDS)}")
        if inc.get("root_cause_class") is not None and inc["root_cause_class"] not in CAUSE_CLASSES:
            out.append(f"incidents[{i}].root_cause_class must be null or one of {', '.join(CAUSE_CLASSES)}")
        for k in ("step", "root_rank"):
            v = inc.get(k)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                out.append(f"incidents[{i}].{k} must be null or a non-negative integer")
    return out


def load_wild_cases(root: Path, splits: tuple[str, ...] = SPLITS) -> list[WildCase]:
    """Every wild case under ``root/tests/wild/<split>/`` for ``splits``, in folder-name order.

    Raises ValueError naming the folder for a case whose ``expected.json`` is broken."""
    out: list[WildCase] = []
    for split in splits:
        base = root / "tests" / "wild" / split
        if not base.is_dir():
            continue
        for d in sorted(p for p in base.iterdir() if p.is_dir() and (p / "logs").is_dir()):
            spec = read_spec(d)
            problems = spec_problems(spec)
            if problems:
                raise ValueError(f"{d}: {problems[0]}")
            case = Case(name=d.name, framework=spec["family"], layout="-", logs=d / "logs",
                        incidents=list(spec["incidents"]), must_not=list(spec.get("must_not") or []),
                        source=f"wild-{split}")
            out.append(WildCase(case=case, split=split, thread=thread_key(spec["thread"]), url=spec["url"],
                                framework=spec["framework"], family=spec["family"],
                                completeness=spec["completeness"], stack=tuple(spec.get("stack") or ())))
    return out
