#!/bin/bash
# Scenario 2: clean DCP run, dcp.save every 10 steps with throttled storage (20 kB/s per writer,
# about 1 s per save), no fault. Layouts: a (torchrun --tee/--log-dir, logging),
# b1 (--role trainer --local-ranks-filter 0,2, print), b2 (TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE, logging),
# c (2 torchrun agents = 2 nodes x 2 procs, logging).
SC=torch-dcp-clean-slow-saves
source "$(dirname "$0")/common.sh"
begin_scenario
COMMON=(--ckpt dcp --save-every 10 --steps 30 --slow-storage-bps 20000)

attempt_begin a-torchrun-tee attempt-1
run_a 4 "${COMMON[@]}" --log-style logging --out "$C"; attempt_end $?
attempt_begin b1-role-trainer-ranks-filter attempt-1
run_b_role_filter 4 "${COMMON[@]}" --log-style print --out "$C"; attempt_end $?
attempt_begin b2-prefix-template attempt-1
run_b_prefix_template 4 "${COMMON[@]}" --log-style logging --log-stream stdout --out "$C"; attempt_end $?
attempt_begin c-two-nodes attempt-1
run_c_two_nodes "${COMMON[@]}" --log-style logging --out "$C"; attempt_end $?
collect
