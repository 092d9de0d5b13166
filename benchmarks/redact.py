"""Redaction time against line length: is it linear?

Times :meth:`ckptwatch.sinks.redact.Redactor.redact` (the packaged patterns) on one
line of 16 KiB, 64 KiB, 256 KiB and 1 MiB of each input below, least time of ``--repeat`` rounds,
(CPU time of the process) and prints the ratio time(1 MiB) / time(64 KiB): about 16 for linear time, about 256 for
quadratic. Inputs: random-ish log text (seeded), the same with a secret every ~4 KiB, and
adversarial lines built to make backtracking regexes retry at every position (runs of
``=``, ``:``, ``@``, ``a``, ``_``, ``-``, ``a.``, ``://``, ``s3://u:``, ``token="``, ``a:b@``, ``X-Amz-Signature%3D``, ``aws_secret_access_key ``,
``password``, ``x-amz-``, ``authorization: ``, non-ASCII text).

``--baseline`` also times the patterns of before issue 14 (kept below) on the 16 KiB lines
only (their 1 MiB times are hours).

    .venv/bin/python benchmarks/redact.py [--repeat 5] [--baseline]
"""

from __future__ import annotations

import argparse
import gc
import random
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ckptwatch.sinks.redact import Pattern, Redactor  # noqa: E402

KIB = 1024
SIZES = [16 * KIB, 64 * KIB, 256 * KIB, 1024 * KIB]

#: The packaged patterns before issue 14 (id, pattern, replacement), for --baseline.
OLD = [
    ("private_key_block", r"-----BEGIN ([A-Z ]*)PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)",
     r"-----BEGIN \1PRIVATE KEY----- [REDACTED]"),
    ("url_password", r"\b([a-z][a-z0-9+.-]*://[^/\s:@]+:)[^@\s]+@", r"\1[REDACTED]@"),
    ("bearer_token", r"(?i)\b(bearer)\s+[A-Za-z0-9\-._~+/]+=*", r"\1 [REDACTED]"),
    ("aws_access_key_id", r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b", "[REDACTED-AWS-KEY-ID]"),
    ("key_value_secret", r"(?i)((?<![A-Za-z0-9])[A-Za-z0-9_.-]*(?:aws_secret_access_key|aws_session_token|password|"
     r"passwd|pwd|secret|client_secret|token|api[_-]?key|access[_-]?key|hf_token|wandb_api_key)\s*[=:]\s*)"
     r"(?:\"[^\"]*\"|'[^']*'|[^\s,;]+)", r"\1[REDACTED]"),
    ("vendor_token", r"\b(?:ghp_[A-Za-z0-9]{36}|github_pat_[A-Za-z0-9_]{22,}|xox[baprs]-[A-Za-z0-9-]{10,}|"
     r"hf_[A-Za-z0-9]{30,}|sk-[A-Za-z0-9_-]{32,})\b", "[REDACTED-TOKEN]"),
]

_WORDS = ("step loss lr grad_norm rank saving checkpoint iteration to /mnt/ckpt/run-7/iter_0000040 NCCL INFO "
          "comm 0x55d1 nranks 8 cudaDev busId WARN Watchdog caught collective operation timeout SeqNum=4417 "
          "OpType=ALLREDUCE torch.distributed.elastic [default0]: tokens/s=18231 mem=71.2GiB").split()
_SECRETS = ("password=hunter2", "https://u:pw@minio.internal/x", "Authorization: Basic dXNlcjpwdw==",
            "ghs_16C7e42F292c6912E7710c838347Ae178B4a", "X-Amz-Signature=fe5f80f77d5fa3be", "?sv=1&sig=abc%3D")


def log_text(n: int, secrets: bool, seed: int = 14) -> str:
    """About ``n`` characters of log-like words on one line (seeded), optionally with a
    secret every ~4 KiB."""
    rng = random.Random(seed)
    out, size, next_secret = [], 0, 4 * KIB
    while size < n:
        w = rng.choice(_WORDS) if rng.random() < 0.8 else str(rng.randint(0, 10**6))
        if secrets and size >= next_secret:
            w, next_secret = rng.choice(_SECRETS), next_secret + 4 * KIB
        out.append(w)
        size += len(w) + 1
    return " ".join(out)[:n]


def repeat(unit: str, n: int) -> str:
    return (unit * (n // len(unit) + 1))[:n]


INPUTS = {
    "log text": lambda n: log_text(n, False),
    "log text + secrets": lambda n: log_text(n, True),
    "'=' * n": lambda n: repeat("=", n),
    "':' * n": lambda n: repeat(":", n),
    "'@' * n": lambda n: repeat("@", n),
    "'a' * n": lambda n: repeat("a", n),
    "'_' * n": lambda n: repeat("_", n),
    "'-' * n": lambda n: repeat("-", n),
    "'a.' * n": lambda n: repeat("a.", n),
    "'://' * n": lambda n: repeat("://", n),
    "'s3://u:' * n": lambda n: repeat("s3://u:", n),
    "'token=\"' * n": lambda n: repeat('token="', n),
    "'password' * n": lambda n: repeat("password", n),
    "'x-amz-' * n": lambda n: repeat("x-amz-", n),
    "'authorization: ' * n": lambda n: repeat("authorization: ", n),
    "'a:b@' * n": lambda n: repeat("a:b@", n),
    "'X-Amz-Signature%3D' * n": lambda n: repeat("X-Amz-Signature%3D", n),
    "'aws_secret_access_key ' * n": lambda n: repeat("aws_secret_access_key ", n),
    "non-ASCII log text": lambda n: repeat("ранг 3 сохранение █▌ ıd=", n),
}


def best(redactor: Redactor, text: str, runs: int) -> float:
    """Least CPU time of this process over ``runs`` redactions of ``text`` (seconds; the
    garbage collector off). CPU time, not wall time: on a shared machine a long run is
    descheduled more often than a short one, which would inflate the ratios."""
    times = []
    gc.disable()
    try:
        for _ in range(runs):
            t = time.process_time()
            redactor.redact(text)
            times.append(time.process_time() - t)
    finally:
        gc.enable()
    return min(times)


def sweep(redactor: Redactor, make, runs: int) -> dict[int, float]:
    """Size -> least time over ``runs`` rounds, each round timing every size once (so a burst
    of load elsewhere on the machine hits all sizes alike, and the least time drops it)."""
    texts = {n: make(n) for n in SIZES}
    out = {n: float("inf") for n in SIZES}
    for _ in range(runs):
        for n in SIZES:
            out[n] = min(out[n], best(redactor, texts[n], 1))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5, help="rounds per measurement (the least time is kept)")
    ap.add_argument("--baseline", action="store_true", help="also time the patterns of before issue 14 at 16 KiB")
    args = ap.parse_args()
    redactor = Redactor.load()
    old = Redactor([Pattern(i, re.compile(p), r, "old") for i, p, r in OLD]) if args.baseline else None
    head = "| input | " + " | ".join(f"{s // KIB} KiB, ms" for s in SIZES) + " | 1 MiB / 64 KiB |"
    if old:
        head += " before issue 14, 16 KiB, ms |"
    print(head)
    print("|---" * (len(SIZES) + 2 + bool(old)) + "|")
    for name, make in INPUTS.items():
        t = sweep(redactor, make, args.repeat)
        row = f"| {name} | " + " | ".join(f"{t[n] * 1e3:.2f}" for n in SIZES)
        row += f" | {t[SIZES[-1]] / max(t[64 * KIB], 1e-9):.1f} |"
        if old:
            row += f" {best(old, make(16 * KIB), 1) * 1e3:.1f} |"
        print(row, flush=True)


if __name__ == "__main__":
    main()
