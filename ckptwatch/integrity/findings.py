"""What an integrity check says: verdicts and findings, shared by every format and by ``verify``.

A *verdict* is one of, from best to worst:

* ``ok``: every check that applies passed;
* ``unverifiable``: nothing could be checked (unknown format and no manifest entry);
* ``incomplete``: something is missing or cut short: a file absent, truncated, a DCP
  ``.metadata`` never written (a torn or unfinished save);
* ``corrupt``: bytes are wrong: a CRC-32 or SHA-256 mismatch, a header that is not valid JSON,
  offsets that disagree with dtype x shape (bit rot, a bad copy).

The verdict of a set of findings is the worst of them (:func:`worst`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Verdict = Literal["ok", "unverifiable", "incomplete", "corrupt"]

#: Verdicts from best to worst.
VERDICTS: tuple[Verdict, ...] = ("ok", "unverifiable", "incomplete", "corrupt")


def worst(verdicts: "list[Verdict] | tuple[Verdict, ...]", default: Verdict = "ok") -> Verdict:
    """The worst verdict of ``verdicts`` (``default`` when empty)."""
    return max(verdicts, key=VERDICTS.index, default=default)


@dataclass(frozen=True)
class Finding:
    """One problem found in a checkpoint.

    ``path`` is relative to the checkpoint directory (POSIX separators); ``problem`` is a
    short stable code (``missing``, ``truncated``, ``crc_mismatch``, ``hash_mismatch``,
    ``size_changed``, ``extra``, ``bad_header``, ...), ``detail`` a sentence for people
    naming the member / tensor / byte offset where known.
    """

    path: str
    verdict: Verdict
    problem: str
    detail: str

    def to_json(self) -> dict[str, str]:
        return {"path": self.path, "verdict": self.verdict, "problem": self.problem, "detail": self.detail}


@dataclass
class FileCheck:
    """The structural check of one file.

    ``format`` is the detected format (``torch_zip``, ``torch_legacy``, ``safetensors``,
    ``dcp_metadata``, ``dcp_shard``, ``hf_index``, ``json``, ``unknown``, ...); ``facts`` are
    the format's own structural facts kept in the manifest (e.g. zip entry count, safetensors
    header length and tensor count), JSON-serializable; ``findings`` is empty when the file
    passed. ``checked`` is False when the format has no structural check (then the file alone
    is ``unverifiable`` unless a manifest vouches for its hash).
    """

    path: str
    format: str
    checked: bool = True
    facts: dict[str, Any] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)

    @property
    def verdict(self) -> Verdict:
        if self.findings:
            return worst([f.verdict for f in self.findings])
        return "ok" if self.checked else "unverifiable"
