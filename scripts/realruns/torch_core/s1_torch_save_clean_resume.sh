#!/bin/bash
# Scenario 1: clean run, rank 0 torch.save()s a full state dict every 10 steps; then a clean resume
# from the last checkpoint (step 30) to step 40. Layouts: a (torchrun --tee/--log-dir, logging),
# d (bare python, print), e (srun --label emulation, print).
SC=torch-save-clean-resume
source "$(dirname "$0")/common.sh"
begin_scenario
COMMON=(--ckpt torch --save-every 10)

attempt_begin a-torchrun-tee attempt-1
run_a 2 "${COMMON[@]}" --log-style logging --steps 30 --out "$C"; attempt_end $?
attempt_begin a-torchrun-tee attempt-2
run_a 2 "${COMMON[@]}" --log-style logging --steps 40 --out "$C" --resume "$C/ckpt_step_30.pt"; attempt_end $?

attempt_begin d-bare-python attempt-1
run_d_bare "${COMMON[@]}" --log-style print --steps 30 --out "$C"; attempt_end $?
attempt_begin d-bare-python attempt-2
run_d_bare "${COMMON[@]}" --log-style print --steps 40 --out "$C" --resume "$C/ckpt_step_30.pt"; attempt_end $?

attempt_begin e1-srun-label attempt-1
run_e_srun 2 "${COMMON[@]}" --log-style print --steps 30 --out "$C"; attempt_end $?
attempt_begin e1-srun-label attempt-2
run_e_srun 2 "${COMMON[@]}" --log-style print --steps 40 --out "$C" --resume "$C/ckpt_step_30.pt"; attempt_end $?
collect
