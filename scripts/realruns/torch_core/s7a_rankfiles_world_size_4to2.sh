#!/bin/bash
# Scenario 7a: every rank torch.save()s its own FSDP2-sharded state dict (DTensors) to
# step_N/rank{R}.pt; saved by 4 ranks (steps 1-20, saves at 10 and 20), resumed from step_20 by 2 ranks.
# Layouts: a (torchrun --tee/--log-dir, logging), e1 (srun --label emulation, print).
SC=torch-rankfiles-world-size-4to2
source "$(dirname "$0")/common.sh"
begin_scenario
COMMON=(--ckpt rankfiles --save-every 10)
attempt_begin a-torchrun-tee attempt-1
run_a 4 "${COMMON[@]}" --log-style logging --steps 20 --out "$C"; attempt_end $?
attempt_begin a-torchrun-tee attempt-2
run_a 2 "${COMMON[@]}" --log-style logging --steps 30 --out "$C" --resume "$C/step_20"; attempt_end $?
attempt_begin e1-srun-label attempt-1
run_e_srun 4 "${COMMON[@]}" --log-style print --steps 20 --out "$C"; attempt_end $?
attempt_begin e1-srun-label attempt-2
run_e_srun 2 "${COMMON[@]}" --log-style print --steps 30 --out "$C" --resume "$C/step_20"; attempt_end $?
collect
