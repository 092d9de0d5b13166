"""Pictures are drawn one at a time per process (ckptwatch.history.plot holds a lock over
matplotlib's process-wide state), and that lock is re-entrant: a drawing entry point called
while its own thread holds it (a picture drawn inside another's drawing, as
:func:`~ckptwatch.history.plot.html_page` draws through ``svg``) completes instead of
waiting for itself forever."""

from __future__ import annotations

import io
import threading

from kafka_support import failing_save

from ckptwatch.history import plot
from ckptwatch.history.timeline import build_timeline
from ckptwatch.pipeline import diagnose


def test_a_drawing_entry_point_called_under_the_drawing_lock_completes(tmp_path):
    for name, text in failing_save("job-a").items():
        (tmp_path / name).write_text(text)
    (inc,) = diagnose([str(tmp_path)])[0]
    tl = build_timeline(None, inc)
    drawn: dict[str, object] = {}

    def nested() -> None:
        with plot._drawing():  # what a drawing entry point holds while it draws
            drawn["svg"] = plot.svg(tl)
            png = io.BytesIO()
            plot.write_png(tl, png)
            drawn["png"] = png.getvalue()
            drawn["page"] = plot.html_page(tl, "report")

    t = threading.Thread(target=nested, name="nested-drawing", daemon=True)
    t.start()
    t.join(20)
    if t.is_alive():  # a plain Lock: the thread waits on itself; free it so later pictures are not stuck
        plot._DRAWING.release()
        t.join(5)
        raise AssertionError("a drawing call made under the drawing lock never returned (the lock is not re-entrant)")
    assert str(drawn["svg"]).startswith("<svg") and "storage_failure_during_save" in str(drawn["page"])
    assert bytes(drawn["png"]).startswith(b"\x89PNG\r\n\x1a\n")
    assert plot._DRAWING.acquire(blocking=False)  # held by no one once they are done
    plot._DRAWING.release()
