"""A storage error on a path that has nothing to do with the checkpoint being saved is not
the save's failure (issue 36, item 2: a clean HF run whose wandb hit ENOSPC on /tmp while
checkpoint-200 was being written was paged as a torn save). Paths are compared by component."""

from __future__ import annotations

import pytest

from ckptwatch.detectors.events import Ev
from ckptwatch.detectors.saves import stored_elsewhere
from ckptwatch.pipeline import diagnose

HF_RUN = """\
[INFO|trainer.py:2134] 2026-11-20 10:00:00,001 >> ***** Running training *****
{{'loss': 2.1, 'learning_rate': 4e-05, 'epoch': 0.5}}
[INFO|trainer.py:3410] 2026-11-20 10:02:00,120 >> Saving model checkpoint to out/checkpoint-200
[INFO|configuration_utils.py:472] 2026-11-20 10:02:00,130 >> Configuration saved in out/checkpoint-200/config.json
{error}
[INFO|modeling_utils.py:2598] 2026-11-20 10:02:05,500 >> Model weights saved in out/checkpoint-200/model.safetensors
{{'loss': 1.9, 'learning_rate': 3e-05, 'epoch': 0.8}}
 60%|██████    | 300/500 [03:00<02:00,  1.66it/s]
[INFO|trainer.py:2383] 2026-11-20 10:05:00,000 >> Training completed. Do not forget to share your model
"""


def _run(tmp_path, error: str):
    (tmp_path / "train.log").write_text(HF_RUN.format(error=error))
    incidents, _ = diagnose([str(tmp_path)])
    return [(i.kind, i.step, i.root_cause.cls if i.root_cause else None) for i in incidents]


def test_wandb_out_of_space_on_tmp_during_a_save_that_went_on_is_no_incident(tmp_path):
    line = ("wandb: ERROR Error while calling W&B API: OSError: [Errno 28] No space left on device: "
            "'/tmp/wandb/run-20261120_100000-abc/files/output.log'")
    assert _run(tmp_path, line) == []


def test_the_same_error_on_the_checkpoints_own_temporary_folder_is_the_saves_failure(tmp_path):
    line = "OSError: [Errno 28] No space left on device: 'out/tmp-checkpoint-200/model.safetensors'"
    assert _run(tmp_path, line) == [("storage_failure_during_save", 200, "storage_error")]


def _ev(path):
    return Ev.from_row({"ts": None, "kind": "storage_error", "path": path, "attrs": "{}", "line": "x",
                        "rule_id": "errno.enospc", "source_id": "s", "offset": 0})


@pytest.mark.parametrize("error_path, checkpoint, elsewhere", [
    ("/tmp/wandb/run-1/files/output.log", "out/checkpoint-200", True),
    ("/scratch/logs/train.log", "/ckpt/run/step_10", True),
    ("out/tmp-checkpoint-200/model.safetensors", "out/checkpoint-200", False),   # a sibling of the save's
    ("checkpoint-1000/model.safetensors", "/data/run/checkpoint-1000", False),   # an upload named from the folder
    ("/ckpt", "/ckpt/run/step_10", False),                                       # the mount it lives on
    ("/data", "out/checkpoint-200", False),                                      # may be the relative one's mount
    ("bucket/run/ckpt/1000/params", "gs://bucket/run/ckpt/1000", False),         # gcsfs drops the scheme
    ("/ckpt/run/latest", "/ckpt/run/global_step100", False),                     # DeepSpeed's tag file beside it
    ("/tmp/wandb/x.log", None, False),                                           # no checkpoint path: unknown
])
def test_stored_elsewhere_compares_paths_by_component(error_path, checkpoint, elsewhere):
    assert stored_elsewhere(_ev(error_path), checkpoint) is elsewhere
