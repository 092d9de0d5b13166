"""A kernel OOM line joins the death it explains by pid when no host label is known (new-user
cases c19b, c19e: a single-node torchrun console beside, or pasted with, ``dmesg -T``). It was
ignored: host events joined a job only by host or by a pid mapped to a rank."""

from __future__ import annotations

import datetime as dt

from ckptwatch.detectors import Detector
from ckptwatch.pipeline import diagnose

CONSOLE = "".join(
    f"[default{r}]:2024-06-01 12:00:{t} INFO [rank{r}] train: {msg}\n"
    for t, msg, ranks in (
        ("10,000", "step 10/60 loss=1.90000 lr=1.0e-03", (0, 1)),
        ("10,100", "Saving checkpoint at step 10 to /ckpt/tz/step_10", (0, 1)),
        ("10,900", "Checkpoint saved to /ckpt/tz/step_10 (0.80s)", (0, 1)),
        ("20,000", "step 20/60 loss=1.80000 lr=1.0e-03", (0, 1)),
        ("20,100", "Saving checkpoint at step 20 to /ckpt/tz/step_20", (0, 1)),
        ("20,900", "Checkpoint saved to /ckpt/tz/step_20 (0.80s)", (0,)),
    ) for r in ranks
) + ("E0601 12:00:21.500000 6099 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -9) "
     "local_rank: 1 (pid: 6101) of binary: /usr/bin/python\n")


def _dmesg(pid: int, when: str = "12:00:21") -> str:
    return (f"[Sat Jun  1 {when} 2024] Out of memory: Killed process {pid} (python) total-vm:98765432kB, "
            "anon-rss:87654321kB, file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:180000kB oom_score_adj:0\n")


def _cause(tmp_path, files: dict[str, str]):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    incs, _ = diagnose([str(tmp_path)])
    assert [(i.kind, i.step) for i in incs] == [("interrupted_save", 20)]
    return incs[0].root_cause


def test_oom_line_in_dmesg_file_joins_by_pid(tmp_path):
    root = _cause(tmp_path, {"console.log": CONSOLE, "dmesg.txt": _dmesg(6101)})
    assert (root.cls, root.rank, root.pid) == ("oom_kill", 1, 6101)
    assert "no kernel OOM-killer line" not in (root.note or "")


def test_oom_line_pasted_with_console_joins_by_pid(tmp_path):
    root = _cause(tmp_path, {"paste.txt": CONSOLE + _dmesg(6101)})
    assert (root.cls, root.rank) == ("oom_kill", 1)


def test_other_pid_is_not_joined(tmp_path):
    root = _cause(tmp_path, {"console.log": CONSOLE, "dmesg.txt": _dmesg(7777)})
    assert (root.cls, root.signal) == ("signal", "SIGKILL")


def test_pid_far_apart_in_time_is_not_joined(tmp_path):
    root = _cause(tmp_path, {"console.log": CONSOLE, "dmesg.txt": _dmesg(6101, "12:09:00")})
    assert root.cls == "signal"


def _ev(i: int, kind: str, *, host: str | None, pid: int, local_rank: int | None = None, **attrs) -> dict:
    return {"ts": dt.datetime(2024, 6, 1, 12, 0, 21, tzinfo=dt.timezone.utc), "job": "j" if kind != "oom_kill" else None,
            "host": host, "kind": kind, "rank": None, "local_rank": local_rank, "pid": pid, "step": None,
            "path": None, "source_id": f"s{i}", "offset": 0, "rule_id": "t", "source_kind": "log",
            "line": "", "attrs": attrs}


def test_known_hosts_that_differ_are_not_joined():
    """Host unknown on either side is compatible with any; both known and different is not."""
    det = Detector()
    det.process([_ev(1, "process_exit", host="a", pid=6101, local_rank=1, exitcode=-9),
                 _ev(2, "oom_kill", host="b", pid=6101, scope="host"),
                 _ev(3, "oom_kill", host=None, pid=6101, scope="host")])
    assert det.jobs["j"].events and next(iter(det.jobs["j"].events.values())).died_of_signal
    assert [e.source_id for e in det._host_events_for(det.jobs["j"])] == ["s3"]
