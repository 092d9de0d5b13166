#!/bin/bash
# Scenario 7b: DCP checkpoint saved by 4 ranks (steps 1-20, saves at 10 and 20), resumed from step_20
# by 2 ranks. DCP reshards on load.
# Layouts: a (torchrun --tee/--log-dir, logging), b2 (prefix template, print).
SC=torch-dcp-reshard-4to2
source "$(dirname "$0")/common.sh"
begin_scenario
COMMON=(--ckpt dcp --save-every 10)
attempt_begin a-torchrun-tee attempt-1
run_a 4 "${COMMON[@]}" --log-style logging --steps 20 --out "$C"; attempt_end $?
attempt_begin a-torchrun-tee attempt-2
run_a 2 "${COMMON[@]}" --log-style logging --steps 30 --out "$C" --resume "$C/step_20"; attempt_end $?
attempt_begin b2-prefix-template attempt-1
run_b_prefix_template 4 "${COMMON[@]}" --log-style print --steps 20 --out "$C"; attempt_end $?
attempt_begin b2-prefix-template attempt-2
run_b_prefix_template 2 "${COMMON[@]}" --log-style print --steps 30 --out "$C" --resume "$C/step_20"; attempt_end $?
collect
