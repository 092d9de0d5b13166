#!/usr/bin/env python3
"""EMULATION of `srun --ntasks N --label CMD` on one machine (Slurm is not installed here).

Starts N copies of CMD with the environment a Slurm step gives them (SLURM_PROCID, SLURM_LOCALID,
SLURM_NTASKS, SLURM_JOB_ID, SLURM_STEP_ID) plus the torch.distributed env:// variables
(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1, MASTER_PORT), and copies every stdout/stderr
line of task T to its own stdout/stderr prefixed the way `srun -l` does: the task id right-aligned
(space padded) to the width of the largest task id (N-1), then ": ".  This follows Slurm's
src/api/step_io.c (label width computed from the number of tasks, format "%*d: "), from memory.
When a task ends abnormally it prints, like srun, "srun: error: HOST: task T: Killed" (signal,
via strsignal) or "srun: error: HOST: task T: Exited with exit code C" (message text from memory
of Slurm's srun; not verified against the source in this session).
Like srun without --kill-on-bad-exit, it does not kill the other tasks.
"""
import argparse
import os
import signal
import socket
import subprocess
import sys
import threading


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ntasks", type=int, required=True)
    p.add_argument("--label", action="store_true")
    p.add_argument("--port", type=int, default=29600)
    p.add_argument("--job-id", default="4242")
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    a = p.parse_args()
    cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
    n = a.ntasks
    width = len(str(max(n - 1, 0)))
    host = socket.gethostname().split(".")[0]
    lock = threading.Lock()
    procs, threads = [], []

    def pump(stream, sink, t):
        pre = (f"{t:>{width}}: " if a.label else "").encode()
        for line in iter(stream.readline, b""):
            with lock:
                sink.buffer.write(pre + line if line.endswith(b"\n") else pre + line + b"\n")
                sink.buffer.flush()

    for t in range(n):
        env = dict(os.environ, SLURM_PROCID=str(t), SLURM_LOCALID=str(t), SLURM_NTASKS=str(n),
                   SLURM_JOB_ID=a.job_id, SLURM_STEP_ID="0", SLURMD_NODENAME=host,
                   RANK=str(t), WORLD_SIZE=str(n), LOCAL_RANK=str(t), LOCAL_WORLD_SIZE=str(n),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(a.port))
        pr = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        procs.append(pr)
        for s, sink in ((pr.stdout, sys.stdout), (pr.stderr, sys.stderr)):
            th = threading.Thread(target=pump, args=(s, sink, t), daemon=True)
            th.start()
            threads.append(th)
    rcs = [pr.wait() for pr in procs]
    for th in threads:
        th.join(timeout=5)
    worst = 0
    for t, rc in enumerate(rcs):
        if rc < 0:
            msg = signal.strsignal(-rc)
            worst = max(worst, 128 - rc)
        elif rc > 0:
            msg = f"Exited with exit code {rc}"
            worst = max(worst, rc)
        else:
            continue
        with lock:
            sys.stderr.write(f"srun: error: {host}: task {t}: {msg}\n")
            sys.stderr.flush()
    sys.exit(worst)


if __name__ == "__main__":
    main()
