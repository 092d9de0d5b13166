"""Helpers shared by the alerting tests: a real incident to page about, later versions of it,
and what a local receiver (pytest-httpserver) was sent."""

from __future__ import annotations

import copy
import json

from ckptwatch.pipeline import diagnose


def sigkill_incident():
    """The one incident of corpus scenario 02 (a rank SIGKILLed mid-save), as diagnose finds it."""
    from conftest import CORPUS

    (inc,) = diagnose([str(CORPUS / "02-sigkill-mid-save" / "logs" / "attempt-1-train")])[0]
    return inc


def version(inc, **changes):
    """A later version of ``inc`` (deep copy with fields changed)."""
    new = copy.deepcopy(inc)
    for k, v in changes.items():
        setattr(new, k, v)
    return new


def sent(server, path: str) -> list[dict]:
    """JSON bodies the receiver got on ``path``, in arrival order."""
    return [json.loads(q.get_data()) for q, _ in server.log if q.path == path]
