"""Issue 17, exact commands: every incident carries the commands to paste, with its real
paths, in its trainer's own terms (flags and files cited in ckptwatch/detectors/commands.py).

Incidents of real runs of HF Trainer, DeepSpeed, Lightning and Megatron-LM-shaped logs, and
of the scenario library; each command is checked whole.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptwatch.detectors.commands import framework
from ckptwatch.groundtruth import restore_mtimes
from ckptwatch.pipeline import diagnose

ROOT = Path(__file__).resolve().parents[1]
C02 = "/tmp/corpus-work/02-sigkill-mid-save/checkpoints"


@pytest.fixture(scope="module")
def incidents():
    restore_mtimes(ROOT)
    cache: dict[str, list] = {}

    def get(folder: str, kind: str):
        if folder not in cache:
            cache[folder] = diagnose([str(ROOT / folder)])[0]
        return next(i for i in cache[folder] if i.kind == kind)

    return get


def _cmds(inc, purpose=None):
    return [c["command"] for c in inc.commands if purpose is None or c["purpose"] == purpose]


def test_hf_trainer_resumes_with_resume_from_checkpoint(incidents):
    inc = incidents("tests/fixtures/realruns/hf-accelerate-sigkill-mid-save/logs", "interrupted_save")
    assert framework(inc) == "hf"
    assert _cmds(inc) == ["ckptwatch verify out/checkpoint-20", "mv out/checkpoint-20 out/checkpoint-20.partial",
                          "ckptwatch verify out/checkpoint-10", "--resume_from_checkpoint out/checkpoint-10"]
    # the paths are the ones the trainer logged
    lines = "\n".join(e.line for e in inc.evidence)
    assert "out/checkpoint-20" in lines


def test_deepspeed_resumes_through_its_latest_file_and_converts_for_another_world_size(incidents):
    inc = incidents("tests/fixtures/realruns/deepspeed-zero1-sigkill-mid-save/logs", "poisoned_resume")
    assert framework(inc) == "deepspeed"
    assert _cmds(inc, "resume") == ["echo global_step10 > ckpt/latest"]
    ws = incidents("tests/fixtures/realruns/deepspeed-zero1-world-size-mismatch/logs", "world_size_mismatch")
    assert _cmds(ws, "reshard") == ["python -m deepspeed.checkpoint.ds_to_universal --input_folder ckpt/global_step20 "
                                    "--output_folder ckpt/global_step20_universal"]
    (src,) = [c["source"] for c in ws.commands if c["purpose"] == "reshard"]
    assert '"checkpoint": {"load_universal": true}' in src


def test_lightning_resumes_with_ckpt_path(incidents):
    inc = incidents("tests/fixtures/realruns/lightning-ddp-sigkill-mid-save/logs", "poisoned_resume")
    assert framework(inc) == "lightning"
    good = "/work/realruns/work2/runs/lightning-ddp-sigkill-mid-save/ckpt/epoch=0-step=10.ckpt"
    assert _cmds(inc) == [
        "ckptwatch verify /work/realruns/work2/runs/lightning-ddp-sigkill-mid-save/ckpt/epoch=0-step=20.ckpt",
        f"ckptwatch verify {good}", f"--ckpt_path {good}"]


def test_megatron_resumes_through_its_tracker_file_or_ckpt_step(incidents):
    inc = incidents("examples/corpus/02-sigkill-mid-save/logs", "interrupted_save")
    assert framework(inc) == "megatron"
    assert _cmds(inc, "resume") == [f"echo 20 > {C02}/latest_checkpointed_iteration.txt",
                                    f"--load {C02} --ckpt-step 20"]
    assert _cmds(inc, "verify") == [f"ckptwatch verify {C02}/iter_0000040", f"ckptwatch verify {C02}/iter_0000020"]
    assert _cmds(inc, "quarantine") == [f"mv {C02}/iter_0000040 {C02}/iter_0000040.partial"]


def test_a_save_cut_off_by_a_collective_timeout_gets_the_trainers_timeout_setting(incidents):
    meg = incidents("tests/scenarios/megatron-nccl-timeout-during-save/logs", "interrupted_save")
    assert (meg.root_cause.cls, framework(meg)) == ("collective_timeout", "megatron")
    assert _cmds(meg, "timeout") == ["--distributed-timeout-minutes 120"]
    plain = incidents("examples/corpus/03-collective-timeout/logs", "interrupted_save")
    assert _cmds(plain, "timeout") == ["torch.distributed.init_process_group(backend, "
                                       "timeout=datetime.timedelta(minutes=120))"]


def test_a_world_size_change_without_a_path_still_says_which_size_to_relaunch_with(incidents):
    inc = incidents("examples/corpus/06-world-size-mismatch/logs", "world_size_mismatch")
    assert _cmds(inc) == ["relaunch with world size 4 (torchrun --nnodes × --nproc-per-node = 4)"]


def test_commands_reach_the_report_and_the_stored_row(incidents, tmp_path):
    import io

    from rich.console import Console

    from ckptwatch.sinks import report
    from ckptwatch.sinks.duckdb_store import Store

    inc = incidents("tests/fixtures/realruns/hf-accelerate-sigkill-mid-save/logs", "interrupted_save")
    out = io.StringIO()
    report.render_text([inc], Console(file=out, width=300, highlight=False))
    assert "    --resume_from_checkpoint out/checkpoint-10  # resume: transformers TrainingArguments" in out.getvalue()
    store = Store(str(tmp_path / "x.duckdb"))
    try:
        store.upsert_incidents([inc])
        from ckptwatch.history.queries import load_incident

        again, _ = load_incident(store.raw, inc.id)
        assert again.commands == inc.commands
    finally:
        store.close()


def test_an_hf_deepspeed_save_is_quarantined_as_the_folder_the_trainer_looks_up(incidents):
    """A new user's trial: DeepSpeed's tag folder inside an HF checkpoint was moved aside
    alone, leaving out/checkpoint-500 for HF's newest-checkpoint lookup."""
    import dataclasses

    from ckptwatch.detectors.commands import checkpoint_dir, commands

    inc = incidents("tests/fixtures/realruns/hf-accelerate-sigkill-mid-save/logs", "interrupted_save")
    inner = dataclasses.replace(inc, checkpoint_path="out/checkpoint-500/global_step500", status="open")
    assert [c["command"] for c in commands(inner) if c["purpose"] == "quarantine"] == [
        "mv out/checkpoint-500 out/checkpoint-500.partial"]
    assert checkpoint_dir("ckpt/global_step20") == "ckpt/global_step20"  # plain DeepSpeed: the tag folder


def test_an_object_store_checkpoint_gets_the_stores_own_commands_and_no_credential(incidents):
    """Issue 35: 's3://u:pw@host/…' was normalized to 's3:/u:pw@host/…', which kept the
    password out of the redactor's sight and made 'mv' / 'echo >' write local files."""
    import dataclasses

    from ckptwatch.detectors.commands import commands

    inc = incidents("tests/fixtures/realruns/hf-accelerate-sigkill-mid-save/logs", "interrupted_save")
    for path, want in (("s3://ops:hunter2@bucket/run7/checkpoint-500",
                        ["aws s3 mv --recursive s3://bucket/run7/checkpoint-500 s3://bucket/run7/checkpoint-500.partial"]),
                       ("gs://bucket/run7/checkpoint-500/",
                        ["gsutil -m mv gs://bucket/run7/checkpoint-500 gs://bucket/run7/checkpoint-500.partial"]),
                       ("az://container/run7/checkpoint-500", [])):
        remote = dataclasses.replace(inc, checkpoint_path=path, status="open",
                                     last_good_checkpoint={"step": 400, "path": "s3://ops:hunter2@bucket/run7/checkpoint-400"})
        cmds = commands(remote)
        assert [c["command"] for c in cmds if c["purpose"] == "quarantine"] == want, path
        assert not [c for c in cmds if c["purpose"] == "verify"]  # verify reads local folders
        assert all("hunter2" not in c["command"] and "s3:/b" not in c["command"] for c in cmds)
        assert [c["command"] for c in cmds if c["purpose"] == "resume"] == [
            "--resume_from_checkpoint s3://bucket/run7/checkpoint-400"]
