#!/bin/bash
# DeepSpeed ZeRO-1 on CPU/gloo, torchrun 2 procs. The global_step20 save is widened: every rank sleeps 5 s after
# mp_rank_00_model_states.pt is written and before its zero_pp_rank_*_optim_states.pt shard (prints nothing).
# attempt-1: watcher sees "Saving model checkpoint: ckpt/global_step20/..." and SIGKILLs rank 1 1.0 s later.
# attempt-2: new job, engine.load_checkpoint("ckpt", tag="global_step20") (the torn tag, explicitly).
# attempt-3: new job, engine.load_checkpoint("ckpt") (tag from `latest`), runs to 30.
source /work/main/scripts/realruns/frameworks/common.sh
export DS_ACCELERATOR=cpu
begin_scenario deepspeed-zero1-sigkill-mid-save "$(readlink -f "$0")"
TR="torchrun --nproc-per-node 2 --tee 3"
watch_and_signal --watch logs/attempt-1/console.log --pattern 'Saving model checkpoint: ckpt/global_step20/' \
  --delay 1.0 --signal SIGKILL --target-env RANK=1 --script ds_train.py --ckpt-dir ckpt --timeout 180
attempt attempt-1 $TR --log-dir logs/attempt-1/torchrun_logs $FW/ds_train.py --ckpt-dir ckpt --max-steps 30 --every 10 --zero 1 --save-sleep 5 --save-sleep-step 20
wait $WATCHER_PID
ckpt_listing after-attempt-1 ckpt; cat ckpt/latest > provenance/latest_after_attempt-1.txt 2>&1
attempt attempt-2 $TR --log-dir logs/attempt-2/torchrun_logs $FW/ds_train.py --ckpt-dir ckpt --max-steps 30 --every 10 --zero 1 --resume --resume-tag global_step20
ckpt_listing after-attempt-2 ckpt
attempt attempt-3 $TR --log-dir logs/attempt-3/torchrun_logs $FW/ds_train.py --ckpt-dir ckpt --max-steps 30 --every 10 --zero 1 --resume
ckpt_listing after-attempt-3 ckpt
cat > expected.json <<'JSON'
{"incidents": [
  {"kind": "interrupted_save", "step": 20, "root_cause_class": "signal", "root_rank": 1},
  {"kind": "load_failure", "step": 20, "root_cause_class": null, "root_rank": null},
  {"kind": "poisoned_resume", "step": 20, "root_cause_class": null, "root_rank": null}
 ],
 "must_not": ["storage_failure_during_save", "partial_checkpoint", "stalled_save", "world_size_mismatch", "post_resume_regression"]}
JSON
cat > README.provenance.md <<'MD'
DeepSpeed ZeRO-1 on CPU (DS_ACCELERATOR=cpu, gloo), torchrun --nproc-per-node 2 --tee 3 --log-dir, DeepSpeed logger at INFO.

Injected (injected_faults.jsonl, fault_watcher.log):
1. inside the global_step20 save every rank sleeps 5 s before `engine._save_zero_checkpoint` (after rank 0 wrote
   mp_rank_00_model_states.pt, before any zero_pp_rank_*_mp_rank_00_optim_states.pt). Prints nothing.
2. SIGKILL to rank 1 (RANK=1 in its environment) 1.0 s after the console showed
   `[Rank 0] Saving model checkpoint: ckpt/global_step20/mp_rank_00_model_states.pt`; torchrun then SIGTERMs rank 0.
`latest` still names global_step10 afterwards (latest_after_attempt-1.txt).
attempt-2 loads the torn tag explicitly (`load_checkpoint("ckpt", tag="global_step20")`) and fails;
attempt-3 loads via `latest` (global_step10) and finishes at 30 (rewriting global_step20 and 30).
MD
finish_scenario
