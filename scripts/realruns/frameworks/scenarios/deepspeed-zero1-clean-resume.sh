#!/bin/bash
# DeepSpeed 0.19 on CPU (DS_ACCELERATOR=cpu, deepspeed.init_distributed(dist_backend="gloo")), ZeRO stage 1,
# torchrun --nproc-per-node 2 --tee 3 --log-dir. engine.save_checkpoint("ckpt") every 10 steps.
# attempt-1: 30 steps (global_step10/20/30, latest=global_step30).
# attempt-2: new job, engine.load_checkpoint("ckpt") (tag from `latest`), runs to 40.
source /work/main/scripts/realruns/frameworks/common.sh
export DS_ACCELERATOR=cpu
begin_scenario deepspeed-zero1-clean-resume "$(readlink -f "$0")"
TR="torchrun --nproc-per-node 2 --tee 3"
attempt attempt-1 $TR --log-dir logs/attempt-1/torchrun_logs $FW/ds_train.py --ckpt-dir ckpt --max-steps 30 --every 10 --zero 1
ckpt_listing after-attempt-1 ckpt
attempt attempt-2 $TR --log-dir logs/attempt-2/torchrun_logs $FW/ds_train.py --ckpt-dir ckpt --max-steps 40 --every 10 --zero 1 --resume
ckpt_listing after-attempt-2 ckpt
cat > expected.json <<JSON
{"incidents": [], "must_not": [$ALL_KINDS]}
JSON
cat > README.provenance.md <<'MD'
Clean DeepSpeed ZeRO-1 run and clean resume on CPU: DS_ACCELERATOR=cpu, `deepspeed.init_distributed(dist_backend="gloo")`,
torchrun --nproc-per-node 2 --tee 3 --log-dir (DeepSpeed honours torchrun's env). Optimizer Adam (torch_adam).
DeepSpeed 0.19's logger defaults to WARNING; the script sets it to INFO
(`deepspeed.utils.logging.set_log_level_from_string("info", logger)`), as users do to see save/load lines.
Nothing was injected. attempt-1 saves global_step10/20/30; attempt-2 (new torchrun job) calls
`engine.load_checkpoint("ckpt")` (tag from the `latest` file: global_step30) and trains to 40.
Generator: scripts/realruns/frameworks/scenarios/deepspeed-zero1-clean-resume.sh
MD
finish_scenario
