#!/bin/bash
# HF Trainer under torchrun (2 CPU procs, gloo), examples-style logging, with ckptwatch's ProbeCallback.
# attempt-1: 30 steps, save every 10, clean. Then, outside the job, every weight in
# out/checkpoint-30/model.safetensors is zeroed in place (the file still loads).
# attempt-2: resumes from out/checkpoint-30 with --probe: no load error; the probe finds constant outputs.
# attempt-3: the user resumes from out/checkpoint-20 with --probe: the probe says ok.
source /work/main/scripts/realruns/frameworks/common.sh
begin_scenario hf-torchrun-probe-zeroed-resume "$(readlink -f "$0")"
TR="torchrun --nproc-per-node 2 --tee 3"
attempt attempt-1 $TR --log-dir logs/attempt-1/torchrun_logs $FW/hf_train.py --output-dir out --max-steps 30 --save-steps 10 --log-style examples
ckpt_listing after-attempt-1 out
python $FW/zero_weights.py out/checkpoint-30/model.safetensors
note_injection '{"fault": "zeroed_weights", "file": "out/checkpoint-30/model.safetensors", "how": "every tensor replaced by zeros_like, metadata kept (scripts/zero_weights.py)", "at_utc": "'$(date -u +%Y-%m-%dT%H:%M:%S.%3NZ)'"}'
attempt attempt-2 $TR --log-dir logs/attempt-2/torchrun_logs $FW/hf_train.py --output-dir out --max-steps 40 --save-steps 10 --log-style examples --resume out/checkpoint-30 --probe
ckpt_listing after-attempt-2 out
attempt attempt-3 $TR --log-dir logs/attempt-3/torchrun_logs $FW/hf_train.py --output-dir out --max-steps 40 --save-steps 10 --log-style examples --resume out/checkpoint-20 --probe
ckpt_listing after-attempt-3 out
cat > expected.json <<JSON
{"incidents": [{"kind": "load_failure", "step": 30, "root_cause_class": null, "root_rank": null}],
 "must_not": ["interrupted_save", "storage_failure_during_save", "partial_checkpoint", "stalled_save", "poisoned_resume", "world_size_mismatch"]}
JSON
cat > README.provenance.md <<'MD'
HF Trainer resumed from a checkpoint that loads but is dead: torchrun --nproc-per-node 2 --tee 3 --log-dir, CPU/gloo,
with ckptwatch's `ckptwatch.probe.hf.ProbeCallback` added by `hf_train.py --probe` (outputs: the logits of 8 fixed
sequences, model in eval mode).
attempt-1 saves checkpoint-10/20/30, clean. Then every tensor of out/checkpoint-30/model.safetensors was replaced by
zeros in place (`zero_weights.py`, metadata kept; provenance/injected_faults.jsonl): what a save of never-gathered
ZeRO-3/FSDP parameters or a zero-filled copy leaves. attempt-2 resumes from out/checkpoint-30: the Trainer loads it
without an error; at on_train_begin the probe prints `ckptwatch event=probe verdict=degenerate reason=constant ...`
(rank 0) and training goes on. attempt-3 resumes from out/checkpoint-20: the probe prints verdict=ok.
Expected: a load_failure of step 30 (class degenerate_outputs) and nothing about checkpoint-20.
Generator: scripts/realruns/frameworks/scenarios/hf-torchrun-probe-zeroed-resume.sh.
MD
finish_scenario
