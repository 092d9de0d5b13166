#!/bin/bash
# PyTorch Lightning DDP (2 CPU procs, `python script.py`), with ckptwatch's probe_callback.
# attempt-1: 30 steps (saves step=10/20/30). Then, outside the job, every tensor of the step=30
# file's state_dict is zeroed in place (the file still loads).
# attempt-2: fit(ckpt_path=...step=30.ckpt) with --probe: no load error; the probe finds constant outputs.
# attempt-3: fit(ckpt_path=...step=20.ckpt) with --probe: the probe says ok.
source /work/main/scripts/realruns/frameworks/common.sh
begin_scenario lightning-ddp-probe-zeroed-resume "$(readlink -f "$0")"
attempt attempt-1 python $FW/lightning_train.py --ckpt-dir ckpt --max-steps 30 --every 10 --atomic-io
ckpt_listing after-attempt-1 ckpt
python $FW/zero_weights.py ckpt/epoch=0-step=30.ckpt
note_injection '{"fault": "zeroed_weights", "file": "ckpt/epoch=0-step=30.ckpt", "how": "every state_dict tensor replaced by zeros_like (scripts/zero_weights.py)", "at_utc": "'$(date -u +%Y-%m-%dT%H:%M:%S.%3NZ)'"}'
attempt attempt-2 python $FW/lightning_train.py --ckpt-dir ckpt --max-steps 40 --every 10 --atomic-io --resume ckpt/epoch=0-step=30.ckpt --probe
ckpt_listing after-attempt-2 ckpt
attempt attempt-3 python $FW/lightning_train.py --ckpt-dir ckpt --max-steps 40 --every 10 --atomic-io --resume ckpt/epoch=0-step=20.ckpt --probe
ckpt_listing after-attempt-3 ckpt
cat > expected.json <<JSON
{"incidents": [{"kind": "load_failure", "step": 30, "root_cause_class": null, "root_rank": null}],
 "must_not": ["interrupted_save", "storage_failure_during_save", "partial_checkpoint", "stalled_save", "poisoned_resume", "world_size_mismatch"]}
JSON
cat > README.provenance.md <<'MD'
PyTorch Lightning DDP on CPU (2 processes, gloo; `python lightning_train.py`) resumed from a checkpoint that loads
but is dead, with ckptwatch's `ckptwatch.probe.lightning.probe_callback` added by `lightning_train.py --probe`
(outputs: the module's net on 16 fixed inputs).
attempt-1 saves epoch=0-step=10/20/30.ckpt, clean. Then every tensor of the step=30 file's state_dict was replaced
by zeros in place (`zero_weights.py`; provenance/injected_faults.jsonl). attempt-2 resumes with
`trainer.fit(..., ckpt_path="ckpt/epoch=0-step=30.ckpt")`: it loads without an error; at on_train_start the probe
prints `ckptwatch event=probe verdict=degenerate reason=constant ...` (rank 0). attempt-3 resumes from step=20:
the probe prints verdict=ok.
Expected: a load_failure of step 30 (class degenerate_outputs) and nothing about step=20.
Generator: scripts/realruns/frameworks/scenarios/lightning-ddp-probe-zeroed-resume.sh.
MD
finish_scenario
