#!/usr/bin/env python3
"""Hashing throughput of ``ckptwatch verify`` against ``sha256sum``, measured in one run on this machine.

    .venv/bin/python benchmarks/verify_throughput.py [--files 8] [--mib 128] [--trials 3]

1. Writes ``--files`` files of ``--mib`` MiB each (default 8 x 128 MiB = 1 GiB) of
   random-looking bytes into a temporary ``checkpoint-100/`` (one 1 MiB block from
   ``os.urandom``, its first 16 bytes changed per MiB, so no two blocks are equal), and
   writes its manifest with ``ckptwatch.integrity.manifest.create_manifest``.
2. Warms the page cache (every file read once more), so both sides hash from memory and
   the figures compare hashing, not the disk.
3. Times, best of ``--trials`` each, interleaved:

   * baseline: one ``sha256sum FILE...`` process over all the files (coreutils);
   * for reference, ``sha256sum`` parallelized by hand: the files split over one process
     per core, run at once;
   * ``verify``: ``ckptwatch.integrity.verify.verify(dir)`` as ``ckptwatch verify`` runs it:
     the manifest read, every file hashed on the default thread pool (one thread per core)
     and compared, each file's structural check (these files are of no known format, so that
     costs next to nothing);
   * ``hash_files(workers=1)``: the same hashing on one thread, to separate what the thread
     pool brings from what a faster SHA-256 implementation brings.

Prints MB/s (10^6 bytes per second) for each and the ratio to ``sha256sum``. Target on 2
cores: verify >= 1.5 x sha256sum.

    .venv/bin/python benchmarks/verify_throughput.py --bomb [--repeats 256] [--member-mib 64]

times ``verify`` on the issue-14 zip bomb instead: a torch zip (``data.pkl`` plus one DEFLATEd
member of ``--member-mib`` MiB of zeros) whose central directory lists that member
``--repeats`` times, all pointing at one local header (80 KB on disk). Before the fix: 41 s
and ``ok`` on this machine (every repeat inflated again); now each local header is read
once and the repeats are ``zip_duplicate_member`` / ``zip_overlap`` findings.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ckptwatch.integrity.hashing import default_workers, hash_files  # noqa: E402
from ckptwatch.integrity.manifest import create_manifest  # noqa: E402
from ckptwatch.integrity.verify import verify  # noqa: E402

MIB = 1 << 20


def bomb(repeats: int, member_mib: int) -> bytes:
    """The issue-14 archive (see the module docstring): PKWARE APPNOTE 4.3 records built by hand."""
    import pickle
    import struct
    import zlib

    out = bytearray()
    central = []

    def local(name: bytes, method: int, crc: int, payload: bytes, usize: int) -> None:
        central.append((name, method, crc, len(payload), usize, len(out)))
        out.extend(struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, method, 0, 0, crc, len(payload), usize,
                               len(name), 0) + name + payload)

    pkl = pickle.dumps({"step": 1}, protocol=2)
    local(b"archive/data.pkl", 0, zlib.crc32(pkl), pkl, len(pkl))
    co, zeros, parts, crc = zlib.compressobj(9, zlib.DEFLATED, -15), bytes(MIB), [], 0
    for _ in range(member_mib):
        parts.append(co.compress(zeros))
        crc = zlib.crc32(zeros, crc)
    local(b"archive/data/0", 8, crc, b"".join(parts) + co.flush(), member_mib * MIB)
    entries = central[:1] + central[1:] * repeats
    cd = len(out)
    for name, method, crc, csize, usize, off in entries:
        out.extend(struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 20, 20, 0, method, 0, 0, crc, csize, usize,
                               len(name), 0, 0, 0, 0, 0, off) + name)
    out.extend(struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, len(entries), len(entries), len(out) - cd, cd, 0))
    return bytes(out)


def run_bomb(args: argparse.Namespace) -> None:
    """Time ``verify`` on :func:`bomb` and print its verdict and findings."""
    tmp = Path(tempfile.mkdtemp(prefix="ckptwatch-bomb-"))
    try:
        ckpt = tmp / "checkpoint-1"
        ckpt.mkdir()
        (ckpt / "model.pt").write_bytes(bomb(args.repeats, args.member_mib))
        t0 = time.perf_counter()
        report = verify(ckpt)
        seconds = time.perf_counter() - t0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"zip bomb: {args.repeats} central entries x one {args.member_mib} MiB DEFLATEd member, "
          f"{(ckpt / 'model.pt').name}: verify {seconds:.2f} s, verdict {report.verdict}")
    for f in report.problems[0].findings if report.problems else []:
        print(f"  {f.verdict} {f.problem}: {f.detail[:160]}")


def make_files(d: Path, files: int, mib: int) -> list[Path]:
    """``files`` files of ``mib`` MiB under ``d``: cheap, and no two MiB blocks alike."""
    d.mkdir(parents=True)
    block = bytearray(os.urandom(MIB))
    out = []
    for i in range(files):
        p = d / f"model-{i:05d}-of-{files:05d}.bin"
        with open(p, "wb") as f:
            for j in range(mib):
                block[:16] = (i * mib + j).to_bytes(16, "little")
                f.write(block)
        out.append(p)
    return out


def warm(paths: list[Path]) -> None:
    buf = bytearray(4 * MIB)
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


def timed(fn) -> float:
    """Wall seconds of ``fn()``."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--mib", type=int, default=128, help="size of each file, MiB")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--dir", help="where to create the files (default: a new temporary directory, removed after)")
    ap.add_argument("--bomb", action="store_true", help="time verify on the issue-14 zip bomb instead")
    ap.add_argument("--repeats", type=int, default=256, help="--bomb: central directory entries of the member")
    ap.add_argument("--member-mib", type=int, default=64, help="--bomb: the member's uncompressed size, MiB")
    args = ap.parse_args()
    if args.bomb:
        run_bomb(args)
        return
    if shutil.which("sha256sum") is None:
        sys.exit("sha256sum (coreutils) is not on PATH: it is the baseline")
    tmp = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="ckptwatch-bench-"))
    ckpt = tmp / "checkpoint-100"
    try:
        paths = make_files(ckpt, args.files, args.mib)
        total = sum(p.stat().st_size for p in paths)
        create_manifest(ckpt)
        warm(paths)
        rels = [p.name for p in paths]

        def baseline() -> None:
            subprocess.run(["sha256sum", *map(str, paths)], check=True, stdout=subprocess.DEVNULL)

        def parallel_baseline() -> None:
            n = default_workers()
            procs = [subprocess.Popen(["sha256sum", *map(str, paths[i::n])], stdout=subprocess.DEVNULL)
                     for i in range(n)]
            if any(p.wait() for p in procs):
                raise RuntimeError("sha256sum failed")

        def ckptwatch_verify() -> None:
            report = verify(ckpt)
            assert report.verdict == "ok" and report.total_bytes == total, report.to_json()["counts"]

        def one_thread() -> None:
            out = hash_files(ckpt, rels, workers=1)
            assert all(r.ok for r, _ in out.values())

        sides = {"sha256sum": baseline, "verify": ckptwatch_verify, "one": one_thread, "par": parallel_baseline}
        timings: dict[str, list[float]] = {k: [] for k in sides}
        for _ in range(args.trials):  # interleaved, so a burst of other load hits every side alike
            for k, fn in sides.items():
                timings[k].append(timed(fn))
        base_s, ver_s, one_s, par_s = (min(timings[k]) for k in sides)
    finally:
        if not args.dir:
            shutil.rmtree(tmp, ignore_errors=True)

    mb = total / 1e6
    version = subprocess.run(["sha256sum", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    print(f"ckptwatch verify throughput, {os.cpu_count()} cores, {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC")
    print(f"  {args.files} files x {args.mib} MiB = {total:,} bytes, page cache warm, best of {args.trials}")
    print(f"  baseline: {version}; ckptwatch: hashlib on {ssl.OPENSSL_VERSION}, "
          f"{default_workers()} worker thread(s) by default")
    print(f"{'':44}{'seconds':>9}{'MB/s':>9}{'x sha256sum':>13}")
    for name, s in (("sha256sum FILE... (one process)", base_s),
                    (f"ckptwatch verify (manifest, {default_workers()} workers)", ver_s),
                    ("ckptwatch hash_files(workers=1)", one_s),
                    (f"sha256sum x {default_workers()} processes (by hand)", par_s)):
        print(f"{name:44}{s:9.2f}{mb / s:9.0f}{base_s / s:13.2f}")
    print(f"  parallel speed-up (verify vs one thread): {one_s / ver_s:.2f}x")
    print(f"  target: verify >= 1.5 x sha256sum ({'met' if base_s / ver_s >= 1.5 else 'NOT met'})")


if __name__ == "__main__":
    main()
