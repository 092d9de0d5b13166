#!/usr/bin/env python3
"""Events through Kafka, collector to detector, without detection (issue 15: "the fleet
path carries >= 100,000 events/s from collectors to detectors").

    .venv/bin/python benchmarks/kafka_transport.py [--events 300000] [--kafka HOST:PORT] [--detect]

1. ``ckptwatch simulate`` writes a fleet (8 jobs x 4 nodes x 8 ranks); ingest and the rules
   turn it into the events frame a collector publishes; the frame is repeated (new offsets)
   up to ``--events``.
2. The collector's half, timed per stage: the messages (keys and batches,
   :meth:`Collector.messages <ckptwatch.services.collect.Collector.messages>`) and their
   publication (:class:`~ckptwatch.kafka.producer.Publisher`, ``acks=all``, idempotent).
3. The detector's half: a consumer of the events topic polls every message and decodes it
   (:func:`~ckptwatch.kafka.codec.decode_events`) into frames.
4. Both for each events format (``kafka.events_format``): ``ndjson`` (gzip by Kafka, the
   baseline) and ``arrow`` (LZ4 or zstd Arrow IPC, no Kafka compression), same events, same broker.
5. Two consumer processes in one group (``wait_for_members``: both hold partitions before
   the events are published) read one Arrow publication: each one's share and rate.
6. ``--detect``: Arrow again, the consumer doing a detector's work on every frame it decodes
   (``process_frame``, ``advance``): the fleet path with detection, one detector.

Prints events/s per stage and end to end (first message built -> last frame decoded), the
bytes on the wire, and which CRC32C kafka-python uses (its pure-Python one unless the
``crc32c`` package is installed). Without ``--kafka`` a broker is started with
``scripts/kafka-local`` and stopped after.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from kafka import KafkaConsumer  # noqa: E402
from kafka.record import util as record_util  # noqa: E402
from kafka_support import fresh_config, kafka_local, wait_for_members  # noqa: E402

from ckptwatch.detectors.runner import Detector, DetectorConfig  # noqa: E402
from ckptwatch.ingest.layout import compile_template  # noqa: E402
from ckptwatch.ingest.stats import Stats  # noqa: E402
from ckptwatch.ingest.watcher import SourceWatcher  # noqa: E402
from ckptwatch.kafka import codec  # noqa: E402
from ckptwatch.pipeline import extract_events  # noqa: E402
from ckptwatch.rules import RuleSet  # noqa: E402
from ckptwatch.services.collect import Collector  # noqa: E402
from ckptwatch.simulate import FleetSpec, generate  # noqa: E402


def fleet_events(tmp: Path, n: int) -> pl.DataFrame:
    """About ``n`` events of a simulated fleet, as a collector's rules make them."""
    truth = generate(tmp / "fleet", FleetSpec(jobs=8, nodes_per_job=4, ranks_per_node=8, steps=120))
    template = compile_template(truth["template"]) if truth["template"] else None
    watcher = SourceWatcher([str(tmp / "fleet" / "logs")], template=template)
    rules, stats, frames = RuleSet.load(()), Stats(), []
    while True:
        records = watcher.poll(final=True)
        frames.append(extract_events(rules, records, stats))
        if not watcher.backlog:
            break
    watcher.close()
    one = pl.concat([f for f in frames if not f.is_empty()])
    # each copy a fleet of its own (new job ids, offsets): detection sees new jobs, not re-deliveries
    copies = [one.with_columns(pl.col("offset") + i * (1 << 40), pl.col("job") + f"-c{i}")
              for i in range(-(-n // one.height))]
    return pl.concat(copies).head(n)


def transport(events: pl.DataFrame, fmt: str, tmp: Path, bootstrap: str, partitions: int, *,
              detect: bool = False) -> tuple[float, list, int]:
    """Publish ``events`` in format ``fmt`` to a new topic and consume them back; prints the
    stage times. ``detect``: the consumer also does a detector's work on each poll's frame
    (:meth:`Detector.process_frame` and :meth:`Detector.advance`, as ``DetectorMember.step``
    does). Returns (events/s end to end, the messages, bytes of values consumed)."""
    cfg = fresh_config(bootstrap, tmp, partitions=partitions)
    cfg = dataclasses.replace(cfg, collect=dataclasses.replace(cfg.collect, paths=[str(tmp / "none")]),
                              kafka=dataclasses.replace(cfg.kafka, events_format=fmt))
    collector = Collector(cfg, rules=RuleSet.load(()))
    t0 = time.perf_counter()
    msgs = collector.messages(events)
    t1 = time.perf_counter()
    collector.publisher.publish(msgs)
    t2 = time.perf_counter()
    collector.close()
    consumer = KafkaConsumer(cfg.kafka.events_topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                             enable_auto_commit=False, group_id=None, fetch_max_bytes=64 << 20,
                             max_partition_fetch_bytes=16 << 20)
    got, wire = 0, 0
    detector = Detector(DetectorConfig(source_idle=60.0)) if detect else None
    t3 = time.perf_counter()
    while got < events.height:
        batches = consumer.poll(timeout_ms=1000, max_records=10_000)
        values = [r.value for recs in batches.values() for r in recs]
        wire += sum(len(v) for v in values)
        frame = codec.decode_events(values)
        got += frame.height
        if detector is not None:
            detector.process_frame(frame)
            detector.advance()
    if detector is not None:
        detector.advance(final=True)
    t4 = time.perf_counter()
    consumer.close()
    n = events.height
    stage = "consume + decode + detect" if detect else "consume + decode"
    for name, s in (("messages (keys, batches)", t1 - t0), ("publish (acks=all)", t2 - t1),
                    (stage, t4 - t3), ("end to end", (t2 - t0) + (t4 - t3))):
        print(f"{fmt:8}{name:34}{s:8.2f}{n / s:12,.0f}")
    if detector is not None:
        print(f"{'':8}detector: {len(detector.jobs)} jobs, {len(detector.incidents())} incidents")
    return n / ((t2 - t0) + (t4 - t3)), msgs, wire


MEMBER = r'''
import sys, time
from kafka import KafkaConsumer
from ckptwatch.kafka import codec
bootstrap, topic, group, idle = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
c = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
                  enable_auto_commit=False, fetch_max_bytes=64 << 20, max_partition_fetch_bytes=16 << 20)
got, first, last, parts = 0, None, time.monotonic(), set()
while time.monotonic() - last < idle:
    batches = c.poll(timeout_ms=200, max_records=10_000)
    values = [r.value for recs in batches.values() for r in recs]
    if values:
        first = first or time.monotonic()
        got += codec.decode_events(values).height
        parts.update(tp.partition for tp in batches)
        c.commit()  # as a detector does: a rebalance after this member is done re-reads nothing
        last = time.monotonic()
print(got, (last - first) if first else 0.0, sorted(parts), flush=True)
c.close()
'''


def shares(events: pl.DataFrame, tmp: Path, bootstrap: str, partitions: int) -> None:
    """Two consumer processes in one group (as two detectors are) read one publication of
    ``events`` (Arrow); prints each one's partitions, events and events/s."""
    cfg = fresh_config(bootstrap, tmp, partitions=partitions)
    cfg = dataclasses.replace(cfg, collect=dataclasses.replace(cfg.collect, paths=[str(tmp / "none")]))
    collector = Collector(cfg, rules=RuleSet.load(()))  # creates the topic
    group = cfg.detect.group
    members = [subprocess.Popen([sys.executable, "-c", MEMBER, bootstrap, cfg.kafka.events_topic, group, "5"],
                                stdout=subprocess.PIPE, text=True, cwd=ROOT) for _ in range(2)]
    wait_for_members(bootstrap, group, 2)
    t0 = time.perf_counter()
    collector.publisher.publish(collector.messages(events))
    collector.close()
    print(f"two consumers in one group, {events.height:,} events (Arrow), published in {time.perf_counter() - t0:.2f} s:")
    total = 0
    for i, m in enumerate(members):
        got, secs, parts = m.communicate(timeout=300)[0].split(" ", 2)
        total += int(got)
        print(f"  member {i + 1}: partitions {parts.strip()}, {int(got):,} events ({int(got) / events.height:.0%}), "
              f"{int(got) / max(float(secs), 1e-9):,.0f} events/s while reading")
    print(f"  together {total:,} of {events.height:,}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=300_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--kafka", help="bootstrap of a running broker (default: start one)")
    ap.add_argument("--formats", nargs="+", default=["ndjson", "arrow"], choices=["ndjson", "arrow"],
                    help="events formats to measure, in this order (ndjson: the baseline)")
    ap.add_argument("--detect", action="store_true", help="also Arrow with a detector's work on every frame")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ckptwatch-transport-"))
    local = kafka_local()
    bootstrap = a.kafka or local.start(tmp / "broker", None, 180.0)
    try:
        events = fleet_events(tmp, a.events)
        (tmp / "none").mkdir()
        crc = "C (crc32c package)" if record_util._crc32c is not record_util.crc32c_py else "pure Python"
        print(f"ckptwatch Kafka transport, {events.height:,} events of a simulated fleet, "
              f"{a.partitions} partitions, CRC32C {crc}")
        print(f"{'format':8}{'stage':34}{'s':>8}{'events/s':>12}")
        rates = {}
        for fmt in a.formats:
            rates[fmt], msgs, wire = transport(events, fmt, tmp, bootstrap, a.partitions)
            print(f"{'':8}{len(msgs):,} messages, {wire / 1e6:.1f} MB of values")
        if len(rates) == 2:
            print(f"arrow / ndjson end to end: {rates['arrow'] / rates['ndjson']:.2f}x")
        if a.detect:
            rate, _, _ = transport(events, "arrow", tmp, bootstrap, a.partitions, detect=True)
            print(f"with detection (arrow, one detector): {rate:,.0f} events/s")
        shares(events, tmp, bootstrap, a.partitions)
        print("target: >= 100,000 events/s end to end")
    finally:
        if not a.kafka:
            local.stop(tmp / "broker")
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
