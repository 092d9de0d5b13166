"""The real-run corpus (tests/fixtures/realruns, see its README): every clean run, in every
launch layout, gives no incident at all (HF Trainer's saves have no end line: training
finishing ends them), and every faulty run is diagnosed in full: each expected incident
with its root-cause class and rank, and nothing false."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptwatch.groundtruth import load_cases, score
from ckptwatch.pipeline import diagnose

ROOT = Path(__file__).resolve().parent.parent
CASES = [c for c in load_cases(ROOT) if c.source == "realruns"]
CLEAN = [c for c in CASES if not c.incidents]


def _id(c) -> str:
    return f"{c.name}[{c.layout}]"


def test_the_corpus_has_the_variety_it_claims():
    assert len(CASES) >= 30 and len(CLEAN) >= len(CASES) // 3
    assert {c.name.split("-")[0] for c in CASES} >= {"torch", "hf", "lightning", "safetensors", "deepspeed"}
    assert {c.layout for c in CASES} >= {"a-torchrun-tee", "b1-role-trainer-ranks-filter", "b2-prefix-template",
                                         "c-two-nodes", "e1-srun-label", "e2-pdsh-two-nodes"}


@pytest.mark.parametrize("case", CLEAN, ids=_id)
def test_a_clean_real_run_gives_no_incident(case):
    incidents, stats = diagnose([str(case.logs)])
    assert [(i.kind, i.step) for i in incidents] == []
    assert stats.errors == []


@pytest.mark.parametrize("case", [c for c in CASES if c.incidents], ids=_id)
def test_a_faulty_real_run_is_diagnosed_in_full(case):
    incidents, _ = diagnose([str(case.logs)])
    s = score(case, [i.to_dict() for i in incidents])
    assert (s.found, s.exact, s.false) == (s.expected, s.expected, 0), s
