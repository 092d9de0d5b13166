#!/bin/bash
# Plain single-process PyTorch loop saving with safetensors.torch.save_file (model + flattened AdamW state).
# ckpt/ is a tmpfs of ${TMPFS_SIZE}; each checkpoint takes ~904 KiB there, so step_000010 and step_000020 fit
# and the step-30 save runs out of space for real (in optimizer.safetensors).
# attempt-1: 40 steps, save every 10 -> fails in the step-30 save.
# attempt-2: resume "latest" (highest step_* dir, no completeness check) -> the torn step_000030.
# attempt-3: the "user" deletes step_000030 and step_000010, resumes "latest" (step_000020), runs to 30.
source /work/main/scripts/realruns/frameworks/common.sh
begin_scenario safetensors-enospc-resume "$(readlink -f "$0")"
TMPFS_SIZE=${TMPFS_SIZE:-2400k}
mkdir -p ckpt
mount -t tmpfs -o size=$TMPFS_SIZE tmpfs ckpt || { echo "mount failed (needs root)"; exit 1; }
trap 'cd "$R" && umount "$R/ckpt" 2>/dev/null' EXIT
df -k ckpt > provenance/df_before.txt
note_injection "{\"event\": \"small_tmpfs\", \"path\": \"ckpt\", \"size\": \"$TMPFS_SIZE\", \"time_iso\": \"$(date -u +%Y-%m-%dT%H:%M:%S.%3NZ)\", \"note\": \"checkpoint dir mounted as tmpfs before attempt-1 so a save hits ENOSPC\"}"
attempt attempt-1 python $FW/safetensors_loop.py --ckpt-dir ckpt --max-steps 40 --every 10
ckpt_listing after-attempt-1 ckpt; df -k ckpt > provenance/df_after_attempt-1.txt
attempt attempt-2 python $FW/safetensors_loop.py --ckpt-dir ckpt --max-steps 40 --every 10 --resume latest
ckpt_listing after-attempt-2 ckpt
rm -rf ckpt/step_000030 ckpt/step_000010
note_injection "{\"event\": \"user_cleanup\", \"time_iso\": \"$(date -u +%Y-%m-%dT%H:%M:%S.%3NZ)\", \"note\": \"rm -rf ckpt/step_000030 ckpt/step_000010 before attempt-3 (frees space)\"}"
attempt attempt-3 python $FW/safetensors_loop.py --ckpt-dir ckpt --max-steps 30 --every 10 --resume latest
ckpt_listing after-attempt-3 ckpt; df -k ckpt > provenance/df_after_attempt-3.txt
cd "$R"; umount ckpt
cat > expected.json <<'JSON'
{"incidents": [
  {"kind": "storage_failure_during_save", "step": 30, "root_cause_class": "storage_error", "root_rank": 0},
  {"kind": "load_failure", "step": 30, "root_cause_class": null, "root_rank": null},
  {"kind": "poisoned_resume", "step": 30, "root_cause_class": null, "root_rank": null}
 ],
 "must_not": ["interrupted_save", "partial_checkpoint", "stalled_save", "world_size_mismatch", "post_resume_regression"]}
JSON
cat > README.provenance.md <<'MD'
Plain single-process loop (no launcher: `python safetensors_loop.py > console.log 2>&1`), checkpoints written
with `safetensors.torch.save_file` into ckpt/step_<N>/ (model.safetensors, optimizer.safetensors, meta.json last).

Injected: ckpt/ is a tmpfs of size=@TMPFS_SIZE@ (mounted by run.sh before attempt-1; df in df_*.txt), so the
step-30 save fails for real with ENOSPC while writing optimizer.safetensors (model.safetensors of step 30 is
complete). attempt-2 resumes from the highest step_* directory (the torn step_000030) and fails loading.
Before attempt-3 the script deletes step_000030 and step_000010 (a user freeing space; recorded in
injected_faults.jsonl); attempt-3 resumes from step_000020 and finishes at 30.
What happened: `save_file` raised `SafetensorError: Error while serializing: I/O error: No space left on device
(os error 28)` (not an OSError) and left NO optimizer.safetensors at all (no partial file), so attempt-2 loaded the
step-30 model weights and then failed with `FileNotFoundError: No such file or directory:
ckpt/step_000030/optimizer.safetensors`.
Single process: root_rank 0 in expected.json means "the only process".
MD
sed -i "s/@TMPFS_SIZE@/$TMPFS_SIZE/" README.provenance.md
finish_scenario
