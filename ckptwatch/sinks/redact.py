"""Redaction: secrets removed from everything ckptwatch shows or sends.

One :class:`Redactor` serves every outbound surface, each redacting after its text is
built: the alert channels (the dispatcher redacts each incident whole, commands included),
the web console's pages and JSON, ``incidents show`` / ``export`` / ``plot`` (frames with
:meth:`Redactor.frame`, trees with :meth:`Redactor.tree`, timelines with
``Timeline.redacted``). What is stored in the database stays raw.

Patterns are data (``redaction.yaml`` beside this module, plus any files the user adds):
each has an ``id``, a Python ``re`` ``pattern``, a ``replacement`` (``\\1`` refers to a
group), a ``prefilter`` (literals, one of which every match contains; compared
case-insensitively, so a text holding none of them skips the pattern) and ``examples``
(``line`` -> ``redacted``) and ``keep`` lines (unchanged), which :meth:`Redactor.check`
runs, so a pattern that stops matching or starts eating ordinary log lines fails the tests.
Patterns apply in file order, every one to every string.

The alert path redacts whole incidents, not chosen fields: :meth:`Redactor.incident` walks
every string of the incident (paths, summaries, root cause, evidence, checkpoint state,
remediation; dict keys too) and cuts each to :data:`MAX_FIELD_CHARS` after redacting it,
so a field added later cannot escape and a secret is never cut in half before it is seen.

Time is linear in the text's length: the packaged patterns are written so (see the comment
at the top of ``redaction.yaml``); ``benchmarks/redact.py`` measures it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import polars as pl
import yaml

from ckptwatch.detectors.incident import Incident

#: Longest string an alert carries (characters); longer ones are cut with :data:`CUT_MARK`.
MAX_FIELD_CHARS = 8192
#: Appended to a cut string; ``{}`` is the number of characters left out.
CUT_MARK = "… [cut: {} more characters]"
_CHUNK = 1 << 15  # characters per prefilter step (fits a CPU cache with its folded copy)


class RedactionError(Exception):
    """A redaction file that cannot be used; the message names file, pattern id and reason."""


@dataclass(frozen=True)
class Pattern:
    """One secret pattern (see the module docstring). ``prefilter``: casefolded ASCII
    literals; empty means the pattern runs on every text."""

    id: str
    regex: re.Pattern[str]
    replacement: str
    file: str
    examples: tuple[tuple[str, str], ...] = ()
    keep: tuple[str, ...] = field(default=())
    prefilter: tuple[str, ...] = ()


def _fold(text: str) -> str:
    """``text`` case-folded so that an ASCII literal a case-insensitive regex can match in
    ``text`` is a substring of the result (``ı`` is the one letter ``re`` folds to ``i``
    that :meth:`str.casefold` does not)."""
    folded = text.casefold()
    return folded if text.isascii() else folded.replace("ı", "i")


def _present(text: str, literals: frozenset[str]) -> frozenset[str]:
    """Which ``literals`` (casefolded ASCII) occur in ``text``, compared as :func:`_fold` does.
    The text is folded and searched one :data:`_CHUNK` at a time (overlapping by the longest
    literal), so every literal is looked for while the chunk is in the CPU cache."""
    if not literals:
        return frozenset()
    found: set[str] = set()
    todo = set(literals)
    overlap = max(map(len, literals)) - 1
    for start in range(0, len(text), _CHUNK):
        chunk = _fold(text[start:start + _CHUNK + overlap])
        found.update(lit for lit in todo if lit in chunk)
        todo -= found
        if not todo:
            break
    return frozenset(found)


def _strings(value: Any, key: str, where: str) -> tuple[str, ...]:
    value = value or ()
    if isinstance(value, str):
        value = (value,)
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise RedactionError(f"{where}: {key} must be a list of strings")
    return tuple(value)


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
        prefilter = _strings(p.get("prefilter"), "prefilter", where)
        if not all(lit and lit.isascii() for lit in prefilter):
            raise RedactionError(f"{where}: prefilter literals must be non-empty ASCII strings")
        try:
            examples = tuple((str(e["line"]), str(e["redacted"])) for e in p.get("examples") or [])
        except (TypeError, KeyError):
            raise RedactionError(f"{where}: each example needs a line and a redacted") from None
        out.append(Pattern(pid, regex, str(p.get("replacement", "[REDACTED]")), file, examples,
                           _strings(p.get("keep"), "keep", where), tuple(lit.casefold() for lit in prefilter)))
    return out


class Redactor:
    """Applies secret patterns to text. Load with :meth:`load`. Thread-safe (compiled
    patterns are shared read-only)."""

    def __init__(self, patterns: Sequence[Pattern]) -> None:
        self.patterns = list(patterns)
        self._literals = frozenset(lit for p in self.patterns for lit in p.prefilter)
        self._keys: dict[str, bool] = {}  # secret_key's answers (a dict write is atomic: thread-safe)

    @staticmethod
    def _scalar(v: Any) -> bool:
        return isinstance(v, (str, int, float)) and not isinstance(v, bool) and v != "" and \
            not (isinstance(v, str) and v.startswith("[REDACTED"))

    @classmethod
    def load(cls, extra_files: Iterable[str] = ()) -> Redactor:
        """The packaged patterns, then those of ``extra_files``.

        Raises RedactionError naming the file (and pattern) when a file is missing, not
        YAML, or holds a pattern that does not compile or has a malformed key."""
        pkg = resources.files("ckptwatch.sinks") / "redaction.yaml"
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
        """``text`` with every secret replaced; time linear in ``len(text)``."""
        present: frozenset[str] | None = None
        for p in self.patterns:
            if p.prefilter:
                if present is None:
                    present = _present(text, self._literals)
                if present.isdisjoint(p.prefilter):
                    continue
            text, n = p.regex.subn(p.replacement, text)
            if n:
                present = None  # the text changed: look for the literals again
        return text

    def field(self, text: str, limit: int = MAX_FIELD_CHARS) -> str:
        """``text`` redacted, then cut to at most ``limit`` characters (a cut string ends
        with :data:`CUT_MARK`). Redacting first means a secret is never cut in half unseen."""
        text = self.redact(text)
        if len(text) <= limit:
            return text
        keep = max(0, limit - len(CUT_MARK.format(len(text))))
        return text[:keep] + CUT_MARK.format(len(text) - keep)

    def tree(self, value: Any, limit: int | None = None) -> Any:
        """A copy of a JSON-like ``value`` (dicts, lists, tuples, scalars) with every string,
        dict keys included, redacted (and, with ``limit``, cut: see :meth:`field`). Tuples
        become lists; other values are returned as they are."""
        if isinstance(value, str):
            return self.redact(value) if limit is None else self.field(value, limit)
        if isinstance(value, dict):  # a scalar under a secret key is a secret, whatever it looks like
            return {self.tree(k, limit): "[REDACTED]" if isinstance(k, str) and self._scalar(v) and self.secret_key(k)
                    else self.tree(v, limit) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.tree(v, limit) for v in value]
        return value

    def text_or_json(self, text: str) -> str:
        """``text`` redacted. A JSON object or array is redacted value by value
        (:meth:`tree`: a value under a secret key too) and written back compactly, so a
        string holding quotes, escaped once more inside the JSON, is seen as it was
        logged; when the result would still change under the text patterns (a secret the
        values alone do not show), the text-redacted form is returned instead (not JSON,
        but safe)."""
        red = self.redact(text)
        if text[:1] in ("{", "[") and text[-1:] in ("}", "]"):
            try:
                doc = json.loads(text)
            except ValueError:
                return red
            clean = self.tree(doc)
            out = text if clean == doc else json.dumps(clean, ensure_ascii=False)
            return out if self.redact(out) == out else red
        return red

    def secret_key(self, key: str) -> bool:
        """``key`` names a secret: the patterns redact ``key=VALUE`` (``password``,
        ``aws_secret_access_key``, ``api_key``, a user's own). Cached per key."""
        hit = self._keys.get(key)
        if hit is None:  # a key that holds a secret itself ("api_key=x3") is not a secret's name
            probe = f"{key}=p0r0b0e0v0a0l0u0e"
            hit = self._keys[key] = len(key) <= 128 and self.redact(key) == key and self.redact(probe) != probe
        return hit

    def frame(self, df: pl.DataFrame) -> pl.DataFrame:
        """``df`` with every string column redacted (:meth:`text_or_json`: JSON text
        columns value by value); other columns as they are. Each distinct value is
        redacted once; the row order and count do not change."""
        for name, dtype in df.schema.items():
            if dtype != pl.String:
                continue
            changed = {v: r for v in df[name].unique().drop_nulls().to_list() if (r := self.text_or_json(v)) != v}
            if changed:
                df = df.with_columns(pl.col(name).replace(changed))
        return df

    def incident(self, inc: Incident, limit: int = MAX_FIELD_CHARS) -> Incident:
        """A copy of ``inc`` with every string redacted and cut to ``limit`` characters:
        what an alert channel may send. The id (a hash of the raw facts) is kept, so
        dedup keys stay stable."""
        d = self.tree(inc.to_dict(), limit)
        d["id"] = inc.id
        return Incident.from_dict(d)

    def check(self) -> list[str]:
        """Run every pattern's examples through the whole set; returns the failures, each
        naming file, pattern id and the line: an example not redacted as expected, an
        expected result that would change again (redaction must be idempotent: the alert
        path may apply it twice), a ``keep`` line that changes."""
        bad = []
        for p in self.patterns:
            for line, want in p.examples:
                got = self.redact(line)
                if got != want:
                    bad.append(f"{p.file}: pattern {p.id}: {line!r} became {got!r}, expected {want!r}")
                elif self.redact(want) != want:
                    bad.append(f"{p.file}: pattern {p.id}: {want!r} is not stable: it became {self.redact(want)!r}")
                if p.prefilter and not any(lit in _fold(line) for lit in p.prefilter):
                    bad.append(f"{p.file}: pattern {p.id}: prefilter {list(p.prefilter)} misses its example {line!r}")
            for line in p.keep:
                if self.redact(line) != line:
                    bad.append(f"{p.file}: pattern {p.id}: {line!r} must not change, became {self.redact(line)!r}")
        return bad
