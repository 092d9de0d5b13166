#!/usr/bin/env python3
"""Add a case to the wild corpus (tests/wild), in the split its thread falls in.

    .venv/bin/python scripts/wild/addcase.py check THREAD
        which split THREAD falls in, and whether it is reserved or already in the corpus
    .venv/bin/python scripts/wild/addcase.py add --spec SPEC.json LOG [LOG ...]
        validate SPEC (see ckptwatch/wild.py and tests/wild/LABELING.md), refuse a reserved
        thread, and write the case: tests/wild/dev/<family>-<repo>-<n>/ or, for a held-back
        thread, tests/wild/heldback/hb-<digest>/ with the logs and spec gzipped

THREAD is ``owner/repo#N``, a GitHub issue / pull / discussion URL, or a forum post's URL.
Exit 0 on success, 2 on a refused or broken case (one line on stderr says why).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from ckptwatch.wild import (  # noqa: E402
    SPLITS, read_spec, reserved, reserved_digests, shared_dir, spec_problems, split_of, thread_key)

SHARED = shared_dir(ROOT)
WILD = ROOT / "tests" / "wild"


def _existing(key: str) -> list[Path]:
    out = []
    for split in SPLITS:
        for d in sorted((WILD / split).glob("*/")):
            try:
                if thread_key(read_spec(d)["thread"]) == key:
                    out.append(d)
            except (OSError, ValueError, KeyError):
                continue
    return out


def _fail(msg: str) -> int:
    print(f"addcase: {msg}", file=sys.stderr)
    return 2


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check")
    c.add_argument("thread")
    a = sub.add_parser("add")
    a.add_argument("--spec", required=True)
    a.add_argument("logs", nargs="+")
    args = ap.parse_args()
    digests = reserved_digests(SHARED)
    if not digests:
        return _fail(f"no reserved-thread list at {SHARED / 'holdout'}: cannot check a thread")
    if args.cmd == "check":
        key = thread_key(args.thread)
        if reserved(key, digests):
            print(f"{key}: RESERVED for outside evaluation: do not use it")
            return 2
        have = _existing(key)
        print(f"{key}: split {split_of(key)}; cases already from it: {len(have)}")
        return 0
    try:
        spec = json.loads(Path(args.spec).read_text())
    except (OSError, ValueError) as e:
        return _fail(f"{args.spec}: {e}")
    if not isinstance(spec, dict):
        return _fail(f"{args.spec}: not a JSON object")
    problems = spec_problems(spec)
    if problems:
        return _fail(f"{args.spec}: {problems[0]}")
    key = thread_key(spec["thread"])
    spec["thread"] = key
    if reserved(key, digests):
        return _fail(f"{key} is reserved for outside evaluation: never take a case from it")
    texts = []
    for p in args.logs:
        try:
            t = Path(p).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            return _fail(f"{p}: {e}")
        if not t.strip():
            return _fail(f"{p}: empty")
        texts.append((Path(p).name, t if t.endswith("\n") else t + "\n"))
    split = split_of(key)
    n = len(_existing(key))
    if split == "dev":
        owner_repo, num = key.split("#") if "#" in key else (key, "")
        repo = re.sub(r"[^a-z0-9]+", "-", owner_repo.split("/")[-1]).strip("-")[:24] if num else \
            re.sub(r"[^a-z0-9]+", "-", key).strip("-")[:32]
        name = f"{spec['family']}-{repo}-{num}" if num else f"{spec['family']}-{repo}"
    else:
        name = "hb-" + hashlib.sha256(key.encode()).hexdigest()[:10]
    base, k = name, n
    while (WILD / split / name).exists() or (k and name == base):
        k += 1
        name = f"{base}-{k}"
    d = WILD / split / name
    (d / "logs").mkdir(parents=True)
    if split == "dev":
        for fname, t in texts:
            (d / "logs" / fname).write_text(t)
        (d / "expected.json").write_text(json.dumps(spec, indent=1, ensure_ascii=False) + "\n")
        print(f"added {d.relative_to(ROOT)} (dev)")
    else:
        for fname, t in texts:
            (d / "logs" / (fname + ".gz")).write_bytes(gzip.compress(t.encode(), mtime=0))
        (d / "expected.json.gz").write_bytes(
            gzip.compress((json.dumps(spec, indent=1, ensure_ascii=False) + "\n").encode(), mtime=0))
        print(f"added {d.relative_to(ROOT)} (held-back: its content stays with whoever does not write rules)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
