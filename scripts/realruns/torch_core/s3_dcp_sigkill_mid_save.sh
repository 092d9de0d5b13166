#!/bin/bash
# Scenario 3: 4 ranks, DCP saves every 10 steps on throttled storage (20 kB/s per writer). An external
# injector SIGKILLs global rank 2 about 0.5 s after the step-20 save starts. Then a resume from the
# torn step_20 (fails) and a resume from step_10 (works, runs to 30).
# Layouts: a (torchrun --tee/--log-dir, logging), c (2 agents = 2 nodes x 2, logging),
# e1 (srun --label emulation, print), e2 (pdsh emulation around 2 torchrun agents, logging).
SC=torch-dcp-sigkill-mid-save
source "$(dirname "$0")/common.sh"
begin_scenario
COMMON=(--ckpt dcp --save-every 10 --slow-storage-bps 20000)
PAT='Saving checkpoint at step 20'

three_attempts() {  # three_attempts LAYOUT RUNFN [runfn-args] -- watch-glob style
  local layout="$1" fn="$2" nargs="$3" watch="$4" style="$5"; shift 5
  attempt_begin "$layout" attempt-1
  inject_bg --watch "$L/$watch" --pattern "$PAT" --delay 0.5 --signal SIGKILL \
            --env "CKPTW_TAG=$CKPTW_TAG" --env RANK=2 --cmd train_core.py
  $fn $nargs "${COMMON[@]}" --log-style "$style" --steps 30 --out "$C" --fault-log "$P/trainer_faults.jsonl"
  attempt_end $?; inject_wait
  attempt_begin "$layout" attempt-2
  $fn $nargs "${COMMON[@]}" --log-style "$style" --steps 30 --out "$C" --resume "$C/step_20"; attempt_end $?
  attempt_begin "$layout" attempt-3
  $fn $nargs "${COMMON[@]}" --log-style "$style" --steps 30 --out "$C" --resume "$C/step_10"; attempt_end $?
}
three_attempts a-torchrun-tee run_a 4 'torchrun_logs/*/attempt_*/2/stderr.log' logging
three_attempts c-two-nodes run_c_two_nodes "" 'node-*/torchrun_logs/*/attempt_*/*/stderr.log' logging
three_attempts e1-srun-label run_e_srun 4 'slurm-4242.out' print
three_attempts e2-pdsh-two-nodes run_e_pdsh "" 'pdsh.log' logging
collect
