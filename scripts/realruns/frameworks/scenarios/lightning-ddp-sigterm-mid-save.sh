#!/bin/bash
# PyTorch Lightning DDP on CPU (2 procs, gloo, `python script.py`), DDPStrategy(timeout=30 s).
# The checkpoint IO is a plain (non-atomic) torch.save into the final path, written in 8 KiB chunks;
# at the step-20 save it sleeps 5 s after the first chunk (widens the save; prints nothing).
# attempt-1: an external watcher sees "saving model to ...epoch=0-step=20.ckpt" and sends SIGTERM to
#   the launcher (the `python lightning_train.py` process = rank 0) 1.0 s later.
# attempt-2: new job resumes from the newest file, ckpt/epoch=0-step=20.ckpt.
# attempt-3: new job resumes from ckpt/epoch=0-step=10.ckpt and finishes at 30.
source /work/main/scripts/realruns/frameworks/common.sh
begin_scenario lightning-ddp-sigterm-mid-save "$(readlink -f "$0")"
watch_and_signal --watch logs/attempt-1/console.log --pattern 'saving model to .*epoch=0-step=20.ckpt' \
  --delay 1.0 --signal SIGTERM --target-launcher lightning_train.py --ckpt-dir ckpt --timeout 180
attempt attempt-1 python $FW/lightning_train.py --ckpt-dir ckpt --max-steps 30 --every 10 --pg-timeout 30 --save-sleep 5 --save-sleep-step 20
wait $WATCHER_PID
ckpt_listing after-attempt-1 ckpt
attempt attempt-2 python $FW/lightning_train.py --ckpt-dir ckpt --max-steps 30 --every 10 --pg-timeout 30 --resume ckpt/epoch=0-step=20.ckpt
ckpt_listing after-attempt-2 ckpt
attempt attempt-3 python $FW/lightning_train.py --ckpt-dir ckpt --max-steps 30 --every 10 --pg-timeout 30 --resume ckpt/epoch=0-step=10.ckpt
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
PyTorch Lightning DDP on CPU (2 procs, gloo), `python lightning_train.py` (Lightning's subprocess launcher),
`DDPStrategy(timeout=timedelta(seconds=30))`.

Injected (injected_faults.jsonl, fault_watcher.log):
1. a non-atomic checkpoint IO (`SlowIO` in lightning_train.py: torch.save into a buffer, then written to the
   final path in 8 KiB chunks) that sleeps 5 s after the first chunk of the step-20 save. Prints nothing.
   (Lightning's default TorchCheckpointIO is atomic: fsspec transaction, temp file then move.)
2. SIGTERM to the launcher process (rank 0) 1.0 s after the console showed
   `... saving model to '.../ckpt/epoch=0-step=20.ckpt' as top 2`.

What Lightning 2.6.6 did (see logs/attempt-1/console.log): rank 0 printed `[rank: 0] Received SIGTERM: 15`,
forwarded SIGTERM to rank 1 (`[rank: 1] Received SIGTERM: 15`), and both SIGTERM handlers called
`dist.broadcast` while rank 1 sat in the post-save barrier; after the 30 s process-group timeout rank 1
raised `Timed out waiting 30000ms for recv operation` / `Application timeout caused pair closure` and rank 0
`Connection closed by peer`. The step-20 file was left at 8192 bytes (torn). Without the 30 s timeout
(default 30 min) the same injection hung (observed in a trial run, killed by hand, not kept).
attempt-2 resumes from the torn file and fails in torch.load; attempt-3 resumes from step=10 and finishes.
The root cause is the SIGTERM delivered to rank 0; rank 1's timeout is a consequence.
MD
finish_scenario
