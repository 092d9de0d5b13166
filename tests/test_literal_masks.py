"""The rules' one Aho-Corasick pass (``_literal_masks``) tells, for each rule's literal,
exactly the lines that hold it: the same as a ``contains`` per literal, on the packaged
literals (136 of which lie inside another) and on adversarial ones."""

from __future__ import annotations

import random

import polars as pl
import pytest

from ckptwatch.rules import RuleSet
from ckptwatch.rules.engine import _literal_masks


def expected(lines: pl.Series, literals: list[str]) -> dict[str, list[bool]]:
    out = {}
    for lit in literals:
        m = lines.str.contains(lit, literal=True).fill_null(False)
        if m.any():
            out[lit] = m.to_list()
    return out


def got(lines: pl.Series, literals: list[str]) -> dict[str, list[bool]]:
    return {k: v.to_list() for k, v in _literal_masks(lines, literals).items()}


def test_each_literal_has_its_own_lines():
    lines = pl.Series(["ab", "cd", "zz"])
    assert got(lines, ["ab", "cd"]) == {"ab": [True, False, False], "cd": [False, True, False]}


def test_the_packaged_literals_on_random_lines_built_from_them():
    literals = list(dict.fromkeys(lit for r in RuleSet.load().rules for lit in r.prefilters))
    rnd = random.Random(15)
    for _ in range(60):
        lines = []
        for _ in range(40):
            parts = [rnd.choice(literals) if rnd.random() < 0.4 else rnd.choice(["x", " ", "é", "🙂", "a1"])
                     for _ in range(rnd.randrange(0, 6))]
            text = "".join(parts)
            if text and rnd.random() < 0.3:  # cut a literal short
                text = text[: rnd.randrange(len(text))]
            lines.append(text)
        series = pl.Series("line", lines, dtype=pl.Utf8)
        assert got(series, literals) == expected(series, literals)


@pytest.mark.parametrize("literals, lines", [
    (["aaa", "aa", "a"], ["a", "aa", "aaaa", "baab", ""]),
    (["checkpoint", "heckpoint", "check", "point"], ["checkpoint", "xheckpoin", "point check", "CHECKPOINT"]),
    (["über", "ber", "é"], ["Über über", "ber", "é", "e"]),
])
def test_literals_inside_each_other_and_non_ascii(literals, lines):
    series = pl.Series("line", lines, dtype=pl.Utf8)
    assert got(series, literals) == expected(series, literals)


def test_a_rule_only_sees_the_lines_that_hold_its_literal(tmp_path):
    """A rule whose pattern would match a line without its literal is not run on it: the
    literal is the rule's gate, as the rule file says; a case-insensitive pattern's literal
    is found in any case (``beta`` for ``BETA``), a case-sensitive one's only as written."""
    from ckptwatch.schema import RECORD_SCHEMA

    (tmp_path / "p.yaml").write_text(
        "family: demo\ndescription: demo\nrules:\n"
        "  - id: demo.alpha\n    event: process_exit\n    prefilter: alpha\n"
        "    pattern: '(?:ALPHA|alpha) (?P<exitcode>\\d+)'\n    examples:\n      match:\n        - line: alpha 3\n"
        "  - id: demo.beta\n    event: process_exit\n    prefilter: BETA\n"
        "    pattern: '(?i)beta (?P<exitcode>\\d+)'\n    examples:\n      match:\n        - line: BETA 4\n")
    rules = RuleSet.load([str(tmp_path / "p.yaml")], packaged=False)
    row = {c: None for c in RECORD_SCHEMA}
    records = pl.DataFrame([dict(row, line=text, source_kind="worker", source_id="s", offset=i)
                            for i, text in enumerate(["alpha? beta 7", "BETA 4", "alpha 3", "ALPHA 5"])],
                           schema=RECORD_SCHEMA)
    events = rules.apply(records)
    assert list(zip(events["rule_id"], events["offset"], strict=True)) == [
        ("demo.beta", 0), ("demo.beta", 1), ("demo.alpha", 2)]
