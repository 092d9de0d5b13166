#!/bin/bash
# Scenario 4b: bare `python train_core.py > train.log 2>&1` (world size 1) inside a bash script; a REAL
# kernel OOM kill in the middle of the step-20 DCP save: inside StorageWriter.write_data the process
# writes its own pid into a memory cgroup (cgroup v1 memory.limit_in_bytes=256M, created by this script)
# and allocates a growing host buffer. Kernel lines of the attempt -> logs/<layout>/attempt-1/kern.log.
# Then a resume from step_10 (works).
# Layouts: d1 (logging with timestamps), d2 (print, no timestamps).
SC=torch-bare-python-oom-kill-mid-save
source "$(dirname "$0")/common.sh"
begin_scenario
COMMON=(--ckpt dcp --save-every 10 --slow-storage-bps 20000)
for layout in d1-bare-python-logging d2-bare-python-print; do
  case $layout in *logging) st=logging;; *) st=print;; esac
  attempt_begin $layout attempt-1
  oom_cgroup_create "ckptw_bare_${st}" 256M
  CKPTW_FAULT_LOG="$P/trainer_faults.jsonl" CKPTW_OOM="0:20:$CG" \
    run_d_bare "${COMMON[@]}" --log-style $st --steps 30 --out "$C"
  rc=$?; oom_cgroup_finish; attempt_end $rc
  attempt_begin $layout attempt-2
  run_d_bare "${COMMON[@]}" --log-style $st --steps 30 --out "$C" --resume "$C/step_10"; attempt_end $?
done
collect
