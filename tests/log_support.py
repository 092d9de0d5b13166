"""Log text shared by tests: small jobs in a common trainer's shape."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path


def two_saves(day: str, run: str, *, second_saved: bool, tail: str = "", hour: int = 10) -> str:
    """Rank 0 of a job (``run``) on ``day`` (``YYYY-MM-DD``) from ``hour``: step 100 saved to
    ``/ckpt/<run>/checkpoint-100``, then a save of step 200 that finishes when ``second_saved``;
    ``tail`` (lines without a time of their own, e.g. an exception) is appended."""
    t = f"[{day} {hour:02d}"
    text = (f"{t}:00:00,000] [INFO] [rank0] step 100 loss 2.1\n"
            f"{t}:00:05,000] [INFO] [rank0] Saving checkpoint to /ckpt/{run}/checkpoint-100\n"
            f"{t}:00:09,000] [INFO] [rank0] Saved checkpoint to /ckpt/{run}/checkpoint-100\n"
            f"{t}:01:00,000] [INFO] [rank0] step 200 loss 1.9\n"
            f"{t}:01:05,000] [INFO] [rank0] Saving checkpoint to /ckpt/{run}/checkpoint-200\n")
    if second_saved:
        text += f"{t}:01:09,000] [INFO] [rank0] Saved checkpoint to /ckpt/{run}/checkpoint-200\n"
    return text + tail


def trial_case(trial: Path, case: str, into: Path) -> Path:
    """A copy under ``into`` of ``case`` (a path under ``trial``: a fixtures directory of
    hand-written cases) with each file's mtime as its author left it (``MTIMES.json``:
    path -> seconds since the epoch): lines without a time of their own are dated by it,
    and a checkout gives every file the time of the checkout. Returns the copy's path."""
    times = json.loads((trial / "MTIMES.json").read_text())
    src, dst = trial / case, into / case
    if src.is_dir():
        shutil.copytree(src, dst)
    else:
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
    for rel, mtime in times.items():
        if rel == case or rel.startswith(case.rstrip("/") + "/"):
            os.utime(into / rel, (mtime, mtime))
    return dst


#: a fact a trial case's truth gives that ckptwatch does not get yet (see the issue's note)
ANY = object()


def facts(inc) -> tuple:
    """An incident's facts a trial's TRUTH.md names: (job, kind, step, cause class, rank,
    host, collateral, world size)."""
    rc = inc.root_cause
    return (inc.job, inc.kind, inc.step, rc.cls if rc else None, rc.rank if rc else None, rc.host if rc else None,
            inc.collateral, inc.checkpoint_state.get("world_size"))


def assert_facts(found: list, expected: list[tuple]) -> None:
    """The incidents ``found`` have the facts ``expected`` (:func:`facts` tuples, any order),
    a fact marked :data:`ANY` aside."""
    got = sorted((facts(i) for i in found), key=lambda f: (f[0], f[1]))
    want = sorted(expected, key=lambda f: (f[0], f[1]))
    assert len(got) == len(want), got
    assert [tuple(w if w is ANY else g for g, w in zip(gf, wf, strict=True)) for gf, wf in zip(got, want)] == want
