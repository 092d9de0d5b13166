"""What the detector knows of each checkpoint, across jobs: which saves finished on every
rank, which an incident marked not-good, and with what world size they were written.

Resumes are usually new jobs (a new torchrun run id) pointed at an old job's checkpoint
directory, so a checkpoint is identified by its directory and step, not by its job.
:func:`checkpoint_key` reduces the forms trainers print to one ``(root, step)``:

* Megatron-LM logs the root (``saving checkpoint at iteration 40 to /ckpt``) and writes
  ``/ckpt/iter_0000040``; HF Trainer logs ``/out/checkpoint-40``; plain loops ``/ckpt/step_40``.
  A last path component that carries the step by one of the naming conventions of
  :mod:`ckptwatch.naming` is dropped: all give ``(/ckpt, 40)``. Other numbers in a path
  (``/ckpt/run-17``) are not steps.
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass, field

from ckptwatch.detectors.incident import Incident
from ckptwatch.naming import step_from_path

#: A checkpoint's identity: (directory holding the per-step checkpoints, step). Either may be None.
CheckpointKey = tuple[str | None, int | None]

#: Save incidents that make their checkpoint not-good.
BAD_KINDS = frozenset({"interrupted_save", "storage_failure_during_save", "partial_checkpoint", "stalled_save",
                       "corrupt_checkpoint"})

#: Steps kept per checkpoint root in each registry table (see :meth:`CheckpointRegistry.prune`).
MAX_PER_ROOT = 256
#: earlier attempts kept per checkpoint (:attr:`CheckpointRegistry.earlier`)
MAX_ATTEMPTS = 4


def checkpoint_key(path: str | None, step: int | None) -> CheckpointKey:
    """``(root, step)`` of a checkpoint named by ``path`` and/or ``step`` (see the module
    docstring). When only the path is known, a step its last component names by convention
    is the step."""
    if not path:
        return (None, step)
    p = os.path.normpath(path.rstrip("/"))
    named = step_from_path(os.path.basename(p))
    if step is None:
        step = named
    if step is not None and step == named:
        return (os.path.dirname(p), step)
    return (p, step)


@dataclass
class SaveFact:
    """One save seen in the logs: its job, path, whether every expected rank finished it
    (``complete``), its first start (UTC), the saving job's world size, and the saving job's
    last losses up to the saved step (``losses``: ``(time UTC, step, loss)`` by step, at most
    :attr:`RegressionSettings.k <ckptwatch.detectors.regression.RegressionSettings.k>`), which a
    resume from it is compared with. A fact is all a detector needs of a save written by a
    job it does not own (fleet mode: the saves topic carries them between members)."""

    job: str
    step: int
    path: str | None
    complete: bool
    first_ts: dt.datetime | None
    world_size: int | None
    losses: tuple[tuple[dt.datetime, int, float], ...] = ()
    #: expected ranks with no end of this save (empty when complete)
    missing: tuple[int, ...] = ()

    def to_dict(self) -> dict:
        """JSON-ready dict (times ISO 8601 UTC; a NaN loss as the string ``"nan"``)."""
        return {"job": self.job, "step": self.step, "path": self.path, "complete": self.complete,
                "first_ts": self.first_ts.isoformat() if self.first_ts else None, "world_size": self.world_size,
                "losses": [[ts.isoformat(), s, v if v == v else "nan"] for ts, s, v in self.losses],
                "missing": list(self.missing)}

    @classmethod
    def from_dict(cls, d: dict) -> SaveFact:
        """Inverse of :meth:`to_dict`. Raises KeyError / ValueError / TypeError on another shape."""
        return cls(d["job"], d["step"], d["path"], bool(d["complete"]),
                   dt.datetime.fromisoformat(d["first_ts"]) if d["first_ts"] else None, d["world_size"],
                   tuple((dt.datetime.fromisoformat(t), int(s), float(v)) for t, s, v in d["losses"]),
                   tuple(int(r) for r in d["missing"]))


def _comparable(fact: SaveFact) -> tuple:
    """``fact`` as a tuple in which a NaN loss equals another NaN (a fact read back from the
    saves topic must compare equal to the one written)."""
    losses = tuple((ts, s, v if v == v else "nan") for ts, s, v in fact.losses)
    return (fact.job, fact.step, fact.path, fact.complete, fact.first_ts, fact.world_size, losses, fact.missing)


@dataclass
class CheckpointRegistry:
    """Facts per :data:`CheckpointKey`. ``saves``: the latest save of each key (by first
    start; a fact learned twice changes nothing); ``earlier``: the attempts a later one
    replaced (a run resumed from an older checkpoint writes the same step again), oldest
    first, at most :data:`MAX_ATTEMPTS`: a load is judged by the attempt written before it
    (:meth:`fact_at`); ``bad``: the save incident (not superseded, not resolved away) that
    marked a key not-good."""

    saves: dict[CheckpointKey, SaveFact] = field(default_factory=dict)
    earlier: dict[CheckpointKey, list[SaveFact]] = field(default_factory=dict)
    bad: dict[CheckpointKey, Incident] = field(default_factory=dict)
    #: checkpoints a verification found ``ok`` (path as verified): good, whatever the logs saw of their save
    verified: dict[CheckpointKey, str | None] = field(default_factory=dict)

    def record_save(self, fact: SaveFact) -> bool:
        """Remember a save (a later one of the same key replaces it, and so does a newer
        view of the same job's save: its first start moves earlier as late lines arrive);
        True if that changed anything."""
        key = checkpoint_key(fact.path, fact.step)
        old = self.saves.get(key)
        if (old is not None and old.job != fact.job and old.first_ts and fact.first_ts
                and old.first_ts > fact.first_ts):
            self.record_earlier(fact)  # another job's older attempt
            return False
        if old is not None and old.first_ts and fact.first_ts and fact.first_ts > old.first_ts:
            self.record_earlier(old)  # a later attempt of the step (a newer view only moves its start earlier)
        self.saves[key] = fact
        return old is None or _comparable(old) != _comparable(fact)

    def record_earlier(self, fact: SaveFact) -> bool:
        """Remember ``fact`` as an attempt that a later one of its key replaced (the detector
        gives those of a job it holds: :func:`~ckptwatch.detectors.saves.saves_of`'s negative
        keys); True if it is new or changed."""
        if fact.first_ts is None:
            return False
        key = checkpoint_key(fact.path, fact.step)
        if key not in self.saves:  # the same step in another folder: the latest save of its own checkpoint
            return self.record_save(fact)
        known = self.earlier.setdefault(key, [])
        same = next((i for i, f in enumerate(known) if f.job == fact.job and f.first_ts == fact.first_ts), None)
        if same is not None:
            if _comparable(known[same]) == _comparable(fact):
                return False
            known[same] = fact
        else:
            known.append(fact)
            known.sort(key=lambda f: f.first_ts or dt.datetime.min.replace(tzinfo=dt.timezone.utc))
            del known[:-MAX_ATTEMPTS]
        return True

    def fact_at(self, key: CheckpointKey, at: dt.datetime) -> SaveFact | None:
        """The save of ``key`` (resolved) that a load at ``at`` (UTC) found: the latest
        attempt begun before ``at``; the latest attempt when none was (or none is dated)."""
        key = self.resolve(key)
        latest = self.saves.get(key)
        before = [f for f in (*self.earlier.get(key, ()), *((latest,) if latest else ()))
                  if f.first_ts is not None and f.first_ts < at]
        return max(before, key=lambda f: f.first_ts) if before else latest

    def record_incident(self, inc: Incident) -> bool:
        """Remember a save incident as marking its checkpoint not-good (or forget it, when
        superseded); True if that changed anything."""
        if inc.kind not in BAD_KINDS:
            return False
        key = checkpoint_key(inc.checkpoint_path, inc.step)
        old = self.bad.get(key)
        if inc.status == "superseded" or (inc.kind == "corrupt_checkpoint" and inc.status == "resolved"):
            # a re-verification found it whole again; a resolved *save* incident still marks its own step
            if old is not None and old.id == inc.id:
                del self.bad[key]
                return True
            return False
        self.bad[key] = inc
        return old is None or old.id != inc.id or old.fingerprint() != inc.fingerprint()

    def record_verified(self, key: CheckpointKey, path: str | None) -> bool:
        """Remember that a verification found ``key`` ok; True if that is new."""
        if key in self.verified:
            return False
        self.verified[key] = path
        return True

    def prune(self, before: dt.datetime, *, keep_per_root: int = MAX_PER_ROOT) -> int:
        """Forget what is older than ``before`` (UTC; saves by first start, bad marks by
        their incident's first event) and, under each root, all but the newest
        ``keep_per_root`` steps of each table (verified keys: by step). Returns how many
        entries went. Keeps the registry bounded over a long-running fleet: a resume
        from a checkpoint older than the horizon is judged as one never seen."""
        gone = 0
        for table, ts_of in ((self.saves, lambda f: f.first_ts), (self.bad, lambda i: i.first_ts)):
            old = [k for k, v in table.items() if ts_of(v) is not None and ts_of(v) < before]
            for k in old:
                del table[k]
            gone += len(old)
        for table in (self.saves, self.bad, self.verified):
            by_root: dict[str | None, list[CheckpointKey]] = {}
            for k in table:
                by_root.setdefault(k[0], []).append(k)
            for keys in by_root.values():
                if len(keys) > keep_per_root:
                    keys.sort(key=lambda k: -1 if k[1] is None else k[1])
                    for k in keys[: len(keys) - keep_per_root]:
                        del table[k]
                        gone += 1
        for k in list(self.earlier):  # attempts older than the horizon, or of a checkpoint let go
            kept = [f for f in self.earlier[k] if k in self.saves and f.first_ts is not None and f.first_ts >= before]
            gone += len(self.earlier[k]) - len(kept)
            if kept:
                self.earlier[k] = kept
            else:
                del self.earlier[k]
        return gone

    def to_dict(self) -> dict:
        """JSON-ready snapshot: ``{"saves": [SaveFact dicts], "earlier": [SaveFact dicts],
        "bad": [incident dicts without evidence], "verified": [[root, step, path]]}``
        (inverse: :meth:`from_dict`; a snapshot without ``earlier`` is read too)."""
        return {
            "saves": [f.to_dict() for f in self.saves.values()],
            "earlier": [f.to_dict() for fs in self.earlier.values() for f in fs],
            "bad": [{**i.to_dict(), "evidence": []} for i in self.bad.values()],
            "verified": [[r, s, p] for (r, s), p in self.verified.items()],
        }

    @classmethod
    def from_dict(cls, d: dict) -> CheckpointRegistry:
        """Inverse of :meth:`to_dict`. Raises KeyError / ValueError / TypeError on another shape."""
        reg = cls()
        for f in d["saves"]:
            reg.record_save(SaveFact.from_dict(f))
        for f in d.get("earlier", ()):
            reg.record_earlier(SaveFact.from_dict(f))
        for i in d["bad"]:
            reg.record_incident(Incident.from_dict(i))
        for r, s, p in d["verified"]:
            reg.verified[(r, s)] = p
        return reg

    def resolve(self, key: CheckpointKey) -> CheckpointKey:
        """``key`` as the registry knows it: a relative root (``ckpt`` in "Restoring states from
        the checkpoint path at ckpt/epoch=0-step=20.ckpt") is the one absolute root of a known
        checkpoint of the same step that ends with it; a load with no step (torchtune's
        epoch folders) is the newest known save of that root. Unchanged otherwise."""
        root, step = key
        if root is None or key in self.saves or key in self.bad:
            return key
        known = set(self.saves) | set(self.bad)
        if step is None:
            same_root = [k for k in known if k[0] == root and k[1] is not None]
            if same_root:
                return max(same_root, key=lambda k: (self.saves[k].first_ts if k in self.saves and self.saves[k].first_ts
                                                     else dt.datetime.min.replace(tzinfo=dt.timezone.utc)))
            return key
        if os.path.isabs(root) or "://" in root:
            return key
        tail = "/" + os.path.normpath(root).lstrip("./")
        hits = {k for k in known if k[1] == step and k[0] and (k[0].endswith(tail) or k[0] == tail.lstrip("/"))}
        return hits.pop() if len(hits) == 1 else key

    def last_good(self, key: CheckpointKey, at: dt.datetime) -> dict | None:
        """``{"step", "path"}`` of the newest checkpoint under the same root as ``key``, at an
        earlier step, not marked bad, and either saved completely (begun before ``at``, UTC)
        or verified ok; else None."""
        root, step = self.resolve(key)
        good: dict[int, str | None] = {s: p for (r, s), p in self.verified.items() if r == root and s is not None}
        attempts = [*self.saves.items(), *((k, f) for k, fs in self.earlier.items() for f in fs)]
        for (r, s), fact in attempts:
            if r == root and s is not None and fact.complete and fact.first_ts is not None and fact.first_ts < at:
                good[s] = fact.path
        earlier = [s for s in good if step is not None and s < step and (root, s) not in self.bad]
        if not earlier:
            return None
        best = max(earlier)
        return {"step": best, "path": good[best]}

    def verdict(self, key: CheckpointKey, at: dt.datetime) -> tuple[Incident | None, SaveFact | None]:
        """(the incident that marked ``key`` not-good, the save seen for it), either None, as
        of ``at`` (UTC, the load's time). A checkpoint written again completely, by an attempt
        begun after the bad one and before ``at`` (another job, or a restart of the same one), is
        good again."""
        key = self.resolve(key)
        save = self.fact_at(key, at)
        bad = self.bad.get(key)
        if bad is not None and save is not None and save.complete and save.first_ts:
            began = min((e.ts for e in bad.evidence if e.role == "save"), default=bad.first_ts)
            if began < save.first_ts < at:
                return None, save
        return bad, save
