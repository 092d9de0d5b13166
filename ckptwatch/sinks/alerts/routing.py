"""Routing: which channels an incident goes to, from its labels.

An incident's labels are few and bounded per fleet: ``job``, ``kind``, ``severity``,
``host`` (of the root cause) and ``cause`` (the root cause class, e.g. ``oom_kill``).
Routes and silences match them with shell-style globs (:func:`fnmatch.fnmatchcase`).
"""

from __future__ import annotations

from collections.abc import Mapping
from fnmatch import fnmatchcase

from ckptwatch.detectors.incident import SEVERITIES, Incident
from ckptwatch.sinks.alerts.settings import ChannelSpec


def labels(inc: Incident) -> dict[str, str]:
    """The incident's labels (missing values are ``""``)."""
    rc = inc.root_cause
    return {"job": inc.job or "", "kind": inc.kind, "severity": inc.severity,
            "host": (rc.host or "") if rc else "", "cause": rc.cls if rc else ""}


def severity_rank(severity: str) -> int:
    """info 0 < warning 1 < error 2 < critical 3; anything else counts as error."""
    return SEVERITIES.index(severity) if severity in SEVERITIES else SEVERITIES.index("error")


def matches(matchers: Mapping[str, tuple[str, ...] | str], lbls: Mapping[str, str]) -> bool:
    """True when, for every label in ``matchers``, the value matches one of its globs."""
    for label, globs in matchers.items():
        globs = (globs,) if isinstance(globs, str) else globs
        if not any(fnmatchcase(lbls.get(label, ""), g) for g in globs):
            return False
    return True


def routed(spec: ChannelSpec, inc: Incident) -> bool:
    """Whether ``inc`` goes to the channel: severity at least ``min_severity`` and ``match``."""
    return severity_rank(inc.severity) >= severity_rank(spec.min_severity) and matches(spec.match, labels(inc))
