"""Saves of a step the logs do not show, one after another (Keras' ModelCheckpoint saving
'best' after each epoch; ColossalAI's 'Start saving model checkpoint with running states' at
each interval), in pastes whose lines have no time of their own (they inherit the next dated
line's): each save is its own, ended by the training that follows it, and the failure after
the last one is that save's, in file order."""

from __future__ import annotations

from ckptwatch.pipeline import diagnose

def bar(e: int) -> str:
    return "1563/1563 " + "━" * 20 + f" 48s 30ms/step - accuracy: 0.{76 + e} - loss: {0.64 / e}"


def found(path) -> list[tuple]:
    incidents, _ = diagnose([str(path)])
    return [(i.kind, i.step, i.root_cause.cls if i.root_cause else None, i.status) for i in incidents]


def keras(epochs_saved: int, *, then: list[str]) -> str:
    lines = []
    for e in range(1, epochs_saved + 1):
        lines += [f"Epoch {e}/30", bar(e), f"Epoch {e}: val_loss improved from 0.9 to 0.{9 - e}, saving model to ckpt/best.keras"]
    return "\n".join(lines + then) + "\n"


def test_keras_killed_in_the_next_epoch_after_its_saves_is_clean(tmp_path):
    """The next epoch's bar is Keras' ('   1/1563   42s 27ms/step', padded to the total's
    width): a progress line of its own, not the indented rest of 'Epoch 5/30'."""
    (tmp_path / "console.log").write_text(keras(4, then=[bar(5), "Epoch 5/30",
                                                          "   1/1563                      42s 27ms/step - loss: 0.4012",
                                                          "Killed"]))
    assert found(tmp_path) == []


def test_killed_right_after_the_last_save_line_is_that_saves_incident(tmp_path):
    (tmp_path / "console.log").write_text(keras(4, then=["Killed"]))
    assert found(tmp_path) == [("interrupted_save", None, "signal", "open")]


def test_a_failure_in_the_second_save_of_no_known_step_is_its_own(tmp_path):
    """ColossalAI: the first save ends ('Saved checkpoint at epoch 0 step 1000'), training goes
    on, the next save runs out of GPU memory; the lines before torchrun's are undated."""
    (tmp_path / "output.txt").write_text("\n".join([
        "Epoch 0:  21%|██        | 999/4800 [2:36:18<9:55:14,  9.40s/it, Loss=1.3594]",
        "Start saving model checkpoint with running states",
        "Saved checkpoint at epoch 0 step 1000 at folder /ckpt/colossal-llama-13b",
        "Epoch 0:  42%|████▏     | 1999/4800 [5:19:02<7:18:44,  9.40s/it, Loss=1.2831]",
        "Start saving model checkpoint with running states",
        "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.02 GiB. GPU 0 has a total "
        "capacity of 79.33 GiB of which 607.81 MiB is free.",
        "W0305 19:44:21.120000 140012458207040 torch/distributed/elastic/multiprocessing/api.py:858] Sending "
        "process 3181905 closing signal SIGTERM",
    ]) + "\n")
    assert found(tmp_path) == [("interrupted_save", None, "cuda_oom", "open")]
