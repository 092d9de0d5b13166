"""The Incident contract (DESIGN.md, "Incident") and its deterministic id.

``status`` is one of :data:`STATUSES`:

* ``open``;
* ``resolved``: what it reported ended (the job saved a complete checkpoint again; a save
  that really stalled finished after all);
* ``superseded``: it no longer stands. Either its save was re-classified under another id,
  or it was **withdrawn** (:meth:`Incident.withdraw`): later evidence showed it never held,
  as when the last end-of-save lines of a save arrive late (a collector restarted) and the
  checkpoint that looked stalled, and the resume that was paged as poisoned for loading
  it, turn out whole. ``checkpoint_state["withdrawn"]`` then says why. A superseded
  incident is closed for alerting (its pages are resolved), marks no checkpoint not-good,
  and is not part of what a run reports (an in-order run would not have found it).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

#: values of ``ts_source`` that are a line's own time: parsed from the line, or captured by a rule
OWN_TIME = frozenset({"line", "rule"})

SEVERITIES = ("info", "warning", "error", "critical")
STATUSES = ("open", "resolved", "superseded")
#: ``checkpoint_state`` key of a withdrawn incident: why it was taken back
WITHDRAWN = "withdrawn"

#: Default severity per incident kind (alert routing reads this; see README).
DEFAULT_SEVERITY = {
    "interrupted_save": "critical",
    "storage_failure_during_save": "critical",
    "partial_checkpoint": "critical",
    "stalled_save": "warning",
    "corrupt_checkpoint": "critical",
    "poisoned_resume": "critical",
    "load_failure": "error",
    "world_size_mismatch": "error",
    "post_resume_regression": "warning",
}


def incident_id(job: str | None, kind: str, step: int | None, path: str | None) -> str:
    """``sha256(job|kind|step|path)`` cut to 16 hex digits: the same facts give the same id."""
    raw = f"{job}|{kind}|{step}|{path}"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def _parse_ts(value: str | None) -> dt.datetime | None:
    return dt.datetime.fromisoformat(value) if value else None


@dataclass
class RootCause:
    """The initiating failure. ``cls`` is one of oom_kill, cuda_oom, signal, collective_timeout,
    node_lost, storage_error, gpu_xid, unknown; ``sender`` says who sent a ``signal``
    (scheduler_time_limit, scheduler_preemption, scancel, kubelet_eviction, external, or None
    when the logs do not say). ``ts`` is UTC. ``line`` is the initiating log line (or, when
    the culprit rank printed nothing, the first report that points at it); ``note`` explains."""

    cls: str
    rank: int | None = None
    host: str | None = None
    pid: int | None = None
    ts: dt.datetime | None = None
    rule_id: str | None = None
    line: str | None = None
    signal: str | None = None
    note: str = ""
    sender: str | None = None

    def to_dict(self) -> dict[str, Any]:
        # by hand, not dataclasses.asdict (which deep-copies every field): incidents are
        # fingerprinted on every update of a fleet's jobs
        return {"rank": self.rank, "host": self.host, "pid": self.pid,
                "ts": self.ts.isoformat() if self.ts else None, "rule_id": self.rule_id, "line": self.line,
                "signal": self.signal, "note": self.note, "sender": self.sender, "class": self.cls}


@dataclass
class EvidenceItem:
    """One event cited by an incident: ``(source_id, offset)`` and what a reader needs."""

    source_id: str
    offset: int
    ts: dt.datetime
    kind: str
    rank: int | None
    host: str | None
    rule_id: str
    line: str
    role: str  # "root_cause", "collateral", "save", "context"
    #: where ``ts`` came from: ``line`` (its own), ``rule`` (captured inside it), ``inherited``
    #: (an earlier line's: the line came no earlier), ``mtime`` (its file's); shown marked
    ts_source: str = "line"

    def to_dict(self) -> dict[str, Any]:
        """The ``evidence`` item of ``diagnose --json`` and the incidents topic; ``ts_source``
        only when the time is not the line's own (``line``)."""
        return {"source_id": self.source_id, "offset": self.offset, "ts": self.ts.isoformat(), "kind": self.kind,
                "rank": self.rank, "host": self.host, "rule_id": self.rule_id, "line": self.line, "role": self.role,
                **({"ts_source": self.ts_source} if self.ts_source != "line" else {})}

    @property
    def own_time(self) -> bool:
        """The time is the line's own (parsed from it, or captured by a rule inside it)."""
        return self.ts_source in OWN_TIME


@dataclass
class Incident:
    """One incident. Timestamps are UTC. ``detected_ts`` is wall-clock time of first detection;
    every other field is a function of the events alone. ``first_ts`` is when what it reports
    began as far as the lines' own times tell: a time a line inherited from an earlier line
    bounds it from below only, and gives way to the next own time of that line's file (the
    failure block, the next dated line: :class:`~ckptwatch.detectors.saves.Dating`); so does
    ``root_cause.ts``."""

    kind: str
    job: str | None
    step: int | None
    checkpoint_path: str | None
    root_cause: RootCause | None
    collateral: list[int]
    checkpoint_state: dict[str, Any]
    last_good_checkpoint: dict[str, Any] | None
    remediation: str
    first_ts: dt.datetime
    evidence: list[EvidenceItem] = field(default_factory=list)
    severity: str = ""
    status: str = "open"
    detected_ts: dt.datetime | None = None
    id: str = ""
    #: concluded before its evidence window closed (the launcher said the job failed, and
    #: the watermark has not yet passed the last failure by the settle time): stored and
    #: shown at once, paged only once a version that is not provisional comes (see
    #: :mod:`ckptwatch.detectors.save_incidents`), so a later line cannot revise a page
    provisional: bool = False
    #: what to paste: ``{"purpose", "command", "framework", "source"}`` dicts, set by the
    #: runner from the incident's facts (:func:`ckptwatch.detectors.commands.commands`)
    commands: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.id:
            where = self.checkpoint_path
            if where is None and self.step is None and self.job in (None, "unknown") and self.evidence:
                # no job, step or path to tell two pastes' incidents apart: the file they were read from
                where = "@" + min(e.source_id for e in self.evidence)
            self.id = incident_id(self.job, self.kind, self.step, where)
        if not self.severity:
            self.severity = DEFAULT_SEVERITY.get(self.kind, "error")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (the ``diagnose --json`` incident shape)."""
        return {
            "id": self.id,
            "kind": self.kind,
            "severity": self.severity,
            "status": self.status,
            "job": self.job,
            "step": self.step,
            "checkpoint_path": self.checkpoint_path,
            "root_cause": self.root_cause.to_dict() if self.root_cause else None,
            "collateral": self.collateral,
            "checkpoint_state": self.checkpoint_state,
            "last_good_checkpoint": self.last_good_checkpoint,
            "remediation": self.remediation,
            "first_ts": self.first_ts.isoformat(),
            "detected_ts": self.detected_ts.isoformat() if self.detected_ts else None,
            "provisional": self.provisional,
            "commands": self.commands,
            "evidence": [e.to_dict() for e in self.evidence],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Incident:
        """Inverse of :meth:`to_dict` (the shape on the incidents topic).

        Raises KeyError / ValueError on a dict that is not an incident."""
        rc = d.get("root_cause")
        root = None
        if rc:
            rc = dict(rc)
            rc["cls"] = rc.pop("class")
            rc["ts"] = _parse_ts(rc.get("ts"))
            root = RootCause(**rc)
        evidence = [EvidenceItem(**{**e, "ts": _parse_ts(e["ts"])}) for e in d.get("evidence", [])]
        return cls(
            kind=d["kind"], job=d.get("job"), step=d.get("step"), checkpoint_path=d.get("checkpoint_path"),
            root_cause=root, collateral=list(d.get("collateral") or []), checkpoint_state=d.get("checkpoint_state") or {},
            last_good_checkpoint=d.get("last_good_checkpoint"), remediation=d.get("remediation", ""),
            first_ts=dt.datetime.fromisoformat(d["first_ts"]), evidence=evidence, severity=d.get("severity", ""),
            status=d.get("status", "open"), detected_ts=_parse_ts(d.get("detected_ts")), id=d.get("id", ""),
            provisional=bool(d.get("provisional", False)), commands=list(d.get("commands") or []),
        )

    def withdraw(self, reason: str) -> None:
        """Take the incident back: later evidence showed it never held. ``reason`` (a
        sentence, no final period) goes to ``checkpoint_state["withdrawn"]`` and the
        remediation; the status becomes ``superseded`` (see the module docstring): pages
        about it are resolved and its checkpoint is no longer marked not-good."""
        self.status = "superseded"
        self.checkpoint_state = {**self.checkpoint_state, WITHDRAWN: reason}
        self.remediation = f"Withdrawn: {reason}. No action needed."

    @property
    def withdrawn(self) -> str | None:
        """Why the incident was withdrawn (:meth:`withdraw`), or None."""
        return self.checkpoint_state.get(WITHDRAWN) if self.status == "superseded" else None

    def fingerprint(self) -> str:
        """Hash of everything but ``detected_ts``: tells whether an update changed anything."""
        d = self.to_dict()
        d.pop("detected_ts")
        return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()
