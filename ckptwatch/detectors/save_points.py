"""A save presumed at a save point: a job that logs no save line, killed where trainers save.

Many trainers log their save at a level the default configuration hides: HF Trainer's
``Saving model checkpoint to …`` is ``logger.info`` (``trainer.py`` ``_save_checkpoint``)
and transformers' default verbosity is WARNING, so a pasted HF / TRL / LLaMA-Factory console
shows the progress bar and then the death, and nothing of the save between them. What the
console does show is *where* the job died: trainers save when a bar completes (the end of an
epoch or of training: Lightning's ``ModelCheckpoint`` on epoch end, ``save_strategy="epoch"``,
the final ``save_model``) and at round steps (``save_steps=200``, ``every_n_train_steps``).
A process killed during a training step dies at a step the bar shows for a second or so,
with nothing special about it; one killed while writing a checkpoint dies with the bar
standing on the save's step, for as long as the save takes.

:func:`presumed_saves` turns that into a ``save_start`` event, marked ``attrs.presumed =
"save_point"``, when every one of these holds:

* the job logged no save line, no save end and no error inside save code (a job that logs
  its saves would have logged this one);
* the job died from outside, the way a process dies in a save that outgrows the host's
  memory: SIGKILL / SIGTERM (``Killed``, ``exitcode: -9``, torchrun's ``Received
  Signals.SIGTERM death signal``), the OOM killer, or host memory exhausted; not when a
  scheduler stopped the job (a time limit, a preemption, ``scancel``, an eviction: its
  moment is the scheduler's);
* the last progress line before that death shows a completed bar (``100%``, ``N/N``), or a
  step that is a multiple of :data:`ROUND` (at least ``ROUND``) in a stream that also logged
  steps that are not, or on a tqdm bar (redrawn at every step): where every logged step is
  round, the roundness is the logging cadence's (YOLOX logs ``iter: 12700/14786`` every few
  iterations).

The save's step is the last step logged before the death (the bar's own, or the training
bar's before an evaluation bar that completed). What the logs do not show (that a save was
under way at all) is said in the incident: the start's line is the progress line.
"""

from __future__ import annotations

import dataclasses
import re

from ckptwatch.detectors.events import Ev, in_save
from ckptwatch.detectors.jobstate import NO_STEP, JobState, ev_key

#: a step that is a multiple of this is a save interval's (save_steps 50, 100, 200, 500, 1000 …)
ROUND = 50
#: signals that stop a process from outside (the OOM killer's, a memory watchdog's, a scheduler's)
_KILLS = frozenset({"SIGKILL", "SIGTERM"})
#: senders of a job-wide signal that pick its moment themselves
_SCHEDULERS = frozenset({"scheduler_time_limit", "scheduler_preemption", "scancel", "kubelet_eviction"})
#: a progress bar that completed: tqdm's ``100%|``, or the bar's own count ``N/N`` (tqdm's
#: before its ``[elapsed<left]``, Keras' before its ``━━━``); not an outer counter that happens
#: to be full (OpenRLHF's ``Episode [1/1]:  12%|█▏  | 37/312``)
_COMPLETE = re.compile(r"\b100%\||(?<![\d/])(\d+)/\1(?=\s*(?:\[\d|[━=]))")


def _death(e: Ev) -> bool:
    if e.kind in ("oom_kill", "host_memory"):
        return True
    if e.kind == "process_exit":
        return e.died_of_signal and e.signal in _KILLS
    if e.kind == "job_signal":
        return e.signal in _KILLS or e.attrs.get("sender") == "external"
    return False


#: a tqdm bar (``200/4443 [11:11:27<255:23:04, 216.68s/it]``): it is redrawn at every step, so
#: standing on a round step is the save's doing, not the cadence's
_TQDM_BAR = re.compile(r"\d+/\d+ \[\d+:\d+")


def _off_round(bucket, upto: int) -> bool:
    """The bucket logged a step that is not a multiple of :data:`ROUND` up to index ``upto``:
    its cadence is finer than a save interval, so a round step stands out. A trainer that
    logs every 50 or 100 iterations (YOLOX's ``iter: 12700/14786``) shows only round steps,
    and one of them being round says nothing."""
    return any(s != NO_STEP and s % ROUND for s in bucket.step[:upto + 1])


def presumed_saves(state: JobState, events: list[Ev]) -> list[Ev]:
    """The ``save_start`` events presumed at a save point for the job of ``state`` (see the
    module docstring); ``events``: the job's events in time order, progress lines not among
    them (they are in ``state.progress_by_rank``). Zero or one event; it has the progress
    line's time, file, offset and text, the step of the last stepped line before the death,
    and ``rule_id`` ``ckptwatch.presumed_save``."""
    if any(e.kind in ("save_start", "save_end", "save_error") or in_save(e) for e in events):
        return []
    if any(e.kind == "job_signal" and e.attrs.get("sender") in _SCHEDULERS for e in events):
        return []  # a time limit, a preemption, a cancel: the moment is the scheduler's, not the save's
    death = next((e for e in events if _death(e)), None)
    if death is None:
        return []
    key = ev_key(death)
    last: tuple[tuple, int, object] | None = None  # (key, index, bucket) of the last progress line before it
    stepped: tuple[tuple, int] | None = None
    for bucket in state.progress_by_rank.values():
        i = bucket.last_before(key)
        if i is not None and (last is None or bucket.key(i) > last[0]):
            last = (bucket.key(i), i, bucket)
        cand = bucket.last_step_before(key)
        if cand is not None and (stepped is None or cand[0] > stepped[0]):
            stepped = cand
    if last is None or stepped is None:
        return []
    _, i, bucket = last
    line = bucket.ev(i)
    step = bucket.step[i]
    complete = bool(_COMPLETE.search(line.line))
    if not complete and (step == NO_STEP or step < ROUND or step % ROUND):
        return []
    if not complete and not _TQDM_BAR.search(line.line) and not _off_round(bucket, i):
        return []  # every step it logged is round: that is its logging cadence, not a save point
    attrs = dict(line.attrs, presumed="save_point")
    return [dataclasses.replace(line, kind="save_start", step=stepped[1], path=None, rule_id="ckptwatch.presumed_save",
                                dedup_key=f"presumed:{line.dedup_key}", attrs=attrs)]
