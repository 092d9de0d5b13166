"""Driving services: call their ``step()`` until interrupted, or until idle."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence


def run_steps(steps: Sequence[Callable[[], int]], *, interval: float, until_idle: float | None = None,
              pace: bool = False, stop: threading.Event | None = None) -> None:
    """Call every step in turn, sleeping ``interval`` seconds after a round with no work
    (with ``pace``, after every round: one batch per interval, as the embedded run does).

    Each step returns how much work it did (records, events). With ``until_idle`` (seconds)
    return once no step has done any work for that long; otherwise run until interrupted
    (KeyboardInterrupt, which the CLI also raises on SIGTERM). ``stop``: the CLI's stop
    request, checked between steps, in case its KeyboardInterrupt landed where Python can
    only print it ("Exception ignored in: …", a finalizer or a C callback) and the loop
    went on; then KeyboardInterrupt is raised here."""
    last_work = time.monotonic()
    while True:
        if stop is not None and stop.is_set():
            raise KeyboardInterrupt
        work = sum(step() for step in steps)
        now = time.monotonic()
        if work:
            last_work = now
            if not pace:
                continue
        elif until_idle is not None and now - last_work >= until_idle:
            return
        if stop is not None:
            stop.wait(interval)
        else:
            time.sleep(interval)
