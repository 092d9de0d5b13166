"""A simulated fleet written live: its lines appended to their files in the order they were
written (true time, whatever each host's clock stamps on them) at a given rate, with
rotation, for load tests and for measuring how long the pipeline takes from a failure's
first line to its incident.

:func:`write_live` generates the fleet (:func:`ckptwatch.simulate.generate`, same seed same
lines) and appends every line to its file under ``out/logs`` at ``rate`` lines per second
in total, in ticks of :data:`TICK_S`, each file flushed at the end of a tick (what a
process writing through a line-buffered stream does). Lines go out in true-time order:
the hosts of a job save together, so a host whose clock is a minute ahead writes lines
stamped a minute later at the same moment as the others (appending in stamp order instead
would hold its lines back a minute, a lag no real fleet has). A file past
``rotate_bytes`` is rotated the way logrotate's default does: renamed to ``<file>.1`` (the
previous ``.1`` dropped) and started anew. ``out/live.json`` records, per job with an
injected failure, the wall time (UTC) its first failure line was written.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from ckptwatch.simulate import FleetSpec, failure_written, generate

#: seconds between two flushes of the lines written
TICK_S = 0.05


def write_live(out: Path, spec: FleetSpec, *, rate: float, rotate_bytes: int | None = None,
               clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep
               ) -> dict[str, Any]:
    """Write the fleet ``spec`` under ``out`` live at ``rate`` lines/s (> 0). Returns
    ``{"truth", "lines", "seconds", "rotations", "initiated": {job: ISO wall time}}`` and
    writes it (without the truth) to ``out/live.json``; ``out/truth.json`` is written first.

    Raises:
        ValueError: a bad spec or rate, or ``out/logs`` already holds files.
    """
    if not rate > 0:
        raise ValueError(f"rate must be more than 0 lines/s, not {rate}")
    rows: list[tuple[dt.datetime, Path, str]] = []  # (true time, file, text)
    truth = generate(out, spec, collect=rows)
    # stable: each file's own order stays (a file is one host's: its lines' true times are
    # their stamps less one offset)
    rows.sort(key=lambda r: r[0])
    # the failure's first line: the first row of the job written at or after it (true time)
    pending = {job: at for job, j in truth["jobs"].items() if (at := failure_written(j)) is not None}
    logs = out / "logs"
    initiated: dict[str, str] = {}
    handles: dict[Path, TextIO] = {}
    jobs: dict[Path, str] = {}  # each file's job
    sizes: dict[Path, int] = {}
    rotations = 0
    per_tick = max(1, round(rate * TICK_S))
    began = clock()
    try:
        for i in range(0, len(rows), per_tick):
            due = began + (i / rate)
            wait = due - clock()
            if wait > 0:
                sleep(wait)
            touched = set()
            for t, path, text in rows[i:i + per_tick]:
                f = handles.get(path)
                if f is None:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    f = handles[path] = open(path, "a", encoding="utf-8")
                    sizes[path] = path.stat().st_size
                f.write(text + "\n")
                sizes[path] += len(text) + 1
                touched.add(path)
                job = jobs.get(path) or jobs.setdefault(path, _job_of(path.relative_to(logs)))
                if job in pending and t >= pending[job]:
                    del pending[job]
                    initiated[job] = dt.datetime.now(dt.timezone.utc).isoformat()
            for path in touched:
                handles[path].flush()
                if rotate_bytes and sizes[path] >= rotate_bytes:
                    handles.pop(path).close()
                    os.replace(path, path.with_name(path.name + ".1"))
                    sizes[path] = 0
                    rotations += 1
    finally:
        for f in handles.values():
            f.close()
    result = {"lines": len(rows), "seconds": round(clock() - began, 3), "rotations": rotations,
              "initiated": initiated}
    (out / "live.json").write_text(json.dumps(result, indent=1) + "\n")
    return {**result, "truth": truth}


def _job_of(rel: Path) -> str:
    """The job of a file of the fleet: ``<job>/<host>/...``, or ``kernel/<job>-nNN.log``."""
    if rel.parts[0] == "kernel":
        return rel.name.split(".log")[0].rsplit("-n", 1)[0]
    return rel.parts[0]
