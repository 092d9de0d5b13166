#!/bin/bash
# HF Trainer under torchrun (2 CPU procs, gloo), examples-style logging. The output dir is a
# tmpfs of ${TMPFS_SIZE} (each checkpoint takes ~444 KiB there), so checkpoint-10 and -20 fit and
# the checkpoint-30 save runs out of space for real (ENOSPC).
# attempt-1: 40 steps, save every 10 -> fails in the checkpoint-30 save.
# attempt-2: new job, resume_from_checkpoint=True (newest dir: the partial checkpoint-30).
# attempt-3: the "user" deletes out/checkpoint-30 and out/checkpoint-10 to free space, and resumes
#            from out/checkpoint-20 explicitly; runs to 30 (saves checkpoint-30 again).
source /work/main/scripts/realruns/frameworks/common.sh
begin_scenario hf-torchrun-enospc "$(readlink -f "$0")"
TMPFS_SIZE=${TMPFS_SIZE:-1000k}
TR="torchrun --nproc-per-node 2 --tee 3"
mkdir -p out
mount -t tmpfs -o size=$TMPFS_SIZE tmpfs out || { echo "mount failed (needs root)"; exit 1; }
trap 'cd "$R" && umount "$R/out" 2>/dev/null' EXIT
df -k out > provenance/df_before.txt
note_injection "{\"event\": \"small_tmpfs\", \"path\": \"out\", \"size\": \"$TMPFS_SIZE\", \"time_iso\": \"$(date -u +%Y-%m-%dT%H:%M:%S.%3NZ)\", \"note\": \"output dir mounted as tmpfs before attempt-1 so a save hits ENOSPC\"}"
attempt attempt-1 $TR --log-dir logs/attempt-1/torchrun_logs $FW/hf_train.py --output-dir out --max-steps 40 --save-steps 10 --log-style examples
ckpt_listing after-attempt-1 out; df -k out > provenance/df_after_attempt-1.txt
attempt attempt-2 $TR --log-dir logs/attempt-2/torchrun_logs $FW/hf_train.py --output-dir out --max-steps 40 --save-steps 10 --log-style examples --resume latest
ckpt_listing after-attempt-2 out
rm -rf out/checkpoint-30 out/checkpoint-10
note_injection "{\"event\": \"user_cleanup\", \"time_iso\": \"$(date -u +%Y-%m-%dT%H:%M:%S.%3NZ)\", \"note\": \"rm -rf out/checkpoint-30 out/checkpoint-10 before attempt-3 (frees space)\"}"
ckpt_listing before-attempt-3 out
attempt attempt-3 $TR --log-dir logs/attempt-3/torchrun_logs $FW/hf_train.py --output-dir out --max-steps 30 --save-steps 10 --log-style examples --resume out/checkpoint-20
ckpt_listing after-attempt-3 out; df -k out > provenance/df_after_attempt-3.txt
cd "$R"; umount out
cat > expected.json <<'JSON'
{"incidents": [
  {"kind": "storage_failure_during_save", "step": 30, "root_cause_class": "storage_error", "root_rank": 0},
  {"kind": "load_failure", "step": 30, "root_cause_class": null, "root_rank": null}
 ],
 "must_not": ["interrupted_save", "partial_checkpoint", "stalled_save", "world_size_mismatch", "post_resume_regression"]}
JSON
cat > README.provenance.md <<'MD'
HF Trainer, torchrun --nproc-per-node 2 --tee 3 --log-dir, CPU/gloo, examples-style logging.

Injected: the output dir `out` is a tmpfs of size=@TMPFS_SIZE@ (mounted by run.sh before attempt-1;
df in df_*.txt). Each checkpoint takes ~444 KiB there, so checkpoint-10 and checkpoint-20 fit and the real
checkpoint-30 save fails with ENOSPC on rank 0 (the only rank writing model/optimizer in DDP).
attempt-2 resumes with `resume_from_checkpoint=True` (picks the partial checkpoint-30).
Before attempt-3 the script deletes out/checkpoint-30 and out/checkpoint-10 (a user freeing space;
recorded in injected_faults.jsonl), then attempt-3 resumes explicitly from out/checkpoint-20 and
finishes at 30 (saves checkpoint-30 completely).
What happened (torchrun, size=1000k): safetensors' Rust writer raised
`SafetensorError: Error while serializing: I/O error: No space left on device (os error 28)` while writing
checkpoint-30/model.safetensors (not an OSError); checkpoint-30 holds only config.json, generation_config.json
and rng_state_1.pth. attempt-2 fails before loading anything (`ValueError: Can't find a valid checkpoint at
out/checkpoint-30`, no `Loading model from` line), so expected.json requires load_failure and leaves
poisoned_resume neither required nor forbidden (nothing was loaded from the bad checkpoint).
Listings: ckpt_listing_*.txt. Exit codes: attempt-*/exit_code.txt.
MD
sed -i "s/@TMPFS_SIZE@/$TMPFS_SIZE/" README.provenance.md
finish_scenario
