#!/bin/bash
# PyTorch Lightning DDP on CPU (2 procs, gloo, `python script.py`), strategy="ddp" (default process-group timeout, 30 min).
# The checkpoint IO is a plain (non-atomic) torch.save into the final path, written in 8 KiB chunks;
# at the step-20 save it sleeps 5 s after the first chunk (widens the save; prints nothing).
# attempt-1: an external watcher sees "saving model to ...epoch=0-step=20.ckpt" and sends SIGTERM to
#   the launcher (the `python lightning_train.py` process = rank 0) 1.0 s later.
# attempt-2: new job resumes from the newest file, ckpt/epoch=0-step=20.ckpt.
# attempt-3: new job resumes from ckpt/epoch=0-step=10.ckpt and finishes at 30.
source /work/main/scripts/realruns/frameworks/common.sh
begin_scenario lightning-ddp-sigterm-mid-save-hang "$(readlink -f "$0")"
watch_and_signal --watch logs/attempt-1/console.log --pattern 'saving model to .*epoch=0-step=20.ckpt' \
  --delay 1.0 --signal SIGTERM --target-launcher lightning_train.py --ckpt-dir ckpt --timeout 180
attempt attempt-1 python $FW/lightning_train.py --ckpt-dir ckpt --max-steps 30 --every 10 --save-sleep 5 --save-sleep-step 20
wait $WATCHER_PID
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
 "must_not": ["storage_failure_during_save", "partial_checkpoint", "world_size_mismatch", "post_resume_regression"]}
JSON
cat > README.provenance.md <<'MD'
PyTorch Lightning DDP on CPU (2 procs, gloo), `python lightning_train.py`, strategy="ddp" with Lightning's DEFAULT
process-group timeout (30 min). Same injection as lightning-ddp-sigterm-mid-save (non-atomic chunked CheckpointIO with a
5 s sleep after the first 8 KiB of the step-20 file; SIGTERM to the launcher = rank 0, 1.0 s after
`saving model to '.../epoch=0-step=20.ckpt'`), but without the 30 s timeout: rank 0 prints `[rank: 0] Received SIGTERM: 15`,
then the job hangs silently for the full 30 min (observed 20:03:27 -> 20:33:28; Lightning's SIGTERM handler calls
dist.broadcast while rank 1 waits in the post-save barrier) until gloo times out on rank 1
(`Timed out waiting 1800000ms for recv operation to complete`); only then does rank 1 print `[rank: 1] Received SIGTERM: 15`. The step-20 file stays torn (8192 B).
attempt-2 resumes from the torn step-20 file (fails), attempt-3 from step=10 (finishes).
expected.json leaves stalled_save unconstrained: the save is silent for 30 min (it IS stalled for that time, which a
live detector may report), and then fails; the root cause is the SIGTERM on rank 0, rank 1's timeout is a consequence.
MD
finish_scenario
