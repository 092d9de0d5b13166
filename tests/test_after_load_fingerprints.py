"""Issue 17, seed fingerprints of a load that "worked": an empty ``EmbeddingBag`` input and
optimizer state of other shapes at the first step after a resume are load failures of the
checkpoint loaded, and nothing in a job that loaded none."""

from __future__ import annotations

from ckptwatch.detectors.headline import headline
from ckptwatch.ingest.layout import compile_template
from ckptwatch.pipeline import PipelineOptions, diagnose

RESUMED = ("[INFO|trainer.py:2400] 2026-12-01 10:00:00,000 >> Loading model from out/checkpoint-20.\n"
           "[INFO|trainer.py:1631] 2026-12-01 10:00:01,000 >>   Continuing training from global step 20\n")
FRESH = "[INFO|trainer.py:3984] 2026-12-01 10:00:00,000 >> Saving model checkpoint to out/checkpoint-10\n"
TRACE = "Traceback (most recent call last):\n  File \"train.py\", line 80, in <module>\n    out = step(batch)\n"


def _diagnose(tmp_path, jobs: dict[str, str]):
    for job, text in jobs.items():
        (tmp_path / job).mkdir()
        (tmp_path / job / "train.log").write_text(text)
    return diagnose([str(tmp_path)], PipelineOptions(template=compile_template("{job}/*.log")))[0]


def test_an_empty_embedding_bag_after_a_resume_blames_the_checkpoint_loaded(tmp_path):
    err = "RuntimeError: 'lengths' argument in 'EmbeddingBag' is empty\n"
    incidents = _diagnose(tmp_path, {"resumed": RESUMED + TRACE + err, "fresh": FRESH + TRACE + err})
    (inc,) = incidents  # the job that loaded nothing has an ordinary bug, not a load failure
    assert (inc.kind, inc.job, inc.step, inc.checkpoint_path) == ("load_failure", "resumed", 20, "out/checkpoint-20")
    assert inc.checkpoint_state["errors"] == ["embedding_bag_empty_lengths"] and inc.checkpoint_state["after_load"]
    assert headline(inc) == ("load_failure: job resumed: after loading step 20 (out/checkpoint-20), the first use "
                             "failed: embedding_bag_empty_lengths")
    assert inc.remediation.startswith("The job loaded out/checkpoint-20, then failed at its first use "
                                      "(embedding_bag_empty_lengths)")


def test_optimizer_state_of_other_shapes_at_the_first_step_after_a_resume(tmp_path):
    err = "RuntimeError: output with shape [64, 32] doesn't match the broadcast shape [128, 32]\n"
    (inc,) = _diagnose(tmp_path, {"resumed": RESUMED + TRACE + err, "fresh": FRESH + TRACE + err})
    assert (inc.kind, inc.job, inc.checkpoint_state["errors"]) == ("load_failure", "resumed",
                                                                   ["optimizer_state_shape_mismatch"])
