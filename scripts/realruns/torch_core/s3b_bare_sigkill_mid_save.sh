#!/bin/bash
# Scenario 3b: bare `python train_core.py > train.log 2>&1` (no torchrun, world size 1, DCP without a
# process group) inside a bash script; an external injector SIGKILLs the python process 0.5 s after the
# step-20 save starts (throttled storage, 20 kB/s). bash reports "line N: PID Killed" on its stderr.
# Then a resume from the torn step_20 (fails) and from step_10 (works).
# Layouts: d1 (logging with timestamps), d2 (print, no timestamps).
SC=torch-bare-python-sigkill-mid-save
source "$(dirname "$0")/common.sh"
begin_scenario
COMMON=(--ckpt dcp --save-every 10 --slow-storage-bps 20000)
for layout in d1-bare-python-logging d2-bare-python-print; do
  case $layout in *logging) st=logging;; *) st=print;; esac
  attempt_begin $layout attempt-1
  inject_bg --watch "$L/train.log" --pattern 'Saving checkpoint at step 20' --delay 0.5 --signal SIGKILL \
            --env "CKPTW_TAG=$CKPTW_TAG" --cmd train_core.py
  run_d_bare "${COMMON[@]}" --log-style $st --steps 30 --out "$C"; attempt_end $?; inject_wait
  attempt_begin $layout attempt-2
  run_d_bare "${COMMON[@]}" --log-style $st --steps 30 --out "$C" --resume "$C/step_20"; attempt_end $?
  attempt_begin $layout attempt-3
  run_d_bare "${COMMON[@]}" --log-style $st --steps 30 --out "$C" --resume "$C/step_10"; attempt_end $?
done
collect
