"""Failpoints: named places where a test can make the process die as ``kill -9`` would.

``CKPTWATCH_FAILPOINTS="detect.after_publish"`` (comma-separated names) sends SIGKILL to
this process the first time :func:`hit` is called with one of those names. Unset (always, outside tests) it costs one dict lookup. The names mark the
windows where a crash must lose nothing:

* ``collect.after_publish``: events acknowledged by the broker, checkpoint not yet saved
* ``detect.after_publish``:  incidents acknowledged, consumer offsets not yet committed
* ``sink.after_write``:      DuckDB committed, consumer offsets not yet committed
"""

from __future__ import annotations

import os
import signal


def hit(name: str) -> None:
    """Die by SIGKILL here if ``CKPTWATCH_FAILPOINTS`` names this point."""
    spec = os.environ.get("CKPTWATCH_FAILPOINTS")
    if spec and name in (p.strip() for p in spec.split(",")):
        os.kill(os.getpid(), signal.SIGKILL)
