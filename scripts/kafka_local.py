#!/usr/bin/env python3
"""Run a real Apache Kafka broker for development and tests, with nothing but Java and Maven.

    scripts/kafka-local start --dir .kafka        # prints the bootstrap address, e.g. 127.0.0.1:40123
    scripts/kafka-local stop --dir .kafka
    scripts/kafka-local status --dir .kafka

``start`` resolves ``org.apache.kafka:kafka_2.13`` and its runtime dependencies from Maven
Central with Maven (``scripts/kafka/pom.xml``) into a cache (``$CKPTWATCH_KAFKA_CACHE``, default
``~/.cache/ckptwatch/kafka-<version>``; the first run downloads ~40 MB, later runs reuse it),
formats a KRaft storage directory under ``--dir`` (once: a restart keeps the data), and
starts one JVM that is broker and controller at once, listening on free 127.0.0.1 ports
(or ``--port``; a restart reuses the port it had). It returns once the broker answers a
metadata request. ``stop`` sends SIGTERM (a clean shutdown) and SIGKILL after 30 s.

A broker counts as running only when the process in the pid file is alive (not a zombie:
a broker killed with ``kill -9`` stays one until its parent reaps it), is this directory's
broker, and answers on its port; a stale pid file is removed. So ``start`` right after a
``kill -9`` starts a new broker instead of handing back the dead one's address.

Standard library only, so it runs before the project's virtualenv exists.
"""

from __future__ import annotations

import argparse
import base64
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
POM = HERE / "kafka" / "pom.xml"
KAFKA_VERSION = "4.1.1"


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "ckptwatch" / f"kafka-{KAFKA_VERSION}"
    return Path(os.environ.get("CKPTWATCH_KAFKA_CACHE", default))


def fetch() -> Path:
    """The folder of jars, resolved by Maven on first use. Raises SystemExit if Maven fails."""
    lib = cache_dir() / "lib"
    done = cache_dir() / ".complete"
    if done.exists():
        return lib
    if shutil.which("mvn") is None or shutil.which("java") is None:
        sys.exit("kafka-local: needs java (17+) and mvn on PATH")
    tmp = cache_dir() / "lib.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"kafka-local: resolving Apache Kafka {KAFKA_VERSION} with Maven into {lib} ...", file=sys.stderr)
    cmd = ["mvn", "-q", "-B", "-f", str(POM), f"-Dkafka.version={KAFKA_VERSION}",
           "dependency:copy-dependencies", "-DincludeScope=runtime", f"-DoutputDirectory={tmp}"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"kafka-local: Maven could not resolve Kafka:\n{res.stdout[-3000:]}{res.stderr[-3000:]}")
    shutil.rmtree(lib, ignore_errors=True)
    tmp.rename(lib)
    done.write_text(KAFKA_VERSION + "\n")
    return lib


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _metadata_ok(port: int) -> bool:
    """True when the broker answers an ApiVersions request (the first thing a client sends)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            client = b"kafka-local"
            body = struct.pack(">hhih", 18, 0, 1, len(client)) + client
            s.sendall(struct.pack(">i", len(body)) + body)
            size = struct.unpack(">i", s.recv(4))[0]
            data = b""
            while len(data) < size:
                chunk = s.recv(size - len(data))
                if not chunk:
                    return False
                data += chunk
            return struct.unpack(">h", data[4:6])[0] == 0  # error_code NONE
    except (OSError, struct.error):
        return False


def _write_config(state: Path, port: int, controller_port: int) -> Path:
    props = state / "server.properties"
    props.write_text("\n".join([
        "process.roles=broker,controller",
        "node.id=1",
        f"controller.quorum.voters=1@127.0.0.1:{controller_port}",
        f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names=CONTROLLER",
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name=PLAINTEXT",
        f"log.dirs={state / 'data'}",
        "num.partitions=1",
        "offsets.topic.replication.factor=1",
        "offsets.topic.num.partitions=4",
        "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1",
        "group.initial.rebalance.delay.ms=0",
        # a broker killed (kill -9) keeps its registration until its lease runs out; the restarted
        # one is refused (DUPLICATE_BROKER_REGISTRATION) until then: 4 s instead of 9 s, heartbeats
        # every second (one node on loopback: its heartbeats do not cross a network)
        "broker.session.timeout.ms=4000",
        "broker.heartbeat.interval.ms=1000",
        "auto.create.topics.enable=false",
        "log.retention.hours=168",
        "",
    ]))
    (state / "log4j2.properties").write_text("\n".join([
        "status = warn",
        "appender.file.type = File",
        "appender.file.name = file",
        f"appender.file.fileName = {state / 'server.log'}",
        "appender.file.layout.type = PatternLayout",
        "appender.file.layout.pattern = [%d] %p %m (%c)%n",
        "rootLogger.level = INFO",
        "rootLogger.appenderRef.file.ref = file",
        "",
    ]))
    return props


def _java(lib: Path, state: Path, *args: str) -> list[str]:
    return ["java", "-Xms256m", "-Xmx768m", f"-Dlog4j2.configurationFile={state / 'log4j2.properties'}",
            "-cp", f"{lib}/*", *args]


def _alive(pid: int) -> bool:
    """``pid`` is a live process: not gone, not a zombie (one that is our child is reaped)."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False  # our child, dead: reaped now
    except ChildProcessError:
        pass  # not our child
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # another user's process: the pid was reused
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True  # no /proc (macOS): kill(0) is all there is
    return state not in ("Z", "X")


def _ours(pid: int, state: Path) -> bool:
    """``pid`` runs the broker of ``state`` (its command line names the state's config), not
    a process that reused a dead broker's pid. True where there is no /proc to tell."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True
    return str(state / "server.properties").encode() in cmdline


def _pid(state: Path) -> int | None:
    """The pid of the broker of ``state`` if its process is alive, else None (a stale pid
    file, of a broker killed or crashed, is removed)."""
    try:
        pid = int((state / "pid").read_text())
    except (OSError, ValueError):
        return None
    if _alive(pid) and _ours(pid, state):
        return pid
    (state / "pid").unlink(missing_ok=True)
    return None


def _port(state: Path) -> int | None:
    """The client port of ``state``'s broker, from its bootstrap file (None: never started)."""
    try:
        return int((state / "bootstrap").read_text().strip().rsplit(":", 1)[1])
    except (OSError, ValueError, IndexError):
        return None


def _running(state: Path, timeout: float) -> str | None:
    """The bootstrap address of ``state``'s broker if it runs: alive and answering on its
    port (waiting up to ``timeout`` seconds for one still starting). None if none runs (a
    stale pid file removed). Raises SystemExit for a live broker that does not answer."""
    pid, port = _pid(state), _port(state)
    if pid is None:
        return None
    deadline = time.monotonic() + timeout
    while port is not None and time.monotonic() < deadline:
        if _metadata_ok(port):
            return f"127.0.0.1:{port}"
        if _pid(state) is None:
            return None  # it died meanwhile
        time.sleep(0.3)
    where = f"on 127.0.0.1:{port}" if port is not None else "(no bootstrap file: still starting?)"
    sys.exit(f"kafka-local: the broker of {state} (pid {pid}) runs but does not answer {where}; stop it first")


def start(state: Path, port: int | None, timeout: float) -> str:
    """Start (or find running) the broker of ``state``; returns its bootstrap address."""
    state.mkdir(parents=True, exist_ok=True)
    addr_file = state / "bootstrap"
    running = _running(state, timeout)
    if running:
        return running
    lib = fetch()
    if port is None and addr_file.exists():
        port = int(addr_file.read_text().rsplit(":", 1)[1])  # a restart keeps its address
    port = port or free_port()
    controller_port = free_port()
    props = _write_config(state, port, controller_port)
    if not (state / "data" / "meta.properties").exists():
        cluster_id = uuid.uuid4().bytes[:16]
        cid = base64.urlsafe_b64encode(cluster_id).decode().rstrip("=")
        res = subprocess.run(_java(lib, state, "kafka.tools.StorageTool", "format", f"--cluster-id={cid}", "-c", str(props)),
                             capture_output=True, text=True)
        if res.returncode != 0:
            sys.exit(f"kafka-local: formatting storage failed:\n{res.stdout}{res.stderr}")
    with open(state / "stdout.log", "ab") as out:
        proc = subprocess.Popen(_java(lib, state, "kafka.Kafka", str(props)), stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    (state / "pid").write_text(str(proc.pid))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"kafka-local: broker exited with {proc.returncode}; see {state / 'server.log'}")
        if _metadata_ok(port):
            addr = f"127.0.0.1:{port}"
            addr_file.write_text(addr + "\n")
            return addr
        time.sleep(0.3)
    stop(state)
    sys.exit(f"kafka-local: broker did not answer on 127.0.0.1:{port} within {timeout:.0f} s; see {state / 'server.log'}")


def stop(state: Path, timeout: float = 30.0) -> bool:
    """Stop the broker of ``state`` (SIGTERM, then SIGKILL). Returns whether one was running."""
    pid = _pid(state)
    if pid is None:
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            break
        time.sleep(0.2)
    else:
        os.kill(pid, signal.SIGKILL)
        while _alive(pid) and time.monotonic() < deadline + 10:  # gone (or a zombie) at once, as a rule
            time.sleep(0.05)
    (state / "pid").unlink(missing_ok=True)
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kafka-local", description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=["fetch", "start", "stop", "status"])
    ap.add_argument("--dir", default=".kafka", help="state directory: config, data, logs, pid (default .kafka)")
    ap.add_argument("--port", type=int, default=None, help="client port (default: a free one)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the broker (default 120)")
    args = ap.parse_args(argv)
    state = Path(args.dir).resolve()
    if args.command == "fetch":
        print(fetch())
    elif args.command == "start":
        print(start(state, args.port, args.timeout))
    elif args.command == "stop":
        print("stopped" if stop(state) else "not running")
    else:
        pid, port = _pid(state), _port(state)
        running = pid is not None and port is not None and _metadata_ok(port)
        print(f"127.0.0.1:{port}" if running else "not answering" if pid is not None else "not running")
        return 0 if running else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
