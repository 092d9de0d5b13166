#!/bin/bash
# DeepSpeed ZeRO-1 on CPU/gloo. attempt-1: torchrun 2 procs, 20 steps, saves global_step10/20.
# attempt-2: new job with ONE process (torchrun --nproc-per-node 1), engine.load_checkpoint("ckpt") -> DP world size 2 vs 1.
# attempt-3: new job with 2 processes again, load_checkpoint("ckpt"), runs to 30.
source /work/main/scripts/realruns/frameworks/common.sh
export DS_ACCELERATOR=cpu
begin_scenario deepspeed-zero1-world-size-mismatch "$(readlink -f "$0")"
attempt attempt-1 torchrun --nproc-per-node 2 --tee 3 --log-dir logs/attempt-1/torchrun_logs $FW/ds_train.py --ckpt-dir ckpt --max-steps 20 --every 10 --zero 1
ckpt_listing after-attempt-1 ckpt
attempt attempt-2 torchrun --nproc-per-node 1 --tee 3 --log-dir logs/attempt-2/torchrun_logs $FW/ds_train.py --ckpt-dir ckpt --max-steps 30 --every 10 --zero 1 --resume
ckpt_listing after-attempt-2 ckpt
attempt attempt-3 torchrun --nproc-per-node 2 --tee 3 --log-dir logs/attempt-3/torchrun_logs $FW/ds_train.py --ckpt-dir ckpt --max-steps 30 --every 10 --zero 1 --resume
ckpt_listing after-attempt-3 ckpt
cat > expected.json <<'JSON'
{"incidents": [
  {"kind": "world_size_mismatch", "step": 20, "root_cause_class": null, "root_rank": null}
 ],
 "must_not": ["interrupted_save", "storage_failure_during_save", "partial_checkpoint", "stalled_save", "corrupt_checkpoint", "poisoned_resume", "post_resume_regression"]}
JSON
cat > README.provenance.md <<'MD'
DeepSpeed ZeRO-1 on CPU (DS_ACCELERATOR=cpu, gloo), torchrun --tee 3 --log-dir, DeepSpeed logger at INFO.
Nothing was injected except the change of world size: attempt-1 (2 processes) saves global_step10/20 completely;
attempt-2 is a new job with 1 process (`torchrun --nproc-per-node 1`) that calls `engine.load_checkpoint("ckpt")`
(tag global_step20 from `latest`) and fails with DeepSpeed's DP-world-size check; attempt-3 (2 processes again)
loads global_step20 and finishes at 30.
expected.json requires world_size_mismatch. load_failure is neither required nor forbidden (the same failed load;
whether it is reported as a second incident is a reporting choice). poisoned_resume is forbidden: global_step20 is complete.
MD
finish_scenario
