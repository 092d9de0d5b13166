"""The accuracy targets of benchmarks/accuracy.py (recall >= 95 %, right root-cause class and
rank >= 90 %, no false incident on a clean scenario), held in CI by the per-case tests:
every case with ground truth (the shared corpus, the real-run corpus in each launch layout,
the hand-written scenarios) is diagnosed by a test that asserts each expected incident with
its class and rank and nothing forbidden (tests/test_corpus.py, tests/test_realruns.py,
tests/test_scenarios.py), which is 100 % on every measure. This file checks that the set of
cases is what the targets are about, and that no case escapes those tests."""

from __future__ import annotations

from pathlib import Path

import test_realruns
import test_scenarios

from ckptwatch.groundtruth import load_cases

ROOT = Path(__file__).resolve().parent.parent


def test_the_cases_are_many_varied_and_a_third_clean():
    cases = load_cases(ROOT)
    frameworks = {c.framework for c in cases}
    clean = [c for c in cases if not c.incidents]
    assert len(cases) >= 40 and len(frameworks) >= 10 and len(clean) * 3 >= len(cases), (len(cases), frameworks)


def test_every_case_is_asserted_in_full_by_a_per_case_test():
    cases = load_cases(ROOT)
    realruns = {(c.name, c.layout) for c in test_realruns.CASES}
    asserted = ({(c.name, c.layout) for c in test_realruns.CLEAN}
                | {(c.name, c.layout) for c in test_realruns.CASES if c.incidents})
    assert {(c.name, c.layout) for c in cases if c.source == "realruns"} == realruns == asserted
    assert {c.name for c in cases if c.source == "scenarios" and c.status != "pending-rules"} == set(test_scenarios.NAMES)
    corpus = sorted(p.name for p in (ROOT / "examples" / "corpus").iterdir() if (p / "expected.json").exists())
    assert [c.name for c in cases if c.source == "corpus"] == corpus
