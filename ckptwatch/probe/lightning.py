"""The probe after a Lightning resume (``Trainer(callbacks=[probe_callback(fn)])``).

:func:`probe_callback` returns a ``lightning.pytorch.Callback`` (or ``pytorch_lightning``'s;
a plain object with the same hook when neither is installed) whose ``on_train_start`` runs,
on global rank 0, when the run resumed from a checkpoint (``trainer.ckpt_path``, set by
``Trainer.fit(..., ckpt_path=...)``): ``outputs(pl_module)``, run in eval mode and without
autograd (:func:`ckptwatch.probe.evaluate`), is judged and reported
(:func:`ckptwatch.probe.report`) about that checkpoint, at ``trainer.global_step``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ckptwatch.integrity.logline import Emit
from ckptwatch.probe import ProbeResult, evaluate, report


def _base() -> type:
    for name in ("lightning.pytorch", "pytorch_lightning"):
        try:
            module = __import__(name, fromlist=["Callback"])
            return module.Callback
        except ImportError:
            continue
    return object


class _Probe:
    """The hook itself (see :func:`probe_callback`); :attr:`result` holds the last verdict."""

    def __init__(self, outputs: Callable[[Any], Any], *, emit: Emit | None = None, atol: float = 1e-6) -> None:
        self.outputs, self.emit, self.atol = outputs, emit, atol
        self.result: ProbeResult | None = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        path = getattr(trainer, "ckpt_path", None)
        if not path or int(getattr(trainer, "global_rank", 0) or 0) != 0:
            return
        step = getattr(trainer, "global_step", None)
        try:
            self.result = report(evaluate(self.outputs, pl_module), path=str(path), step=step, emit=self.emit, atol=self.atol)
        except Exception as e:  # the probe must never stop training
            from ckptwatch.integrity.logline import emit_to_stderr

            (self.emit or emit_to_stderr)(f"ckptwatch: probe of {path} failed: {type(e).__name__}: {e}")


def probe_callback(outputs: Callable[[Any], Any], *, emit: Emit | None = None, atol: float = 1e-6) -> Any:
    """A Lightning callback running the probe after a resume. ``outputs(pl_module) -> array``:
    the module's outputs on a fixed batch, as numpy."""
    cls = type("ProbeCallback", (_Probe, _base()), {})
    return cls(outputs, emit=emit, atol=atol)
