"""The broker goes away for 10 s while a collector runs, then comes back: the collector says
it is waiting, does not crash, and every line reaches DuckDB once. Runs its own broker
(scripts/kafka-local), since it stops it."""

from __future__ import annotations

import dataclasses
import os
import threading
import time

import pytest
from kafka_support import ckptwatch, cli_env, expected_lines, fresh_config, save_lines, stored_lines

pytestmark = pytest.mark.kafka


def test_broker_restart_while_collecting(own_broker, tmp_path):
    local, state, addr = own_broker
    logs = tmp_path / "logs" / "job-outage"
    logs.mkdir(parents=True)
    log = logs / "rank0.log"
    log.write_text("")
    cfg = fresh_config(addr, tmp_path, partitions=2)
    env = cli_env(cfg, CKPTWATCH_COLLECT_PATH_TEMPLATE="{job}/rank{rank}.log")
    total, chunk = 2400, 100

    def writer():
        with open(log, "a") as f:
            for first in range(0, total, chunk):
                f.write(save_lines(first, chunk))
                f.flush()
                time.sleep(0.5)  # 12 s of writing, across the outage

    collector = ckptwatch(["collect", str(tmp_path / "logs"), "--until-idle", "5"], env)
    t = threading.Thread(target=writer)
    t.start()
    # stop the broker once the collector is publishing (its offsets file is written after the
    # first acknowledged batch), not at a fixed time: a slow start under load would otherwise
    # spend the outage inside topic creation, which is not what this test is about
    deadline = time.monotonic() + 60
    while not os.path.exists(cfg.collect.checkpoint):
        assert time.monotonic() < deadline and collector.poll() is None, "the collector never published"
        time.sleep(0.1)
    local.stop(state, 10.0)
    down = time.monotonic()
    time.sleep(10.0)
    assert collector.poll() is None, collector.communicate()[1]  # still running: waiting, not crashed
    local.start(state, None, 180.0)  # same data dir, same port
    outage = time.monotonic() - down
    t.join()
    _, err = collector.communicate(timeout=120)  # catches up, then exits once idle
    assert collector.returncode == 0, err
    assert "waiting for Kafka at " + addr in err
    sink = ckptwatch(["sink", "--until-idle", "4"], env)
    _, serr = sink.communicate(timeout=120)
    assert sink.returncode == 0, serr
    assert outage >= 10.0
    assert stored_lines(cfg.sink.db) == expected_lines(total)


@pytest.mark.parametrize("frozen_before", ["list_topics", "create_topics"])
def test_ensure_topics_is_bounded_when_the_broker_freezes_after_answering(own_broker, tmp_path, monkeypatch,
                                                                           frozen_before):
    """The broker answers the bootstrap, then freezes (SIGSTOP: a hung host, a network
    partition) before the topics are listed or created. ensure_topics used to wait for
    kafka-python's request timeouts (10 s, 30 s) and fail with a bare RequestTimedOutError;
    it now says it is waiting and gives up at connect_timeout with an error naming the broker."""
    import signal

    from kafka import KafkaAdminClient

    from ckptwatch.kafka.admin import BrokerUnavailable, ensure_topics

    local, state, addr = own_broker
    pid = int((state / "pid").read_text())
    cfg = fresh_config(addr, tmp_path)
    original = getattr(KafkaAdminClient, frozen_before)

    def freeze_then_call(self, *args, **kwargs):
        os.kill(pid, signal.SIGSTOP)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(KafkaAdminClient, frozen_before, freeze_then_call)
    said: list[str] = []
    settings = dataclasses.replace(cfg.kafka, connect_timeout=7.0, connect_hint_after=30.0)  # topics are new
    t0 = time.monotonic()
    try:
        with pytest.raises(BrokerUnavailable) as e:
            ensure_topics(settings, on_wait=said.append)
        took = time.monotonic() - t0
    finally:
        os.kill(pid, signal.SIGCONT)
    assert 7.0 <= took < 9.5, took
    assert str(e.value).startswith(f"Kafka at {addr} stopped answering while the topics were checked or created: "
                                   "gave up after 7 s: check the address")
    assert f"waiting for Kafka at {addr}: the broker stopped answering while the topics were checked" in said
