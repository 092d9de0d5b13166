"""Routing: which channels an incident goes to, from its labels.

An incident's labels are few and bounded per fleet: ``job``, ``kind``, ``severity``,
``host`` (of the root cause), ``cause`` (the root cause class, e.g. ``oom_kill``) and
``storage_host`` (where a storage failure happened: :func:`storage_host`).
Routes and silences match them with shell-style globs (:func:`fnmatch.fnmatchcase`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from fnmatch import fnmatchcase

from ckptwatch.detectors.headline import nfs_server
from ckptwatch.detectors.incident import SEVERITIES, Incident
from ckptwatch.sinks.alerts.settings import ChannelSpec


_BUCKET = re.compile(r"^(?:s3|gs|gcs|az|abfss?|hdfs)://([^/@]+@)?([^/]+)")


def storage_host(inc: Incident) -> str:
    """Where a storage failure happened, for grouping many jobs' pages into one: the NFS
    server a root-cause or evidence line names, else the bucket of a cloud checkpoint path
    (``s3://bucket/...``), else the first two parts of the checkpoint path (the shared
    mount, ``/mnt/ckpt``), else the root cause's host; ``""`` when the root cause is not a
    storage error."""
    rc = inc.root_cause
    if rc is None or rc.cls != "storage_error":
        return ""
    for line in [rc.line, *(e.line for e in inc.evidence)]:
        server = nfs_server(line)
        if server:
            return server
    path = inc.checkpoint_path or ""
    m = _BUCKET.match(path)
    if m:
        return m.group(2)
    parts = [p for p in path.split("/") if p]
    if path.startswith("/") and len(parts) >= 3:
        return "/" + "/".join(parts[:2])
    return rc.host or ""


def labels(inc: Incident) -> dict[str, str]:
    """The incident's labels (missing values are ``""``): ``job``, ``kind``, ``severity``,
    ``host`` and ``cause`` of the root cause, ``storage_host`` (:func:`storage_host`)."""
    rc = inc.root_cause
    return {"job": inc.job or "", "kind": inc.kind, "severity": inc.severity,
            "host": (rc.host or "") if rc else "", "cause": rc.cls if rc else "", "storage_host": storage_host(inc)}


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
