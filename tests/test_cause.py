"""Root-cause ordering of the detector, on small hand-built event streams: the killed
rank is blamed, not the ranks that report timeouts after it died."""

from __future__ import annotations

import datetime as dt
import json

from ckptwatch.detectors import Detector

T0 = dt.datetime(2026, 11, 30, 10, 0, tzinfo=dt.timezone.utc)
_n = iter(range(10_000))


def ev(kind, sec, *, rank=None, pid=None, step=None, job="job-a", host=None, line="", **attrs):
    off = next(_n)
    return {"ts": T0 + dt.timedelta(seconds=sec), "ts_source": "line", "job": job, "host": host, "rank": rank,
            "local_rank": rank, "pid": pid, "kind": kind, "step": step, "path": f"/c/step_{step}" if step else None,
            "rule_id": f"test.{kind}", "attrs": json.dumps(attrs), "source_id": "src", "source_kind": "log",
            "offset": off, "line": line or f"{kind} {attrs}", "dedup_key": f"k{off}"}


def world(n=4, job="job-a", host="h1"):
    return [ev("world_size", 0, rank=r, pid=100 + r, job=job, host=host, world_size=n) for r in range(n)]


def saves(step, sec, ranks=range(4), end=False):
    return [ev("save_end" if end else "save_start", sec, rank=r, step=step) for r in ranks]


def run(events):
    d = Detector()
    d.process(events)
    d.advance(final=True)
    return [i for i in d.incidents() if i.status != "superseded"]


def test_killed_rank_then_timeouts_on_all_others_blames_the_killed_rank():
    events = world() + saves(20, 1) + saves(20, 2, end=True) + saves(40, 10)
    events += [ev("collective_timeout", 40, rank=r, backend="nccl", seq=812, timeout_ms=30000) for r in (0, 1, 3)]
    events += [ev("agent_signal", 41, pid=p, signal="SIGTERM") for p in (100, 101, 103)]
    events += [ev("process_exit", 41.5, pid=102, exitcode=-9, reporter="agent")]  # reported late, died first
    events += [ev("process_exit", 41.6, pid=p, exitcode=-15, reporter="torchrun_summary") for p in (100, 101, 103)]
    (inc,) = run(events)
    assert (inc.kind, inc.step) == ("interrupted_save", 40)
    assert (inc.root_cause.cls, inc.root_cause.rank, inc.root_cause.pid, inc.root_cause.signal) == ("signal", 2, 102, "SIGKILL")
    assert inc.collateral == [0, 1, 3]
    assert inc.last_good_checkpoint == {"step": 20, "path": "/c/step_20"}


def test_kernel_oom_line_for_the_pid_makes_it_an_oom_kill():
    events = world() + saves(40, 10)
    events += [ev("oom_kill", 10.3, pid=102, job=None, host="h1", comm="python3")]
    events += [ev("process_exit", 11, pid=102, exitcode=-9, reporter="agent")]
    events += [ev("agent_signal", 10.9, pid=p, signal="SIGTERM") for p in (100, 101, 103)]
    (inc,) = run(events)
    assert (inc.root_cause.cls, inc.root_cause.rank, inc.root_cause.host) == ("oom_kill", 2, "h1")
    assert inc.root_cause.ts == T0 + dt.timedelta(seconds=10.3)


def test_oom_line_on_another_host_is_not_joined():
    events = world() + saves(40, 10)
    events += [ev("oom_kill", 10.3, pid=999, job=None, host="other-node", comm="python3")]
    events += [ev("process_exit", 11, pid=102, exitcode=-9, reporter="agent")]
    (inc,) = run(events)
    assert inc.root_cause.cls == "signal"


def test_sigabrt_after_own_nccl_timeout_is_not_the_cause():
    events = world() + saves(40, 10, ranks=(0, 1, 2, 3))
    events += [ev("collective_timeout", 40, rank=1, seq=811, backend="nccl"),
               ev("collective_timeout", 40.2, rank=0, seq=812, backend="nccl"),
               ev("collective_timeout", 40.2, rank=2, seq=812, backend="nccl"),
               ev("collective_timeout", 40.3, rank=3, seq=812, backend="nccl")]
    events += [ev("process_exit", 41, pid=100 + r, exitcode=-6, reporter="agent") for r in range(4)]
    (inc,) = run(events)
    assert (inc.root_cause.cls, inc.root_cause.rank) == ("collective_timeout", 1)
    assert "SeqNum 811" in inc.root_cause.note


def test_storage_error_during_save_is_its_own_kind():
    events = world() + saves(40, 10)
    events += [ev("storage_error", 12, rank=3, errno_name="ENOSPC", **{"class": "no_space"})]
    events += [ev("process_exit", 13, pid=103, exitcode=1, reporter="agent")]
    (inc,) = run(events)
    assert (inc.kind, inc.root_cause.cls, inc.root_cause.rank) == ("storage_failure_during_save", "storage_error", 3)


def test_partial_checkpoint_when_a_rank_never_finished_but_the_job_went_on():
    events = world() + saves(40, 10) + saves(40, 12, ranks=(0, 1, 3), end=True)
    events += [ev("metric", 20, rank=r, step=41, loss=0.4) for r in (0, 1, 3)]
    (inc,) = run(events)
    assert inc.kind == "partial_checkpoint"
    assert inc.checkpoint_state["started_not_finished"] == [2]


def test_stalled_save_only_past_the_deadline():
    events = world() + saves(40, 10) + saves(40, 12, ranks=(0, 1, 2), end=True)
    assert run(events + [ev("world_size", 600, rank=0, world_size=4)]) == []
    (inc,) = run(events + [ev("world_size", 3600, rank=0, world_size=4)])
    assert inc.kind == "stalled_save" and inc.checkpoint_state["started_not_finished"] == [3]


def test_clean_saves_give_nothing_and_rank0_only_logging_is_complete():
    events = world() + saves(20, 1) + saves(20, 2, end=True)
    events += [ev("save_start", 5, rank=0, step=40), ev("save_end", 6, rank=0, step=40)]
    assert run(events) == []


def test_duplicate_lines_count_once():
    a = ev("collective_timeout", 40, rank=0, backend="gloo")
    b = dict(a, source_id="other", offset=99999)  # the same worker line read from the console
    d = Detector()
    d.process(world() + saves(40, 10) + [a, b])
    assert d.stats.duplicates == 1


def test_a_sigabrt_reported_by_the_launcher_after_peers_timed_out_is_the_watchdogs_teardown():
    """DeepSpeed's launcher reports 'exits with return code = -6' for no rank; pdsh passes on
    exit code 250 (no signal: above 128 + 64). Ranks 0, 1, 3 time out waiting for rank 2,
    whose save never finished: rank 2 is blamed, for a collective timeout."""
    events = world() + saves(40, 10) + saves(40, 12, ranks=(0, 1, 3), end=True)
    events += [ev("collective_timeout", 1810, rank=r, backend="nccl", seq=9, timeout_ms=1800000) for r in (0, 1, 3)]
    events += [ev("process_exit", 1812, exitcode=-6, reporter="launcher")]
    events += [ev("process_exit", 1813, exitcode=250, reporter="launcher")]
    (inc,) = run(events)
    assert (inc.kind, inc.step) == ("interrupted_save", 40)
    assert (inc.root_cause.cls, inc.root_cause.rank) == ("collective_timeout", 2)
    assert inc.collateral == [0, 1, 3]


def test_a_rank_that_began_another_file_after_one_was_saved_has_not_finished():
    """DeepSpeed logs each file: '[Torch] Saving …/zero_pp_rank_N_mp_rank_00_model_states.pt...',
    '[Torch] Saved ….pt.'; rank 2 saved its model states, began its optimizer states and never
    said they were saved. A rank whose files all have their end line is done; an end line that
    names no file ends the rank's part whatever it began."""
    def file(kind, sec, rank, name):
        return ev(kind, sec, rank=rank, step=40, file=name)
    events = world()
    for r in range(4):
        events += [file("save_start", 10, r, f"zero_pp_rank_{r}_model_states.pt"),
                   file("save_end", 11, r, f"zero_pp_rank_{r}_model_states.pt"),
                   file("save_start", 11.5, r, f"bf16_zero_pp_rank_{r}_optim_states.pt")]
        if r != 2:
            events.append(file("save_end", 14, r, f"bf16_zero_pp_rank_{r}_optim_states.pt"))
    timeouts = [ev("collective_timeout", 1810, rank=r, backend="nccl", seq=9, timeout_ms=1800000) for r in (0, 1, 3)]
    (inc,) = run(events + timeouts)
    assert inc.checkpoint_state["started_not_finished"] == [2]
    assert inc.checkpoint_state["finished"] == [0, 1, 3]
    assert (inc.root_cause.cls, inc.root_cause.rank) == ("collective_timeout", 2)
    # the same, with rank 2's whole part ended by a line that names no file: nothing is open
    assert run(events + [ev("save_end", 15, rank=2, step=40)] + timeouts) == []
