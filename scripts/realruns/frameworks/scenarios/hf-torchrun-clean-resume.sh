#!/bin/bash
# HF Trainer under torchrun (2 CPU procs, gloo), examples-style logging (timestamps).
# attempt-1: 30 steps, save every 10 (checkpoint-10/20/30), clean.
# attempt-2: a new torchrun job resumes from out/checkpoint-30 and runs to step 40 (saves checkpoint-40).
source /work/main/scripts/realruns/frameworks/common.sh
begin_scenario hf-torchrun-clean-resume "$(readlink -f "$0")"
TR="torchrun --nproc-per-node 2 --tee 3"
attempt attempt-1 $TR --log-dir logs/attempt-1/torchrun_logs $FW/hf_train.py --output-dir out --max-steps 30 --save-steps 10 --log-style examples
ckpt_listing after-attempt-1 out
attempt attempt-2 $TR --log-dir logs/attempt-2/torchrun_logs $FW/hf_train.py --output-dir out --max-steps 40 --save-steps 10 --log-style examples --resume out/checkpoint-30
ckpt_listing after-attempt-2 out
cat > expected.json <<JSON
{"incidents": [], "must_not": [$ALL_KINDS]}
JSON
cat > README.provenance.md <<'MD'
Clean HF Trainer run and clean resume, torchrun --nproc-per-node 2 --tee 3 --log-dir, CPU/gloo.
Nothing was injected. attempt-1 saves checkpoint-10/20/30; attempt-2 (new torchrun job id) resumes
from out/checkpoint-30 (`resume_from_checkpoint="out/checkpoint-30"`) and trains to 40 (saves checkpoint-40).
Logging: transformers examples style (`enable_explicit_format`, timestamps on transformers lines; the loss
dicts printed by PrinterCallback have none). Replica (rank 1) transformers logging is at WARNING
(Trainer default `log_level_replica="warning"`), so rank 1 prints no INFO lines.
Exit codes: provenance/attempt-*/exit_code.txt. Generator: scripts/realruns/frameworks/scenarios/hf-torchrun-clean-resume.sh.
MD
finish_scenario
