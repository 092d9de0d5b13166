#!/usr/bin/env python3
"""EMULATION of `pdsh -w host1,host2 CMD` on one machine (pdsh/ssh are not used here).

Runs CMD once per "host" locally (in parallel), with %h in CMD replaced by the host name and %n
by its index, and copies each output line to stdout/stderr prefixed with "HOST: " as pdsh does.
A non-zero exit is reported like pdsh does with the ssh rcmd module:
"pdsh@LOCALHOST: HOST: ssh exited with exit code N" (text from memory of pdsh; emulated).
"""
import argparse
import socket
import subprocess
import sys
import threading


def main():
    p = argparse.ArgumentParser()
    p.add_argument("-w", required=True)
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    a = p.parse_args()
    cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
    hosts = a.w.split(",")
    me = socket.gethostname().split(".")[0]
    lock = threading.Lock()
    procs, threads = [], []

    def pump(stream, sink, h):
        for line in iter(stream.readline, b""):
            with lock:
                sink.buffer.write(f"{h}: ".encode() + line.rstrip(b"\n") + b"\n")
                sink.buffer.flush()

    for i, h in enumerate(hosts):
        c = [x.replace("%h", h).replace("%n", str(i)) for x in cmd]
        pr = subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        procs.append((h, pr))
        for s, sink in ((pr.stdout, sys.stdout), (pr.stderr, sys.stderr)):
            th = threading.Thread(target=pump, args=(s, sink, h), daemon=True)
            th.start()
            threads.append(th)
    worst = 0
    for h, pr in procs:
        rc = pr.wait()
        if rc != 0:
            code = rc if rc > 0 else 128 - rc
            worst = max(worst, code)
            with lock:
                sys.stderr.write(f"pdsh@{me}: {h}: ssh exited with exit code {code}\n")
                sys.stderr.flush()
    for th in threads:
        th.join(timeout=5)
    sys.exit(1 if worst else 0)


if __name__ == "__main__":
    main()
