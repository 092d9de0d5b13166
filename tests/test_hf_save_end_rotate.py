"""HF Trainer: "Deleting older checkpoint [...] due to args.save_total_limit" is logged by
Trainer._rotate_checkpoints after the new checkpoint was fully written, so it ends the save
under way (new-user report: a rank crashing 30 s after such a save paged interrupted_save);
and a CUDA error traceback is a root cause, not 'unknown'."""

from __future__ import annotations

from ckptwatch.pipeline import diagnose

CONSOLE = """\
I0601 10:00:00.100000 7001 torch/distributed/run.py:793] Using nproc_per_node=2.
[default0]:{'loss': 1.9, 'grad_norm': 1.23, 'learning_rate': 4.9e-05, 'epoch': 0.1}
[default0]:[INFO|trainer.py:3984] 2024-06-01 10:01:00,100 >> Saving model checkpoint to /scratch/out/checkpoint-100
[default0]:[INFO|modeling_utils.py:2627] 2024-06-01 10:01:03,000 >> Model weights saved in /scratch/out/checkpoint-100/model.safetensors
[default0]:{'loss': 1.8, 'grad_norm': 1.2, 'learning_rate': 4.8e-05, 'epoch': 0.2}
[default0]:[INFO|trainer.py:3984] 2024-06-01 10:02:00,100 >> Saving model checkpoint to /scratch/out/checkpoint-200
[default0]:[INFO|modeling_utils.py:2627] 2024-06-01 10:02:03,000 >> Model weights saved in /scratch/out/checkpoint-200/model.safetensors
[default0]:[INFO|tokenization_utils_base.py:2646] 2024-06-01 10:02:03,100 >> tokenizer config file saved in /scratch/out/checkpoint-200/tokenizer_config.json
ROTATE
[default1]:[rank1]: Traceback (most recent call last):
[default1]:[rank1]:   File "/workspace/train.py", line 88, in <module>
[default1]:[rank1]:     trainer.train()
[default1]:[rank1]:   File "/opt/conda/lib/python3.11/site-packages/transformers/trainer.py", line 3740, in training_step
[default1]:[rank1]:     loss = self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
[default1]:[rank1]: RuntimeError: CUDA error: an illegal memory access was encountered
W0601 10:02:41.000000 7001 torch/distributed/elastic/multiprocessing/api.py:897] Sending process 7010 closing signal SIGTERM
E0601 10:02:41.500000 7001 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) local_rank: 1 (pid: 7011) of binary: /opt/conda/bin/python
"""
ROTATE = ("[default0]:[INFO|trainer.py:4076] 2024-06-01 10:02:09,500 >> Deleting older checkpoint "
          "[/scratch/out/checkpoint-100] due to args.save_total_limit")


def test_a_save_followed_by_checkpoint_rotation_is_complete(tmp_path):
    log = tmp_path / "console.log"
    log.write_text(CONSOLE.replace("ROTATE", ROTATE))
    incidents, stats = diagnose([str(log)])
    assert incidents == []
    assert stats.events >= 8


def test_rotation_does_not_end_an_older_step_and_a_cuda_error_is_the_root_cause(tmp_path):
    log = tmp_path / "console.log"
    log.write_text(CONSOLE.replace("ROTATE\n", ""))  # no rotation: the save of step 200 is interrupted
    (inc,), _ = diagnose([str(log)])
    assert (inc.kind, inc.step, inc.checkpoint_path) == ("interrupted_save", 200, "/scratch/out/checkpoint-200")
    assert inc.root_cause.cls == "gpu_xid" and inc.root_cause.rank == 1
    assert "illegal memory access" in inc.root_cause.line
