"""Two collectors following the same file are named by the sink (issue 35, item 11).

Reproduced with a live simulated fleet (4 jobs x 2 nodes of torchrun consoles written at
250 lines/s, copytruncate rotations every 0.3-1.5 s, kill -9 of the collectors and the
broker every 1-4 s): with one collector per job directory, 0 lines stored twice over 57
kills; with two collectors over the same directory, 301 lines stored twice in 8 kills,
three consoles each under two source ids. A collector that followed a file reads its
copytruncate copy on under the file's id; the other collector, down when the copy was made,
can only read the copy as a new file, under another id. So the sink now says which file is
followed by which two collectors as soon as both publish it, before any copy exists
(``ckptwatch/sinks/shared_sources.py``)."""

from __future__ import annotations

import dataclasses

from kafka_support import failing_save, fresh_config, step_until

from ckptwatch.ingest.layout import compile_template
from ckptwatch.kafka import codec
from ckptwatch.kafka.admin import ensure_topics
from ckptwatch.rules import RuleSet
from ckptwatch.services.collect import Collector
from ckptwatch.services.sink import SinkMember
from ckptwatch.sinks.duckdb_store import Store
from ckptwatch.sinks.metrics import Metrics
from ckptwatch.sinks.shared_sources import SharedSources


def test_a_source_is_reported_once_per_second_collector_and_never_without_one():
    shared = SharedSources(max_sources=3)
    assert shared.published("h1:/a.json", {"s1": "/logs/r0.log", "s2": "/logs/r1.log"}) == []
    assert shared.published("h1:/a.json", {"s1": "/logs/r0.log"}) == []  # its own again: nothing
    found = shared.published("h2:/b.json", {"s1": "/logs/r0.log", "s3": "/logs/r2.log"})
    assert [(f.source_id, f.first, f.second) for f in found] == [("s1", "h1:/a.json", "h2:/b.json")]
    assert "/logs/r0.log (source s1) is followed by two collectors, h1:/a.json and h2:/b.json" in found[0].message()
    assert shared.published("h2:/b.json", {"s1": "/logs/r0.log"}) == []  # said once
    assert [(f.source_id, f.new_pair) for f in shared.published("h1:/a.json", {"s3": "/logs/r2.log"})] == [
        ("s3", False)]  # h1 and h2 share a second file: counted, not said again
    assert [(f.second, f.new_pair) for f in shared.published("h3:/c.json", {"s1": "/logs/r0.log"})] == [
        ("h3:/c.json", True)]
    assert shared.published(None, {"s1": "/logs/r0.log"}) == []  # a collector older than the field
    shared.published("h4:/d.json", {"s4": "x", "s5": "y", "s6": "z"})  # s1..s3 forgotten (3 kept)
    assert shared.published("h2:/b.json", {"s1": "/logs/r0.log"}) == []  # known anew as h2's


def test_pairs_of_collectors_are_bounded_and_a_forgotten_pair_is_said_again():
    shared = SharedSources(max_pairs=2)
    shared.published("a:/o", {"s1": "/l/1"})
    for other in ("b:/o", "c:/o", "d:/o"):  # three pairs found on s1: (a, b) is forgotten
        assert [f.new_pair for f in shared.published(other, {"s1": "/l/1"})] == [True]
    assert len(shared._pairs) == 2
    shared.published("a:/o", {"s2": "/l/2"})
    assert [f.new_pair for f in shared.published("b:/o", {"s2": "/l/2"})] == [True]  # (a, b) said again
    assert [f.new_pair for f in shared.published("d:/o", {"s2": "/l/2"})] == [False]  # (a, d) still known


def test_the_sources_header_names_its_collector_and_an_older_header_still_decodes():
    value = codec.encode_sources("node7", {"s1": "/logs/r0.log"}, "node7:/var/lib/ckptwatch/collect.json")
    assert codec.decode_sources(value) == ("node7", {"s1": "/logs/r0.log"}, "node7:/var/lib/ckptwatch/collect.json")
    assert codec.decode_sources(b'{"host":"node7","files":{"s1":"/logs/r0.log"}}').collector is None
    try:
        codec.decode_sources(b'{"host":"node7","files":{},"collector":7}')
    except codec.DecodeError as e:
        assert "ckptwatch-sources" in str(e)
    else:
        raise AssertionError("a collector id that is no string was taken")


def test_the_sink_names_each_file_two_collectors_publish_and_stores_its_lines_once(kafka_bootstrap, tmp_path):
    cfg = fresh_config(kafka_bootstrap, tmp_path, partitions=2)
    ensure_topics(cfg.kafka)
    logs = tmp_path / "logs"
    for job in ("job-a", "job-b"):
        (logs / job).mkdir(parents=True)
        for name, text in failing_save(job).items():
            (logs / job / name).write_text(text)
    template = compile_template("{job}/rank{rank}.log")
    ids = []
    # collector 1 follows job-a only; collector 2 (another offsets file) the whole tree: job-a twice
    for paths, ckpt in (([str(logs / "job-a")], "one.json"), ([str(logs)], "two.json")):
        c = dataclasses.replace(cfg, collect=dataclasses.replace(cfg.collect, paths=paths,
                                                                checkpoint=str(tmp_path / ckpt)))
        collector = Collector(c, rules=RuleSet.load(), template=template)
        try:
            collector.step(final=True)
            ids.append(collector.collector_id)
        finally:
            collector.close()
    assert ids[0] != ids[1] and ids[0].endswith(str(tmp_path / "one.json"))

    store, said, metrics = Store(cfg.sink.db), [], Metrics()
    sink = SinkMember(cfg, store, poll_timeout=0.2, on_message=said.append, metrics=metrics)
    try:
        step_until(sink, lambda m: m.stats.events_received >= 24)  # 8 of job-a from each collector, 8 of job-b
        stored = store.con.execute("SELECT job, count(*), count(DISTINCT line) FROM events GROUP BY job ORDER BY job"
                                   ).fetchall()
    finally:
        sink.close()
        store.close()
    assert stored == [("job-a", 8, 8), ("job-b", 8, 8)]  # the same file has the same ids: stored once
    shared = [m for m in said if "followed by two collectors" in m]  # one line for the pair, both files counted
    assert len(shared) == 1 and sink.stats.sources_shared == 2
    assert shared[0].startswith((f"{logs / 'job-a' / 'rank0.log'} (source ", f"{logs / 'job-a' / 'rank1.log'} (source "))
    assert f"two collectors, {ids[0]} and {ids[1]}:" in shared[0]
    assert "ckptwatch_sources_shared_total 2.0" in metrics.exposition()


def test_a_second_collector_that_starts_after_a_sink_restart_is_named(kafka_bootstrap, tmp_path):
    """Found by a fresh user: the first collector published in one sink session, the second
    in the next; the second sink had never seen the first collector and said nothing. The
    first collector of each source is kept in the sink's ``sources`` table."""
    cfg = fresh_config(kafka_bootstrap, tmp_path, partitions=1)
    ensure_topics(cfg.kafka)
    logs = tmp_path / "logs" / "job-a"
    logs.mkdir(parents=True)
    for name, text in failing_save("job-a").items():
        (logs / name).write_text(text)
    ids, said = [], []
    for ckpt in ("one.json", "two.json"):
        c = dataclasses.replace(cfg, collect=dataclasses.replace(cfg.collect, paths=[str(logs)],
                                                                checkpoint=str(tmp_path / ckpt)))
        collector = Collector(c, rules=RuleSet.load(), template=compile_template("{job}/rank{rank}.log"))
        try:
            collector.step(final=True)
            ids.append(collector.collector_id)
        finally:
            collector.close()
        store = Store(cfg.sink.db)  # a sink session per collector, on the same database
        sink = SinkMember(cfg, store, poll_timeout=0.2, on_message=said.append)
        try:
            step_until(sink, lambda m: m.stats.events_received >= 8)
            kept = store.con.execute("SELECT DISTINCT collector FROM sources").fetchall()
        finally:
            sink.close()
            store.close()
        assert kept == [(ids[0],)]  # the first collector stays the one kept
    shared = [m for m in said if "followed by two collectors" in m]
    assert len(shared) == 1 and f"two collectors, {ids[0]} and {ids[1]}:" in shared[0]
    assert sink.stats.sources_shared == 2


def test_one_collector_through_a_symlinked_path_is_one_collector(kafka_bootstrap, tmp_path):
    """The third attack round: the same offsets file reached through a symlinked directory was
    named as a second collector."""
    cfg = fresh_config(kafka_bootstrap, tmp_path, partitions=1)
    (tmp_path / "state").mkdir()
    (tmp_path / "state-link").symlink_to(tmp_path / "state")
    ids = []
    for where in ("state", "state-link"):
        c = dataclasses.replace(cfg, collect=dataclasses.replace(cfg.collect, paths=[str(tmp_path / "none")],
                                                                checkpoint=str(tmp_path / where / "off.json")))
        collector = Collector(c, rules=RuleSet.load())
        try:
            ids.append(collector.collector_id)
        finally:
            collector.close()
    assert ids[0] == ids[1] and ids[0].endswith(str(tmp_path / "state" / "off.json"))


def test_a_sink_stopped_by_sigterm_says_its_counts(kafka_bootstrap, tmp_path):
    """The third attack round: stopped by SIGTERM or Ctrl-C, ``sink`` printed only its alerts
    line, not what it stored and found (files shared by two collectors, offsets lost)."""
    import signal

    from kafka_support import ckptwatch, cli_env, wait_for_members

    cfg = fresh_config(kafka_bootstrap, tmp_path, partitions=1)
    ensure_topics(cfg.kafka)
    proc = ckptwatch(["sink"], cli_env(cfg))
    try:
        wait_for_members(kafka_bootstrap, cfg.sink.group, 1)  # the member exists and joined
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "0 new events, 0 incident writes, 0 bad messages skipped; database " in err
