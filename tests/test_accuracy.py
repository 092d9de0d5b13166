"""The accuracy targets of benchmarks/accuracy.py, asserted over every scenario the
repository holds (the shared corpus, the real-run corpus in each launch layout, the
hand-written scenarios): recall >= 95 %, right root-cause class and rank >= 90 %, no false
incident on a clean scenario; at least 40 cases over at least 10 frameworks, a third clean."""

from __future__ import annotations

from pathlib import Path

from ckptwatch.groundtruth import load_cases, score
from ckptwatch.pipeline import diagnose

ROOT = Path(__file__).resolve().parent.parent


def test_accuracy_targets_over_every_scenario():
    cases = load_cases(ROOT)
    frameworks = {c.framework for c in cases}
    clean = [c for c in cases if not c.incidents]
    assert len(cases) >= 40 and len(frameworks) >= 10 and len(clean) * 3 >= len(cases), (len(cases), frameworks)
    expected = found = exact = false_clean = 0
    misses = []
    for case in cases:
        incidents, _ = diagnose([str(case.logs)])
        s = score(case, [i.to_dict() for i in incidents])
        expected, found, exact = expected + s.expected, found + s.found, exact + s.exact
        if not case.incidents:
            false_clean += s.false
        if s.missed or (not case.incidents and s.false):
            misses.append((case.name, case.layout, s.missed, s.extra))
    assert found / expected >= 0.95, misses
    assert exact / expected >= 0.90, misses
    assert false_clean == 0, misses
