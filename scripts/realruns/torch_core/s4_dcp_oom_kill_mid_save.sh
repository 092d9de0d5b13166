#!/bin/bash
# Scenario 4: a REAL kernel OOM kill of global rank 1 in the middle of the step-20 DCP save.
# The run script creates a memory cgroup (cgroup v1 memory controller on this VM: memory.limit_in_bytes
# = 256M); inside StorageWriter.write_data of the step-20 save rank 1 writes its own pid to the cgroup's
# cgroup.procs and allocates a growing host buffer (64 MiB chunks), so the kernel OOM killer kills it.
# The kernel lines (dmesg -T) of the attempt are kept as logs/<layout>/attempt-1/kern.log.
# Then a resume from the last good checkpoint step_10 (works).
# Layouts: a (torchrun --tee/--log-dir, logging), c (2 agents = 2 nodes x 2, logging).
SC=torch-dcp-oom-kill-mid-save
source "$(dirname "$0")/common.sh"
begin_scenario
COMMON=(--ckpt dcp --save-every 10 --slow-storage-bps 20000)
for layout in a-torchrun-tee c-two-nodes; do
  case $layout in a-*) fn="run_a 4";; c-*) fn=run_c_two_nodes;; esac
  attempt_begin $layout attempt-1
  oom_cgroup_create "ckptw_${layout}" 256M
  CKPTW_FAULT_LOG="$P/trainer_faults.jsonl" CKPTW_OOM="1:20:$CG" \
    $fn "${COMMON[@]}" --log-style logging --steps 30 --out "$C"
  rc=$?; oom_cgroup_finish; attempt_end $rc
  attempt_begin $layout attempt-2
  $fn "${COMMON[@]}" --log-style logging --steps 30 --out "$C" --resume "$C/step_10"; attempt_end $?
done
collect
