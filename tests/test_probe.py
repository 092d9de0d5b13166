"""Issue 17, the seed fingerprint "a checkpoint that loads but yields constant or degenerate
outputs": the probe API (numpy in, one structured line out), its rule, the incident it
raises for the checkpoint resumed from, and the HF Trainer and Lightning callbacks."""

from __future__ import annotations

import datetime as dt
import math
from types import SimpleNamespace

import numpy as np
import pytest

from ckptwatch.detectors.headline import headline
from ckptwatch.ingest.layout import compile_template
from ckptwatch.integrity.logline import stamped
from ckptwatch.pipeline import PipelineOptions, diagnose
from ckptwatch.probe import check, line, report
from ckptwatch.probe.hf import ProbeCallback
from ckptwatch.probe.lightning import probe_callback

T0 = dt.datetime(2026, 12, 1, 10, 0, tzinfo=dt.timezone.utc)
RNG = np.random.default_rng(7)


@pytest.mark.parametrize(("outputs", "verdict", "reason"), [
    (RNG.normal(size=(8, 16)), "ok", ""),
    (np.full((8, 16), 0.25), "degenerate", "constant"),
    (np.where(np.eye(8, 16) > 0, np.nan, 1.0), "degenerate", "not_finite"),
    (np.tile(RNG.normal(size=16), (8, 1)), "degenerate", "collapsed"),
    (np.zeros((0, 16)), "degenerate", "empty"),
    # every weight one value (a new user's trial): rows differ, each row's outputs are one value
    (np.repeat(RNG.normal(size=(8, 1)) * 10, 16, axis=1), "degenerate", "flat"),
    (RNG.normal(size=(8, 1)), "ok", ""),  # one output per row (a regression head) is not flat
    ([1.0, 2.0, 3.0], "ok", ""),
])
def test_check_judges_the_outputs_alone(outputs, verdict, reason):
    r = check(outputs)
    assert (r.verdict, r.reason) == (verdict, reason)


def test_the_line_is_ckptwatchs_grammar():
    r = check(np.full((8, 8), 1.0))
    assert (r.values, r.rows, r.distinct_rows, r.finite, r.std) == (64, 8, 1, 1.0, 0.0)
    assert line(r, path="/ckpt/checkpoint-20", step=20, rank=0) == (
        "ckptwatch event=probe step=20 rank=0 verdict=degenerate reason=constant values=64 rows=8 distinct_rows=1 "
        "finite=1 std=0 path=/ckpt/checkpoint-20")
    with pytest.raises(ValueError, match="numeric"):
        check(np.array(["a", "b"]))
    assert math.isclose(check(RNG.normal(size=(4, 4))).finite, 1.0)


def _job(tmp_path, name: str, outputs) -> None:
    lines: list[str] = []
    report(outputs, path="out/checkpoint-20", step=20, rank=0, emit=lines.append)
    (tmp_path / name).mkdir()
    (tmp_path / name / "train.log").write_text(
        stamped("ckptwatch event=save_end step=10 rank=0 path=out/checkpoint-10", T0 - dt.timedelta(seconds=30))
        + stamped("ckptwatch event=save_end step=20 rank=0 path=out/checkpoint-20", T0)
        + "".join(stamped(x, T0 + dt.timedelta(seconds=60 + i)) for i, x in enumerate(lines)))


def test_a_degenerate_probe_after_a_resume_is_a_load_failure_of_that_checkpoint(tmp_path):
    _job(tmp_path, "healthy", RNG.normal(size=(8, 16)))
    _job(tmp_path, "broken", np.zeros((8, 16)))
    incidents, _ = diagnose([str(tmp_path)], PipelineOptions(template=compile_template("{job}/*.log")))
    (inc,) = incidents
    assert (inc.kind, inc.job, inc.step, inc.checkpoint_path) == ("load_failure", "broken", 20, "out/checkpoint-20")
    assert inc.checkpoint_state["errors"] == ["degenerate_outputs"]
    assert inc.checkpoint_state["probe"] == {"reason": "constant", "rows": 8, "distinct_rows": 1, "finite": 1.0,
                                             "std": 0.0}
    # no save incident says which checkpoint is good: the newest complete earlier save is
    assert inc.last_good_checkpoint == {"step": 10, "path": "out/checkpoint-10"}
    assert headline(inc) == ("load_failure: job broken: after loading step 20 (out/checkpoint-20), the outputs are "
                             "constant (std 0 over 8 rows, ckptwatch probe); last good: step 10 (out/checkpoint-10)")
    assert [c["command"] for c in inc.commands][:2] == ["ckptwatch verify out/checkpoint-20",
                                                        "ckptwatch verify out/checkpoint-10"]


@pytest.mark.parametrize(("outputs", "words"), [
    (np.tile(RNG.normal(size=16), (8, 1)), "the same for every input (1 distinct row(s) of 8, ckptwatch probe)"),
    (np.where(np.eye(8, 16) > 0, np.nan, 1.0), "not finite (NaN or inf) (0.9375 of the values finite, ckptwatch probe)"),
])
def test_the_headline_says_what_the_probe_saw(tmp_path, outputs, words):
    _job(tmp_path, "broken", outputs)
    (inc,), _ = diagnose([str(tmp_path)], PipelineOptions(template=compile_template("{job}/*.log")))
    assert headline(inc).endswith(f"the outputs are {words}; last good: step 10 (out/checkpoint-10)")


def test_the_hf_callback_probes_a_resumed_run_only():
    lines: list[str] = []
    cb = ProbeCallback(lambda model: model["w"] * 0.0, emit=lines.append)
    model = {"w": RNG.normal(size=(4, 4))}
    fresh = SimpleNamespace(global_step=0, is_world_process_zero=True)
    args = SimpleNamespace(output_dir="out", resume_from_checkpoint=None)
    cb.on_train_begin(args, fresh, None, model=model)
    assert lines == [] and cb.result is None
    cb.on_step_end(args, fresh, None)  # every other Trainer event is a no-op
    resumed = SimpleNamespace(global_step=20, is_world_process_zero=True)
    cb.on_train_begin(args, resumed, None, model=model)
    assert cb.result.reason == "constant"
    assert lines == ["ckptwatch event=resume step=20 path=out/checkpoint-20",
                     "ckptwatch event=probe step=20 verdict=degenerate reason=constant values=16 rows=4 "
                     "distinct_rows=1 finite=1 std=0 path=out/checkpoint-20"]
    boom = ProbeCallback(lambda model: 1 / 0, emit=lines.append)
    boom.on_train_begin(args, resumed, None, model=model)  # never stops training
    assert lines[-1] == "ckptwatch: probe of out/checkpoint-20 failed: ZeroDivisionError: division by zero"


def test_the_lightning_callback_probes_when_fit_was_given_a_checkpoint():
    lines: list[str] = []
    cb = probe_callback(lambda module: np.full((2, 3), np.nan), emit=lines.append)
    cb.on_train_start(SimpleNamespace(ckpt_path=None, global_rank=0, global_step=0), None)
    assert lines == []
    cb.on_train_start(SimpleNamespace(ckpt_path="ckpt/epoch=0-step=10.ckpt", global_rank=0, global_step=10), None)
    assert cb.result.reason == "not_finite" and lines[0] == "ckptwatch event=resume step=10 path=ckpt/epoch=0-step=10.ckpt"


class _Module:
    """What the callbacks see of a torch module: ``training``, ``eval()``, ``train(mode)``."""

    def __init__(self) -> None:
        self.training = True

    def eval(self):
        self.training = False
        return self

    def train(self, mode: bool = True):
        self.training = mode
        return self


def test_the_callbacks_probe_in_eval_mode_and_restore_training():
    seen: list[bool] = []
    model = _Module()

    def outputs(m):
        seen.append(m.training)
        return RNG.normal(size=(4, 4))

    ProbeCallback(outputs, emit=[].append).on_train_begin(
        SimpleNamespace(output_dir="out", resume_from_checkpoint=None),
        SimpleNamespace(global_step=20, is_world_process_zero=True), None, model=model)
    probe_callback(outputs, emit=[].append).on_train_start(
        SimpleNamespace(ckpt_path="ckpt/last.ckpt", global_rank=0, global_step=20), model)
    assert seen == [False, False] and model.training  # dropout off while probing, training mode back after
    frozen = _Module().eval()
    ProbeCallback(outputs, emit=[].append).on_train_begin(
        SimpleNamespace(output_dir="out", resume_from_checkpoint=None),
        SimpleNamespace(global_step=20, is_world_process_zero=True), None, model=frozen)
    assert not frozen.training  # a module in eval mode is left so
