#!/usr/bin/env python3
"""Fault injection: zero every weight of a checkpoint file in place, keeping it loadable.

What a save of parameters that were never gathered (ZeRO-3 / FSDP ``save_pretrained`` without
a full state dict) or a zero-filled copy leaves: a file with the right names, shapes and
dtypes whose values are all 0. It loads without an error; the model's outputs are constant.

    zero_weights.py out/checkpoint-30/model.safetensors   # safetensors (keeps its metadata)
    zero_weights.py ckpt/epoch=0-step=30.ckpt             # a Lightning checkpoint: its state_dict

Prints nothing; the scenario script records the injection.
"""
import sys

import torch


def main(path: str) -> None:
    if path.endswith(".safetensors"):
        from safetensors import safe_open
        from safetensors.torch import load_file, save_file

        with safe_open(path, "pt") as f:
            meta = f.metadata()
        sd = load_file(path)
        save_file({k: torch.zeros_like(v) for k, v in sd.items()}, path, metadata=meta)
    else:
        ck = torch.load(path, map_location="cpu", weights_only=False)
        ck["state_dict"] = {k: torch.zeros_like(v) for k, v in ck["state_dict"].items()}
        torch.save(ck, path)


if __name__ == "__main__":
    main(sys.argv[1])
