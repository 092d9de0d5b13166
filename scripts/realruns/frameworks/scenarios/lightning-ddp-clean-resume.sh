#!/bin/bash
# PyTorch Lightning, Trainer(accelerator="cpu", devices=2, strategy="ddp"), started as `python script.py`
# (Lightning's subprocess launcher starts rank 1). ModelCheckpoint(every_n_train_steps=10,
# monitor="train_loss", save_top_k=-1, verbose=True), Lightning's default TorchCheckpointIO.
# attempt-1: 30 steps (saves step=10/20/30). attempt-2: new job, fit(ckpt_path=ckpt/epoch=0-step=30.ckpt) to 40.
source /work/main/scripts/realruns/frameworks/common.sh
begin_scenario lightning-ddp-clean-resume "$(readlink -f "$0")"
attempt attempt-1 python $FW/lightning_train.py --ckpt-dir ckpt --max-steps 30 --every 10 --atomic-io
ckpt_listing after-attempt-1 ckpt
attempt attempt-2 python $FW/lightning_train.py --ckpt-dir ckpt --max-steps 40 --every 10 --atomic-io --resume ckpt/epoch=0-step=30.ckpt
ckpt_listing after-attempt-2 ckpt
cat > expected.json <<JSON
{"incidents": [], "must_not": [$ALL_KINDS]}
JSON
cat > README.provenance.md <<'MD'
Clean PyTorch Lightning DDP run on CPU (2 processes, gloo; `python lightning_train.py`, Lightning's
subprocess launcher re-runs the script for rank 1; both ranks write to the same console).
Nothing was injected. attempt-1 saves epoch=0-step=10/20/30.ckpt; attempt-2 (a new job) resumes with
`trainer.fit(..., ckpt_path="ckpt/epoch=0-step=30.ckpt")` and trains to 40 (saves step=40).
ModelCheckpoint(verbose=True, monitor="train_loss") prints `Epoch 0, global step N: 'train_loss' reached ...,
saving model to '<abs path>' as top K` BEFORE writing; nothing is printed after the write.
Per-step loss lines (`INFO train: step N train_loss X`, with timestamps) come from the training script (rank 0).
Generator: scripts/realruns/frameworks/scenarios/lightning-ddp-clean-resume.sh
MD
finish_scenario
