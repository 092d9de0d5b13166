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
