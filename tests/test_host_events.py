"""Kernel log lines join the job by host and pid: the real 02 run plus the OOM-killer
lines a kernel would have printed for the killed pid (hand-written, realistic layout:
syslog prefix, kernel uptime, `Out of memory: Killed process PID (NAME) …`)."""

from __future__ import annotations

from ckptwatch.pipeline import diagnose

KERN = (
    "Nov 30 10:21:21 vm kernel: [ 4242.101000] python3 invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), order=0, oom_score_adj=0\n"
    "Nov 30 10:21:21 vm kernel: [ 4242.101200] oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,task_memcg=/user.slice,task=python3,pid=5879,uid=0\n"
    "Nov 30 10:21:21 vm kernel: [ 4242.101300] Out of memory: Killed process 5879 (python3) total-vm:9876543kB, anon-rss:7654321kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:15000kB oom_score_adj:0\n"
)


def test_kernel_oom_line_turns_the_sigkill_into_an_oom_kill(copy_scenario):
    logs = copy_scenario("02-sigkill-mid-save", "attempt-1-train")
    (logs / "kern.log").write_text(KERN)
    (inc,) = diagnose([str(logs)])[0]
    rc = inc.root_cause
    assert (inc.kind, inc.step, rc.cls, rc.rank, rc.pid, rc.host) == ("interrupted_save", 40, "oom_kill", 2, 5879, "vm")
    assert "Out of memory: Killed process 5879" in rc.line or "pid=5879" in rc.line
    assert inc.collateral == [0, 1, 3]


def test_oom_of_an_unrelated_pid_on_another_host_changes_nothing(copy_scenario):
    logs = copy_scenario("02-sigkill-mid-save", "attempt-1-train")
    (logs / "kern.log").write_text(KERN.replace(" vm ", " other-host ").replace("5879", "777"))
    (inc,) = diagnose([str(logs)])[0]
    assert (inc.root_cause.cls, inc.root_cause.rank) == ("signal", 2)
