"""Helpers of the integrity tests: the real checkpoint fixture, the corpus' damage, and running
the CLI as a process that file permissions apply to (also when the tests run as root)."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path

#: A real 4-rank DCP checkpoint (HF/accelerate FSDP layout) from the corpus' 01-clean run.
CHECKPOINT = Path(__file__).resolve().parent / "fixtures" / "corpus" / "01-clean" / "artifacts" / "output" / "checkpoint-60"
SHARD = "pytorch_model_fsdp_0/__1_0.distcp"  # the shard scenario 07 truncated and bit-flipped
DELETED = "pytorch_model_fsdp_0/__2_0.distcp"  # the shard scenario 07 deleted


def copy_checkpoint(dst: Path) -> Path:
    """A writable copy of :data:`CHECKPOINT` at ``dst`` (``dst`` must not exist)."""
    shutil.copytree(CHECKPOINT, dst)
    for p in dst.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dst


def flip_middle_byte(path: Path) -> int:
    """XOR 0xFF the byte at the middle of the file, as scenario 07's bitflip-shard; returns its offset."""
    data = bytearray(path.read_bytes())
    off = len(data) // 2
    data[off] ^= 0xFF
    path.write_bytes(bytes(data))
    return off


def truncate_half(path: Path) -> int:
    """Truncate the file to 50 %, as scenario 07's truncated-shard; returns the new size."""
    size = path.stat().st_size // 2
    os.truncate(path, size)
    return size


def _drop_dac_capabilities() -> None:  # pragma: no cover - runs in the child before exec
    """Root ignores file modes through CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH: drop both from the
    bounding set so the exec'd process (still uid 0) gets "permission denied" like a user would."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            os._exit(97)


def run_cli(*args: object, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``python -m ckptwatch ARGS`` in a subprocess where file permissions are enforced."""
    return subprocess.run([sys.executable, "-m", "ckptwatch", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, preexec_fn=_drop_dac_capabilities if os.geteuid() == 0 else None,
                          env={**os.environ, "COLUMNS": "300"})
