"""The vocabulary corpus (tests/vocab): frameworks' own wordings, read line by line.

The files must parse (header, five columns, known kinds, whole-number steps), every row must
name the source it was read from, and a floor holds under what the rule layer reads of them:
kind right over all rows, with every pack and generic only, and how many benign rows it
reads as an event. The floors are today's figures (benchmarks/vocab.py prints them); a
change that loses wordings, or reads benign lines as failures, fails here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptwatch.vocab import HEADER, classify, load_vocab

ROOT = Path(__file__).resolve().parent.parent
ROWS = load_vocab(ROOT / "tests" / "vocab")


def test_the_corpus_is_large_and_every_row_names_its_source():
    assert len(ROWS) >= 900 and len({r.framework for r in ROWS}) >= 60
    assert [r.where for r in ROWS if len(r.source.split()) < 2] == []
    assert sum(r.expect == "none" for r in ROWS) >= len(ROWS) // 7  # benign rows: what must not be read


def test_a_bad_row_is_refused_naming_file_and_line(tmp_path):
    (tmp_path / "x.tsv").write_text("\t".join(HEADER) + "\nkeras\tk f.py g\tsave_begun\t\tEpoch 1: saving\n")
    with pytest.raises(ValueError, match=r"x\.tsv:2: expect 'save_begun' is no event kind"):
        load_vocab(tmp_path)
    (tmp_path / "x.tsv").write_text("\t".join(HEADER) + "\nkeras\tk f.py g\tsave_start\n")
    with pytest.raises(ValueError, match=r"x\.tsv:2: 3 columns, want 5"):
        load_vocab(tmp_path)


def test_floor_under_what_the_rules_read():
    full = classify(ROWS)
    generic = classify(ROWS, ("system", "generic"))
    kind_right = sum(r.hit for r in full) / len(full)
    generic_right = sum(r.hit for r in generic) / len(generic)
    benign_read = [r.row.where for r in full if r.row.expect == "none" and not r.hit]
    assert kind_right >= 0.68, f"kind right {kind_right:.1%}"
    assert generic_right >= 0.65, f"generic only {generic_right:.1%}"
    assert len(benign_read) <= 3, benign_read
