"""The output probe: is a resumed model's output alive? Numpy in, one structured line out.

A checkpoint can load without an error and still be broken: zeroed or duplicated weights
give constant outputs, a NaN in the optimizer state gives NaN outputs, a collapsed
embedding gives every input the same row. The training loss may take many steps to show
it. The probe runs the model once on a fixed batch right after a resume (the HF Trainer
and Lightning callbacks in :mod:`ckptwatch.probe.hf` and :mod:`ckptwatch.probe.lightning`
do it) and judges the outputs alone, framework-agnostic:

* ``not_finite``: a NaN or an infinity in the outputs;
* ``constant``: every value equal (standard deviation under ``atol``);
* ``collapsed``: every row (first axis) equal to the first, with two rows or more: the
  model ignores its input;
* ``flat``: every row the same value across its outputs, with two outputs or more (logits
  equal over the vocabulary): what weights all set to one value give;
* ``empty``: no value at all.

:func:`check` returns a :class:`ProbeResult`; :func:`report` prints it as ckptwatch's
structured line (:mod:`ckptwatch.integrity.logline`, event ``probe``) after the ``resume``
line of the checkpoint it probes, and the rule ``ckptwatch.probe_degenerate`` (rule pack
``05-ckptwatch.yaml``) makes a degenerate verdict a ``load_failure`` of that checkpoint
(class ``degenerate_outputs``), whose page names it and the last good checkpoint.

Usage, in any training loop::

    from ckptwatch.probe import report
    report(model(fixed_batch).detach().cpu().numpy(), path=ckpt_dir, step=step, rank=rank)
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ckptwatch.integrity.logline import emit_to_stderr, format_line

REASONS = ("not_finite", "constant", "collapsed", "flat", "empty")


@dataclass(frozen=True)
class ProbeResult:
    """The probe's verdict on one output array: ``verdict`` ``ok`` or ``degenerate``,
    ``reason`` (one of :data:`REASONS`, ``""`` when ok), ``values`` (count), ``rows`` (first
    axis), ``distinct_rows`` (rows not equal to the first, plus one), ``finite`` (fraction of
    finite values, 0..1), ``std`` (standard deviation of the finite values)."""

    verdict: str
    reason: str
    values: int
    rows: int
    distinct_rows: int
    finite: float
    std: float

    @property
    def ok(self) -> bool:
        return self.verdict == "ok"


def check(outputs: Any, *, atol: float = 1e-6) -> ProbeResult:
    """Judge ``outputs`` (anything :func:`numpy.asarray` takes: a numpy array, a list, a CPU
    tensor's ``.numpy()``; shape ``(rows, ...)``; a 0-d or 1-d array is one row).

    Raises ValueError when ``outputs`` is not numeric."""
    a = np.asarray(outputs)
    if a.dtype.kind not in "fiub":
        raise ValueError(f"probe outputs must be numeric, not {a.dtype}")
    a = a.astype(np.float64, copy=False)
    if a.size == 0:
        return ProbeResult("degenerate", "empty", 0, 0, 0, 0.0, 0.0)
    rows = a.reshape(a.shape[0], -1) if a.ndim >= 2 else a.reshape(1, -1)
    finite_mask = np.isfinite(rows)
    finite = float(finite_mask.mean())
    std = float(rows[finite_mask].std()) if finite_mask.any() else math.nan
    distinct = 1 + int((~np.all(np.isclose(rows[1:], rows[:1], atol=atol, rtol=0), axis=1)).sum()) \
        if rows.shape[0] > 1 else 1
    reason = ""
    if finite < 1.0:
        reason = "not_finite"
    elif std < atol:
        reason = "constant"
    elif rows.shape[0] > 1 and distinct == 1:
        reason = "collapsed"
    elif rows.shape[1] > 1 and bool(np.all(np.ptp(rows, axis=1) <= atol)):
        reason = "flat"
    return ProbeResult("degenerate" if reason else "ok", reason, int(rows.size), int(rows.shape[0]), distinct,
                       finite, 0.0 if math.isnan(std) else std)


def line(result: ProbeResult, *, path: str, step: int | None = None, rank: int | None = None) -> str:
    """The structured line of ``result`` about the checkpoint at ``path``::

        ckptwatch event=probe step=20 rank=0 verdict=degenerate reason=constant values=64 rows=8
            distinct_rows=1 finite=1 std=0 path=/ckpt/checkpoint-20
    """
    return format_line("probe", path, step=step, rank=rank, verdict=result.verdict, reason=result.reason or "none",
                       values=result.values, rows=result.rows, distinct_rows=result.distinct_rows,
                       finite=f"{result.finite:.4g}", std=f"{result.std:.4g}")


def report(outputs: Any, *, path: str, step: int | None = None, rank: int | None = None,
           emit: Callable[[str], None] | None = None, atol: float = 1e-6) -> ProbeResult:
    """:func:`check` ``outputs``, then write the ``resume`` line of ``path`` and the probe's
    line (:func:`line`) with ``emit`` (default: stderr with a UTC time prefix, what torchrun
    and the log files capture). Returns the result."""
    result = check(outputs, atol=atol)
    out = emit or emit_to_stderr
    out(format_line("resume", path, step=step, rank=rank))
    out(line(result, path=path, step=step, rank=rank))
    return result


def evaluate(outputs: Callable[[Any], Any], model: Any) -> Any:
    """``outputs(model)`` as a probe must run it: a torch module (anything with ``training``,
    ``eval`` and ``train``) in eval mode, so that dropout noise neither hides collapsed
    outputs nor invents differences, and without autograd when torch is loaded; the
    module's mode is restored after. Used by the HF and Lightning callbacks."""
    training = bool(getattr(model, "training", False)) and hasattr(model, "eval") and hasattr(model, "train")
    torch = sys.modules.get("torch")  # never imported here: a process that has a module has torch
    grad = torch.no_grad() if torch is not None and hasattr(torch, "no_grad") else contextlib.nullcontext()
    if training:
        model.eval()
    try:
        with grad:
            return outputs(model)
    finally:
        if training:
            model.train(True)
