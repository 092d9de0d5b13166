#!/usr/bin/env python3
"""External fault injector (adapted from shared/corpus/_tools/kill_watcher.py).

Tails --watch (a log file being written by a launcher, e.g. console.log), and when a line
matching --pattern appears for the --nth time, waits --delay seconds and sends --signal to
the target process:
  --target-env RANK=1 --script hf_train.py : the process whose environment has RANK=1 and whose
                                             command line mentions hf_train.py
  --target-env LOCAL_RANK=1 ...            : same with any variable
  --target-launcher CMD_SUBSTR             : the oldest process whose cmdline contains CMD_SUBSTR
                                             and that has no RANK/LOCAL_RANK in its environment
Everything it does is written to --log (text, timestamps) and --fault-log (one JSON line). It
never writes into the training log.
"""
import argparse
import json
import logging
import os
import re
import signal
import time


def procs():
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            env = open(f"/proc/{d}/environ", "rb").read().split(b"\0")
            cmd = open(f"/proc/{d}/cmdline", "rb").read().split(b"\0")
            start = int(open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[19])
        except (OSError, ValueError, IndexError):
            continue
        e = dict(x.split(b"=", 1) for x in env if b"=" in x)
        yield int(d), e, b" ".join(cmd).decode(errors="replace"), start


def find_target(a):
    cands = []
    for pid, env, cmd, start in procs():
        if pid == os.getpid():
            continue
        if a.target_env:
            k, v = a.target_env.split("=", 1)
            if env.get(k.encode()) == v.encode() and a.script in cmd and "fault_watcher" not in cmd:
                cands.append((start, pid, cmd))
        elif a.target_launcher:
            if (a.target_launcher in cmd and b"RANK" not in env and b"LOCAL_RANK" not in env
                    and "fault_watcher" not in cmd and not cmd.startswith("/bin/sh") and not cmd.startswith("timeout")
                    and "bash" not in cmd.split(" ")[0]):
                cands.append((start, pid, cmd))
    if not cands:
        return None, None
    cands.sort()
    return cands[0][1], cands[0][2]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--watch", required=True)
    p.add_argument("--pattern", required=True)
    p.add_argument("--nth", type=int, default=1)
    p.add_argument("--delay", type=float, default=0.3)
    p.add_argument("--signal", default="SIGKILL")
    p.add_argument("--target-env", default=None)
    p.add_argument("--script", default="")
    p.add_argument("--target-launcher", default=None)
    p.add_argument("--ckpt-dir", default=None)
    p.add_argument("--log", required=True)
    p.add_argument("--fault-log", required=True)
    p.add_argument("--timeout", type=float, default=600)
    a = p.parse_args()
    logging.basicConfig(filename=a.log, level=logging.INFO,
                        format="%(asctime)s.%(msecs)03d fault_watcher[%(process)d]: %(message)s",
                        datefmt="%Y-%m-%d %H:%M:%S")
    log = logging.getLogger()
    sig = getattr(signal, a.signal)
    rx = re.compile(a.pattern)
    t0 = time.time()
    log.info(f"watching {a.watch} pattern={a.pattern!r} nth={a.nth} delay={a.delay}s signal={a.signal} "
             f"target_env={a.target_env} script={a.script!r} target_launcher={a.target_launcher!r}")
    off, seen = 0, 0
    while time.time() - t0 < a.timeout:
        hit = None
        if os.path.exists(a.watch):
            with open(a.watch, "rb") as fh:
                fh.seek(off)
                data = fh.read()
            cut = data.rfind(b"\n") + 1
            off += cut
            for line in data[:cut].decode(errors="replace").splitlines():
                if rx.search(line):
                    seen += 1
                    if seen >= a.nth:
                        hit = line
                        break
        if hit is not None:
            t_obs = time.time()
            log.info(f"matched (occurrence {seen}): {hit!r}")
            time.sleep(a.delay)
            pid, cmd = find_target(a)
            if pid is None:
                log.info("no target process found; nothing sent")
                return
            t_kill = time.time()
            os.kill(pid, sig)
            lst = []
            if a.ckpt_dir and os.path.isdir(a.ckpt_dir):
                for root, _, files in os.walk(a.ckpt_dir):
                    for f in sorted(files):
                        fp = os.path.join(root, f)
                        try:
                            lst.append({"path": os.path.relpath(fp, a.ckpt_dir), "size": os.path.getsize(fp)})
                        except OSError:
                            pass
            log.info(f"sent {a.signal} to pid={pid} ({cmd[:200]}) at {t_kill:.3f}, "
                     f"{t_kill - t_obs:.3f}s after the line was observed")
            rec = {"event": "external_signal", "signal": a.signal, "target_pid": pid, "target_cmd": cmd[:300],
                   "target_env": a.target_env, "target_launcher": a.target_launcher,
                   "matched_line": hit, "line_observed_time": t_obs, "kill_time": t_kill,
                   "kill_time_iso": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t_kill))
                   + f".{int((t_kill % 1) * 1000):03d}Z", "ckpt_dir_right_after_kill": lst}
            with open(a.fault_log, "a") as fh:
                fh.write(json.dumps(rec) + "\n")
            return
        time.sleep(0.01)
    log.info("timeout without match")


if __name__ == "__main__":
    main()
