#!/bin/bash
# Scenario 6: the checkpoint directory is a 2 MiB tmpfs (mount -t tmpfs -o size=2m), the model is
# bigger (hidden=300, about 1.2 MB of model+AdamW state per checkpoint), saves every 10 steps: the step-10
# save fits, the step-20 save runs out of space (real ENOSPC from the kernel). Unmounted afterwards.
# Layouts: a (torchrun --tee/--log-dir, 4 ranks, dcp.save, logging), b2 (prefix template, 4 ranks,
# dcp.save, print), d (bare python, torch.save of the full state dict, print).
SC=torch-enospc-during-save
source "$(dirname "$0")/common.sh"
begin_scenario
COMMON=(--save-every 10 --steps 30 --hidden 300)
for layout in a-torchrun-tee b2-prefix-template d-bare-python-torch-save; do
  attempt_begin $layout attempt-1
  { echo "$(date -u +%Y-%m-%dT%H:%M:%S.%3NZ) mount -t tmpfs -o size=2m tmpfs $C";
    mount -t tmpfs -o size=2m tmpfs "$C" && echo "mounted"; df -B1 "$C"; } >> "$P/injected_faults.log" 2>&1
  case $layout in
    a-*)  run_a 4 "${COMMON[@]}" --ckpt dcp --log-style logging --out "$C";;
    b2-*) run_b_prefix_template 4 "${COMMON[@]}" --ckpt dcp --log-style print --out "$C";;
    d-*)  run_d_bare "${COMMON[@]}" --ckpt torch --log-style print --out "$C";;
  esac
  rc=$?
  attempt_end $rc
  { echo "$(date -u +%Y-%m-%dT%H:%M:%S.%3NZ) after the run:"; df -B1 "$C";
    umount "$C" && echo "$(date -u +%Y-%m-%dT%H:%M:%S.%3NZ) umount $C"; } >> "$P/injected_faults.log" 2>&1
done
collect
