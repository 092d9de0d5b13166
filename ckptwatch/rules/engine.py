"""Rules as data: load YAML rule packs and apply them to batches of records.

A rule pack is a YAML file::

    family: torchrun                      # the source family the pack covers
    description: ...
    rules:
      - id: torchrun.worker_failed        # unique across all loaded packs
        event: process_exit               # one of ckptwatch.schema.EVENT_KINDS
        prefilter: "failed (exitcode:"    # a literal every matching record contains
        pattern: 'failed \\(exitcode: (?P<exitcode>-?\\d+)\\) local_rank: (?P<local_rank>\\d+)'
        sources: [console]                # optional: source kinds (console, worker, log)
        attrs: {reporter: agent}          # optional: static attributes added to the event
        path_format: "{path}/iter_{step:07d}"  # optional: rewrite the captured path
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

Matching is vectorized: per rule, a literal ``str.contains`` prefilter over the batch,
then the regex over the survivors only. Rules are tried in load order (pack files in
name order, rules in file order) and a record yields at most one event: the first rule
that matches it. So ``(source_id, offset)`` identifies an event.
"""

from __future__ import annotations

import email.utils
import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import polars as pl
import yaml

from ckptwatch.ingest import timestamps
from ckptwatch.naming import step_from_path
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
    prefilter: str
    file: str
    sources: tuple[str, ...] = ()
    attrs: dict[str, Any] = field(default_factory=dict)
    path_format: str | None = None
    match_examples: tuple[tuple[str, dict[str, Any]], ...] = ()
    no_match_examples: tuple[str, ...] = ()
    disable: bool = False  # a user's rule that removes the packaged rule of the same id
    source: str = ""  # the framework file and function the wording was read from
    during: str | None = None  # only records that are tracebacks through this code (save / load)


@dataclass(frozen=True)
class Frame:
    """A traceback frame of save or load code (a pack's ``frames:`` list). An event whose
    record is a traceback through such a frame gets ``attrs["during"] = during``
    (``save`` or ``load``): the detectors then know a save (or load) failed even when the
    trainer printed no save line. ``pattern`` is matched against the whole record."""

    during: str
    prefilter: str
    pattern: str
    file: str
    source: str = ""


def packaged_rule_files() -> list[str]:
    """Paths of the rule packs shipped inside the package, in load order."""
    pack_dir = resources.files("ckptwatch.rules") / "packs"
    return sorted(str(p) for p in pack_dir.iterdir() if p.name.endswith((".yaml", ".yml")))


def _parse_rule(raw: Any, file: str, index: int) -> Rule:
    if not isinstance(raw, dict):
        raise RuleError(file, f"#{index + 1}", "a rule must be a mapping")
    rid = raw.get("id")
    if not isinstance(rid, str) or not rid:
        raise RuleError(file, f"#{index + 1}", "missing 'id'")
    if raw.get("disable") is not None:
        if raw.get("disable") is not True or set(raw) - {"id", "disable", "description"}:
            raise RuleError(file, rid, "a disabling entry is {id: <packaged rule id>, disable: true} and nothing else")
        return Rule(id=rid, event="", pattern="", prefilter="", file=file, disable=True)
    for key in ("event", "pattern", "prefilter"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise RuleError(file, rid, f"missing or empty '{key}' (a string)")
    unknown = set(raw) - {"id", "event", "pattern", "prefilter", "sources", "attrs", "path_format", "examples",
                          "description", "source", "during"}
    if unknown:
        raise RuleError(file, rid, f"unknown field(s) {sorted(unknown)}")
    if raw["event"] not in EVENT_KINDS:
        raise RuleError(file, rid, f"event {raw['event']!r} is not a known kind; known: {sorted(EVENT_KINDS)}")
    sources = raw.get("sources") or []
    if not isinstance(sources, list) or not set(sources) <= _SOURCE_KINDS:
        raise RuleError(file, rid, f"'sources' must be a list drawn from {sorted(_SOURCE_KINDS)}")
    attrs = raw.get("attrs") or {}
    if not isinstance(attrs, dict) or not all(isinstance(v, str | int | float | bool) for v in attrs.values()):
        raise RuleError(file, rid, "'attrs' must be a mapping of names to strings, numbers or booleans")
    if raw.get("during") not in (None, "save", "load"):
        raise RuleError(file, rid, "'during' must be save or load (the rule then matches only tracebacks through that code)")
    if not isinstance(raw.get("source", ""), str):
        raise RuleError(file, rid, "'source' must be a string (the framework file and function the line comes from)")
    ex = raw.get("examples") or {}
    if not isinstance(ex, dict):
        raise RuleError(file, rid, "'examples' must be a mapping with 'match' and 'no_match' lists")
    matches: list[tuple[str, dict[str, Any]]] = []
    for item in ex.get("match") or []:
        if isinstance(item, str):
            matches.append((item, {}))
        elif isinstance(item, dict) and isinstance(item.get("line"), str):
            matches.append((item["line"], dict(item.get("expect") or {})))
        else:
            raise RuleError(file, rid, "each 'match' example is a string or {line: ..., expect: {...}}")
    no_matches = ex.get("no_match") or []
    if not all(isinstance(x, str) for x in no_matches):
        raise RuleError(file, rid, "each 'no_match' example is a string")
    if not matches:
        raise RuleError(file, rid, "needs at least one 'match' example")
    return Rule(
        id=rid, event=raw["event"], pattern=raw["pattern"], prefilter=raw["prefilter"], file=file,
        sources=tuple(sources), attrs=attrs, path_format=raw.get("path_format"),
        match_examples=tuple(matches), no_match_examples=tuple(no_matches), source=raw.get("source", ""),
        during=raw.get("during"),
    )


def load_rule_file(path: str) -> list[Rule]:
    """Parse one rule pack. Raises RuleError (file, rule id, reason) on any defect it can see
    without running the patterns; :func:`check_rules` runs them."""
    return load_pack(path)[0]


def load_pack(path: str) -> tuple[list[Rule], list[Frame]]:
    """Parse one rule pack: its rules and its traceback ``frames``. Raises RuleError."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.load(f, Loader=_YAML_LOADER)
    except OSError as e:
        raise RuleError(path, None, f"cannot read: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise RuleError(path, None, f"invalid YAML: {where}{getattr(e, 'problem', e)}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("rules", []), list) or not (
            doc.get("rules") or doc.get("frames")):
        raise RuleError(path, None, "expected a mapping with a 'rules' list")
    return [_parse_rule(r, path, i) for i, r in enumerate(doc.get("rules") or [])], _parse_frames(doc, path)


def _parse_frames(doc: dict, path: str) -> list[Frame]:
    raw = doc.get("frames") or []
    if not isinstance(raw, list):
        raise RuleError(path, None, "'frames' must be a list")
    out = []
    for i, f in enumerate(raw):
        where = f"frame #{i + 1}"
        if not isinstance(f, dict) or f.get("during") not in ("save", "load"):
            raise RuleError(path, where, "a frame is a mapping with 'during' (save or load), 'prefilter', 'pattern'")
        if set(f) - {"during", "prefilter", "pattern", "source", "description"}:
            raise RuleError(path, where, f"unknown field(s) {sorted(set(f) - {'during', 'prefilter', 'pattern', 'source'})}")
        for key in ("prefilter", "pattern"):
            if not isinstance(f.get(key), str) or not f[key]:
                raise RuleError(path, where, f"missing or empty '{key}' (a string)")
        out.append(Frame(during=f["during"], prefilter=f["prefilter"], pattern=f["pattern"], file=path,
                         source=str(f.get("source", ""))))
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
            try:
                probe.str.contains(r.pattern)
            except Exception as e:  # polars raises ComputeError with the regex crate's message
                raise RuleError(r.file, r.id, f"pattern does not compile: {str(e).splitlines()[0:4]}") from None
            self.rules.append(r)
        for f in self.frames:
            try:
                probe.str.contains(f.pattern)
            except Exception as e:
                raise RuleError(f.file, f"frame {f.prefilter!r}", f"pattern does not compile: {str(e).splitlines()[0:4]}") from None

    @classmethod
    def load(cls, extra: Iterable[str] = (), *, packaged: bool = True) -> RuleSet:
        """The packaged packs (unless ``packaged=False``) plus ``extra`` files or directories,
        whose rules override packaged rules of the same id (see the module docstring).

        Raises RuleError for a broken file, a duplicate id, or an override of an unknown id."""
        base: list[Rule] = []
        frames: list[Frame] = []
        for f in packaged_rule_files() if packaged else []:
            rules, fr = load_pack(f)
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
        pool = records.with_row_index("_rid")
        # every distinct prefilter in one pass (polars runs the columns in parallel); then each
        # rule looks only at the records its prefilter admits that no earlier rule claimed
        prefilters = list(dict.fromkeys(r.prefilter for r in self.rules))
        masks = records.select([pl.col("line").str.contains(p, literal=True).alias(str(i))
                                for i, p in enumerate(prefilters)])
        column = {p: str(i) for i, p in enumerate(prefilters)}
        source_masks: dict[tuple[str, ...], pl.Series] = {}
        claimed = pl.Series("claimed", [False] * records.height, dtype=pl.Boolean)
        parts: list[pl.DataFrame] = []
        for rule in self.rules:
            m = masks.get_column(column[rule.prefilter])
            if not m.any():
                continue
            if rule.sources:
                if rule.sources not in source_masks:
                    source_masks[rule.sources] = records["source_kind"].is_in(list(rule.sources))
                m = m & source_masks[rule.sources]
            m = m & ~claimed
            if not m.any():
                continue
            cand = pool.filter(m)
            hit = cand.filter(pl.col("line").str.contains(rule.pattern))
            if rule.during and not hit.is_empty():
                hit = hit.filter(pl.Series([d == rule.during for d in self._during(hit["line"])], dtype=pl.Boolean))
            if hit.is_empty():
                continue
            claimed = claimed.scatter(hit["_rid"], True)
            parts.append(self._events_for(rule, hit))
        if not parts:
            return empty_events()
        return pl.concat(parts).sort("_rid").drop("_rid")

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
        attrs_df = pl.DataFrame([_cast_attr(_coalesced(groups, n)) for n in attr_names]) if attr_names else pl.DataFrame()
        static = rule.attrs
        attrs_json = []
        rows = attrs_df.to_dicts() if attr_names else [{} for _ in range(hit.height)]
        multi = hit["line"].str.contains("\n", literal=True)
        during = self._during(hit["line"], multi) if multi.any() else [None] * hit.height
        at_line = _match_lines(hit["line"], rule.pattern, multi) if multi.any() else [0] * hit.height
        for row, code, n in zip(rows, during, at_line, strict=True):
            d = {k: v for k, v in row.items() if v is not None}
            d.update(static)
            if code is not None and "during" not in d:
                d["during"] = code
            if n:
                d["at_line"] = n
            attrs_json.append(json.dumps(d, sort_keys=True))
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
        if df["step"].is_null().any() and path.is_not_null().any():  # the step a path names by convention
            df = df.with_columns(pl.Series("step", [s if s is not None else step_from_path(p)
                                                    for s, p in zip(df["step"], path, strict=True)],
                                           dtype=pl.Int64))
        df = df.with_columns(
            path.alias("path"),
            pl.lit(rule.event).alias("kind"),
            pl.lit(rule.id).alias("rule_id"),
            pl.Series("attrs", attrs_json, dtype=pl.Utf8),
        )
        df = df.with_columns(pl.Series("dedup_key", _dedup_keys(df), dtype=pl.Utf8))
        return df.select(["_rid", *EVENT_SCHEMA]).cast({k: v for k, v in EVENT_SCHEMA.items()})  # type: ignore[arg-type]


    def _during(self, lines: pl.Series, multi: pl.Series | None = None) -> list[str | None]:
        """Per record: ``save`` / ``load`` when it is a traceback through a frame of that
        code (the first frame in pack order that matches), else None. ``multi``: which
        records have several lines, when the caller knows."""
        out: list[str | None] = [None] * len(lines)
        if multi is None:
            multi = lines.str.contains("\n", literal=True)
        if not self.frames or not multi.any():
            return out
        for f in self.frames:
            hit = multi & lines.str.contains(f.prefilter, literal=True) & lines.str.contains(f.pattern)
            for i in hit.arg_true().to_list():
                if out[i] is None:
                    out[i] = f.during
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
    if path is None:
        return None
    try:
        return fmt.format(path=path.rstrip("/"), step=step if step is not None else 0)
    except (ValueError, KeyError, IndexError):
        return path


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


def _dedup_keys(df: pl.DataFrame) -> list[str]:
    """The same worker line read twice (console with ``--tee`` and the per-rank file) gets
    the same key: job, local rank (else rank), the record text and, when the record has
    its own time, that time. Records without their own time (tracebacks) key on text alone,
    because the line before them differs between the two files; but in a file with no
    time at all (its mtime stands in) the file is part of the key."""
    keys = []
    cols = df.select("job", "host", "local_rank", "rank", "line", "ts", "ts_source", "source_id").iter_rows()
    for job, host, lr, rank, line, ts, src, sid in cols:
        who = f"l{lr}" if lr is not None else (f"r{rank}" if rank is not None else "-")
        # a file with no time at all (print() logs): the same line in two such files is two events
        # (a restarted run printing its save line again), not one seen twice
        when = ts.isoformat() if src == "line" and ts is not None else (f"@{sid}" if src == "mtime" else "")
        keys.append(hashlib.sha256(f"{job}\x1f{who}\x1f{when}\x1f{line}".encode()).hexdigest()[:20])
    return keys


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
            if rule.prefilter not in line:
                errors.append(RuleError(rule.file, rule.id, f"prefilter {rule.prefilter!r} is not in match example "
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
