"""The probe after a Hugging Face Trainer resume (``trainer.add_callback(ProbeCallback(fn))``).

A ``TrainerCallback``-compatible object, like :class:`ckptwatch.integrity.api.ManifestCallback`:
transformers is not imported, and every Trainer event but ``on_train_begin`` is a no-op.
At ``on_train_begin`` (transformers ``trainer.py`` ``_inner_training_loop`` calls it after
the checkpoint's model, optimizer and ``TrainerState`` are loaded) of a resumed run
(``state.global_step > 0``), it runs ``outputs(model)`` on the main process, in eval mode
and without autograd (:func:`ckptwatch.probe.evaluate`), and reports the verdict
(:func:`ckptwatch.probe.report`) about the checkpoint resumed from:
``args.resume_from_checkpoint`` when it names one, else ``<output_dir>/checkpoint-<step>``,
the Trainer's layout.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ckptwatch.integrity.api import TrainerCallbackBase
from ckptwatch.integrity.logline import Emit
from ckptwatch.probe import ProbeResult, evaluate, report


class ProbeCallback(TrainerCallbackBase):
    """``outputs(model) -> array``: the model's outputs on a fixed batch, as numpy (e.g.
    ``lambda m: m(**batch).logits.detach().float().cpu().numpy()``). ``emit``: where the
    lines go (default stderr). :attr:`result` holds the last verdict. An ``outputs`` that
    raises is reported on ``emit`` in one line and training goes on."""

    def __init__(self, outputs: Callable[[Any], Any], *, emit: Emit | None = None, atol: float = 1e-6) -> None:
        self.outputs, self.emit, self.atol = outputs, emit, atol
        self.result: ProbeResult | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        step = int(getattr(state, "global_step", 0) or 0)
        if step <= 0 or not getattr(state, "is_world_process_zero", True):
            return None  # a fresh run: nothing was resumed
        given = getattr(args, "resume_from_checkpoint", None)
        path = given if isinstance(given, str) and given else os.path.join(str(args.output_dir), f"checkpoint-{step}")
        try:
            self.result = report(evaluate(self.outputs, model), path=path, step=step, emit=self.emit, atol=self.atol)
        except Exception as e:  # the probe must never stop training
            self._say(f"ckptwatch: probe of {path} failed: {type(e).__name__}: {e}")
        return None
