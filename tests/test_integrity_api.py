"""The one-line API for training scripts, on a copy of the corpus' real DCP checkpoint: the
manifest it writes, what guard_resume refuses, the Hugging Face callback, the DCP save
wrapper, and the structured lines each prints, read back by the rules into the pipeline."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from integrity_support import SHARD, copy_checkpoint, flip_middle_byte

from ckptwatch.integrity.api import ManifestCallback, ResumeRefused, dcp_save, guard_resume, write_manifest
from ckptwatch.integrity.manifest import read_manifest
from ckptwatch.pipeline import extract_events
from ckptwatch.rules import RuleSet


def events_of(lines: list[str]) -> list[dict]:
    """The events the rules read from ``lines`` (as a worker log would hold them)."""
    import datetime as dt

    import polars as pl

    from ckptwatch.schema import RECORD_SCHEMA

    n = len(lines)
    t = dt.datetime(2026, 11, 30, 10, 0, tzinfo=dt.timezone.utc)
    records = pl.DataFrame({
        "source_id": ["s"] * n, "source_kind": ["worker"] * n, "file": ["rank0.log"] * n, "stream": [None] * n,
        "offset": list(range(n)), "job": ["job-a"] * n, "host": ["h"] * n, "rank": [None] * n,
        "local_rank": [None] * n, "pid": [None] * n, "ts": [t] * n, "ts_source": ["line"] * n,
        "ts_year_guessed": [False] * n, "ingest_ts": [t] * n, "line": lines,
    }, schema=RECORD_SCHEMA)
    from ckptwatch.ingest.stats import Stats

    out = extract_events(RuleSet.load([]), records, Stats())
    return [{**r, "attrs": json.loads(r["attrs"])} for r in out.iter_rows(named=True)]


def test_write_manifest_then_guard_resume_on_a_whole_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    ckpt = copy_checkpoint(tmp_path / "checkpoint-60")
    lines: list[str] = []
    m = write_manifest(ckpt, emit=lines.append)
    assert read_manifest(ckpt / "ckptwatch-manifest.json").files.keys() == m.files.keys()
    assert (m.step, m.world_size, len(m.files)) == (60, 4, 15)
    report = guard_resume(ckpt, emit=lines.append)
    assert report.verdict == "ok"
    evs = events_of(lines)
    assert [(e["kind"], e["step"], e["rank"], e["path"], e["attrs"].get("verdict")) for e in evs] == [
        ("integrity", 60, 3, str(ckpt), "ok"),   # write_manifest
        ("integrity", 60, 3, str(ckpt), "ok"),   # guard_resume's verify
        ("resume", 60, 3, str(ckpt), "ok"),
    ]
    assert evs[0]["attrs"] == {"world_size": 4, "verdict": "ok", "files": 15, "bytes": m.total_bytes,
                               "problems": 0, "manifest": "yes"}


def test_guard_resume_refuses_a_bit_flip_and_names_the_shard(tmp_path):
    ckpt = copy_checkpoint(tmp_path / "checkpoint-60")
    write_manifest(ckpt, emit=lambda line: None)
    flip_middle_byte(ckpt / SHARD)
    lines: list[str] = []
    with pytest.raises(ResumeRefused) as info:
        guard_resume(ckpt, emit=lines.append)
    assert str(info.value).startswith(f"refusing to resume from {ckpt}: corrupt: {SHARD}: hash_mismatch")
    assert info.value.report.verdict == "corrupt"
    (ev,) = events_of(lines)  # the integrity line; no resume line
    assert (ev["kind"], ev["step"], ev["attrs"]["verdict"], ev["attrs"]["problems"], ev["attrs"]["detail"]) == \
        ("integrity", 60, "corrupt", 1, f"{SHARD}: hash_mismatch")


def test_hf_callback_writes_a_manifest_after_each_save_on_the_main_process(tmp_path):
    out = tmp_path / "output"
    copy_checkpoint(out / "checkpoint-60")
    lines: list[str] = []
    cb = ManifestCallback(emit=lines.append)
    args = SimpleNamespace(output_dir=str(out))
    assert cb.on_train_begin(args, None, None) is None  # every other Trainer event is a no-op
    cb.on_save(args, SimpleNamespace(global_step=60, is_world_process_zero=False), None)
    assert not (out / "checkpoint-60" / "ckptwatch-manifest.json").exists() and lines == []
    cb.on_save(args, SimpleNamespace(global_step=60, is_world_process_zero=True), None)
    assert read_manifest(out / "checkpoint-60" / "ckptwatch-manifest.json").step == 60
    assert [e["kind"] for e in events_of(lines)] == ["integrity"]
    cb.on_save(args, SimpleNamespace(global_step=80, is_world_process_zero=True), None)  # no such directory
    assert lines[-1].startswith(f"ckptwatch: no manifest for {out / 'checkpoint-80'}: ")
    with pytest.raises(AttributeError):
        cb.not_an_event  # noqa: B018


def test_dcp_save_wraps_the_save_with_start_end_and_a_manifest(tmp_path):
    src = copy_checkpoint(tmp_path / "src")
    target = tmp_path / "step_40"

    def fake_save(state_dict, *, checkpoint_id):  # stands in for torch.distributed.checkpoint.save
        import shutil

        shutil.copytree(src, checkpoint_id)
        return "metadata"

    lines: list[str] = []
    assert dcp_save({}, target, rank=0, world_size=4, save=fake_save, emit=lines.append) == "metadata"
    evs = events_of(lines)
    assert [(e["kind"], e["step"], e["rank"], e["attrs"].get("world_size")) for e in evs] == [
        ("save_start", 40, 0, 4), ("save_end", 40, 0, 4), ("integrity", 40, 0, 4)]

    def failing_save(state_dict, *, checkpoint_id):
        raise OSError(28, "No space left on device")

    lines.clear()
    with pytest.raises(OSError):
        dcp_save({}, tmp_path / "step_60", rank=1, world_size=4, save=failing_save, emit=lines.append)
    assert [e["kind"] for e in events_of(lines)] == ["save_start"]  # an interrupted save, as the logs show it


def test_lines_reach_the_pipeline_a_refused_checkpoint_is_corrupt(tmp_path):
    """A job's guard_resume refuses a flipped checkpoint: the pipeline reports corrupt_checkpoint."""
    from ckptwatch.pipeline import diagnose

    ckpt = copy_checkpoint(tmp_path / "ckpt" / "checkpoint-60")
    write_manifest(ckpt, emit=lambda line: None)
    flip_middle_byte(ckpt / SHARD)
    log = tmp_path / "logs" / "job-b" / "rank0.log"
    log.parent.mkdir(parents=True)
    stamped: list[str] = []
    with pytest.raises(ResumeRefused):
        guard_resume(ckpt, rank=0, world_size=4, emit=lambda line: stamped.append(f"2026-11-30T10:40:00Z {line}\n"))
    log.write_text("".join(stamped))
    incidents, _ = diagnose([str(tmp_path / "logs")])
    assert [(i.kind, i.step, i.checkpoint_path, i.checkpoint_state["detail"]) for i in incidents] == [
        ("corrupt_checkpoint", 60, str(ckpt), f"{SHARD}: hash_mismatch")]
