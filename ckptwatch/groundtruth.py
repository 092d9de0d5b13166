"""Scenarios with ground truth, and how a diagnosis is scored against them.

Three kinds of scenario folders hold ``logs/`` and the incidents a correct diagnosis
reports (``{"incidents": [{"kind", "step", "root_cause_class", "root_rank"}], "must_not":
[kinds]}``; ``null`` = any):

* ``examples/corpus/<name>/expected.json``: the shared corpus of real PyTorch runs;
* ``tests/fixtures/realruns/<name>/expected.json``: real framework runs; a ``"layouts"``
  list names sub-folders of ``logs/`` that are the same run launched another way, each
  diagnosed on its own;
* ``tests/scenarios/<name>/scenario.json``: hand-written in the frameworks' formats
  (``"framework"``; ``"status": "pending-rules"`` for ground truth of rules not written yet).

Used by the tests (``tests/conftest.py``) and ``benchmarks/accuracy.py``.

A file's modification time is evidence for the lines that carry no time of their own (a
``print()`` log is dated by its file's mtime; see ``ckptwatch/ingest/timestamps.py``), and a
git checkout loses it: ``mtimes.json`` beside a real run's ``logs/`` keeps each log file's
original mtime, and :func:`restore_mtimes` puts them back before a diagnosis.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Incidents about saves (counted exactly); resume-side kinds may come more than once per scenario.
SAVE_KINDS = frozenset({"interrupted_save", "partial_checkpoint", "storage_failure_during_save", "stalled_save"})


@dataclass(frozen=True)
class Case:
    """One diagnosis to run: ``logs`` (a directory) and what it must give; ``framework`` is
    the folder name's first word (``hf``, ``torch``, ``megatron``, …) or ``corpus``."""

    name: str
    framework: str
    layout: str
    logs: Path
    incidents: list[dict[str, Any]]
    must_not: list[str]
    status: str = "passing"
    source: str = ""  # corpus | realruns | scenarios


@dataclass
class Score:
    """How one diagnosis met its case: expected incidents ``found`` (kind and step),
    ``exact`` (also root-cause class and rank), ``false`` incidents (matching no expected
    one by kind and step: a save incident, or a kind not expected at all; another load
    failure or resume incident of an expected kind is a repeat, listed in ``extra`` only),
    and the leftovers for a report."""

    expected: int = 0
    found: int = 0
    exact: int = 0
    false: int = 0
    missed: list[dict[str, Any]] = field(default_factory=list)
    extra: list[tuple[Any, ...]] = field(default_factory=list)


def matches(inc: dict[str, Any], want: dict[str, Any], *, cause: bool = True) -> bool:
    """``inc`` (``diagnose --json`` shape) is the expected incident ``want`` (kind, step and,
    with ``cause``, root-cause class and rank; None = any)."""
    rc = inc.get("root_cause") or {}
    ok = inc["kind"] == want["kind"] and (want.get("step") is None or inc.get("step") == want["step"])
    if cause:
        ok = ok and (want.get("root_cause_class") is None or rc.get("class") == want["root_cause_class"])
        ok = ok and (want.get("root_rank") is None or rc.get("rank") == want["root_rank"])
    return ok


def unmatched(wanted: list[dict[str, Any]], got: list[dict[str, Any]], *, cause: bool = True) -> list[dict[str, Any]]:
    """The expected incidents left over after each took a distinct matching incident, most
    specific first."""
    free = list(got)
    left = []
    for want in sorted(wanted, key=lambda w: sum(v is None for v in w.values())):
        hit = next((i for i in free if matches(i, want, cause=cause)), None)
        if hit is None:
            left.append(want)
        else:
            free.remove(hit)
    return left


def score(case: Case, got: list[dict[str, Any]]) -> Score:
    """Score the incidents ``got`` (``diagnose --json`` shape) against ``case``."""
    missed = unmatched(case.incidents, got, cause=False)
    inexact = unmatched(case.incidents, got, cause=True)
    free = list(got)
    for want in case.incidents:  # what is left after every expected incident took its match
        hit = next((i for i in free if matches(i, want, cause=False)), None)
        if hit is not None:
            free.remove(hit)
    n = len(case.incidents)
    kinds = {w["kind"] for w in case.incidents}
    false = [i for i in free if i["kind"] in SAVE_KINDS or i["kind"] not in kinds]
    return Score(expected=n, found=n - len(missed), exact=n - len(inexact), false=len(false), missed=inexact,
                 extra=[(i["kind"], i["step"], (i.get("root_cause") or {}).get("class"),
                         (i.get("root_cause") or {}).get("rank")) for i in free])


def load_cases(root: Path) -> list[Case]:
    """Every case under the repository ``root`` (see the module docstring), in name order."""
    cases: list[Case] = []
    for source, folder, spec_name in (("corpus", root / "examples" / "corpus", "expected.json"),
                                      ("realruns", root / "tests" / "fixtures" / "realruns", "expected.json"),
                                      ("scenarios", root / "tests" / "scenarios", "scenario.json")):
        if not folder.is_dir():
            continue
        for d in sorted(p for p in folder.iterdir() if (p / spec_name).is_file() and (p / "logs").is_dir()):
            spec = json.loads((d / spec_name).read_text())
            framework = "corpus" if source == "corpus" else d.name.split("-")[0]
            layouts = spec.get("layouts") or [""]
            for layout in layouts:
                cases.append(Case(name=d.name, framework=str(framework), layout=layout or "-",
                                  logs=d / "logs" / layout if layout else d / "logs",
                                  incidents=list(spec.get("incidents") or []), must_not=list(spec.get("must_not") or []),
                                  status=spec.get("status", "passing"), source=source))
    return cases


MTIMES = "mtimes.json"


def record_mtimes(case_dir: Path) -> int:
    """Write ``case_dir/mtimes.json``: each file under ``case_dir/logs`` (relative path) ->
    its mtime in ns. Returns the number of files."""
    logs = case_dir / "logs"
    found = {str(p.relative_to(logs)): p.stat().st_mtime_ns for p in sorted(logs.rglob("*")) if p.is_file()}
    (case_dir / MTIMES).write_text(json.dumps(found, indent=0, sort_keys=True) + "\n")
    return len(found)


def restore_mtimes(root: Path) -> int:
    """Give every log file of the repository's scenarios that has a recorded mtime (see the
    module docstring) that mtime again. Returns the number of files touched."""
    n = 0
    for folder in (root / "tests" / "fixtures" / "realruns", root / "tests" / "scenarios", root / "examples" / "corpus"):
        for spec in sorted(folder.glob(f"*/{MTIMES}")) if folder.is_dir() else []:
            for rel, ns in json.loads(spec.read_text()).items():
                p = spec.parent / "logs" / rel
                if p.is_file() and p.stat().st_mtime_ns != ns:
                    os.utime(p, ns=(ns, ns))
                    n += 1
    return n
