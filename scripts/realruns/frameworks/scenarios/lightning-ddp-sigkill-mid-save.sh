#!/bin/bash
# PyTorch Lightning DDP on CPU (2 procs, gloo, `python script.py`).
# Non-atomic checkpoint IO, 5 s sleep after the first 8 KiB chunk of the step-20 save (prints nothing).
# attempt-1: an external watcher sees "saving model to ...epoch=0-step=20.ckpt" and sends SIGKILL to
#   rank 0 (the launcher process, the only writer) 1.0 s later. Rank 1 is left alone.
# attempt-2: new job resumes from the newest file, ckpt/epoch=0-step=20.ckpt.
# attempt-3: new job resumes from ckpt/epoch=0-step=10.ckpt and finishes at 30.
source /work/main/scripts/realruns/frameworks/common.sh
begin_scenario lightning-ddp-sigkill-mid-save "$(readlink -f "$0")"
watch_and_signal --watch logs/attempt-1/console.log --pattern 'saving model to .*epoch=0-step=20.ckpt' \
  --delay 1.0 --signal SIGKILL --target-launcher lightning_train.py --ckpt-dir ckpt --timeout 180
attempt attempt-1 python $FW/lightning_train.py --ckpt-dir ckpt --max-steps 30 --every 10 --save-sleep 5 --save-sleep-step 20
wait $WATCHER_PID
sleep 2; ps -eo pid,args | grep '[l]ightning_train.py' > provenance/leftover_processes_after_attempt-1.txt
ckpt_listing after-attempt-1 ckpt
attempt attempt-2 python $FW/lightning_train.py --ckpt-dir ckpt --max-steps 30 --every 10 --resume ckpt/epoch=0-step=20.ckpt
ckpt_listing after-attempt-2 ckpt
attempt attempt-3 python $FW/lightning_train.py --ckpt-dir ckpt --max-steps 30 --every 10 --resume ckpt/epoch=0-step=10.ckpt
ckpt_listing after-attempt-3 ckpt
cat > expected.json <<'JSON'
{"incidents": [
  {"kind": "interrupted_save", "step": 20, "root_cause_class": "signal", "root_rank": 0},
  {"kind": "load_failure", "step": 20, "root_cause_class": null, "root_rank": null},
  {"kind": "poisoned_resume", "step": 20, "root_cause_class": null, "root_rank": null}
 ],
 "must_not": ["storage_failure_during_save", "partial_checkpoint", "stalled_save", "world_size_mismatch", "post_resume_regression"]}
JSON
cat > README.provenance.md <<'MD'
PyTorch Lightning DDP on CPU (2 procs, gloo), `python lightning_train.py` (Lightning's subprocess launcher:
rank 0 is the launcher process itself, rank 1 its child; both print to the same console).

Injected (injected_faults.jsonl, fault_watcher.log):
1. a non-atomic checkpoint IO (`SlowIO` in lightning_train.py) that sleeps 5 s after writing the first
   8 KiB chunk of the step-20 checkpoint into its final path. Prints nothing.
2. SIGKILL to rank 0 (the launcher process, the only process that writes the checkpoint) 1.0 s after the
   console showed `... saving model to '.../ckpt/epoch=0-step=20.ckpt' as top 2`.
A SIGKILLed process prints nothing; the shell sees exit code 137. Rank 1 (in the post-save barrier)
then fails on its own (see the console) — leftover_processes_after_attempt-1.txt lists any survivor.
attempt-2 resumes from the torn epoch=0-step=20.ckpt; attempt-3 from epoch=0-step=10.ckpt.
MD
finish_scenario
