"""ckptwatch's own structured lines (integrity.logline) read back exactly by the rules, and
integrity events in the detectors: ``corrupt_checkpoint``, the checkpoint marked not-good
for ``last_good_checkpoint`` and ``poisoned_resume``, resolved by a good re-verification."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from ckptwatch.integrity.logline import emit_to_stderr, format_line
from ckptwatch.pipeline import diagnose

T0 = dt.datetime(2026, 11, 30, 10, 20, 0, tzinfo=dt.timezone.utc)


def stamped(seconds: float, line: str) -> str:
    t = T0 + dt.timedelta(seconds=seconds)
    return f"{t.strftime('%Y-%m-%dT%H:%M:%S.%f')}Z {line}\n"


def test_emitted_line_is_read_back_exactly(tmp_path, capsys):
    emit_to_stderr(format_line("integrity", "/ckpt/run 7/checkpoint-60", step=60, rank=0, world_size=4,
                               verdict="corrupt", files=15, bytes=1220311, problems=2, manifest="yes",
                               detail='pytorch_model_fsdp_0/__2_0.distcp: "hash_mismatch"'),
                   now=T0)
    log = tmp_path / "job-a" / "rank0.log"
    log.parent.mkdir()
    log.write_text(capsys.readouterr().err)
    from ckptwatch.ingest.watcher import SourceWatcher
    from ckptwatch.pipeline import extract_events
    from ckptwatch.rules import RuleSet

    w = SourceWatcher([str(log)])
    records = w.poll(final=True)
    w.close()
    ev = extract_events(RuleSet.load([]), records, w.stats).row(0, named=True)
    assert (ev["kind"], ev["rule_id"], ev["step"], ev["rank"], ev["path"], ev["ts"]) == \
        ("integrity", "ckptwatch.integrity", 60, 0, "/ckpt/run 7/checkpoint-60", T0)
    assert json.loads(ev["attrs"]) == {"world_size": 4, "verdict": "corrupt", "files": 15, "bytes": 1220311,
                                       "problems": 2, "manifest": "yes",
                                       "detail": "pytorch_model_fsdp_0/__2_0.distcp: 'hash_mismatch'"}


def test_format_line_refuses_what_cannot_be_one_line():
    with pytest.raises(ValueError, match="unknown ckptwatch event 'saved'"):
        format_line("saved", "/ckpt")
    with pytest.raises(ValueError, match="line break"):
        format_line("save_end", "/ckpt/a\nb")


def _saver(root: Path) -> None:
    """job-a, 2 ranks: checkpoint-20 and checkpoint-40 saved completely (structured lines)."""
    for rank in (0, 1):
        lines = []
        for i, step in enumerate((20, 40)):
            path = f"/ckpt/out/checkpoint-{step}"
            lines.append(stamped(i * 60 + rank * 0.1, format_line("save_start", path, step=step, rank=rank, world_size=2)))
            lines.append(stamped(i * 60 + 5 + rank * 0.1, format_line("save_end", path, step=step, rank=rank,
                                                                      world_size=2, files=6, bytes=4096)))
        d = root / "job-a"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"rank{rank}.log").write_text("".join(lines))


def _verify(root: Path, seconds: float, verdict: str) -> None:
    with (root / "verify" / "ckptwatch-verify.log").open("a") as f:
        f.write(stamped(seconds, format_line(
            "integrity", "/ckpt/out/checkpoint-40", step=40, verdict=verdict, files=6, bytes=4096,
            problems=0 if verdict == "ok" else 1, manifest="yes",
            detail=None if verdict == "ok" else "pytorch_model_fsdp_0/__1_0.distcp: hash_mismatch")))


def _resume(root: Path, seconds: float, job: str) -> None:
    d = root / job
    d.mkdir(parents=True, exist_ok=True)
    (d / "rank0.log").write_text(stamped(seconds, format_line("resume", "/ckpt/out/checkpoint-40", step=40, rank=0,
                                                              world_size=2)))


def _run(root: Path) -> dict[str, dict]:
    incidents, stats = diagnose([str(root)], _options(root))
    assert stats.errors == []
    return {i.kind: i.to_dict() for i in incidents}


def _options(root: Path):
    from ckptwatch.ingest.layout import compile_template
    from ckptwatch.pipeline import PipelineOptions

    return PipelineOptions(template=compile_template("{job}/*.log"))


def test_corrupt_checkpoint_marks_it_bad_and_a_resume_from_it_is_poisoned(tmp_path):
    _saver(tmp_path)
    (tmp_path / "verify").mkdir()
    _verify(tmp_path, 300, "corrupt")
    _resume(tmp_path, 400, "job-b")
    got = _run(tmp_path)
    assert set(got) == {"corrupt_checkpoint", "poisoned_resume"}
    cc, pr = got["corrupt_checkpoint"], got["poisoned_resume"]
    assert (cc["job"], cc["step"], cc["checkpoint_path"], cc["status"], cc["severity"]) == \
        ("verify", 40, "/ckpt/out/checkpoint-40", "open", "critical")
    assert cc["checkpoint_state"] == {"verdict": "corrupt", "files": 6, "bytes": 4096, "problems": 1,
                                      "detail": "pytorch_model_fsdp_0/__1_0.distcp: hash_mismatch", "manifest": True}
    assert cc["last_good_checkpoint"] == {"step": 20, "path": "/ckpt/out/checkpoint-20"}
    assert cc["first_ts"] == (T0 + dt.timedelta(seconds=300)).isoformat()
    assert (pr["job"], pr["step"], pr["checkpoint_state"]["marked_bad_by"], pr["checkpoint_state"]["bad_kind"]) == \
        ("job-b", 40, cc["id"], "corrupt_checkpoint")
    assert pr["last_good_checkpoint"] == {"step": 20, "path": "/ckpt/out/checkpoint-20"}


def test_good_reverification_resolves_it_and_a_later_resume_is_clean(tmp_path):
    _saver(tmp_path)
    (tmp_path / "verify").mkdir()
    _verify(tmp_path, 300, "corrupt")
    _verify(tmp_path, 350, "ok")  # restored from a good copy
    _resume(tmp_path, 400, "job-b")
    got = _run(tmp_path)
    assert set(got) == {"corrupt_checkpoint"}
    assert got["corrupt_checkpoint"]["status"] == "resolved"


def test_unverifiable_and_ok_raise_nothing(tmp_path):
    _saver(tmp_path)
    (tmp_path / "verify").mkdir()
    _verify(tmp_path, 300, "unverifiable")
    _verify(tmp_path, 310, "ok")
    _resume(tmp_path, 400, "job-b")
    assert _run(tmp_path) == {}
