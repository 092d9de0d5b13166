#!/bin/bash
# PyTorch Lightning DDP on CPU (2 procs, gloo, `python script.py`), DDPStrategy(timeout=30 s), Lightning's default
# (atomic) TorchCheckpointIO, 0.2 s per training step so the run can be hit between saves.
# attempt-1: 40 steps, save every 10. An external watcher sees rank 0 log "step 15 train_loss" and sends SIGTERM
#   to the launcher process (rank 0) 0.1 s later, i.e. between the step-10 and step-20 saves.
# attempt-2: new job resumes from ckpt/epoch=0-step=10.ckpt (the newest file) and runs to 40.
source /work/main/scripts/realruns/frameworks/common.sh
begin_scenario lightning-ddp-sigterm-mid-run "$(readlink -f "$0")"
watch_and_signal --watch logs/attempt-1/console.log --pattern 'INFO train: step 15 train_loss' \
  --delay 0.1 --signal SIGTERM --target-launcher lightning_train.py --ckpt-dir ckpt --timeout 180
attempt attempt-1 python $FW/lightning_train.py --ckpt-dir ckpt --max-steps 40 --every 10 --pg-timeout 30 --atomic-io --step-sleep 0.2
wait $WATCHER_PID
ckpt_listing after-attempt-1 ckpt
attempt attempt-2 python $FW/lightning_train.py --ckpt-dir ckpt --max-steps 40 --every 10 --pg-timeout 30 --atomic-io --resume ckpt/epoch=0-step=10.ckpt
ckpt_listing after-attempt-2 ckpt
cat > expected.json <<'JSON'
{"incidents": [],
 "must_not": ["interrupted_save", "storage_failure_during_save", "partial_checkpoint", "stalled_save", "corrupt_checkpoint", "load_failure", "poisoned_resume", "world_size_mismatch", "post_resume_regression"]}
JSON
cat > README.provenance.md <<'MD'
PyTorch Lightning DDP on CPU (2 procs, gloo), `python lightning_train.py`, `DDPStrategy(timeout=timedelta(seconds=30))`,
Lightning's default atomic TorchCheckpointIO, `--step-sleep 0.2` (each training step sleeps 0.2 s).

Injected (injected_faults.jsonl, fault_watcher.log): SIGTERM to the launcher process (rank 0) 0.1 s after the
console showed `INFO train: step 15 train_loss ...`, i.e. between the step-10 and step-20 saves (no save running).
The job stops (see the console for how Lightning handles it); the step-10 checkpoint is complete. attempt-2 resumes
from ckpt/epoch=0-step=10.ckpt and finishes at 40. No checkpoint incident should be reported: the job was
stopped between saves, and the resume is from a complete checkpoint.
MD
finish_scenario
