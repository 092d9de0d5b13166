"""Resume incidents: what happens when a job loads a checkpoint.

* ``poisoned_resume`` (critical): a job loads a checkpoint that a save incident or a failed
  verification marked not-good (see :class:`~.checkpoints.CheckpointRegistry`), named by a
  resume line of any trainer (``load_start`` / ``resume`` events). It is reported at once,
  without waiting for the watermark: the resume line is the whole evidence needed. It
  names the bad checkpoint, the incident that made it bad and the last good checkpoint
  instead. A load of a save that was seen to start but never seen to finish on every
  rank is poisoned too, once the watermark passes the resume (late lines of the save had
  their chance). When the save incident comes, the poisoned resume names it.

  A poisoned resume follows the fate of what it cites: should later lines show the save
  finished on every rank after all (the last end-of-save lines arrived late, from a
  collector restarted after a kill), the save incident no longer makes the checkpoint
  not-good, and the poisoned resume is withdrawn (:func:`retraction` says why), whichever
  of the save's end and the resume arrived first; had the end arrived before the resume,
  none is ever created.
* ``world_size_mismatch`` (error): the load failed and the world size is the reason: a
  fingerprint says so (DeepSpeed's "DP world size of 8 but the current world size is 4",
  a DTensor copied between different ``DeviceMesh`` sizes), or the job's world size
  differs from that of the save it loads.
* ``load_failure`` (error): any other load-error fingerprint (torch zip, unpickling, EOF,
  safetensors header, missing ``.metadata`` or shard, size mismatches; and, in a job that
  loaded a checkpoint before them, the fingerprints of a load that "worked": an empty
  ``EmbeddingBag`` input, optimizer state of other shapes at the first step), one incident per
  job and checkpoint, linked to the save incident of the same checkpoint when there is
  one ("this load failed because the save at step N was interrupted by ...").
"""

from __future__ import annotations

import datetime as dt
import os
import re
from dataclasses import dataclass, field

from ckptwatch.detectors import regression, save_incidents
from ckptwatch.detectors.checkpoints import CheckpointKey, CheckpointRegistry, SaveFact, checkpoint_key
from ckptwatch.detectors.events import FAILURE_KINDS, LOAD_KINDS, Ev
from ckptwatch.detectors.headline import PROBE_WORDS
from ckptwatch.detectors.incident import Incident, RootCause
from ckptwatch.detectors.jobstate import JobState

#: Kinds of a failed load: one incident per job and checkpoint, re-classified in place.
LOAD_INCIDENT_KINDS = ("load_failure", "world_size_mismatch")
_WS_CLASSES = ("world_size_mismatch", "device_mesh_mismatch")
_MESH = re.compile(r"DeviceMesh\(\(([\d, ]+)\)")
_CKPT_FILES = re.compile(r"(^\.metadata$|^__\d+(_\d+)?\.(distcp|metadata)$|\.(pt|pth|bin|safetensors|json|pkl)$)")


@dataclass
class Load:
    """A job's load of one checkpoint: its key, what it printed, when it began (UTC)."""

    key: CheckpointKey
    path: str | None
    step: int | None
    events: list[Ev] = field(default_factory=list)

    @property
    def first_ts(self):
        return self.events[0].ts


def _error_key(path: str | None) -> CheckpointKey:
    """The checkpoint a load error's path points into (a file or a shard folder inside it)."""
    if not path:
        return (None, None)
    p = os.path.normpath(path)
    while _inside_checkpoint(os.path.basename(p)):
        p = os.path.dirname(p)
    return checkpoint_key(p, None)


def _inside_checkpoint(name: str) -> bool:
    """A file of a checkpoint (``.metadata``, ``__0_0.distcp``, ``model.safetensors`` ...) or
    a shard folder in it (``pytorch_model_fsdp_0``), not the checkpoint's own folder."""
    if _CKPT_FILES.search(name):
        return True
    return bool(re.fullmatch(r"\w+_\d+", name)) and not re.search(r"checkpoint|iter|step", name)


def loads_of(events: list[Ev]) -> list[Load]:
    """The job's loads, one per checkpoint key, in time order. A line with only a step
    joins the load of that step that names a path."""
    loads: dict[CheckpointKey, Load] = {}
    for ev in events:
        if ev.kind not in LOAD_KINDS or (ev.path is None and ev.step is None):
            continue
        key = checkpoint_key(ev.path, ev.step)
        if key[0] is None:
            key = next((k for k in loads if k[1] == key[1]), key)
        ld = loads.setdefault(key, Load(key, ev.path, ev.step))
        if ld.path is None or (ev.path and key[0] and len(ev.path) > len(ld.path)):
            ld.path = ev.path or ld.path
        ld.events.append(ev)
    # a step-only load met before the line naming the path: merge it
    for key in [k for k in loads if k[0] is None]:
        other = next((k for k in loads if k[0] is not None and k[1] == key[1]), None)
        if other is not None:
            loads[other].events = sorted(loads[other].events + loads.pop(key).events,
                                         key=lambda e: (e.ts, e.source_id, e.offset))
    return sorted(loads.values(), key=lambda ld: ld.first_ts)


_BAD_WORDS = {"interrupted_save": "interrupted by", "storage_failure_during_save": "broken by a storage failure:",
              "partial_checkpoint": "left partial", "stalled_save": "stalled", "corrupt_checkpoint": "found corrupt"}


def _bad_summary(bad: Incident) -> str:
    rc = bad.root_cause
    words = _BAD_WORDS.get(bad.kind, bad.kind)
    why = (f" {rc.cls}" + (f" on rank {rc.rank}" if rc.rank is not None else "")) if rc and words.endswith((":", "by")) \
        else ""
    return f"the save at step {bad.step} (job {bad.job}) was {words}{why} (incident {bad.id})"


def _cause_of(bad: Incident) -> dict | None:
    """The root cause of save incident ``bad`` as ``checkpoint_state["bad_cause"]`` of the
    incidents that cite it (class, rank, host, signal, sender), so that their headline can
    say what broke the checkpoint; None when ``bad`` has no root cause."""
    rc = bad.root_cause
    if rc is None:
        return None
    return {"class": rc.cls, "rank": rc.rank, "host": rc.host, "signal": rc.signal, "sender": rc.sender,
            "line": rc.line}


def _resume_from(last_good: dict | None) -> str:
    if not last_good:
        return "No complete earlier checkpoint was seen: restart from scratch or from a verified external checkpoint."
    return f"Resume from the last good checkpoint instead: step {last_good['step']} ({last_good.get('path')})."


def _world_sizes(errors: list[Ev], state: JobState, save_ws: int | None) -> tuple[int | None, int | None] | None:
    """(saved, current) world sizes when they are known to differ, else None."""
    for e in errors:
        a = e.attrs
        if a.get("class") == "world_size_mismatch":  # the loader said so; the sizes when it gave them
            if a.get("saved_world_size") and a.get("current_world_size"):
                return int(a["saved_world_size"]), int(a["current_world_size"])
            return (save_ws, state.world_size)
        if a.get("class") == "device_mesh_mismatch":
            meshes = [_mesh_size(m) for m in _MESH.findall(e.line)]
            if len(meshes) >= 2 and meshes[0] != meshes[1]:
                return meshes[1], meshes[0]  # copy_(model param, checkpoint tensor)
            return (save_ws, state.world_size)
    if save_ws and state.world_size and save_ws != state.world_size:
        return save_ws, state.world_size
    return None


def _mesh_size(dims: str) -> int:
    n = 1
    for d in filter(None, (x.strip() for x in dims.split(","))):
        n *= int(d)
    return n


def finished_after_all(bad: Incident, save: SaveFact | None) -> bool:
    """Save incident ``bad`` is about a save that is now seen complete on every rank (the
    same attempt: begun no later than the save ``bad`` cites), so it no longer makes its
    checkpoint not-good, whatever its status (withdrawn, or a stall resolved by its end).
    A corrupt checkpoint (a verification's finding) is not a save's and stays bad."""
    return (bad.kind in save_incidents.KINDS and save is not None and save.complete and save.job == bad.job
            and save.first_ts is not None and save.first_ts <= save_incidents.began(bad))


def verdict(registry: CheckpointRegistry, key: CheckpointKey, at: dt.datetime) -> tuple[Incident | None, SaveFact | None]:
    """:meth:`CheckpointRegistry.verdict`, except that a save incident whose save
    :func:`finished_after_all` marks nothing."""
    bad, save = registry.verdict(key, at)
    if bad is not None and finished_after_all(bad, save):
        return None, save
    return bad, save


def retraction(inc: Incident, registry: CheckpointRegistry) -> str | None:
    """Why resume incident ``inc`` (a ``poisoned_resume`` evaluation no longer reports) is
    withdrawn, from what ``registry`` knows now of the checkpoint it loads (a sentence, for
    :meth:`Incident.withdraw`): its save is seen complete, or a verification found it
    whole. None when neither: the load only waits again (its job's watermark fell back
    behind it as new lines arrived), and the incident stands."""
    cs = inc.checkpoint_state
    key = registry.resolve(checkpoint_key(cs.get("loaded_path") or inc.checkpoint_path, inc.step))
    save = registry.fact_at(key, inc.first_ts)  # what the load found, not a later run's save of the step
    cited = f" ({cs['bad_kind']} {cs['marked_bad_by']} no longer stands)" if cs.get("marked_bad_by") else ""
    if save is not None and save.complete:
        return (f"the save of step {save.step} by job {save.job} finished on every rank after all (its last "
                f"end-of-save lines arrived late): the checkpoint loaded is whole{cited}")
    if key in registry.verified:
        return f"a verification found the checkpoint loaded whole{cited}"
    return None


def evaluate(state: JobState, registry: CheckpointRegistry,
             settings: regression.RegressionSettings = regression.RegressionSettings(),
             *, wm: dt.datetime | None = None) -> tuple[list[Incident], bool]:
    """The job's resume incidents as of the events it has, and whether a load waits for the
    watermark ``wm`` (UTC; None: nothing past it yet) to judge a save not seen to finish."""
    events = sorted(state.loading, key=lambda e: (e.ts, e.source_id, e.offset))
    loads = loads_of(events)
    out: list[Incident] = []
    waiting = False
    for ld in loads:
        bad, save = verdict(registry, ld.key, ld.first_ts)
        if bad is None:
            if save is not None and save.complete:
                out += _regression(state, ld, save, settings)
            elif save is not None and save.first_ts is not None and save.first_ts < ld.first_ts:
                if wm is not None and wm >= ld.first_ts:
                    out.append(_unfinished(state, registry, ld, save))
                else:
                    waiting = True
            continue
        last_good = bad.last_good_checkpoint  # as the save incident said: the same in every mode
        context = [(e, "resume") for e in ld.events]
        out.append(Incident(
            kind="poisoned_resume", job=state.job, step=ld.key[1], checkpoint_path=bad.checkpoint_path or ld.path,
            root_cause=None, collateral=[],
            checkpoint_state={"marked_bad_by": bad.id, "bad_kind": bad.kind, "bad_job": bad.job,
                              "bad_step": bad.step, "bad_cause": _cause_of(bad), "loaded_path": ld.path},
            last_good_checkpoint=last_good,
            remediation=(f"Stop this job: it loads step {ld.key[1]} ({bad.checkpoint_path or ld.path}), which is not a "
                         f"good checkpoint: {_bad_summary(bad)}. {_resume_from(last_good)} Verify a checkpoint with "
                         "`ckptwatch verify` before resuming from it."),
            first_ts=ld.first_ts, evidence=state.evidence(context),
            provisional=bad.provisional,  # what broke the checkpoint may still be revised
        ))
    # a fingerprint seen after a load (the first forward or optimizer step: an empty
    # EmbeddingBag input, optimizer state of other shapes) is a load failure only in a job
    # that loaded a checkpoint before it; anywhere else it is an ordinary bug
    errors = [e for e in events if e.kind == "load_error"
              and (e.attrs.get("after_load") != "yes" or any(ld.first_ts <= e.ts for ld in loads))
              and not _trained_on(state, e)]
    for key, errs in _group_errors(errors, loads).items():
        out.append(_load_incident(state, registry, key, errs, loads))
    return out, waiting


def _trained_on(state: JobState, err: Ev) -> bool:
    """After the load error ``err``, its file logs training progress, and
    nothing between says the process died or a new run began (no failure, no load or
    resume in that file): the loader only warned (mmengine's non-strict load_state_dict
    lists its size mismatches and goes on; a fine-tune from other heads does so by design)."""
    if err.attrs.get("after_load") == "yes" or err.attrs.get("class") == "degenerate_outputs":
        return False  # found after a load that went through (at first use, by ckptwatch's probe)
    first = min((off for bucket in state.progress_by_rank.values()
                 if (off := bucket.first_in_file_after(err.source_id, err.offset, err.ts)) is not None), default=None)
    if first is None:
        return False
    between = [e for e in (*state.events.values(), *state.loading)
               if e.source_id == err.source_id and err.offset < e.offset < first
               and (e.kind in FAILURE_KINDS or e.kind in ("load_start", "resume"))]
    return not between


def _unfinished(state: JobState, registry: CheckpointRegistry, ld: Load, save: SaveFact) -> Incident:
    """``poisoned_resume`` of a save seen to start and never seen to finish on every rank."""
    last_good = registry.last_good(ld.key, ld.first_ts)
    ranks = ", ".join(map(str, save.missing)) or "?"
    path = save.path or ld.path
    return Incident(
        kind="poisoned_resume", job=state.job, step=ld.key[1], checkpoint_path=path, root_cause=None, collateral=[],
        checkpoint_state={"reason": "never_finished", "saved_by": save.job, "missing_ranks": list(save.missing),
                          "loaded_path": ld.path},
        last_good_checkpoint=last_good,
        remediation=(f"Stop this job: it loads step {ld.key[1]} ({path}), whose save by job {save.job} was never seen "
                     f"to finish on every rank (no end of save from rank(s) {ranks}). {_resume_from(last_good)} "
                     "Verify a checkpoint with `ckptwatch verify` before resuming from it."),
        first_ts=ld.first_ts, evidence=state.evidence([(e, "resume") for e in ld.events]),
    )


def _regression(state: JobState, ld: Load, save: SaveFact, settings: regression.RegressionSettings) -> list[Incident]:
    step, saver, path = ld.key[1], save.job, save.path
    curve = list(save.losses)
    w = regression.windows(curve, state.losses, step, ld.first_ts, settings.k) if curve and step is not None else None
    f = regression.judge(*w, settings) if w else None
    if f is None:
        return []
    return [Incident(
        kind="post_resume_regression", job=state.job, step=step, checkpoint_path=path or ld.path, root_cause=None,
        collateral=[], checkpoint_state={"reason": f.reason, "saved_by": saver, "before_median": f.before_median,
                                         "after_median": None if f.reason == "not_finite" else f.after_median,
                                         "before": list(f.before), "after": [str(v) for v in f.after],
                                         "after_steps": list(f.after_steps)},
        last_good_checkpoint=None, remediation=regression.describe(f, step), first_ts=ld.first_ts,
        evidence=state.evidence([(e, "resume") for e in ld.events]),
    )]


def _group_errors(errors: list[Ev], loads: list[Load]) -> dict[CheckpointKey, list[Ev]]:
    """Load errors per checkpoint: the job's load just before each error (or its first load,
    for an error stamped a little earlier: console lines are not in time order), else the
    error's own path; a path-less error goes with the previous one of its file."""
    groups: dict[CheckpointKey, list[Ev]] = {}
    last_by_source: dict[str, CheckpointKey] = {}
    for e in errors:
        before = [ld for ld in loads if ld.first_ts <= e.ts] or loads[:1]
        if before:
            key = before[-1].key
        elif e.path:
            key = _error_key(e.path)
        else:
            key = last_by_source.get(e.source_id, (None, None))
        last_by_source[e.source_id] = key
        groups.setdefault(key, []).append(e)
    return groups


def _load_incident(state: JobState, registry: CheckpointRegistry, key: CheckpointKey, errs: list[Ev],
                   loads: list[Load]) -> Incident:
    load = next((ld for ld in loads if ld.key == key), None)
    bad, save = verdict(registry, key, errs[0].ts)
    path = (load.path if load else None) or (bad.checkpoint_path if bad else None) or (save.path if save else None) \
        or next((e.path for e in errs if e.path), None)
    classes = sorted({str(e.attrs.get("class") or e.rule_id) for e in errs})
    ranks = sorted({r for r in (state.rank_of(e) for e in errs) if r is not None})
    ws = _world_sizes(errs, state, save.world_size if save else None)
    items = [(e, "root_cause") for e in errs] + [(e, "resume") for e in (load.events if load else [])]
    cs: dict = {"errors": classes, "ranks": ranks}
    after = all(e.attrs.get("after_load") == "yes" for e in errs)  # it loaded, then broke at first use
    if after:
        cs["after_load"] = True
    probe = next((e.attrs for e in errs if e.attrs.get("class") == "degenerate_outputs"), None)
    if probe is not None:  # ckptwatch.probe's verdict: what the outputs looked like
        cs["probe"] = {k: probe.get(k) for k in ("reason", "rows", "distinct_rows", "finite", "std")}
    # with no save incident to say it, the last good checkpoint is the newest complete earlier save
    last_good = bad.last_good_checkpoint if bad else registry.last_good(key, min(e.ts for e in errs))
    if bad is not None:
        cs.update(save_incident=bad.id, save_kind=bad.kind, bad_cause=_cause_of(bad))
    if ws is not None:
        saved, current = ws
        cs.update(saved_world_size=saved, current_world_size=current)
        sizes = (f"saved at world size {saved}, loaded at {current}" if saved and current
                 else "saved at another world size (or on other devices) than it is loaded at")
        remediation = (f"The checkpoint was {sizes}: its shards are laid out for the old size. Either resume with "
                       f"the original world size{f' ({saved})' if saved else ''}, or reshard it: load it through "
                       "torch.distributed.checkpoint (DCP reshards on load), restore an Orbax checkpoint with target "
                       "shardings for the new devices, or for DeepSpeed ZeRO convert it to a universal checkpoint "
                       "(ds_to_universal.py) and load with --universal-checkpoint.")
        kind = "world_size_mismatch"
    else:
        why = f"It failed because {_bad_summary(bad)}. " if bad is not None else ""
        if probe is not None:
            what = (f"The job loaded {path or 'a checkpoint'} without an error, but ckptwatch's probe found the "
                    f"model's outputs {PROBE_WORDS.get(str(probe.get('reason')), 'degenerate')} on a fixed batch: "
                    "the weights it holds are not trained weights (zeroed or never-gathered ZeRO-3/FSDP "
                    "parameters, a bad copy, a NaN in the state).")
        elif after:
            what = (f"The job loaded {path or 'a checkpoint'}, then failed at its first use ({', '.join(classes)}): "
                    "the checkpoint loads, but the state it holds is not what the model or optimizer needs (empty "
                    "or wrongly shaped tensors: a damaged or mismatched checkpoint).")
        else:
            what = f"Loading {path or 'the checkpoint'} failed ({', '.join(classes)})."
        parts = (what, why.strip(), _resume_from(last_good) if last_good is not None else "",
                 "Run `ckptwatch verify` on the checkpoint to see which files are missing or damaged.")
        remediation = " ".join(p for p in parts if p)
        kind = "load_failure"
    first = min(errs, key=lambda e: e.ts)
    root = RootCause(cls="load_error", rank=state.rank_of(first), host=first.host or state.host_of(state.rank_of(first)), pid=first.pid,
                     ts=first.ts, rule_id=first.rule_id, line=first.line,
                     note="the first rank whose load failed")
    return Incident(
        kind=kind, job=state.job, step=key[1], checkpoint_path=path, root_cause=root, collateral=[],
        checkpoint_state=cs, last_good_checkpoint=last_good, remediation=remediation,
        first_ts=first.ts, evidence=state.evidence(items), provisional=bool(bad and bad.provisional),
    )
