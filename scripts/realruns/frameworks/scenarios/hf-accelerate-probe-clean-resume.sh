#!/bin/bash
# HF Trainer under `accelerate launch --multi_gpu --num_processes 2` on CPU, default transformers logging, with
# ckptwatch's ProbeCallback. attempt-1: 30 steps, save every 10, clean. attempt-2: resume_from_checkpoint=True
# (checkpoint-30) with --probe: the probe prints verdict=ok. Nothing is injected: a negative case.
source /work/main/scripts/realruns/frameworks/common.sh
begin_scenario hf-accelerate-probe-clean-resume "$(readlink -f "$0")"
AL="accelerate launch --multi_gpu --num_processes 2 --tee 3"
attempt attempt-1 $AL --log_dir logs/attempt-1/accelerate_logs $FW/hf_train.py --output-dir out --max-steps 30 --save-steps 10 --log-style default
ckpt_listing after-attempt-1 out
attempt attempt-2 $AL --log_dir logs/attempt-2/accelerate_logs $FW/hf_train.py --output-dir out --max-steps 40 --save-steps 10 --log-style default --resume latest --probe
ckpt_listing after-attempt-2 out
cat > expected.json <<JSON
{"incidents": [], "must_not": [$ALL_KINDS]}
JSON
cat > README.provenance.md <<'MD'
Clean HF Trainer run and clean resume under accelerate launch --multi_gpu --num_processes 2 --tee 3 --log_dir
(CPU, gloo), with ckptwatch's `ckptwatch.probe.hf.ProbeCallback` (`hf_train.py --probe`). Nothing was injected.
attempt-2 resumes with resume_from_checkpoint=True (checkpoint-30); at on_train_begin the probe prints
`ckptwatch event=resume ...` and `ckptwatch event=probe ... verdict=ok ...` (rank 0). Expected: no incident.
What happened on its own (not injected): after "Training completed" of attempt-1, rank 0 aborted at exit
("terminate called without an active exception", exit code -6, SIGABRT); torchelastic sent SIGTERM to rank 1 and
printed its ChildFailedError summary; accelerate exited 1. Every save had ended before it: still no incident.
Generator: scripts/realruns/frameworks/scenarios/hf-accelerate-probe-clean-resume.sh.
MD
finish_scenario
