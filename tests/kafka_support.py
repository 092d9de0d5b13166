"""Helpers for the tests that use the real Kafka broker (see the ``kafka_bootstrap`` fixture).

The broker is Apache Kafka itself: started from its Maven Central artifacts by
``scripts/kafka-local`` (KRaft, one node, 127.0.0.1), or by testcontainers where a Docker
engine answers, or an existing one named by ``CKPTWATCH_TEST_KAFKA=host:port``.
"""

from __future__ import annotations

import collections
import importlib.util
import signal
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path


from ckptwatch.config import CollectSettings, Config, DetectSettings, KafkaSettings, SinkSettings

ROOT = Path(__file__).resolve().parent.parent


def kafka_local():
    """The ``scripts/kafka_local.py`` module (not a package: loaded from its path)."""
    spec = importlib.util.spec_from_file_location("kafka_local", ROOT / "scripts" / "kafka_local.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def docker_engine() -> bool:
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def step_until(member, done, timeout: float = 60.0):
    """Step a Kafka group ``member`` (sink or detector) until ``done(member)``; fails the test
    after ``timeout`` seconds, naming the member's stats. Returns the member."""
    deadline = time.monotonic() + timeout
    while not done(member):
        member.step()
        assert time.monotonic() < deadline, f"the member stopped at {getattr(member, 'stats', None)}"
    return member


def fresh_config(bootstrap: str, tmp: Path, *, partitions: int = 1) -> Config:
    """A config with topics and groups of its own, so tests sharing a broker never meet."""
    tag = uuid.uuid4().hex[:8]
    return Config(
        kafka=KafkaSettings(bootstrap_servers=bootstrap, events_topic=f"t{tag}.events",
                            incidents_topic=f"t{tag}.incidents", saves_topic=f"t{tag}.saves",
                            notifications_topic=f"t{tag}.notifications",
                            partitions=partitions),
        collect=CollectSettings(checkpoint=str(tmp / f"collect-{tag}.json"), interval=0.1),
        detect=DetectSettings(group=f"detect-{tag}", interval=0.1),
        sink=SinkSettings(db=str(tmp / f"sink-{tag}.duckdb"), group=f"sink-{tag}"),
    )


def cli_env(cfg: Config, **extra: str) -> dict[str, str]:
    """Environment that points a ``ckptwatch`` subprocess at ``cfg``'s broker, topics and groups."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTWATCH_")}
    env.update({
        "CKPTWATCH_KAFKA_BOOTSTRAP_SERVERS": cfg.kafka.bootstrap_servers,
        "CKPTWATCH_KAFKA_EVENTS_TOPIC": cfg.kafka.events_topic,
        "CKPTWATCH_KAFKA_INCIDENTS_TOPIC": cfg.kafka.incidents_topic,
        "CKPTWATCH_KAFKA_SAVES_TOPIC": cfg.kafka.saves_topic,
        "CKPTWATCH_KAFKA_NOTIFICATIONS_TOPIC": cfg.kafka.notifications_topic,
        "CKPTWATCH_KAFKA_PARTITIONS": str(cfg.kafka.partitions),
        "CKPTWATCH_COLLECT_CHECKPOINT": cfg.collect.checkpoint,
        "CKPTWATCH_COLLECT_INTERVAL": str(cfg.collect.interval),
        "CKPTWATCH_DETECT_GROUP": cfg.detect.group,
        "CKPTWATCH_DETECT_INTERVAL": str(cfg.detect.interval),
        "CKPTWATCH_SINK_GROUP": cfg.sink.group,
        "CKPTWATCH_SINK_DB": cfg.sink.db,
    })
    env.update(extra)
    return env


def ckptwatch(args: list[str], env: dict[str, str], **kw) -> subprocess.Popen:
    """Start ``python -m ckptwatch ARGS`` (stdout/stderr captured as text)."""
    return subprocess.Popen([sys.executable, "-m", "ckptwatch", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def finish(p: subprocess.Popen, timeout: float = 120) -> tuple[str, str]:
    """Wait for ``p``; assert it exited 0 (its stderr is the message); return (stdout, stderr)."""
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, err
    return out, err


def killed_at(failpoint: str, args: list[str], env: dict[str, str], timeout: float = 120) -> None:
    """Run ``ckptwatch ARGS`` until the failpoint kills it; assert it died by SIGKILL."""
    p = ckptwatch(args, {**env, "CKPTWATCH_FAILPOINTS": failpoint})
    p.communicate(timeout=timeout)
    assert p.returncode == -signal.SIGKILL


def published_per_id(bootstrap: str, topic: str) -> collections.Counter:
    """How many messages the incidents ``topic`` holds per incident id (its key)."""
    return collections.Counter(m.key.decode() for m in topic_messages(bootstrap, topic))


def topic_messages(bootstrap: str, topic: str) -> list:
    """Every message now in ``topic`` (all partitions), read without a group."""
    from ckptwatch.config import KafkaSettings
    from ckptwatch.kafka.consumer import read_to_end

    return read_to_end(KafkaSettings(bootstrap_servers=bootstrap), topic, client_id="test-reader")


def topic_events(bootstrap: str, topic: str) -> list[dict]:
    """Every event now in the events ``topic``, each message's batch split into its events
    (dicts, in order), whatever its format."""
    from ckptwatch.kafka.codec import decode_events

    return [e for m in topic_messages(bootstrap, topic) for e in decode_events([m.value]).to_dicts()]


def owned_partitions(bootstrap: str, group: str) -> list[int]:
    """How many partitions each member of consumer ``group`` owns (sorted), once the group is
    stable; empty while it rebalances or before it exists (kafka-python's ``describe_groups``)."""
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="test-group-watch")
    try:
        seen = admin.describe_groups([group])[group]
    except KafkaError:  # no coordinator yet: the group does not exist yet
        return []
    finally:
        admin.close()
    if seen["group_state"] != "Stable":
        return []
    return sorted(sum(len(t["partitions"]) for t in m["member_assignment"].get("assigned_partitions", []))
                  if isinstance(m["member_assignment"], dict) else 0 for m in seen["members"])


def wait_for_members(bootstrap: str, group: str, n: int, timeout: float = 60.0) -> None:
    """Block until consumer ``group`` is stable with ``n`` members, each with partitions
    assigned. Raises AssertionError after ``timeout`` seconds."""
    deadline, owned = time.monotonic() + timeout, []
    while time.monotonic() < deadline:
        owned = owned_partitions(bootstrap, group)
        if len(owned) == n and all(owned):
            return
        time.sleep(0.2)
    raise AssertionError(f"group {group} did not settle with {n} members in {timeout} s: partitions per member {owned}")


INCIDENT_COLS = ("id, kind, severity, status, job, step, checkpoint_path, root_cause_class, root_rank, root_host, "
                 "root_pid, root_ts, root_line, collateral, checkpoint_state, last_good_step, last_good_path, "
                 "remediation, first_ts")


def snapshot(db_path: str | Path) -> dict:
    """What a run left in DuckDB, minus wall-clock columns: current incidents (superseded
    versions left out), their evidence, and the stored events' ``(source_id, offset)``."""
    import duckdb

    con = duckdb.connect(str(db_path), read_only=True)
    try:
        incidents = con.execute(f"SELECT {INCIDENT_COLS} FROM incidents WHERE status <> 'superseded' ORDER BY id").fetchall()
        ids = [r[0] for r in incidents]
        evidence = con.execute(
            'SELECT incident_id, seq, source_id, "offset", role FROM incident_evidence '
            "WHERE list_contains(?, incident_id) ORDER BY incident_id, seq", [ids]).fetchall()
        keys = con.execute('SELECT source_id, "offset" FROM events ORDER BY source_id, "offset"').fetchall()
    finally:
        con.close()
    return {"incidents": incidents, "evidence": evidence, "event_keys": keys}


def run_embedded(logs: Path, db: Path, *, named: bool = True) -> dict:
    """``ckptwatch run --once`` in this process; returns :func:`snapshot` of its database.
    ``named`` False: job-less lines are job ``unknown``, as separate ``ckptwatch detect``
    services judge them (``run`` names them after the directory read)."""
    from ckptwatch.embedded import EmbeddedRunner
    from ckptwatch.pipeline import PipelineOptions

    runner = EmbeddedRunner(str(logs), str(db), PipelineOptions(name_unlabelled=named))
    try:
        runner.run(once=True)
    finally:
        runner.close()
    return snapshot(db)


def save_lines(first: int, n: int) -> str:
    """``n`` log lines, each one event: save_start / save_end of steps counted from
    ``first // 2``. Line ``i`` is told apart by ``(kind, step)``."""
    out = []
    for i in range(first, first + n):
        step, kind = divmod(i, 2)
        ts = f"2026-11-30 10:{(i // 600) % 60:02d}:{(i // 10) % 60:02d},{(i % 10) * 100:03d}"
        out.append(f"{ts} INFO ckptwatch event={'save_end' if kind else 'save_start'} step={step} path=/ckpt/step_{step}\n")
    return "".join(out)


def stored_lines(db_path: str | Path) -> list[tuple[str, int]]:
    """``(kind, step)`` of every stored event, sorted (duplicates kept, so a count shows them)."""
    import duckdb

    con = duckdb.connect(str(db_path), read_only=True)
    try:
        return sorted(con.execute("SELECT kind, step FROM events").fetchall())
    finally:
        con.close()


def expected_lines(n: int) -> list[tuple[str, int]]:
    return sorted(("save_end" if i % 2 else "save_start", i // 2) for i in range(n))


def assert_no_version_twice(bootstrap: str, topic: str) -> None:
    """Each message of the incidents topic is a new version of its incident: a replay or a
    rebalance never re-publishes one (a load failure may gain a version once the save
    incident of its checkpoint, found by another member, is learned)."""
    from ckptwatch.kafka.codec import decode_incident

    seen = collections.Counter((m.key, decode_incident(m.value).fingerprint()) for m in topic_messages(bootstrap, topic))
    assert [k for k, n in seen.items() if n > 1] == []


def fleet_equals_embedded(bootstrap: str, logs: Path, tmp: Path, *, partitions: int) -> list[dict]:
    """Run ``logs`` embedded and through the broker (``run --kafka --once`` in-process,
    ``partitions`` partitions); assert both left the same incidents, evidence and events in
    DuckDB and nothing was undecodable. Returns the incidents as ``{kind, step,
    root_cause: {class, rank}}`` for matching with ``conftest.unmatched``."""
    import dataclasses

    from ckptwatch.pipeline import PipelineOptions
    from ckptwatch.services import launch
    from ckptwatch.sinks.duckdb_store import Store

    embedded = run_embedded(logs, tmp / "embedded.duckdb")
    cfg = fresh_config(bootstrap, tmp, partitions=partitions)
    cfg = dataclasses.replace(cfg, collect=dataclasses.replace(cfg.collect, paths=[str(logs)]))
    store = Store(cfg.sink.db)
    try:
        collector, detector, sink = launch.run_all(cfg, PipelineOptions(), store, once=True, until_idle=2.0,
                                                   say=print)
    finally:
        store.close()
    fleet = snapshot(cfg.sink.db)
    assert fleet["incidents"] == embedded["incidents"]
    assert fleet["evidence"] == embedded["evidence"]
    assert fleet["event_keys"] == embedded["event_keys"]
    assert len(fleet["event_keys"]) == collector.published > 0
    assert detector.stats.bad_messages == sink.stats.bad_messages == 0
    return [{"kind": r[1], "step": r[5], "root_cause": {"class": r[7], "rank": r[8]}} for r in fleet["incidents"]]


def failing_save(job: str) -> dict[str, str]:
    """Two rank files of ``job``: a complete save, then rank 1 fails the next one with ENOSPC
    (8 events; rank file name -> text)."""
    t = "2026-11-30T08:0"
    out = {}
    for r in (0, 1):
        lines = [f"{t}0:00.00{r}000Z ckptwatch event=save_start step=10 rank={r} world_size=2 path=/ckpt/{job}/step_10",
                 f"{t}0:02.00{r}000Z ckptwatch event=save_end step=10 rank={r} world_size=2 files=2 bytes=4096 "
                 f"path=/ckpt/{job}/step_10",
                 f"{t}3:20.00{r}000Z ckptwatch event=save_start step=30 rank={r} world_size=2 path=/ckpt/{job}/step_30"]
        lines.append(f"{t}3:21.000000Z ERROR OSError: [Errno 28] No space left on device: '/ckpt/{job}/step_30/x.pt'"
                     if r else f"{t}3:22.000000Z ckptwatch event=save_end step=30 rank=0 world_size=2 files=2 "
                               f"bytes=4096 path=/ckpt/{job}/step_30")
        out[f"rank{r}.log"] = "\n".join(lines) + "\n"
    return out
