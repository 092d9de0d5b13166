#!/bin/bash
# HF Trainer under `accelerate launch --multi_gpu --num_processes 2` on CPU (gloo), default transformers logging (no timestamps).
# attempt-1: 30 steps, save every 10. The checkpoint-20 save is widened: every rank sleeps 5 s inside
#   the save, after model.safetensors is written and before optimizer/scheduler/rng/trainer_state.
#   An external watcher sees rank 0 print "Saving model checkpoint to out/checkpoint-20" on the
#   console and sends SIGKILL to rank 1 1.0 s later. the elastic agent inside accelerate then stops rank 0.
# attempt-2: new job, resume_from_checkpoint=True (the newest dir: the torn checkpoint-20).
# attempt-3: new job, resume from out/checkpoint-10 explicitly, runs to 30.
source /work/main/scripts/realruns/frameworks/common.sh
begin_scenario hf-accelerate-sigkill-mid-save "$(readlink -f "$0")"
AL="accelerate launch --multi_gpu --num_processes 2 --tee 3"
watch_and_signal --watch logs/attempt-1/console.log --pattern 'Saving model checkpoint to out/checkpoint-20' \
  --delay 1.0 --signal SIGKILL --target-env RANK=1 --script hf_train.py --ckpt-dir out --timeout 120
attempt attempt-1 $AL --log_dir logs/attempt-1/accelerate_logs $FW/hf_train.py --output-dir out --max-steps 30 --save-steps 10 --log-style default --save-sleep 5 --save-sleep-step 20
wait $WATCHER_PID
ckpt_listing after-attempt-1 out
attempt attempt-2 $AL --log_dir logs/attempt-2/accelerate_logs $FW/hf_train.py --output-dir out --max-steps 30 --save-steps 10 --log-style default --resume latest
ckpt_listing after-attempt-2 out
attempt attempt-3 $AL --log_dir logs/attempt-3/accelerate_logs $FW/hf_train.py --output-dir out --max-steps 30 --save-steps 10 --log-style default --resume out/checkpoint-10
ckpt_listing after-attempt-3 out
cat > expected.json <<'JSON'
{"incidents": [
  {"kind": "interrupted_save", "step": 20, "root_cause_class": "signal", "root_rank": 1},
  {"kind": "load_failure", "step": 20, "root_cause_class": null, "root_rank": null},
  {"kind": "poisoned_resume", "step": 20, "root_cause_class": null, "root_rank": null}
 ],
 "must_not": ["storage_failure_during_save", "partial_checkpoint", "stalled_save", "world_size_mismatch", "post_resume_regression"]}
JSON
cat > README.provenance.md <<'MD'
HF Trainer, `accelerate launch --multi_gpu --num_processes 2 --tee 3 --log_dir` on CPU (torch elastic inside accelerate, gloo), default transformers logging (`[transformers] msg`, no timestamps).

Injected (see injected_faults.jsonl, fault_watcher.log):
1. a 5 s sleep inside the checkpoint-20 save on every rank (`--save-sleep 5 --save-sleep-step 20`:
   `Trainer._save_optimizer_and_scheduler` is wrapped; model.safetensors/config are already written,
   optimizer.pt, scheduler.pt, rng_state_*.pth and trainer_state.json are not). It prints nothing.
2. SIGKILL to rank 1 (found by RANK=1 in its environment) 1.0 s after the console showed
   `Saving model checkpoint to out/checkpoint-20`. the elastic agent then SIGTERMs rank 0.

attempt-2 resumes with `resume_from_checkpoint=True`, which picks the newest checkpoint dir
(the torn checkpoint-20); attempt-3 resumes explicitly from out/checkpoint-10 and finishes.
Listings of out/ after each attempt: ckpt_listing_*.txt. Exit codes: attempt-*/exit_code.txt.
MD
finish_scenario
