"""Shared fixtures. The corpus scenarios are the verbatim copies bundled under
``examples/corpus`` (see examples/corpus/PROVENANCE.md)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "examples" / "corpus"
SCENARIOS = sorted(p.name for p in CORPUS.iterdir() if (p / "expected.json").exists())
#: Incident kinds built so far; the others in expected.json come with later issues.
SAVE_KINDS = {"interrupted_save", "partial_checkpoint", "storage_failure_during_save", "stalled_save"}


def expected(scenario: str) -> dict:
    return json.loads((CORPUS / scenario / "expected.json").read_text())


@pytest.fixture
def copy_scenario(tmp_path):
    """Copy a scenario's logs into a writable temp dir and return the copy's path."""

    def _copy(scenario: str, sub: str = "") -> Path:
        src = CORPUS / scenario / "logs" / sub
        dst = tmp_path / scenario / sub
        shutil.copytree(src, dst)
        for p in dst.rglob("*"):
            p.chmod(0o755 if p.is_dir() else 0o644)
        return dst

    return _copy
