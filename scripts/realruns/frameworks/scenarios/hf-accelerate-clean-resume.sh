#!/bin/bash
# HF Trainer under `accelerate launch --multi_gpu --num_processes 2` on CPU (gloo; accelerate runs torch elastic), default transformers logging (set_verbosity_info, no timestamps).
# attempt-1: 30 steps, save every 10 (checkpoint-10/20/30), clean.
# attempt-2: a new job resumes with resume_from_checkpoint=True (newest: checkpoint-30) and runs to step 40 (saves checkpoint-40).
source /work/main/scripts/realruns/frameworks/common.sh
begin_scenario hf-accelerate-clean-resume "$(readlink -f "$0")"
AL="accelerate launch --multi_gpu --num_processes 2 --tee 3"
attempt attempt-1 $AL --log_dir logs/attempt-1/accelerate_logs $FW/hf_train.py --output-dir out --max-steps 30 --save-steps 10 --log-style default
ckpt_listing after-attempt-1 out
attempt attempt-2 $AL --log_dir logs/attempt-2/accelerate_logs $FW/hf_train.py --output-dir out --max-steps 40 --save-steps 10 --log-style default --resume latest
ckpt_listing after-attempt-2 out
cat > expected.json <<JSON
{"incidents": [], "must_not": [$ALL_KINDS]}
JSON
cat > README.provenance.md <<'MD'
Clean HF Trainer run and clean resume under `accelerate launch --multi_gpu --num_processes 2 --tee 3 --log_dir`
on CPU (no GPU: accelerate's multi-GPU launcher is torch elastic; the Trainer uses gloo, `use_cpu=True`).
Launcher defaults left unset on purpose, so accelerate prints its "values were not passed" warning.
Nothing was injected. attempt-1 saves checkpoint-10/20/30; attempt-2 (new job) resumes with
`resume_from_checkpoint=True` (picks checkpoint-30) and trains to 40.
Logging: only `transformers.logging.set_verbosity_info()`: transformers' default handler prints
`[transformers] <message>` on stderr, with no timestamp. Rank 1 is at WARNING (Trainer default).
Exit codes: provenance/attempt-*/exit_code.txt. Generator: scripts/realruns/frameworks/scenarios/hf-accelerate-clean-resume.sh.
MD
finish_scenario
