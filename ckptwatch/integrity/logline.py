"""ckptwatch's own structured log lines: what the integrity API prints so the rules can read
a save, a verification and a resume exactly (rule pack ``05-ckptwatch.yaml``).

Grammar (one line, fields in this order, optional ones left out when unknown)::

    ckptwatch event=<event> [step=<int>] [rank=<int>] [world_size=<int>] [<extra>=<value> ...] path=<path>

* ``event``: ``save_start`` | ``save_end`` | ``integrity`` | ``resume`` (the event kinds of
  DESIGN.md of the same name) | ``probe`` (:mod:`ckptwatch.probe`: ``verdict=<ok|degenerate>
  reason=<...> values rows distinct_rows finite std``);
* extras, for ``save_end``: ``files=<int> bytes=<int>``; for ``integrity``:
  ``verdict=<ok|unverifiable|incomplete|corrupt> files=<int> bytes=<int> problems=<int>
  manifest=<yes|no> detail="<first problem>"`` (``"`` in the detail becomes ``'``);
* ``path`` comes last and runs to the end of the line, so a path may hold spaces.

:func:`emit_to_stderr` prefixes the line with its UTC time in ISO 8601
(``2026-11-30T10:21:15.400000Z``), which ingest reads as the event time; a line routed
through a ``logging`` handler gets the handler's time instead.
"""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Callable

EVENTS = ("save_start", "save_end", "integrity", "resume", "probe")

#: Where a line goes: a callable taking the line (no newline).
Emit = Callable[[str], None]


def format_line(event: str, path: str, *, step: int | None = None, rank: int | None = None,
                world_size: int | None = None, **extra: object) -> str:
    """The structured line (no time prefix, no newline). ``extra`` values are written in the
    order given; a string value with a space is double-quoted.

    Raises ValueError for an unknown ``event`` or a path with a newline."""
    if event not in EVENTS:
        raise ValueError(f"unknown ckptwatch event {event!r} (known: {', '.join(EVENTS)})")
    if "\n" in path or "\r" in path:
        raise ValueError(f"a path with a line break cannot be logged on one line: {path!r}")
    parts = [f"ckptwatch event={event}"]
    for key, value in (("step", step), ("rank", rank), ("world_size", world_size), *extra.items()):
        if value is None:
            continue
        text = str(value).replace('"', "'").replace("\n", " ")
        parts.append(f'{key}="{text}"' if (" " in text or not text) else f"{key}={text}")
    parts.append(f"path={path}")
    return " ".join(parts)


def stamped(line: str, now: dt.datetime | None = None) -> str:
    """``<UTC time ISO 8601> <line>\\n``: the line as :func:`emit_to_stderr` writes it."""
    t = (now or dt.datetime.now(dt.timezone.utc)).astimezone(dt.timezone.utc)
    return f"{t.strftime('%Y-%m-%dT%H:%M:%S.%f')}Z {line}\n"


def emit_to_stderr(line: str, *, now: dt.datetime | None = None) -> None:
    """Write :func:`stamped` ``line`` to stderr and flush it (torchrun's ``--tee`` and
    per-rank log files capture it with every other worker line)."""
    sys.stderr.write(stamped(line, now))
    sys.stderr.flush()
