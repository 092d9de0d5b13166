"""The console's "diagnose a log" page, without the web: uploaded or pasted text checked,
spooled to a private temporary directory, read by :func:`ckptwatch.pipeline.diagnose`
exactly as ``ckptwatch diagnose`` reads files, and turned into what the page shows (the
report text, each incident with its timeline as SVG). Nothing leaves the machine.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field

from ckptwatch.detectors.incident import Incident
from ckptwatch.history import plot, timeline
from ckptwatch.history.cli import report_text
from ckptwatch.pipeline import PipelineOptions, diagnose

#: bytes of one request at most (pasted text and files together)
MAX_UPLOAD = 64 << 20
#: bytes at the start of a file looked at to tell text from binary
SNIFF = 8192


class UploadError(ValueError):
    """Nothing to read in what was sent; the message says why, for the user."""


@dataclass
class Upload:
    """One piece of input: a file's name (as the browser gave it) and its bytes."""

    name: str
    data: bytes


@dataclass
class Diagnosis:
    """What a diagnosis found: ``incidents`` (``diagnose`` order), their ``report`` (the
    text ``diagnose`` prints), one SVG timeline per incident, the files read and the
    files refused (``name``: why), and the read's stats (``diagnose --json``'s)."""

    incidents: list[Incident]
    report: str
    svgs: list[str]
    read: list[str]
    refused: dict[str, str] = field(default_factory=dict)
    stats: dict = field(default_factory=dict)


def refusal(upload: Upload) -> str | None:
    """Why ``upload`` cannot be a log (empty, or binary and not gzip), or None."""
    if not upload.data.strip():
        return "empty"
    head = upload.data[:SNIFF]
    if head[:2] == b"\x1f\x8b":
        return None  # a gzipped log: read as such
    if b"\x00" in head:
        return "binary, not a text log (a checkpoint or an archive? ckptwatch verify checks checkpoints)"
    return None


def _safe_name(name: str, taken: set[str]) -> str:
    base = os.path.basename(name.replace("\\", "/")) or "pasted.log"
    base = "".join(c if c.isalnum() or c in "._-" else "_" for c in base)[:120] or "log"
    if base.startswith("."):
        base = "_" + base
    out, n = base, 1
    while out in taken:
        n += 1
        out = f"{n}-{base}"
    taken.add(out)
    return out


def run_diagnosis(uploads: Sequence[Upload]) -> Diagnosis:
    """Diagnose ``uploads`` as ``ckptwatch diagnose`` would the same files in one directory
    (each file's labels from its name and lines, as for files given one by one).
    Raises :class:`UploadError` when nothing sent can be read (none, all empty or binary,
    more than :data:`MAX_UPLOAD` bytes), or no line was read."""
    if not uploads:
        raise UploadError("nothing to diagnose: paste a log or drop log files")
    total = sum(len(u.data) for u in uploads)
    if total > MAX_UPLOAD:
        raise UploadError(f"{total / 2**20:.1f} MiB sent: at most {MAX_UPLOAD >> 20} MiB here; for bigger logs "
                          "run ckptwatch diagnose on them")
    refused: dict[str, str] = {}
    keep: list[Upload] = []
    for u in uploads:
        why = refusal(u)
        if why:
            refused[u.name] = why
        else:
            keep.append(u)
    if not keep:
        raise UploadError("nothing readable: " + "; ".join(f"{n}: {w}" for n, w in refused.items()))
    with tempfile.TemporaryDirectory(prefix="ckptwatch-ui-") as spool:
        os.chmod(spool, 0o700)
        taken: set[str] = set()
        names = []
        for u in keep:
            name = _safe_name(u.name, taken)
            if u.data[:2] == b"\x1f\x8b" and not name.endswith(".gz"):
                name += ".gz"
            with open(os.path.join(spool, name), "wb") as f:
                f.write(u.data)
            names.append(name)
        incidents, stats = diagnose([spool], PipelineOptions())
        errors = [m.replace(spool + os.sep, "") for m in stats.errors]
    if stats.lines == 0:
        raise UploadError("no line to read in what was sent")
    svgs = [plot.svg(timeline.build_timeline(None, inc)) for inc in incidents]
    doc = stats.to_dict()
    doc["errors"] = errors
    text = "".join(report_text(inc) for inc in incidents) if incidents else "No incident found.\n"
    return Diagnosis(incidents, text, svgs, names, refused, doc)
