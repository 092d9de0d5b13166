"""Redaction: secrets removed from log lines before they leave the machine in an alert.

Patterns are data (``redaction.yaml`` beside this module, plus any files the user adds):
each has an ``id``, a Python ``re`` ``pattern``, a ``replacement`` (``\\1`` refers to a
group) and ``examples`` (``line`` -> ``redacted``) and ``keep`` lines (unchanged), which
:meth:`Redactor.check` runs, so a pattern that stops matching or starts eating ordinary
log lines fails the tests. Patterns apply in file order, every one to every line.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import yaml


class RedactionError(Exception):
    """A redaction file that cannot be used; the message names file, pattern id and reason."""


@dataclass(frozen=True)
class Pattern:
    """One secret pattern (see the module docstring)."""

    id: str
    regex: re.Pattern[str]
    replacement: str
    file: str
    examples: tuple[tuple[str, str], ...] = ()
    keep: tuple[str, ...] = field(default=())


def _parse(doc: Any, file: str) -> list[Pattern]:
    if not isinstance(doc, dict) or not isinstance(doc.get("patterns"), list):
        raise RedactionError(f"{file}: expected a mapping with a 'patterns' list")
    out = []
    for i, p in enumerate(doc["patterns"]):
        pid = p.get("id") if isinstance(p, dict) else None
        where = f"{file}: pattern {pid or '#' + str(i + 1)}"
        if not isinstance(p, dict) or not isinstance(pid, str) or not isinstance(p.get("pattern"), str):
            raise RedactionError(f"{where}: needs a string id and a string pattern")
        try:
            regex = re.compile(p["pattern"])
        except re.error as e:
            raise RedactionError(f"{where}: bad regex: {e}") from None
        examples = tuple((e["line"], e["redacted"]) for e in p.get("examples") or [])
        out.append(Pattern(pid, regex, str(p.get("replacement", "[REDACTED]")), file, examples,
                           tuple(p.get("keep") or [])))
    return out


class Redactor:
    """Applies secret patterns to text. Load with :meth:`load`."""

    def __init__(self, patterns: Sequence[Pattern]) -> None:
        self.patterns = list(patterns)

    @classmethod
    def load(cls, extra_files: Iterable[str] = ()) -> Redactor:
        """The packaged patterns, then those of ``extra_files``.

        Raises RedactionError naming the file (and pattern) when a file is missing, not
        YAML, or holds a pattern that does not compile."""
        pkg = resources.files("ckptwatch.sinks.alerts") / "redaction.yaml"
        patterns = _parse(yaml.safe_load(pkg.read_text()), "redaction.yaml (packaged)")
        for f in extra_files:
            try:
                with open(f) as fh:
                    doc = yaml.safe_load(fh)
            except OSError as e:
                raise RedactionError(f"{f}: cannot read: {e.strerror or e}") from None
            except yaml.YAMLError as e:
                raise RedactionError(f"{f}: not valid YAML: {e}") from None
            patterns += _parse(doc, f)
        return cls(patterns)

    def redact(self, text: str) -> str:
        """``text`` with every secret replaced."""
        for p in self.patterns:
            text = p.regex.sub(p.replacement, text)
        return text

    def check(self) -> list[str]:
        """Run every pattern's examples through the whole set; returns the failures, each
        naming file, pattern id and the line."""
        bad = []
        for p in self.patterns:
            for line, want in p.examples:
                got = self.redact(line)
                if got != want:
                    bad.append(f"{p.file}: pattern {p.id}: {line!r} became {got!r}, expected {want!r}")
            for line in p.keep:
                if self.redact(line) != line:
                    bad.append(f"{p.file}: pattern {p.id}: {line!r} must not change, became {self.redact(line)!r}")
        return bad
