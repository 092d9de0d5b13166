"""``corrupt_checkpoint`` (critical): a verification of a checkpoint's files (an ``integrity``
event, from ckptwatch's own structured lines: ``guard_resume``, the save callbacks, or
a collector watching a checkpoint root) found it
``incomplete`` or ``corrupt``.

One incident per checkpoint (its directory and step, :func:`~.checkpoints.checkpoint_key`),
dated by the first bad verification. It marks the checkpoint not-good, so a later resume
from it is a ``poisoned_resume``. A later verification of the same checkpoint that is
``ok`` (restored from a good copy) resolves it, and the checkpoint is good again. An
``unverifiable`` verdict (nothing could be checked) raises nothing.
"""

from __future__ import annotations

from ckptwatch.detectors.checkpoints import CheckpointKey, CheckpointRegistry, checkpoint_key
from ckptwatch.detectors.events import Ev
from ckptwatch.detectors.incident import Incident
from ckptwatch.detectors.jobstate import JobState

BAD_VERDICTS = ("incomplete", "corrupt")


def evaluate(state: JobState, registry: CheckpointRegistry) -> list[Incident]:
    """The job's ``corrupt_checkpoint`` incidents as of its integrity events (no watermark:
    a verification is a conclusion in itself). Checkpoints whose latest verification is ok
    are recorded in ``registry`` first, as last good checkpoints the incidents can name."""
    by_key: dict[CheckpointKey, list[Ev]] = {}
    for ev in sorted(state.integrity, key=lambda e: (e.ts, e.source_id, e.offset)):
        by_key.setdefault(checkpoint_key(ev.path, ev.step), []).append(ev)
    for key, evs in by_key.items():
        if evs[-1].attrs.get("verdict") == "ok":
            registry.record_verified(key, evs[-1].path)  # a good checkpoint to fall back to
    out = []
    for key, evs in by_key.items():
        bad = [e for e in evs if e.attrs.get("verdict") in BAD_VERDICTS]
        if bad:
            out.append(_incident(state, registry, key, bad[0], evs))
    return out


def _incident(state: JobState, registry: CheckpointRegistry, key: CheckpointKey, first: Ev, evs: list[Ev]) -> Incident:
    latest = evs[-1]
    a = first.attrs
    detail = f" ({a['detail']})" if a.get("detail") else ""
    last_good = registry.last_good(key, first.ts)
    instead = (f"Resume from the last good checkpoint, step {last_good['step']} ({last_good['path']}), after "
               "verifying it." if last_good else "No earlier good checkpoint of it is known: verify older ones "
               "with `ckptwatch verify` before resuming from any.")
    inc = Incident(
        kind="corrupt_checkpoint", job=state.job, step=key[1], checkpoint_path=first.path, root_cause=None,
        collateral=[],
        checkpoint_state={"verdict": a.get("verdict"), "files": a.get("files"), "bytes": a.get("bytes"),
                          "problems": a.get("problems"), "detail": a.get("detail"),
                          "manifest": a.get("manifest") == "yes"},
        last_good_checkpoint=last_good,
        remediation=(f"Do not resume from {first.path}: verification found it {a.get('verdict')}{detail}. "
                     f"Run `ckptwatch verify {first.path}` for every problem. {instead}"),
        first_ts=first.ts, evidence=state.evidence([(e, "integrity") for e in evs]),
    )
    if latest.attrs.get("verdict") == "ok":
        inc.status = "resolved"
    return inc
