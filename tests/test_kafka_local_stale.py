"""``scripts/kafka-local`` does not take a dead broker for a running one (issue 35, item 14).
It used to trust the pid file as long as ``kill(pid, 0)`` succeeded, which it does for a
zombie (a broker killed with ``kill -9`` whose parent has not reaped it yet) and for any
process that reused the pid: ``start`` then handed back the dead broker's address and
``status`` said it ran. A broker runs when its process is alive, is this directory's broker
and answers on its port; a stale pid file is removed. No JVM here: the processes are
``sleep``; ``tests/test_fleet_sink_broker_restart.py`` restarts a real broker after a kill -9."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest
from kafka_support import kafka_local


def stale_state(tmp_path: Path, pid: int) -> Path:
    """A state directory whose pid file names ``pid`` and whose broker listened on a port
    nothing listens on now."""
    local = kafka_local()
    state = tmp_path / "broker"
    state.mkdir()
    (state / "pid").write_text(str(pid))
    (state / "bootstrap").write_text(f"127.0.0.1:{local.free_port()}\n")
    return state


@pytest.mark.parametrize("what", ["zombie", "pid reused", "gone"])
def test_status_and_start_see_no_broker_behind_a_stale_pid_file(tmp_path, capsys, what):
    local = kafka_local()
    proc = subprocess.Popen(["sleep", "30"])
    try:
        if what != "pid reused":
            proc.send_signal(signal.SIGKILL)  # not waited for: a zombie of this process
        if what == "gone":
            proc.wait()
        state = stale_state(tmp_path, proc.pid)
        assert local.main(["status", "--dir", str(state)]) == 1
        assert capsys.readouterr().out.strip() == "not running"
        assert not (state / "pid").exists()  # the stale pid file is gone
        (state / "pid").write_text(str(proc.pid))
        assert local._running(state, 1.0) is None  # start goes on to start a broker
    finally:
        proc.kill()
        proc.wait()
