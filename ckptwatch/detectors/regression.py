"""``post_resume_regression`` (warning): after a resume, the loss is clearly worse than it
was when the checkpoint was written, or it is NaN / infinite, or it stopped moving.

The comparison is robust: the median of the first ``k`` losses logged after the resume
against the median of the last ``k`` logged up to the saved step, by the job that saved
it. "Clearly worse" means above the old median by more than ``rel`` of it and by more
than ``mad`` scaled median absolute deviations of the old window (ordinary step-to-step
noise never gets there). A constant loss (every one of the ``k`` values equal while the
old window moved) points at a model that is not training: weights not loaded, a frozen
optimizer.

The saving job's last losses travel with the save itself (:attr:`SaveFact.losses
<ckptwatch.detectors.checkpoints.SaveFact.losses>`, cut by :func:`saver_windows`), so the
resume is judged wherever it is seen: in fleet mode the saves topic carries them to the
member that owns the resumed job.
"""

from __future__ import annotations

import bisect
import datetime as dt
import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

Losses = list[tuple[dt.datetime, int, float]]


@dataclass(frozen=True)
class RegressionSettings:
    """``k`` logged steps on each side; ``rel`` (fraction of the old median) and ``mad``
    (scaled MADs of the old window) that the new median must both exceed."""

    k: int = 5
    rel: float = 0.25
    mad: float = 5.0


@dataclass(frozen=True)
class Finding:
    """What was found: ``reason`` (``worse`` | ``not_finite`` | ``constant``) and the two
    windows' medians and values."""

    reason: str
    before_median: float
    after_median: float
    before: tuple[float, ...]
    after: tuple[float, ...]
    after_steps: tuple[int, ...]


def saver_windows(curve: Losses, steps: Iterable[int], k: int) -> dict[int, tuple[tuple[dt.datetime, int, float], ...]]:
    """For each saved step of ``steps``: the last ``k`` points of ``curve`` (``(time UTC,
    step, loss)`` in arrival order) at or before it, one per step (the latest logged), in
    step order: what a save keeps of its job's loss curve. One pass over the curve for all
    the job's saves."""
    by_step = {s: (ts, s, v) for ts, s, v in curve}
    logged = sorted(by_step)
    out = {}
    for step in steps:
        i = bisect.bisect_right(logged, step)
        out[step] = tuple(by_step[s] for s in logged[max(0, i - k):i])
    return out


def windows(saver: Losses, resumed: Losses, step: int, resumed_at: dt.datetime,
            k: int) -> tuple[list[float], list[tuple[int, float]]] | None:
    """(last ``k`` losses of ``saver`` up to ``step`` before ``resumed_at``, first ``k``
    (step, loss) of ``resumed`` past ``step`` after ``resumed_at``), or None while either
    has fewer than ``k``."""
    before_by_step = {s: v for ts, s, v in saver if s <= step and ts < resumed_at}
    after_by_step: dict[int, float] = {}
    for ts, s, v in resumed:
        if s > step and ts >= resumed_at:
            after_by_step.setdefault(s, v)
    before = [before_by_step[s] for s in sorted(before_by_step)][-k:]
    after = sorted(after_by_step.items())[:k]
    if len(before) < k or len(after) < k:
        return None
    return before, after


def judge(before: list[float], after: list[tuple[int, float]], settings: RegressionSettings) -> Finding | None:
    """A :class:`Finding` when the resumed losses regressed, else None."""
    values = [v for _, v in after]
    steps = tuple(s for s, _ in after)
    finite_before = [v for v in before if math.isfinite(v)]
    if not finite_before:
        return None  # the run was already broken before the checkpoint: not the resume's doing
    b_med = statistics.median(finite_before)
    if not all(math.isfinite(v) for v in values):
        return Finding("not_finite", b_med, math.nan, tuple(before), tuple(values), steps)
    a_med = statistics.median(values)
    if len(set(values)) == 1 and len(set(finite_before)) > 1:
        return Finding("constant", b_med, a_med, tuple(before), tuple(values), steps)
    mad = statistics.median(abs(v - b_med) for v in finite_before) * 1.4826
    if a_med - b_med > max(settings.rel * abs(b_med), settings.mad * mad):
        return Finding("worse", b_med, a_med, tuple(before), tuple(values), steps)
    return None


def describe(f: Finding, step: int) -> str:
    """One sentence for the remediation text."""
    if f.reason == "not_finite":
        what = f"the loss is NaN/inf after the resume (steps {f.after_steps[0]}-{f.after_steps[-1]})"
    elif f.reason == "constant":
        what = f"the loss stays at {f.after_median:.6g} after the resume, while it moved before the checkpoint"
    else:
        what = (f"the median loss of the first {len(f.after)} logged steps after the resume is "
                f"{f.after_median:.6g}, against {f.before_median:.6g} over the last {len(f.before)} steps up to "
                f"step {step}")
    return (f"{what[0].upper()}{what[1:]}. The checkpoint may be damaged without any load error (a flipped byte "
            f"loads silently) or not what the job thinks it loaded: run `ckptwatch verify` on it, compare the "
            "optimizer and scheduler state, and resume from the last good checkpoint if it is not whole.")
