#!/bin/bash
# Scenario 5: scheduler-style preemption. 4 ranks, DCP saves every 10 steps on throttled storage
# (20 kB/s per writer). An external injector sends SIGTERM to the torchrun launcher (the elastic agent)
# 0.5 s after the step-20 save starts; the agent forwards the signal to its workers.
# Then a resume from the last good checkpoint step_10 (works).
# Layouts: a (torchrun --tee/--log-dir, logging), b1 (--role trainer --local-ranks-filter 0,2, print).
SC=torch-launcher-sigterm-mid-save
source "$(dirname "$0")/common.sh"
begin_scenario
COMMON=(--ckpt dcp --save-every 10 --slow-storage-bps 20000)
for layout in a-torchrun-tee b1-role-trainer-ranks-filter; do
  case $layout in a-*) fn=run_a; st=logging; watch='torchrun_logs/*/attempt_*/0/stderr.log';;
                  b1-*) fn=run_b_role_filter; st=print; watch=console.log;; esac
  attempt_begin $layout attempt-1
  inject_bg --watch "$L/$watch" --pattern 'Saving checkpoint at step 20' --delay 0.5 --signal SIGTERM \
            --env "CKPTW_TAG=$CKPTW_TAG" --cmd bin/torchrun
  $fn 4 "${COMMON[@]}" --log-style $st --steps 30 --out "$C"; attempt_end $?; inject_wait
  attempt_begin $layout attempt-2
  $fn 4 "${COMMON[@]}" --log-style $st --steps 30 --out "$C" --resume "$C/step_10"; attempt_end $?
done
collect
