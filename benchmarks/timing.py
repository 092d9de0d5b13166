"""Timing a benchmark's subprocess: wall time and peak RSS from ``/usr/bin/time``."""

from __future__ import annotations

import subprocess
from typing import NamedTuple


class Timed(NamedTuple):
    """``wall`` seconds, peak ``rss_mb`` (MB), ``stdout`` and ``code`` (exit code) of a run."""

    wall: float
    rss_mb: int
    stdout: str
    code: int


def timed(cmd: list[str], **kw) -> Timed:
    """Run ``cmd`` (``subprocess.run`` keywords in ``kw``) under ``/usr/bin/time``. Exits the
    benchmark naming the command if it fails with a code other than 0 or 1 (1: ckptwatch
    found incidents, grep found nothing)."""
    r = subprocess.run(["/usr/bin/time", "-f", "%e %M", *cmd], capture_output=True, text=True, **kw)
    wall, kb = r.stderr.strip().splitlines()[-1].split()
    if r.returncode not in (0, 1):
        raise SystemExit(f"{cmd[:4]} exited {r.returncode}: {r.stderr[-800:]}")
    return Timed(float(wall), int(kb) // 1024, r.stdout, r.returncode)
