#!/usr/bin/env python3
"""Tiny Hugging Face Trainer run (GPT-2 built from a config, 2 layers, hidden 32), CPU/gloo.

Launched by torchrun or `accelerate launch` (2 processes). Nothing is downloaded
(HF_HUB_OFFLINE=1): the model comes from `GPT2Config`, the data is random token ids.

--log-style default   : only `transformers.logging.set_verbosity_info()` (transformers' own
                        handler on stderr, bare messages, no timestamps).
--log-style examples  : the setup of transformers' examples/pytorch/*/run_*.py
                        (basicConfig with asctime, set_verbosity_info, enable_explicit_format).

--probe : after a resume, run ckptwatch's output probe (ckptwatch.probe.hf.ProbeCallback) on a fixed
   batch of 8 sequences (eval mode); it prints one `ckptwatch event=probe ...` line (rank 0).

--save-sleep S --save-sleep-step N : fault-injection helper used to widen the save window.
   Inside the save of checkpoint-N, every rank sleeps S seconds after the model weights are
   written and before the optimizer/scheduler/RNG/trainer_state are. It prints nothing.
"""
import argparse
import logging
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments  # noqa: E402


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, n=512, seq=16, vocab=128, seed=0):
        g = torch.Generator().manual_seed(seed)
        # a learnable pattern: next token = (token + 1) % vocab, with random starts
        start = torch.randint(0, vocab, (n, 1), generator=g)
        self.x = (start + torch.arange(seq)) % vocab

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--output-dir", required=True)
    ap.add_argument("--max-steps", type=int, default=30)
    ap.add_argument("--save-steps", type=int, default=10)
    ap.add_argument("--resume", default=None, help="checkpoint dir, or 'latest' for resume_from_checkpoint=True")
    ap.add_argument("--log-style", choices=["default", "examples"], default="default")
    ap.add_argument("--save-sleep", type=float, default=0.0)
    ap.add_argument("--save-sleep-step", type=int, default=-1)
    ap.add_argument("--step-sleep", type=float, default=0.0, help="sleep per training step (keeps runs observable)")
    ap.add_argument("--probe", action="store_true", help="ckptwatch's output probe after a resume")
    a = ap.parse_args()

    if a.log_style == "examples":
        logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
                            datefmt="%m/%d/%Y %H:%M:%S", handlers=[logging.StreamHandler(sys.stdout)])
        transformers.utils.logging.set_verbosity_info()
        transformers.utils.logging.enable_default_handler()
        transformers.utils.logging.enable_explicit_format()
        logger = logging.getLogger("train")
        logger.setLevel(logging.INFO)
    else:
        transformers.logging.set_verbosity_info()
        logger = None

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=2, n_head=2)
    model = GPT2LMHeadModel(cfg)

    args = TrainingArguments(
        output_dir=a.output_dir,
        max_steps=a.max_steps,
        save_strategy="steps",
        save_steps=a.save_steps,
        logging_steps=1,
        per_device_train_batch_size=4,
        learning_rate=3e-3,
        lr_scheduler_type="constant",
        use_cpu=True,
        ddp_backend="gloo",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
    )
    if logger is not None:
        logger.warning(f"Process rank: {args.process_index}, device: {args.device}, n_gpu: {args.n_gpu}, "
                       f"distributed training: {args.parallel_mode.value == 'distributed'}")
        logger.info(f"Training/evaluation parameters: output_dir={args.output_dir} max_steps={args.max_steps} "
                    f"save_steps={args.save_steps}")

    trainer = Trainer(model=model, args=args, train_dataset=RandomTokens())

    if a.step_sleep > 0:
        from transformers import TrainerCallback

        class _Slow(TrainerCallback):
            def on_step_end(self, *_, **__):
                time.sleep(a.step_sleep)
        trainer.add_callback(_Slow())

    if a.save_sleep > 0:
        orig = trainer._save_optimizer_and_scheduler

        def slow(output_dir, _orig=orig):
            if trainer.state.global_step == a.save_sleep_step:
                time.sleep(a.save_sleep)
            return _orig(output_dir)
        trainer._save_optimizer_and_scheduler = slow

    if a.probe:
        from ckptwatch.probe.hf import ProbeCallback

        fixed = RandomTokens(n=8, seed=1).x

        def outputs(m):  # the callback runs it in eval mode, without autograd
            return m(input_ids=fixed.to(m.device)).logits.float().cpu().numpy()
        trainer.add_callback(ProbeCallback(outputs))

    resume = a.resume
    if resume == "latest":
        resume = True
    trainer.train(resume_from_checkpoint=resume)


if __name__ == "__main__":
    main()
