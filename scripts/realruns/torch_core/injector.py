#!/usr/bin/env python3
"""External fault injector (adapted from /work/shared/corpus/_tools/kill_watcher.py).

Tails log files (globs, re-expanded while waiting), and when a line matching --pattern
appears, waits --delay seconds and sends --signal to the target process.

The target is found in /proc: a process whose environment holds every --env KEY=VALUE and
whose command line contains --cmd (e.g. train_core.py for a worker, torchrun for the launcher).
Everything it does is logged (with timestamps) to --log and as one JSON line to --fault-log.
"""
import argparse
import glob
import json
import logging
import os
import re
import signal
import time


def find_pids(envs, cmd_sub):
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            env = open(f"/proc/{d}/environ", "rb").read().split(b"\0")
            cmd = open(f"/proc/{d}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        e = dict(x.decode(errors="replace").split("=", 1) for x in env if b"=" in x)
        if all(e.get(k) == v for k, v in envs) and cmd_sub in cmd and "injector.py" not in cmd:
            pids.append((int(d), cmd))
    return pids


def listing(path):
    res = []
    for root, _, files in os.walk(path):
        for n in sorted(files):
            fp = os.path.join(root, n)
            try:
                res.append({"path": os.path.relpath(fp, path), "size": os.stat(fp).st_size})
            except OSError:
                pass
    return res


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--watch", action="append", required=True, help="glob of files to tail")
    p.add_argument("--pattern", required=True)
    p.add_argument("--nth", type=int, default=1, help="act on the n-th matching line")
    p.add_argument("--delay", type=float, default=0.3)
    p.add_argument("--signal", default="SIGKILL")
    p.add_argument("--env", action="append", default=[], help="KEY=VALUE the target's environment must hold")
    p.add_argument("--cmd", required=True, help="substring of the target's command line")
    p.add_argument("--ckpt-dir", default=None)
    p.add_argument("--log", required=True)
    p.add_argument("--fault-log", required=True)
    p.add_argument("--timeout", type=float, default=300)
    a = p.parse_args()
    logging.basicConfig(filename=a.log, level=logging.INFO,
                        format="%(asctime)s.%(msecs)03d injector[%(process)d]: %(message)s",
                        datefmt="%Y-%m-%d %H:%M:%S")
    log = logging.getLogger()
    envs = [tuple(x.split("=", 1)) for x in a.env]
    rx = re.compile(a.pattern)
    sig = getattr(signal, a.signal)
    log.info(f"watching {a.watch} for {a.pattern!r} (match #{a.nth}); target env={envs} cmd~{a.cmd!r}; "
             f"then sleep {a.delay}s and send {a.signal}")
    offsets, seen, t0 = {}, 0, time.time()
    while time.time() - t0 < a.timeout:
        hit = None
        for g in a.watch:
            for f in sorted(glob.glob(g)):
                off = offsets.get(f, 0)
                try:
                    with open(f, "rb") as fh:
                        fh.seek(off)
                        data = fh.read()
                except OSError:
                    continue
                cut = data.rfind(b"\n") + 1
                offsets[f] = off + cut
                for line in data[:cut].decode(errors="replace").splitlines():
                    if rx.search(line):
                        seen += 1
                        if seen == a.nth:
                            hit = (f, line)
                            break
                if hit:
                    break
            if hit:
                break
        if hit:
            t_obs = time.time()
            log.info(f"matched in {hit[0]}: {hit[1]!r}")
            time.sleep(a.delay)
            pids = find_pids(envs, a.cmd)
            if len(pids) != 1:
                log.info(f"expected exactly one target, found {pids}")
            pid = pids[0][0]
            t_kill = time.time()
            os.kill(pid, sig)
            lst = listing(a.ckpt_dir) if a.ckpt_dir else None
            log.info(f"sent {a.signal} to pid={pid} ({pids[0][1].strip()[:160]}) "
                     f"{t_kill - t_obs:.3f}s after the line was observed")
            if lst is not None:
                log.info(f"checkpoint dir {a.ckpt_dir} right after the signal: {json.dumps(lst)}")
            with open(a.fault_log, "a") as fh:
                fh.write(json.dumps({
                    "event": "external_signal", "signal": a.signal, "target_pid": pid,
                    "target_env": dict(envs), "target_cmd": pids[0][1].strip(), "matched_file": hit[0],
                    "matched_line": hit[1], "line_observed_time": t_obs, "signal_time": t_kill,
                    "signal_time_iso": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t_kill))
                    + f".{int(t_kill % 1 * 1000):03d}Z",
                    "ckpt_listing_right_after": lst}) + "\n")
            return
        time.sleep(0.01)
    log.info("timeout without match")


if __name__ == "__main__":
    main()
