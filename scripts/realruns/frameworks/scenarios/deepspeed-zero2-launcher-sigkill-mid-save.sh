#!/bin/bash
# DeepSpeed 0.19 ZeRO-2 on CPU/gloo, started with the `deepspeed` launcher (deepspeed --num_accelerators 2):
# its runner/launch.py print their own [INFO] lines, worker output is not prefixed.
# The global_step20 save is widened (5 s sleep before the ZeRO shards, after mp_rank_00_model_states.pt).
# attempt-1: watcher sees "Saving model checkpoint: ckpt/global_step20/" and SIGKILLs rank 1 1.0 s later.
# attempt-2: new job, engine.load_checkpoint("ckpt") (tag from `latest`, still global_step10), runs to 30.
source /work/main/scripts/realruns/frameworks/common.sh
export DS_ACCELERATOR=cpu
begin_scenario deepspeed-zero2-launcher-sigkill-mid-save "$(readlink -f "$0")"
watch_and_signal --watch logs/attempt-1/console.log --pattern 'Saving model checkpoint: ckpt/global_step20/' \
  --delay 1.0 --signal SIGKILL --target-env RANK=1 --script ds_train.py --ckpt-dir ckpt --timeout 180
export FAULT_SAVE_SLEEP=5 FAULT_SAVE_SLEEP_STEP=20
attempt attempt-1 deepspeed --num_accelerators 2 --master_port 29541 $FW/ds_train.py --ckpt-dir ckpt --max-steps 30 --every 10 --zero 2
unset FAULT_SAVE_SLEEP FAULT_SAVE_SLEEP_STEP
wait $WATCHER_PID
ckpt_listing after-attempt-1 ckpt; cat ckpt/latest > provenance/latest_after_attempt-1.txt 2>&1
attempt attempt-2 deepspeed --num_accelerators 2 --master_port 29542 $FW/ds_train.py --ckpt-dir ckpt --max-steps 30 --every 10 --zero 2 --resume
ckpt_listing after-attempt-2 ckpt
cat > expected.json <<'JSON'
{"incidents": [
  {"kind": "interrupted_save", "step": 20, "root_cause_class": "signal", "root_rank": 1}
 ],
 "must_not": ["storage_failure_during_save", "partial_checkpoint", "stalled_save", "load_failure", "poisoned_resume", "world_size_mismatch", "post_resume_regression"]}
JSON
cat > README.provenance.md <<'MD'
DeepSpeed ZeRO-2 on CPU (DS_ACCELERATOR=cpu, gloo), launched with `deepspeed --num_accelerators 2` (DeepSpeed's own
runner + launch.py; they print `[runner.py]`/`[launch.py]` lines; worker output is unprefixed). DeepSpeed logger at INFO.

Injected (injected_faults.jsonl, fault_watcher.log):
1. (env FAULT_SAVE_SLEEP=5 FAULT_SAVE_SLEEP_STEP=20, not on the command line, which the deepspeed launcher echoes) inside the global_step20 save every rank sleeps 5 s before `engine._save_zero_checkpoint` (after rank 0 wrote
   mp_rank_00_model_states.pt). Prints nothing.
2. SIGKILL to rank 1 (RANK=1 in its environment) 1.0 s after the console showed
   `[Rank 0] Saving model checkpoint: ckpt/global_step20/mp_rank_00_model_states.pt`.
`latest` still names global_step10 (latest_after_attempt-1.txt), so attempt-2's `load_checkpoint("ckpt")` resumes
from the complete global_step10 and finishes at 30 (rewriting global_step20): no poisoned resume, no load failure.
MD
finish_scenario
