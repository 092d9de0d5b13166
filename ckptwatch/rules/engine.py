"""Rules as data: load YAML rule packs and apply them to batches of records.

A rule pack is a YAML file::

    family: torchrun                      # the source family the pack covers
    description: ...
    rules:
      - id: torchrun.worker_failed        # unique across all loaded packs
        event: process_exit               # one of ckptwatch.schema.EVENT_KINDS
        prefilter: "failed (exitcode:"    # a literal every matching record contains (or a list:
                                          # every matching record contains one of them)
        pattern: 'failed \\(exitcode: (?P<exitcode>-?\\d+)\\) local_rank: (?P<local_rank>\\d+)'
        sources: [console]                # optional: source kinds (console, worker, log)
        attrs: {reporter: agent}          # optional: static attributes added to the event
        path_format: "{path}/iter_{step:07d}"  # optional: rewrite the captured path
        during: save                      # optional: only tracebacks through save (or load) code;
                                          # neither: through code no frame vocabulary places;
                                          # !save / !load: any record but such a traceback
        unless: "KeyboardInterrupt"       # optional: records this also matches go to later rules
        requires: ['(?i)checkpoint', '(?i)\\bload']  # optional: patterns the record must also match,
                                          # in any order (a vocabulary's verb and object)
        examples:
          match:                          # each must match; "expect" checks captured groups
            - line: "E1130 ... failed (exitcode: -9) local_rank: 2 (pid: 5879) of binary: ..."
              expect: {exitcode: -9, local_rank: 2}
          no_match:
            - "I1130 ... Starting worker group"

Patterns use the Rust ``regex`` syntax that polars runs (named groups ``(?P<name>…)``;
no look-around, no back-references). A record is a line or a multiline group joined with
``\\n``; use ``(?m)`` for per-line anchors and ``(?s)`` to let ``.`` cross lines.

Named groups ``job``, ``host``, ``rank``, ``local_rank``, ``pid``, ``step``, ``path`` and
``ts`` fill the event columns of the same name (``path__2``, ``rank__2`` ...: alternatives
for the same column, for patterns with two places a value can be, the first that matched wins) (a captured ``ts`` replaces a record time
unless the record starts with a time of its own: it beats one inherited from an earlier line); every other group goes into ``attrs`` (as an integer or float
when every captured value is one).

**Overriding a packaged rule.** A rule in a user's pack (``--rules``) with the id of a
packaged rule replaces it where it stands in the order (so a misfiring packaged rule can
be fixed), and ``{id: <packaged id>, disable: true}`` removes it. Ids must otherwise be
unique; overriding an id no packaged rule has is an error (a typo would do nothing).

**Validation.** A pack is checked completely when it is loaded, so that nothing in it can
fail or run away at match time: UTF-8 YAML of at most 8 MiB nested at most 64 deep; every
field of its type; ``attrs`` names are strings and values strings, finite floats, 64-bit
integers or booleans (a YAML date is refused, naming the rule and key); ``path_format``
uses only ``{path}`` and ``{step}`` (no attribute or index access, no conversion) with
widths and precisions of at most 64; a pattern is at most 2,000 characters, its ``{n,m}``
counts at most 1,000 (10,000 nested), and it has no nested unbounded repetition that can
backtrack catastrophically (:func:`pattern_cost_problem`). The packaged packs skip the two
costly checks when a run loads them; ``ckptwatch rules check`` runs everything on them.

Matching is vectorized: per rule, a literal ``str.contains`` prefilter over the batch
(found in any case when the pattern starts with ``(?i)``), then the regex over the
survivors only. Rules are tried in load order (pack files in
name order, rules in file order) and a record yields at most one event: the first rule
that matches it. So ``(source_id, offset)`` identifies an event.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import hashlib
import json
import math
import os
import re
import re._constants as _sre_c  # the structural pattern-cost check reads Python's parse of a pattern
import re._parser as _sre_p
import string
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import polars as pl
import yaml

from ckptwatch.ingest import timestamps
from ckptwatch.naming import checkpoint_of, step_from_path
from ckptwatch.schema import EVENT_KINDS, EVENT_SCHEMA, RECORD_SCHEMA, TS, empty_events

#: libyaml's safe loader where PyYAML was built with it (the packs are ~200 rules: 10x faster)
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_COLUMN_GROUPS = {"job": pl.Utf8, "host": pl.Utf8, "rank": pl.Int32, "local_rank": pl.Int32,
                  "pid": pl.Int64, "step": pl.Int64, "path": pl.Utf8}
_SOURCE_KINDS = {"console", "worker", "log"}


class RuleError(ValueError):
    """A broken rule or rule file. ``str()`` names the file, the rule id and the reason."""

    def __init__(self, file: str, rule_id: str | None, reason: str) -> None:
        self.file, self.rule_id, self.reason = file, rule_id, reason
        where = f"{file}: rule {rule_id}" if rule_id else file
        super().__init__(f"{where}: {reason}")


@dataclass(frozen=True)
class Rule:
    """One log fingerprint. See the module docstring for the fields."""

    id: str
    event: str
    pattern: str
    prefilters: tuple[str, ...]  # literals: a record holding any one of them is tested
    file: str
    sources: tuple[str, ...] = ()
    attrs: dict[str, Any] = field(default_factory=dict)
    path_format: str | None = None
    match_examples: tuple[tuple[str, dict[str, Any]], ...] = ()
    no_match_examples: tuple[str, ...] = ()
    disable: bool = False  # a user's rule that removes the packaged rule of the same id
    source: str = ""  # the framework file and function the wording was read from
    during: str | None = None  # only records that are tracebacks through this code (save / load)
    unless: str | None = None  # a pattern: records it matches are left to later rules
    requires: tuple[str, ...] = ()  # patterns a record must also match, anywhere and in any order


@dataclass(frozen=True)
class Frame:
    """A traceback frame of save or load code (a pack's ``frames:`` list). An event whose
    record is a traceback through such a frame gets ``attrs["during"] = during``
    (``save`` or ``load``): the detectors then know a save (or load) failed even when the
    trainer printed no save line. ``pattern`` is matched against the whole record.

    An ``innermost`` frame (the generic layer's vocabulary of any package's code) is
    matched against one frame line at a time (:data:`FRAME_LINE`: a Python frame's
    ``File "…", line N, in func``, a C++ ``frame #N: …``, a Lua ``file.lua:N: in function
    …``), in pack order, first match wins per line; ``during`` may also be ``other`` (code
    that is neither: activation checkpointing, evaluation, data loading) or ``ignore``
    (library internals that say nothing, skipped). A traceback that no frame of a pack
    names is read by the innermost line some innermost frame classifies: save, load, or
    (``other``) neither."""

    during: str
    prefilter: str
    pattern: str
    file: str
    source: str = ""
    innermost: bool = False


#: the function the innermost frame's code line calls: ``self._save_last_checkpoint(tra`` (a
#: paste cut in the middle of it), ``torch.save(state, path)``, ``result = self.load(p)``
_INNERMOST_CALL = (r'(?s)^.*\n[ \t]*File "([^"\n]*)", line \d+,? in [^\n]+\n[ \t]+(?:[^\n(]*?[^\w.])?'
                   r'(?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*)\s*\(')

#: one frame line of a traceback: Python's (CPython traceback.py ``  File "{}", line {}, in {}``),
#: c10's native backtrace (``frame #3: caffe2::serialize::PyTorchStreamWriter::…``) and Lua's
#: (``…/torch/File.lua:210: in function 'writeObject'``)
FRAME_LINE = (r'(?m)^[ \t]*File "[^"\n]*", line \d+, in [^\n]+|^frame #\d+: [^\n]+'
              r'|^[ \t]*[^\s:]+\.lua:\d+: in [^\n]+')


#: What a pack is about (its top-level ``scope:``; ``framework`` when absent): a trainer or
#: framework's own wordings, the system under every stack (launchers, schedulers, kernel,
#: storage, NCCL), or the generic layer that any stack falls back to.
SCOPES = ("framework", "system", "generic")
_SCOPE_LINE = re.compile(r"^scope:\s*(\w+)\s*$", re.M)


def pack_scope(path: str) -> str:
    """The ``scope:`` of a pack file (see :data:`SCOPES`), read without parsing the YAML."""
    with open(path, encoding="utf-8", errors="replace") as f:
        m = _SCOPE_LINE.search(f.read(4096))
    return m.group(1) if m and m.group(1) in SCOPES else "framework"


def packaged_rule_files(scopes: Iterable[str] | None = None) -> list[str]:
    """Paths of the rule packs shipped inside the package, in load order; only those whose
    :func:`pack_scope` is in ``scopes`` when given (``("system", "generic")``: every
    framework pack turned off, as the accuracy benchmark's "generic only" column runs)."""
    pack_dir = resources.files("ckptwatch.rules") / "packs"
    files = sorted(str(p) for p in pack_dir.iterdir() if p.name.endswith((".yaml", ".yml")))
    if scopes is None:
        return files
    keep = set(scopes)
    return [f for f in files if pack_scope(f) in keep]


# -- limits of what a rule pack may hold (checked at load, so nothing fails at match time) ---

#: the largest rule pack read (the packaged ones are ~30 KB each)
MAX_PACK_BYTES = 8 << 20
#: how deep a pack's mappings and lists may nest (a rule needs 5: libyaml's loader crashes
#: some ten thousand levels down, the pure-Python one raises RecursionError sooner)
MAX_YAML_DEPTH = 64
#: longest pattern (the longest packaged one is under 500) and prefilter
MAX_PATTERN_CHARS = 2000
MAX_PREFILTER_CHARS = 500
#: largest count of one ``{n,m}`` repetition, and of nested ones multiplied together
MAX_REPEAT_COUNT = 1000
MAX_NESTED_REPEATS = 10_000
#: largest width or precision in a ``path_format`` field, and longest ``path_format``
MAX_FORMAT_WIDTH = 64
MAX_FORMAT_CHARS = 512
#: longest static attribute value, id and attribute name
MAX_ATTR_CHARS = 1000
MAX_NAME_CHARS = 128
_INT64 = (-(1 << 63), (1 << 63) - 1)


def _kind(value: Any) -> str:
    """What a YAML value is, in words, for an error message (the value itself may be huge
    or recursive, so it is never printed whole)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, dt.datetime):
        return "a datetime"
    if isinstance(value, dt.date):
        return "a date"
    names = {int: "an int", float: "a float", str: "a string", list: "a list", dict: "a mapping", bytes: "binary data",
             set: "a set", tuple: "a list"}
    return names.get(type(value), f"a {type(value).__name__}")


def _name(value: Any) -> str:
    """A mapping key as shown in an error message: scalars as text (cut short), others by kind."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return "<a huge integer>"
    if isinstance(value, (str, int, float, bool, dt.date)) or value is None:
        text = str(value)
        return text if len(text) <= 60 and "\n" not in text else repr(text[:60]) + "..."
    return f"<{_kind(value)}>"


def _scalar_problem(value: Any, *, null_ok: bool) -> str | None:
    """Why ``value`` cannot be a static attribute or an expected value: None when it is a
    string, a finite float, a 64-bit integer or a boolean (or null, with ``null_ok``)."""
    if value is None and null_ok:
        return None
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return None if _INT64[0] <= value <= _INT64[1] else "an integer outside 64 bits"
    if isinstance(value, float):
        return None if math.isfinite(value) else "a float that is not finite"
    if isinstance(value, str):
        return None if len(value) <= MAX_ATTR_CHARS else f"a string longer than {MAX_ATTR_CHARS} characters"
    return _kind(value)


def _check_mapping(value: Any, field: str, file: str, rid: str, *, null_ok: bool, what: str) -> dict[str, Any]:
    """``value`` as a dict of names to scalars, or RuleError naming the key and what is wrong."""
    if not isinstance(value, dict):
        raise RuleError(file, rid, f"'{field}' must be a mapping of names to {what}")
    for k, v in value.items():
        if not isinstance(k, str) or not k or len(k) > MAX_NAME_CHARS:
            why = _kind(k) if not isinstance(k, str) else f"not 1 to {MAX_NAME_CHARS} characters"
            raise RuleError(file, rid, f"'{field}' key {_name(k)}: {why}; {field} names are strings")
        problem = _scalar_problem(v, null_ok=null_ok)
        if problem:
            raise RuleError(file, rid, f"'{field}' {_name(k)}: {problem}; {field} values are {what}")
    return dict(value)


_FORMAT_SPEC = re.compile(r"(?:(?P<fill>.)?[<>=^])?[-+ ]?z?#?0?(?P<width>\d+)?[,_]?(?:\.(?P<precision>\d+))?"
                          r"(?P<type>[bdoxXneEfFgG%s]?)", re.S)
_FORMAT_TYPES = {"path": {"", "s"}, "step": set("bdoxXneEfFgG%") | {""}}


def _check_path_format(fmt: Any, file: str, rid: str) -> str | None:
    """``path_format`` checked completely: only ``{path}`` and ``{step}`` (no attribute or
    index access, no conversion, no nested field), widths and precisions of at most
    :data:`MAX_FORMAT_WIDTH`, and it formats every path and 64-bit step."""
    if fmt is None:
        return None
    if not isinstance(fmt, str):
        raise RuleError(file, rid, f"'path_format' must be a string (it is {_kind(fmt)})")

    def bad(why: str) -> RuleError:
        return RuleError(file, rid, f"'path_format' {_name(fmt)}: {why}")

    if len(fmt) > MAX_FORMAT_CHARS:
        raise bad(f"longer than {MAX_FORMAT_CHARS} characters")
    try:
        fields = list(string.Formatter().parse(fmt))
    except ValueError as e:
        raise bad(f"not a valid format string ({e})") from None
    for _, name, spec, conversion in fields:
        if name is None:
            continue
        if name not in _FORMAT_TYPES:
            raise bad(f"field {name!r}: only {{path}} and {{step}} can be used (no attribute or index access)")
        if conversion:
            raise bad(f"no conversion (!{conversion}) allowed: write {{{name}}} or {{{name}:FORMAT}}")
        if "{" in spec or "}" in spec:
            raise bad("a nested field in the format spec is not allowed")
        m = _FORMAT_SPEC.fullmatch(spec or "")
        if m is None:
            raise bad(f"format spec {spec!r} is not valid")
        for part in ("width", "precision"):
            if m[part] and (len(m[part]) > 4 or int(m[part]) > MAX_FORMAT_WIDTH):
                raise bad(f"{part} {m[part]} is more than {MAX_FORMAT_WIDTH}")
        if m["type"] not in _FORMAT_TYPES[name]:
            raise bad(f"format spec {spec!r} does not apply to {{{name}}} "
                      f"({'a string' if name == 'path' else 'an integer'})")
    for step in (0, -1, _INT64[1]):
        try:
            fmt.format(path="/ckpt/run", step=step)
        except (ValueError, TypeError, OverflowError) as e:
            raise bad(f"cannot format step {step}: {e}") from None
    return fmt


# the parsed-pattern operators of Python's regex parser, used for a structural cost check
_REPEATS = {_sre_c.MAX_REPEAT, _sre_c.MIN_REPEAT, getattr(_sre_c, "POSSESSIVE_REPEAT", _sre_c.MAX_REPEAT)}
_ATOMS = {_sre_c.LITERAL, _sre_c.NOT_LITERAL, _sre_c.ANY, _sre_c.IN}
_ZERO_WIDTH = {_sre_c.AT, _sre_c.ASSERT, _sre_c.ASSERT_NOT}
_CATEGORY_ESCAPES = {getattr(_sre_c, "CATEGORY_" + n): e for n, e in (
    ("DIGIT", r"\d"), ("NOT_DIGIT", r"\D"), ("SPACE", r"\s"), ("NOT_SPACE", r"\S"), ("WORD", r"\w"),
    ("NOT_WORD", r"\W"), ("LINEBREAK", r"\n"), ("NOT_LINEBREAK", r"[^\n]"))}
#: characters the sets of a pattern are compared on: ASCII and a few of each Unicode class
_SAMPLE = frozenset(chr(i) for i in range(128)) | frozenset("\u00a0\u2028\u3000éßÄ中٠١…–—’🙂")


class _Sets:
    """Which characters each single-character item of one parsed pattern can match,
    over :data:`_SAMPLE` plus the pattern's own literals (letters in both cases: a
    ``(?i)`` anywhere makes no difference to the answer)."""

    def __init__(self, universe: frozenset[str]) -> None:
        self.all = universe

    def atom(self, op: Any, av: Any) -> frozenset[str]:
        if op is _sre_c.LITERAL:
            c = chr(av)
            return frozenset({c, c.lower(), c.upper()})
        if op is _sre_c.NOT_LITERAL:
            return self.all - {chr(av), chr(av).lower(), chr(av).upper()}
        if op is _sre_c.ANY:
            return self.all
        if op is _sre_c.IN:
            negate = any(o is _sre_c.NEGATE for o, _ in av)
            hit = frozenset(c for c in self.all if any(self._in(o, a, c) for o, a in av if o is not _sre_c.NEGATE))
            return self.all - hit if negate else hit
        return self.all

    def _in(self, op: Any, av: Any, c: str) -> bool:
        cases = {c, c.lower(), c.upper()}
        if op is _sre_c.LITERAL:
            return chr(av) in cases
        if op is _sre_c.RANGE or op is getattr(_sre_c, "RANGE_UNI_IGNORE", None):
            return any(av[0] <= ord(x) <= av[1] for x in cases if len(x) == 1)
        if op is _sre_c.CATEGORY and av in _CATEGORY_ESCAPES:
            return re.fullmatch(_CATEGORY_ESCAPES[av], c) is not None
        return True  # unknown: may match anything

    def consumed(self, items: Any) -> frozenset[str]:
        """Every character some part of ``items`` can consume."""
        out: frozenset[str] = frozenset()
        for op, av in items:
            if op in _ATOMS:
                out |= self.atom(op, av)
            elif op in _REPEATS:
                out |= self.consumed(av[2])
            elif op is _sre_c.SUBPATTERN:
                out |= self.consumed(av[-1])
            elif op is _sre_c.BRANCH:
                for alt in av[1]:
                    out |= self.consumed(alt)
            elif op not in _ZERO_WIDTH:
                return self.all
        return out

    def edge(self, items: Any, *, last: bool) -> tuple[frozenset[str], bool]:
        """The characters ``items`` can start (or, ``last``, end) with, and whether it can
        match the empty string."""
        out: frozenset[str] = frozenset()
        for op, av in (reversed(list(items)) if last else items):
            if op in _ATOMS:
                chars, empty = self.atom(op, av), False
            elif op in _REPEATS:
                chars, empty = self.edge(av[2], last=last)
                empty = empty or av[0] == 0
            elif op is _sre_c.SUBPATTERN:
                chars, empty = self.edge(av[-1], last=last)
            elif op is _sre_c.BRANCH:
                ends = [self.edge(alt, last=last) for alt in av[1]]
                chars, empty = frozenset().union(*(e[0] for e in ends)), any(e[1] for e in ends)
            elif op in _ZERO_WIDTH:
                chars, empty = frozenset(), True
            else:
                chars, empty = self.all, True
            out |= chars
            if not empty:
                return out, False
        return out, True


def _unbounded_inside(items: Any) -> bool:
    for op, av in items:
        if op in _REPEATS and (av[1] == _sre_c.MAXREPEAT or _unbounded_inside(av[2])):
            return True
        if op is _sre_c.SUBPATTERN and _unbounded_inside(av[-1]):
            return True
        if op is _sre_c.BRANCH and any(_unbounded_inside(alt) for alt in av[1]):
            return True
    return False


def _literals(items: Any, out: set[str]) -> None:
    for op, av in items:
        if op is _sre_c.LITERAL or op is _sre_c.NOT_LITERAL:
            out.add(chr(av))
        elif op is _sre_c.IN:
            for o, a in av:
                if o is _sre_c.LITERAL:
                    out.add(chr(a))
                elif o is _sre_c.RANGE:
                    out.update((chr(a[0]), chr(a[1])))
        elif op in _REPEATS:
            _literals(av[2], out)
        elif op is _sre_c.SUBPATTERN:
            _literals(av[-1], out)
        elif op is _sre_c.BRANCH:
            for alt in av[1]:
                _literals(alt, out)


def pattern_cost_problem(pattern: str) -> str | None:
    """Why ``pattern`` is too costly to accept, or None.

    Refused: more than :data:`MAX_PATTERN_CHARS` characters; a ``{n,m}`` count over
    :data:`MAX_REPEAT_COUNT` or nested counts multiplying to more than
    :data:`MAX_NESTED_REPEATS` (the compiled program grows with them); and a nested
    unbounded repetition such as ``(a+)+``, ``(.*)*`` or ``(\\w+\\s?)*``, which a
    backtracking engine takes exponential time on, unless every iteration of the outer
    repetition starts (or ends) with a character the inner ones cannot consume, as in
    ``(?:, \\w+=[^,]*)*`` (then the split into iterations is forced). polars runs the
    patterns with Rust's linear-time engine; the check keeps rule packs usable by any
    engine and their cost bounded. A pattern Python's parser does not read (syntax only
    Rust has) is left to the compile check."""
    if len(pattern) > MAX_PATTERN_CHARS:
        return f"pattern is longer than {MAX_PATTERN_CHARS} characters"
    try:
        tree = _sre_p.parse(pattern)
    except RecursionError:
        return "pattern nests groups too deeply"
    except (re.error, OverflowError, ValueError):
        return None
    sets: list[_Sets] = []  # made when first needed: few patterns nest repetitions

    def nested_problem(body: Any) -> bool:
        if not sets:
            universe: set[str] = set()
            _literals(tree, universe)
            sets.append(_Sets(_SAMPLE | frozenset(universe)))
        s = sets[0]
        inner = frozenset().union(*(s.consumed(sub[2]) for sub in _inner_repeats(body)))
        first, first_empty = s.edge(body, last=False)
        last, last_empty = s.edge(body, last=True)
        return bool((first_empty or first & inner) and (last_empty or last & inner))

    def walk(items: Any, product: int) -> str | None:
        for op, av in items:
            if op in _REPEATS:
                low, high, body = av
                unbounded = high == _sre_c.MAXREPEAT
                for n in (low, high):
                    if n != _sre_c.MAXREPEAT and n > MAX_REPEAT_COUNT:
                        return f"repetition count {n} is more than {MAX_REPEAT_COUNT}"
                times = product * max(1, low if unbounded else high)
                if times > MAX_NESTED_REPEATS:
                    return (f"repetitions nested to {times} repeats in all (at most {MAX_NESTED_REPEATS}): "
                            "the compiled pattern would be huge")
                if unbounded and _unbounded_inside(body) and nested_problem(body):
                    return ("nested unbounded repetition (a repeated group that repeats inside, as in (a+)+ or "
                            "(\\w+\\s?)*) can backtrack catastrophically: make each iteration start or end "
                            "with a character the inner repetition cannot match, or bound it")
                problem = walk(body, times)
            elif op is _sre_c.SUBPATTERN:
                problem = walk(av[-1], product)
            elif op is _sre_c.BRANCH:
                problem = next(filter(None, (walk(alt, product) for alt in av[1])), None)
            elif op in (_sre_c.ASSERT, _sre_c.ASSERT_NOT):
                problem = walk(av[1], product)
            else:
                problem = None
            if problem:
                return problem
        return None

    try:
        return walk(tree, 1)
    except RecursionError:
        return "pattern nests groups too deeply"


def _inner_repeats(items: Any) -> list[Any]:
    """The unbounded repetitions inside ``items`` (their ``(low, high, body)``)."""
    out = []
    for op, av in items:
        if op in _REPEATS:
            if av[1] == _sre_c.MAXREPEAT:
                out.append(av)
            out += _inner_repeats(av[2])
        elif op is _sre_c.SUBPATTERN:
            out += _inner_repeats(av[-1])
        elif op is _sre_c.BRANCH:
            for alt in av[1]:
                out += _inner_repeats(alt)
    return out


def _check_pattern(raw: dict, file: str, where: str, *, cost: bool = True) -> None:
    """``prefilter`` and ``pattern``: present, strings, bounded, and (``cost``) of bounded
    cost (:func:`pattern_cost_problem`)."""
    if not isinstance(raw.get("pattern"), str) or not raw["pattern"]:
        raise RuleError(file, where, "missing or empty 'pattern' (a string)")
    pre = raw.get("prefilter")
    literals = pre if isinstance(pre, list) else [pre]
    if not literals or len(literals) > 16 or not all(isinstance(lit, str) and lit for lit in literals):
        raise RuleError(file, where, "missing or empty 'prefilter' (a string, or a list of at most 16 strings)")
    if any(len(lit) > MAX_PREFILTER_CHARS for lit in literals):
        raise RuleError(file, where, f"'prefilter' is longer than {MAX_PREFILTER_CHARS} characters")
    problem = pattern_cost_problem(raw["pattern"]) if cost else None
    if problem:
        raise RuleError(file, where, problem)


def _string_list(value: Any, field: str, file: str, rid: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise RuleError(file, rid, f"'{field}' must be a list of strings (it is {_kind(value)})"
                        if not isinstance(value, list) else f"each '{field}' example is a string")
    return value


def _parse_examples(ex: Any, file: str, rid: str) -> tuple[list[tuple[str, dict[str, Any]]], list[str]]:
    if ex is None:
        ex = {}
    if not isinstance(ex, dict):
        raise RuleError(file, rid, "'examples' must be a mapping with 'match' and 'no_match' lists")
    items = ex.get("match")
    if items is not None and not isinstance(items, list):
        raise RuleError(file, rid, f"'match' must be a list (it is {_kind(items)})")
    matches: list[tuple[str, dict[str, Any]]] = []
    for item in items or []:
        if isinstance(item, str):
            matches.append((item, {}))
        elif isinstance(item, dict) and isinstance(item.get("line"), str):
            expect = item.get("expect")
            matches.append((item["line"], {} if expect is None else _check_mapping(
                expect, "expect", file, rid, null_ok=True, what="strings, numbers, booleans or null (quote times)")))
        else:
            raise RuleError(file, rid, "each 'match' example is a string or {line: ..., expect: {...}}")
    no_matches = ex.get("no_match")
    if no_matches is not None and not isinstance(no_matches, list):
        raise RuleError(file, rid, f"'no_match' must be a list (it is {_kind(no_matches)})")
    return matches, _string_list(no_matches, "no_match", file, rid)


def _parse_rule(raw: Any, file: str, index: int, *, trusted: bool = False) -> Rule:
    if not isinstance(raw, dict):
        raise RuleError(file, f"#{index + 1}", "a rule must be a mapping")
    rid = raw.get("id")
    if not isinstance(rid, str) or not rid:
        raise RuleError(file, f"#{index + 1}", "missing 'id'")
    if len(rid) > MAX_NAME_CHARS or not rid.isprintable():
        raise RuleError(file, f"#{index + 1}", f"'id' must be printable and at most {MAX_NAME_CHARS} characters")
    if raw.get("disable") is not None:
        if raw.get("disable") is not True or set(raw) - {"id", "disable", "description"}:
            raise RuleError(file, rid, "a disabling entry is {id: <packaged rule id>, disable: true} and nothing else")
        return Rule(id=rid, event="", pattern="", prefilters=(), file=file, disable=True)
    if not isinstance(raw.get("event"), str) or not raw["event"]:
        raise RuleError(file, rid, "missing or empty 'event' (a string)")
    _check_pattern(raw, file, rid, cost=not trusted)
    unknown = set(raw) - {"id", "event", "pattern", "prefilter", "sources", "attrs", "path_format", "examples",
                          "description", "source", "during", "unless", "requires"}
    if unknown:
        raise RuleError(file, rid, f"unknown field(s) {sorted(_name(k) for k in unknown)}")
    if raw["event"] not in EVENT_KINDS:
        raise RuleError(file, rid, f"event {raw['event'][:60]!r} is not a known kind; known: {sorted(EVENT_KINDS)}")
    sources = raw.get("sources") or []
    if not isinstance(sources, list) or not all(isinstance(s, str) and s in _SOURCE_KINDS for s in sources):
        raise RuleError(file, rid, f"'sources' must be a list drawn from {sorted(_SOURCE_KINDS)}")
    attrs = _check_mapping({} if raw.get("attrs") is None else raw["attrs"], "attrs", file, rid, null_ok=False,
                           what="strings, numbers or booleans")
    if raw.get("during") not in (None, "save", "load", "neither", "!save", "!load"):
        raise RuleError(file, rid, "'during' must be save or load (the rule then matches only tracebacks through that "
                                   "code), neither (tracebacks through code no frame vocabulary knows), or !save / "
                                   "!load (any record but a traceback through that code)")
    if not isinstance(raw.get("source", ""), str):
        raise RuleError(file, rid, "'source' must be a string (the framework file and function the line comes from)")
    if not isinstance(raw.get("description", ""), str):
        raise RuleError(file, rid, f"'description' must be a string (it is {_kind(raw['description'])})")
    unless = raw.get("unless")
    if unless is not None:
        if not isinstance(unless, str) or not unless or len(unless) > MAX_PATTERN_CHARS:
            raise RuleError(file, rid, f"'unless' must be a pattern of at most {MAX_PATTERN_CHARS} characters")
        problem = None if trusted else pattern_cost_problem(unless)
        if problem:
            raise RuleError(file, rid, f"'unless': {problem}")
    requires = raw.get("requires") or []
    if not isinstance(requires, list) or len(requires) > 8 or not all(
            isinstance(q, str) and q and len(q) <= MAX_PATTERN_CHARS for q in requires):
        raise RuleError(file, rid, f"'requires' must be a list of at most 8 patterns of at most {MAX_PATTERN_CHARS} "
                                   "characters")
    for q in requires:
        problem = None if trusted else pattern_cost_problem(q)
        if problem:
            raise RuleError(file, rid, f"'requires': {problem}")
    path_format = _check_path_format(raw.get("path_format"), file, rid)
    matches, no_matches = _parse_examples(raw.get("examples"), file, rid)
    if not matches:
        raise RuleError(file, rid, "needs at least one 'match' example")
    return Rule(
        id=rid, event=raw["event"], pattern=raw["pattern"], file=file,
        prefilters=tuple(raw["prefilter"]) if isinstance(raw["prefilter"], list) else (raw["prefilter"],),
        sources=tuple(sources), attrs=attrs, path_format=path_format,
        match_examples=tuple(matches), no_match_examples=tuple(no_matches), source=raw.get("source", ""),
        during=raw.get("during"), unless=unless, requires=tuple(requires),
    )


def load_rule_file(path: str) -> list[Rule]:
    """Parse one rule pack. Raises RuleError (file, rule id, reason) on any defect it can see
    without running the patterns; :func:`check_rules` runs them."""
    return load_pack(path)[0]


def _read_yaml(path: str, *, trusted: bool) -> Any:
    """The YAML document of a rule pack. Raises RuleError naming the file (and line) when it
    cannot be read, is larger than :data:`MAX_PACK_BYTES`, is not UTF-8 or not YAML, or
    (unless ``trusted``: the packaged packs) nests deeper than :data:`MAX_YAML_DEPTH`."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_PACK_BYTES + 1)
    except OSError as e:
        raise RuleError(path, None, f"cannot read: {e.strerror or e}") from None
    if len(raw) > MAX_PACK_BYTES:
        raise RuleError(path, None, f"larger than {MAX_PACK_BYTES >> 20} MiB: not a rule pack")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise RuleError(path, None, f"not UTF-8 text (line {line}, byte 0x{raw[e.start]:02x}): "
                                    "save the file as UTF-8") from None
    try:
        if not trusted:  # depth first, from the event stream: the loader recurses per level
            depth = 0
            for ev in yaml.parse(text, Loader=_YAML_LOADER):
                if isinstance(ev, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                    depth += 1
                    if depth > MAX_YAML_DEPTH:
                        mark = ev.start_mark
                        raise RuleError(path, None, f"nested too deeply (line {mark.line + 1}: mappings and lists "
                                                    f"more than {MAX_YAML_DEPTH} levels deep)")
                elif isinstance(ev, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
                    depth -= 1
        return yaml.load(text, Loader=_YAML_LOADER)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = str(getattr(e, "problem", None) or e).splitlines()[0][:200]
        raise RuleError(path, None, f"invalid YAML: {where}{problem}") from None
    except (RecursionError, MemoryError, ValueError, OverflowError) as e:  # values past the constructors' limits
        raise RuleError(path, None, f"not a usable rule pack: {type(e).__name__}: {str(e)[:120]}") from None


def load_pack(path: str, *, trusted: bool = False) -> tuple[list[Rule], list[Frame]]:
    """Parse one rule pack: its rules and its traceback ``frames``, every field checked
    (types, attrs, ``path_format``, pattern cost). Raises RuleError naming the file, the
    rule and the reason. ``trusted``: the packaged packs, loaded by every run, skip the
    two costly checks (YAML nesting, pattern cost); :func:`check_rule_files` (``ckptwatch
    rules check``, and the test suite) runs them on the packaged packs too."""
    doc = _read_yaml(path, trusted=trusted)
    if not isinstance(doc, dict) or not isinstance(doc.get("rules", []), list) or not (
            doc.get("rules") or doc.get("frames")):
        raise RuleError(path, None, "expected a mapping with a 'rules' list")
    return ([_parse_rule(r, path, i, trusted=trusted) for i, r in enumerate(doc.get("rules") or [])],
            _parse_frames(doc, path, trusted=trusted))


def _parse_frames(doc: dict, path: str, *, trusted: bool = False) -> list[Frame]:
    raw = doc.get("frames") or []
    if not isinstance(raw, list):
        raise RuleError(path, None, "'frames' must be a list")
    out = []
    for i, f in enumerate(raw):
        where = f"frame #{i + 1}"
        innermost = isinstance(f, dict) and f.get("innermost") is True
        kinds = ("save", "load", "other", "ignore") if innermost else ("save", "load")
        if not isinstance(f, dict) or f.get("during") not in kinds:
            raise RuleError(path, where, "a frame is a mapping with 'during' (save or load; other or ignore with "
                                         "innermost: true), 'prefilter', 'pattern'")
        unknown = set(f) - {"during", "prefilter", "pattern", "source", "description", "innermost"}
        if unknown:
            raise RuleError(path, where, f"unknown field(s) {sorted(_name(k) for k in unknown)}")
        if not isinstance(f.get("innermost", False), bool):
            raise RuleError(path, where, "'innermost' must be true or false")
        _check_pattern(f, path, where, cost=not trusted)
        for key in ("source", "description"):
            if not isinstance(f.get(key, ""), str):
                raise RuleError(path, where, f"'{key}' must be a string (it is {_kind(f[key])})")
        out.append(Frame(during=f["during"], prefilter=f["prefilter"], pattern=f["pattern"], file=path,
                         source=f.get("source", ""), innermost=innermost))
    return out


def _expand(paths: Iterable[str]) -> list[str]:
    """Rule files from files and directories (their ``*.yaml`` / ``*.yml``, in name order)."""
    files: list[str] = []
    for p in paths:
        if os.path.isdir(p):
            files += sorted(os.path.join(p, f) for f in os.listdir(p) if f.endswith((".yaml", ".yml")))
        else:
            files.append(p)
    return files


def merge_overrides(base: list[Rule], user: list[Rule]) -> list[Rule]:
    """``base`` (packaged) with ``user`` rules applied: same id replaces in place, ``disable``
    removes, new ids come after. Raises RuleError for an override of an unknown id or an id
    two user rules share."""
    out = list(base)
    index = {r.id: i for i, r in enumerate(base)}
    seen: dict[str, str] = {}
    for r in user:
        if r.id in seen:
            raise RuleError(r.file, r.id, f"duplicate id (also in {seen[r.id]})")
        seen[r.id] = r.file
        if r.id in index:
            out[index[r.id]] = r
        elif r.disable:
            raise RuleError(r.file, r.id, "disables a rule no packaged pack has (see: ckptwatch rules list)")
        else:
            out.append(r)
    return [r for r in out if not r.disable]


def _cast_attr(s: pl.Series) -> pl.Series:
    for dtype in (pl.Int64, pl.Float64):
        c = s.cast(dtype, strict=False)
        if c.null_count() == s.null_count():
            return c
    return s


class RuleSet:
    """An ordered set of compiled rules.

    Raises RuleError on duplicate ids or a pattern the regex engine rejects.
    """

    def __init__(self, rules: Iterable[Rule], frames: Iterable[Frame] = ()) -> None:
        self.rules: list[Rule] = []
        self.frames: list[Frame] = list(frames)
        seen: dict[str, str] = {}
        probe = pl.Series("line", ["x"], dtype=pl.Utf8)
        for r in rules:
            if r.id in seen:
                raise RuleError(r.file, r.id, f"duplicate id (also in {seen[r.id]})")
            seen[r.id] = r.file
            for what, pattern in (("pattern", r.pattern), ("'unless'", r.unless),
                                  *(("'requires'", q) for q in r.requires)):
                if pattern is None:
                    continue
                try:
                    probe.str.contains(pattern)
                except Exception as e:  # polars raises ComputeError with the regex crate's message
                    raise RuleError(r.file, r.id, f"{what} does not compile: {str(e).splitlines()[0:4]}") from None
            self.rules.append(r)
        for f in self.frames:
            try:
                probe.str.contains(f.pattern)
            except Exception as e:
                raise RuleError(f.file, f"frame {f.prefilter!r}", f"pattern does not compile: {str(e).splitlines()[0:4]}") from None

    @classmethod
    def load(cls, extra: Iterable[str] = (), *, packaged: bool = True,
             scopes: Iterable[str] | None = None) -> RuleSet:
        """The packaged packs (unless ``packaged=False``; only those of ``scopes`` when given,
        see :func:`packaged_rule_files`) plus ``extra`` files or directories, whose rules
        override packaged rules of the same id (see the module docstring).

        Raises RuleError for a broken file, a duplicate id, or an override of an unknown id."""
        base: list[Rule] = []
        frames: list[Frame] = []
        for f in packaged_rule_files(scopes) if packaged else []:
            rules, fr = load_pack(f, trusted=True)
            base += rules
            frames += fr
        user: list[Rule] = []
        for f in _expand(extra):
            rules, fr = load_pack(f)
            user += rules
            frames += fr
        return cls(merge_overrides(base, user), frames)

    def apply(self, records: pl.DataFrame) -> pl.DataFrame:
        """Match records (RECORD_SCHEMA) and return events (EVENT_SCHEMA), in record order."""
        if records.is_empty():
            return empty_events()
        # one Aho-Corasick pass over the batch for every rule's literal at once keeps the
        # records that hold any (a few in a thousand in real logs); only those are tested
        # literal by literal, and each rule looks at the ones its literal admits that no
        # earlier rule claimed
        # a rule whose pattern starts with (?i) has its literal found whatever its case
        exact = list(dict.fromkeys(lit for r in self.rules if not _folds_case(r) for lit in r.prefilters))
        folded = list(dict.fromkeys(lit.lower() for r in self.rules if _folds_case(r) for lit in r.prefilters))
        line = pl.col("line")
        keep = line.str.contains_any(exact) if exact else pl.lit(False)  # a set of (?i) rules only has none
        if folded:
            keep = keep | line.str.contains_any(folded, ascii_case_insensitive=True)
        records = records.filter(keep)
        if records.is_empty():
            return empty_events()
        pool = records.with_row_index("_rid")
        masks = _literal_masks(records["line"], exact) if exact else {}
        if folded:
            masks |= {_FOLDED + k: v for k, v in _literal_masks(records["line"], folded, fold_case=True).items()}
        source_masks: dict[tuple[str, ...], pl.Series] = {}
        claimed = pl.Series("claimed", [False] * records.height, dtype=pl.Boolean)
        # a traceback is never a save line, a progress line or a resume: the code lines it
        # quotes (logger.info(f"Saving current state to {output_dir}")) are not log lines
        # a traceback, or a pasted one whose header was cut (it starts at a frame): its lines
        # are code and an exception, never a save, load or progress report
        traceback = (records["line"].str.starts_with("Traceback (most recent call last)")
                     | records["line"].str.contains(r'^[ \t]*File "[^"\n]+", line \d+[^\n]*\n'))
        parts: list[pl.DataFrame] = []
        for rule in self.rules:
            m = None
            for lit in rule.prefilters:
                lm = masks.get(_FOLDED + lit.lower() if _folds_case(rule) else lit)
                m = lm if m is None else (m if lm is None else m | lm)
            if m is None:
                continue
            if rule.sources:
                if rule.sources not in source_masks:
                    source_masks[rule.sources] = records["source_kind"].is_in(list(rule.sources))
                m = m & source_masks[rule.sources]
            m = m & ~claimed
            if rule.event in _CONTEXT_KINDS:
                m = m & ~traceback
            if not m.any():
                continue
            cand = pool.filter(m)
            hit = cand.filter(pl.col("line").str.contains(rule.pattern))
            for q in rule.requires:
                if not hit.is_empty():
                    hit = hit.filter(pl.col("line").str.contains(q))
            if rule.unless and not hit.is_empty():
                hit = hit.filter(~pl.col("line").str.contains(rule.unless))
            if rule.during and not hit.is_empty():
                multi = hit["line"].str.contains("\n", literal=True)
                where = self._during(hit["line"], multi, keep_other=True)
                if rule.during.startswith("!"):
                    keep = pl.Series([d != rule.during[1:] for d in where], dtype=pl.Boolean)
                else:
                    want: str | None = None if rule.during == "neither" else rule.during
                    keep = pl.Series([d == want for d in where], dtype=pl.Boolean) & multi
                hit = hit.filter(keep)
            if hit.is_empty():
                continue
            claimed = claimed.scatter(hit["_rid"], True)
            parts.append(self._events_for(rule, hit))
        if not parts:
            return empty_events()
        return _floored_by_rule_times(pl.concat(parts).sort("_rid")).drop("_rid")

    def _events_for(self, rule: Rule, hit: pl.DataFrame) -> pl.DataFrame:
        groups = hit.select(pl.col("line").str.extract_groups(rule.pattern).alias("g")).unnest("g")
        df = hit
        for name, dtype in _COLUMN_GROUPS.items():
            if not _alternatives(groups, name):
                continue
            captured = _coalesced(groups, name).str.strip_chars().cast(dtype, strict=False)
            if name in df.columns:  # a value in the line beats a label from path or prefix
                df = df.with_columns(pl.coalesce(captured, pl.col(name)).alias(name))
            else:
                df = df.with_columns(captured.alias(name))
        if "ts" in groups.columns:
            captured_ts = _parse_captured_ts(groups["ts"], df["ts"])
            own = df["ts_source"] == "line"  # a time inside the line beats an inherited or guessed one
            df = df.with_columns(
                pl.when(own | captured_ts.is_null()).then(pl.col("ts")).otherwise(captured_ts).alias("ts"),
                pl.when(own | captured_ts.is_null()).then(pl.col("ts_source")).otherwise(pl.lit("rule")).alias("ts_source"),
            )
        attr_names = list(dict.fromkeys(c.split("__")[0] for c in groups.columns
                                         if c.split("__")[0] not in _COLUMN_GROUPS and c != "ts"))
        captured = (pl.DataFrame([_cast_attr(_coalesced(groups, n)) for n in attr_names]) if attr_names
                    else hit.select(pl.int_range(pl.len()).alias("_row")))  # no attribute: a frame of the rows
        multi = hit["line"].str.contains("\n", literal=True)
        if multi.any():  # tracebacks: the code they ran through, the line a report should cite
            captured = captured.with_columns(
                pl.Series("_during", self._during(hit["line"], multi, innermost=rule.event not in _PEER_KINDS,
                                                   keep_other=True),
                          dtype=pl.Utf8),
                pl.Series("_at_line", _match_lines(hit["line"], rule.pattern, multi), dtype=pl.Int64))
        if rule.event == "save_start" and "async" not in rule.attrs:  # 'async save scheduled', 'in the background'
            said = hit["line"].str.contains(_ASYNC_SAVE) & ~hit["line"].str.contains(_MAYBE_ASYNC)
            if said.any():
                captured = captured.with_columns(said.alias("_async"))
        attrs_json = attrs_json_of(captured, rule.attrs)
        for name in ("pid", "step", "path"):
            if name not in df.columns:
                df = df.with_columns(pl.lit(None, dtype=_COLUMN_GROUPS[name]).alias(name))
        if rule.path_format:
            df = df.with_columns(
                pl.Series("path", [_format_path(rule.path_format, p, s) for p, s in zip(df["path"], df["step"],
                                                                                         strict=True)],
                          dtype=pl.Utf8)
            )
        path = df["path"].str.strip_chars_end("/.,;:'\")]")
        if rule.event in _CHECKPOINT_KINDS and path.is_null().any():
            path = _named_path(df["line"], path)
        if df["step"].is_null().any() and path.is_not_null().any():  # the step a path names by convention
            df = df.with_columns(pl.Series("step", [s if s is not None else step_from_path(p)
                                                    for s, p in zip(df["step"], path, strict=True)],
                                           dtype=pl.Int64))
        if rule.event in _STEP_WORD_KINDS and df["step"].is_null().any():  # 'for step 2000', '@ 4999 steps'
            said = df["line"].str.extract_groups(_STEP_WORD).struct
            df = df.with_columns(pl.coalesce(pl.col("step"), said.field("said").cast(pl.Int64, strict=False),
                                             said.field("said_after").cast(pl.Int64, strict=False)).alias("step"))
        df = df.with_columns(
            path.alias("path"),
            pl.lit(rule.event).alias("kind"),
            pl.lit(rule.id).alias("rule_id"),
            attrs_json.alias("attrs"),
        )
        df = df.with_columns(_dedup_keys(df).alias("dedup_key"))
        return df.select(["_rid", *EVENT_SCHEMA]).cast({k: v for k, v in EVENT_SCHEMA.items()})  # type: ignore[arg-type]


    def _during(self, lines: pl.Series, multi: pl.Series | None = None, *,
                innermost: bool = True, keep_other: bool = False) -> list[str | None]:
        """Per record: ``save`` / ``load`` when it is a traceback through a frame of that
        code (the first of the packs' frames in pack order that matches; else, with
        ``innermost``, the innermost frame line the generic vocabulary classifies, see
        :class:`Frame`), else None; with ``keep_other``, ``other`` for a traceback whose
        innermost classified frame is neither. ``multi``: which records have several
        lines, when the caller knows."""
        out: list[str | None] = [None] * len(lines)
        if multi is None:
            multi = lines.str.contains("\n", literal=True)
        if not self.frames or not multi.any():
            return out
        rows = multi.arg_true()  # only tracebacks (several lines) are looked at
        sub = lines.gather(rows)
        for f in self.frames:
            if f.innermost:
                continue
            cand = sub.str.contains(f.prefilter, literal=True)
            if not cand.any():
                continue
            at = rows.filter(cand)
            for i in at.filter(lines.gather(at).str.contains(f.pattern)).to_list():
                if out[i] is None:
                    out[i] = f.during
        inner = [f for f in self.frames if f.innermost] if innermost else []
        left = [i for i in rows.to_list() if out[i] is None]
        if inner and left:
            for i, d in _innermost(lines.gather(left), inner).items():
                out[left[i]] = d if d != "other" or keep_other else None
        return out


def _innermost(lines: pl.Series, frames: list[Frame]) -> dict[int, str]:
    """Per record of ``lines`` (by position): ``save``, ``load`` or ``other``, what the
    innermost of its frame lines (:data:`FRAME_LINE`) that ``frames`` classify (first
    matching frame per line; ``ignore`` lines skipped) is; records with none are left out."""
    found = (pl.DataFrame({"f": lines.str.extract_all(FRAME_LINE)}).with_row_index("_r")
             .explode("f").drop_nulls("f"))
    # the call the innermost frame was making (its code line: the raising statement, or in a
    # traceback cut before its next frame, the call into it) counts as one frame further in
    # (in the innermost frame's file: a call inside a library the vocabulary calls other stays other)
    calls = (pl.DataFrame({"p": lines.str.extract(_INNERMOST_CALL, 1), "c": lines.str.extract(_INNERMOST_CALL, 2)})
             .with_row_index("_r").drop_nulls("c")
             .select("_r", pl.format('  File "{}", line -1, in {}', pl.col("p"), pl.col("c")).alias("f")))
    found = pl.concat([found, calls]).sort("_r", maintain_order=True)
    if found.is_empty():
        return {}
    label: Any = None
    for f in frames:
        hit = pl.col("f").str.contains(f.pattern)
        label = pl.when(hit).then(pl.lit(f.during)) if label is None else label.when(hit).then(pl.lit(f.during))
    found = (found.with_columns(label.otherwise(pl.lit(None, dtype=pl.Utf8)).alias("d"))
             .filter(pl.col("d").is_not_null() & (pl.col("d") != "ignore")))
    last = found.group_by("_r", maintain_order=True).agg(pl.col("d").last())
    return {int(r): str(d) for r, d in last.iter_rows() if d in ("save", "load", "other")}


#: what a line reports when nothing failed (a save, progress, a resume): never read from a traceback
_CONTEXT_KINDS = frozenset({"save_start", "save_end", "load_start", "load_end", "resume", "metric", "job_end",
                            "world_size"})

#: what a line says of the checkpoint it loads (or failed to save or store): its path may be anywhere in
#: the line (see :func:`_named_path`); a save line's rule captures the path it saves to, for a
#: save line may name another checkpoint too (HF's 'Deleting older checkpoint [...]')
_CHECKPOINT_KINDS = frozenset({"save_error", "storage_error", "load_start", "load_end", "load_error", "resume"})
#: a save's or a load's line that names its step in words, when its rule captured none and its
#: path names none: 'Checkpoint save for step 2000 started', '[step=1000] Finished synchronous
#: save', 'tag global_step3000', 'Saved first model at 40.1 @ 4999 steps'
_STEP_WORD_KINDS = _CHECKPOINT_KINDS | {"save_start", "save_end"}
_STEP_WORD = (r"(?i)(?:\b(?:global[_ ]?step|step|iteration|iter)(?:s\b)?[ \t_-]*[=:#]?[ \t]*\"?(?P<said>\d{1,12})\b"
              r"|\b(?P<said_after>\d{1,12})[ \t]+(?:steps|iterations|updates)\b)")
#: a save line that says its save runs on after it returns: such a save ends at its own end
#: line, never at the next progress line (:mod:`ckptwatch.detectors.saves`)
_ASYNC_SAVE = r"(?i)\basync(?:hronous(?:ly)?)?\b|\bin the background\b|\bbackground (?:save|thread|checkpoint)"
#: ... unless it only says what happens when async saving is configured (torchtitan's 'Saving the
#: checkpoint (or staging if async is enabled)')
_MAYBE_ASYNC = r"(?i)\bif async|\basync(?: \w+)? is (?:enabled|disabled|on|off)|\basync\w*\s*[:=]\s*(?:false|0|no)\b"
#: a path-like token: a URL of an object store, words joined by slashes, or a bare file name
#: with a checkpoint's naming (TF's ``model.ckpt-60.data-00000-of-00001``)
_PATH_TOKEN = (r"(?:[a-z][a-z0-9+]*://[^\s'\",;()\[\]{}]+|[\w.~-]*/[^\s'\",;()\[\]{}]+"
               r"|[\w.-]*(?i:ckpt|checkpoint)[-_]\d[\w.-]*)")


def _named_path(lines: pl.Series, path: pl.Series) -> pl.Series:
    """``path`` where the rule captured one; elsewhere the checkpoint the first path-like token
    of the line names by a trainer's convention (:func:`ckptwatch.naming.checkpoint_of`: ``…
    /ckpt/run1/checkpoint-1500/trainer_state.json`` gives ``/ckpt/run1/checkpoint-1500``), else
    null: a path that names no step is not taken, so no rule's reading changes by a path it
    did not ask for. Shapes: two Utf8 series of one length."""
    tokens = lines.str.extract_all(_PATH_TOKEN).to_list()
    found = [p if p is not None else next((c for t in (ts or ()) if (c := checkpoint_of(t)) is not None), None)
             for p, ts in zip(path, tokens, strict=True)]
    return pl.Series("path", found, dtype=pl.Utf8)


#: a peer's report of a collective that failed: a rank waiting in a save's barrier is not the
#: rank whose save failed, so only the packs' own frames (never the generic vocabulary) say
#: what code such a report passed through
_PEER_KINDS = ("collective_error", "collective_timeout")

#: the key of a case-folded literal's mask (see :func:`_folds_case`)
_FOLDED = "\x00i:"


def _folds_case(rule: Rule) -> bool:
    """The rule's pattern is case-insensitive (``(?i)`` first): its prefilter is too."""
    return rule.pattern.startswith("(?i)")


def _literal_masks(lines: pl.Series, literals: list[str], *, fold_case: bool = False) -> dict[str, pl.Series]:
    """Which of ``lines`` hold each of ``literals``, for the literals some line holds:
    ``{literal: Boolean Series of len(lines)}``. One overlapping Aho-Corasick pass reports
    every literal a line holds (``checkpoint`` and ``heckpoint`` both), where a ``contains``
    per literal made one pass per rule's literal: 189 passes, two thirds of the rules'
    time on a fleet's logs."""
    found = (pl.DataFrame({"line": lines}).with_row_index("_r")
             .select("_r", pl.col("line").str.extract_many(literals, overlapping=True, ascii_case_insensitive=fold_case)
                     .alias("_lit"))
             .explode("_lit").drop_nulls("_lit").unique(["_r", "_lit"]))
    out: dict[str, pl.Series] = {}
    if fold_case:  # the matched text, in the line's case: keyed by the literal it folds to
        found = found.with_columns(pl.col("_lit").str.to_lowercase()).unique(["_r", "_lit"])
    for (lit,), rows in found.partition_by("_lit", as_dict=True).items():
        # a new Series each: scatter writes into the Series it is called on
        out[str(lit)] = pl.repeat(False, len(lines), dtype=pl.Boolean, eager=True).scatter(rows["_r"], True)
    return out


def _alternatives(groups: pl.DataFrame, name: str) -> list[str]:
    """The columns of an extract that fill ``name``: itself and its ``name__N`` alternatives."""
    return [c for c in groups.columns if c == name or (c.startswith(name + "__") and c[len(name) + 2:].isdigit())]


def _coalesced(groups: pl.DataFrame, name: str) -> pl.Series:
    """Group ``name`` of an extract, with its ``name__N`` alternatives filled in."""
    alts = _alternatives(groups, name)
    return groups[alts[0]].alias(name) if len(alts) == 1 else groups.select(pl.coalesce(alts).alias(name)).to_series()


def _match_lines(lines: pl.Series, pattern: str, multi: pl.Series) -> list[int]:
    """Per record: the index of the line where ``pattern``'s match starts, in records of
    several lines (``multi``) that are not tracebacks (0 elsewhere): the line a report should cite."""
    out = [0] * len(lines)
    multi = multi & ~lines.str.starts_with("Traceback")
    if not multi.any():
        return out
    idx = multi.arg_true()
    sub = lines.gather(idx)
    for i, text, pos in zip(idx.to_list(), sub.to_list(), sub.str.find(pattern).to_list(), strict=True):
        if pos:
            out[i] = text.encode()[:pos].count(b"\n")
    return out


def _format_path(fmt: str, path: str | None, step: int | None) -> str | None:
    """``path`` rewritten by the rule's ``path_format``; a path that already holds what the
    format appends is cut after it instead: ``.../iter_0000300`` (a script that logs the
    checkpoint where Megatron-LM logs the root) stays, and a rank's own file in it
    (``.../iter_0000300/mp_rank_01/model_optim_rng.pt``) becomes ``.../iter_0000300``, not a
    path that is neither."""
    if path is None:
        return None
    root = path.rstrip("/")
    try:
        out = fmt.format(path=root, step=step if step is not None else 0)
    except (ValueError, KeyError, IndexError):
        return path
    added = out[len(root):] if out.startswith(root) else ""
    if added and added.startswith("/"):
        at = (root + "/").find(added + "/")
        if at >= 0:
            return root[: at + len(added)]
    return root if added and root.endswith(added) else out


def _rfc1123_to_iso(v: str | None) -> str | None:
    """``Mon, 30 Nov 2026 10:38:21 +0000`` (RFC 1123 / 2822, as kubectl describe prints
    times) as ISO 8601; other values unchanged."""
    if not v or "," not in v[:5]:
        return v
    try:
        return email.utils.parsedate_to_datetime(v).isoformat()
    except (TypeError, ValueError, IndexError):
        return v


def _parse_captured_ts(values: pl.Series, context: pl.Series) -> pl.Series:
    values = pl.Series(values.name, [_rfc1123_to_iso(v) for v in values], dtype=pl.Utf8)
    df = pl.DataFrame({"line": values.fill_null(""), "stream_key": [str(i) for i in range(len(values))],
                       "mtime": context}, schema={"line": pl.Utf8, "stream_key": pl.Utf8, "mtime": TS})
    out = timestamps.add_event_time(df)
    return out.select(pl.when(pl.col("ts_source") == "line").then(pl.col("ts")).alias("ts"))["ts"]


def _floored_by_rule_times(events: pl.DataFrame) -> pl.DataFrame:
    """Events (in record order, ``_rid``) whose time is inherited from an earlier line are no
    earlier than the own time of an earlier event of their file: the ingest stage dates a
    line by the last stamped line of its stream (an ``srun -l`` task's), or before any rule
    read the time inside a line (slurmstepd's ``CANCELLED AT 2026-12-02T03:34:31``,
    torchrun's ``time : …``), so rank 0's 'Received SIGTERM' printed after the cancellation
    was dated by its own save line a minute before it, and came before its cause. A file is
    written in order, so a line printed later was printed no earlier. Within one batch of
    records: a time of an earlier batch does not carry over."""
    own = pl.col("ts_source").is_in(["line", "rule"])
    if not (events["ts_source"] == "inherited").any():
        return events
    # by place in the file, not by record order: a traceback is one record, emitted once its
    # stream's next line came, after lines of other streams printed below its first line
    floor = pl.when(own).then(pl.col("ts")).cum_max().forward_fill().shift(1).over("source_id")
    return (events.with_row_index("_order").sort("source_id", "offset", "_order")
            .with_columns(pl.when((pl.col("ts_source") == "inherited") & (floor > pl.col("ts"))).then(floor)
                          .otherwise(pl.col("ts")).alias("ts"))
            .sort("_order").drop("_order"))


def _dedup_keys(df: pl.DataFrame) -> pl.Series:
    """The same worker line read twice (console with ``--tee`` and the per-rank file) gets
    the same key: job, local rank (else rank, else host), the record text and, when the record has
    its own time, that time. Records without their own time (tracebacks) key on text alone,
    because the line before them differs between the two files; but in a file with no
    time at all (its mtime stands in), and for a record that names no rank or host, the
    file is part of the key.

    The key is the first 20 hex digits of the SHA-256 of ``job \\x1f who \\x1f when \\x1f
    line`` (``who``: ``l<local_rank>``, ``r<rank>``, ``h<host>`` or ``-``; ``when``: the
    time in Python's ``isoformat`` or ``@<source_id>``); the strings are built in one polars
    pass, only the hash is per row."""
    host = pl.col("host")
    who = (pl.when(pl.col("local_rank").is_not_null()).then(pl.format("l{}", pl.col("local_rank")))
           # no rank: the host tells two workers' identical lines apart (a pod's own log file)
           .when(pl.col("rank").is_not_null()).then(pl.format("r{}", pl.col("rank")))
           .when(host.is_not_null() & (host != "")).then(pl.format("h{}", host))
           .otherwise(pl.lit("-")))
    ts = pl.col("ts")
    iso = pl.concat_str([  # datetime.isoformat() of a UTC time: microseconds only when not zero
        ts.dt.strftime("%Y-%m-%dT%H:%M:%S"),
        pl.when(ts.dt.microsecond() != 0).then(pl.format(".{}", ts.dt.microsecond().cast(pl.Utf8).str.zfill(6)))
        .otherwise(pl.lit("")),
        pl.lit("+00:00")])
    # a file with no time at all (print() logs): the same line in two such files is two events
    # (a restarted run printing its save line again), not one seen twice. Nor is an undated
    # line of no rank in two files: copies (a tee'd console and the rank's own file) name
    # their rank, and two files that name none are two runs ("Training completed." of each
    # attempt of a job whose logs carry no job id)
    when = (pl.when((pl.col("ts_source") == "line") & ts.is_not_null()).then(iso)
            .when(pl.col("ts_source") == "mtime").then(pl.format("@{}", pl.col("source_id")))
            .when(who == "-").then(pl.format("@{}", pl.col("source_id")))
            .otherwise(pl.lit("")))
    # one chunk per column first: over the multi-chunk columns a poll's concat gives, polars
    # 2.1 can panic in this when/then + concat_str ("assertion failed: i < self.len()")
    cols = df.select("job", "host", "local_rank", "rank", "line", "ts", "ts_source", "source_id").rechunk()
    text = cols.select(pl.concat_str([pl.col("job").fill_null("None"), who, when.fill_null(""),
                                      pl.col("line").fill_null("None")], separator="\x1f")).to_series()
    return pl.Series("dedup_key", [hashlib.sha256(t.encode()).hexdigest()[:20] for t in text.to_list()],
                     dtype=pl.Utf8)


def attrs_json_of(captured: pl.DataFrame, static: dict[str, Any]) -> pl.Series:
    """Each row's attributes as a JSON object (keys sorted), built in one polars pass.

    ``captured``: one column per captured group (Int64, Float64 or Utf8; null where the
    line did not have it: the key is left out), and optionally ``_during`` (Utf8: the code a
    traceback ran through, kept as ``during`` unless the row has one), ``_at_line``
    (Int64: the line of a multi-line record the match starts on, kept when not 0) and
    ``_async`` (Boolean: the save line says it is asynchronous, ``async: true`` unless the
    row captured an ``async`` of its own).
    ``static``: the rule's constant attributes, which win over captured ones. The text is
    ``json.dumps(d, sort_keys=True)``'s up to number spelling and non-ASCII escapes (same
    values when parsed); NaN and infinities are spelled as Python's ``json`` does."""
    names = [c for c in captured.columns if not c.startswith("_")]
    keys = sorted(set(names) | set(static) | ({"during"} if "_during" in captured.columns else set())
                  | ({"at_line"} if "_at_line" in captured.columns else set())
                  | ({"async"} if "_async" in captured.columns else set()))
    frags: list[pl.Expr] = []
    for k in keys:
        head = json.dumps(k) + ": "
        if k in static:
            value: pl.Expr = pl.lit(json.dumps(static[k]))
        else:
            value = _json_value(captured, k) if k in names else pl.lit(None, dtype=pl.Utf8)
        if k == "during" and "_during" in captured.columns and k not in static:
            value = pl.coalesce(value, _json_value(captured, "_during"))
        if k == "async" and "_async" in captured.columns and k not in static:
            value = pl.coalesce(value, pl.when(pl.col("_async")).then(pl.lit("true")))
        if k == "at_line" and "_at_line" in captured.columns:
            value = pl.when(pl.col("_at_line") != 0).then(pl.col("_at_line").cast(pl.Utf8)).otherwise(value)
        frags.append(pl.concat_str([pl.lit(head), value]))
    if not frags:
        return pl.repeat("{}", captured.height, eager=True, dtype=pl.Utf8).alias("attrs")
    body = pl.concat_list(frags).list.drop_nulls().list.join(", ")
    out = captured.select(pl.concat_str([pl.lit("{"), body, pl.lit("}")]).alias("attrs")).to_series()
    if len(out) != captured.height:  # static attributes only: one literal row
        out = pl.repeat(out[0], captured.height, eager=True, dtype=pl.Utf8).alias("attrs")
    return out


def _json_value(frame: pl.DataFrame, name: str) -> pl.Expr:
    """Column ``name`` of ``frame`` as JSON text per row (null where null)."""
    col = pl.col(name)
    dtype = frame.schema[name]
    if dtype == pl.Float64:
        return (pl.when(col.is_nan()).then(pl.lit("NaN"))
                .when(col == float("inf")).then(pl.lit("Infinity"))
                .when(col == float("-inf")).then(pl.lit("-Infinity"))
                .otherwise(col.cast(pl.Utf8)))
    if dtype.is_integer():
        return col.cast(pl.Utf8)
    # a string's JSON spelling: a one-field object's encoding without the ``{"_": `` and ``}``
    encoded = pl.struct(col.cast(pl.Utf8).alias("_")).struct.json_encode()
    return pl.when(col.is_not_null()).then(encoded.str.slice(5).str.strip_suffix("}"))


def _example_records(lines: list[str], source_kind: str) -> pl.DataFrame:
    n = len(lines)
    return pl.DataFrame(
        {
            "source_id": ["example"] * n, "source_kind": [source_kind] * n, "file": ["<example>"] * n,
            "stream": ["-"] * n, "offset": list(range(n)), "job": [None] * n, "host": [None] * n,
            "rank": [None] * n, "local_rank": [None] * n, "pid": [None] * n, "ts": [None] * n,
            "ts_source": ["mtime"] * n, "ts_year_guessed": [False] * n,
            "ingest_ts": [None] * n, "line": lines,
        },
        schema=RECORD_SCHEMA,
    )


def check_examples(ruleset: RuleSet) -> list[RuleError]:
    """Run every rule's examples through the whole rule set, as the pipeline would.

    A ``match`` example must produce an event from *this* rule (not an earlier rule that
    claims the line first) with the ``expect``-ed groups; a ``no_match`` example must not
    produce an event from this rule; every ``match`` example must contain the prefilter.
    """
    errors: list[RuleError] = []
    for rule in ruleset.rules:
        kind = rule.sources[0] if rule.sources else "log"
        lines = [line for line, _ in rule.match_examples]
        for line in lines:
            if not any((lit.lower() in line.lower()) if _folds_case(rule) else (lit in line) for lit in rule.prefilters):
                errors.append(RuleError(rule.file, rule.id, f"prefilter {list(rule.prefilters)} is not in match example "
                                                            f"{line[:80]!r}: the rule could never see it"))
        events = ruleset.apply(_example_records(lines, kind))
        by_offset = {row["offset"]: row for row in events.iter_rows(named=True)}
        for i, (line, expect) in enumerate(rule.match_examples):
            ev = by_offset.get(i)
            if ev is None:
                errors.append(RuleError(rule.file, rule.id, f"match example not matched: {line[:120]!r}"))
                continue
            if ev["rule_id"] != rule.id:
                errors.append(RuleError(rule.file, rule.id, f"match example claimed first by rule {ev['rule_id']}: "
                                                            f"{line[:120]!r}"))
                continue
            attrs = json.loads(ev["attrs"])
            for key, want in expect.items():
                got = ev.get(key) if key in _COLUMN_GROUPS or key == "ts" else attrs.get(key)
                if key == "ts" and got is not None:
                    got = got.isoformat()
                if str(got) != str(want):
                    errors.append(RuleError(rule.file, rule.id, f"example {line[:80]!r}: expected {key}={want!r}, "
                                                                f"got {got!r}"))
        if rule.no_match_examples:
            events = ruleset.apply(_example_records(list(rule.no_match_examples), kind))
            for row in events.filter(pl.col("rule_id") == rule.id).iter_rows(named=True):
                errors.append(RuleError(rule.file, rule.id, f"no_match example matched: "
                                                            f"{rule.no_match_examples[row['offset']][:120]!r}"))
    return errors


def check_rule_files(paths: Iterable[str]) -> tuple[int, list[RuleError]]:
    """Validate rule files: YAML, fields, patterns, ids unique, examples. Returns
    ``(number of rules checked, errors)``; the packaged packs are loaded alongside so that
    id clashes and rule-order conflicts with them are found too."""
    errors: list[RuleError] = []
    packaged = packaged_rule_files()
    base: list[Rule] = []
    user: list[Rule] = []
    frames: list[Frame] = []
    for f in [*packaged, *[p for p in _expand(paths) if os.path.abspath(p) not in {os.path.abspath(q) for q in packaged}]]:
        try:
            rules_of, frames_of = load_pack(f)
        except RuleError as e:
            errors.append(e)
            continue
        (base if f in packaged else user).extend(rules_of)
        for fr in frames_of:
            try:
                RuleSet([], [fr])
                frames.append(fr)
            except RuleError as e:
                errors.append(e)
    try:
        rules = merge_overrides(base, user)
    except RuleError as e:
        errors.append(e)
        rules = base + [r for r in user if not r.disable]
    good: list[Rule] = []
    seen: set[str] = set()
    for r in rules:
        try:
            RuleSet([r])
        except RuleError as e:
            errors.append(e)
            continue
        if r.id in seen:
            errors.append(RuleError(r.file, r.id, "duplicate id"))
            continue
        seen.add(r.id)
        good.append(r)
    ruleset = RuleSet(good, frames)
    errors += check_examples(ruleset)
    return len(rules), errors
