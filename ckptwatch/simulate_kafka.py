"""A simulated fleet published straight to Kafka: what its collectors would publish, at a
given rate, without tailing files (a load test of the fleet path from the events topic on:
detectors, sinks, alerts; and a way to time a failure's first event to its incident).

:func:`publish_fleet` generates the fleet (:func:`ckptwatch.simulate.generate`: the same
logs, ``truth.json``), reads its files once as a collector's ``--once`` would
(:class:`~ckptwatch.ingest.watcher.SourceWatcher`, the packaged rules) before the clock
starts, then publishes the events in the order their lines were written (each one's event
time less its host's clock offset: collectors publish a line when it is written, whatever
its host's clock stamps on it) at ``rate`` events per second (each
publish sends every event due by then and waits for the broker's acknowledgement), in the
collectors' messages (keyed by job, host events copied to every partition:
:func:`ckptwatch.services.collect.event_messages`). Each message carries floors (the lowest offset of its
sources still to be sent), so a sink drops nothing it should keep and looks nothing up.
``out/kafka.json`` records the figures and, per job with an injected failure, the wall
time (UTC) the message holding its first failure event was acknowledged.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import polars as pl

from ckptwatch.config import Config
from ckptwatch.ingest.stats import Stats
from ckptwatch.ingest.watcher import SourceWatcher
from ckptwatch.kafka.admin import ensure_topics
from ckptwatch.kafka.producer import Publisher
from ckptwatch.pipeline import extract_events
from ckptwatch.rules import RuleSet
from ckptwatch.services.collect import event_messages
from ckptwatch.simulate import FleetSpec, check_out, failure_written, generate

#: seconds at most between two publishes while waiting for events to be due
TICK_S = 0.05
#: events in one publish at most (its messages stay a few MB)
MAX_PUBLISH = 50_000


def fleet_events(logs: Path, template: re.Pattern[str] | None, rules: RuleSet,
                 truth: Mapping[str, Any] | None = None) -> tuple[pl.DataFrame, Stats]:
    """The events (EVENT_SCHEMA) of every file under ``logs``, read to their ends as
    ``collect --once`` reads them, sorted by event time (events without one last, each
    file's own order kept), and the reading's stats. With ``truth`` (what
    :func:`~ckptwatch.simulate.generate` returned for the fleet under ``logs``), sorted
    instead by when each line was written, in an added column ``written`` (UTC: its event
    time less its host's clock offset, the truth's ``skew_ms``): the order the fleet's
    collectors would publish them in. Raises OSError if ``logs`` cannot be listed."""
    watcher = SourceWatcher([str(logs)], template=template)
    frames = []
    try:
        while True:
            records = watcher.poll(final=True)
            if not records.is_empty():
                frames.append(extract_events(rules, records, watcher.stats))
            if not watcher.backlog:
                break
        paths = {c.source_id: c.path for c in watcher.checkpoints()}
    finally:
        watcher.close()
    events = pl.concat(frames) if frames else pl.DataFrame()
    if events.is_empty():
        return events, watcher.stats
    if truth is None:
        return events.sort("ts", nulls_last=True, maintain_order=True), watcher.stats
    offsets = {host: ms for job in truth["jobs"].values() for host, ms in job.get("skew_ms", {}).items()}
    by_source = pl.DataFrame({"source_id": list(paths), "_skew": [offsets.get(_host_of(Path(p), logs), 0)
                                                                  for p in paths.values()]},
                             schema={"source_id": pl.Utf8, "_skew": pl.Int64})
    events = (events.join(by_source, on="source_id", how="left", maintain_order="left")
              .with_columns(written=pl.col("ts") - pl.duration(milliseconds=pl.col("_skew").fill_null(0)))
              .drop("_skew"))
    return events.sort("written", nulls_last=True, maintain_order=True), watcher.stats


def _host_of(path: Path, logs: Path) -> str:
    """The host a file of a simulated fleet is of: ``<job>/<host>/...`` or ``kernel/<host>.log``."""
    rel = path.relative_to(logs) if path.is_relative_to(logs) else path
    if rel.parts[0] == "kernel":
        return rel.name.split(".log")[0]
    return rel.parts[1] if len(rel.parts) > 2 else ""


def floors_from(events: pl.DataFrame) -> pl.Series:
    """Per row of ``events`` (in send order), its source's floor when the row is sent: the
    lowest offset of the source among this row and the rows after it (no later event of
    the source lies below it), Int64."""
    return events.select(pl.col("offset").reverse().cum_min().reverse().over("source_id"))["offset"]


def initiating_rows(events: pl.DataFrame, failed_at: Mapping[str, dt.datetime], *, time: str = "ts"
                    ) -> dict[int, str]:
    """Row index in ``events`` (send order) -> job, of each job's first event at or after
    its failure's time ``failed_at[job]`` (UTC), by column ``time`` (``written``: when the
    lines were written, :func:`fleet_events`)."""
    if not failed_at or events.is_empty():
        return {}
    first = (events.with_row_index("_i").filter(pl.col("job").is_in(list(failed_at)))  # indexes of the whole frame
             .join(pl.DataFrame({"job": list(failed_at), "_at": list(failed_at.values())},
                                schema={"job": pl.Utf8, "_at": events[time].dtype}), on="job")
             .filter(pl.col(time) >= pl.col("_at")).group_by("job").agg(pl.col("_i").min()))
    return dict(zip(first["_i"].to_list(), first["job"].to_list(), strict=True))


def publish_fleet(out: Path, spec: FleetSpec, config: Config, *, rate: float | None = None,
                  template: re.Pattern[str] | None = None, rules: RuleSet | None = None,
                  on_wait: Callable[[str], None] | None = None,
                  clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep
                  ) -> dict[str, Any]:
    """Generate the fleet ``spec`` under ``out`` and publish its events to
    ``config.kafka.events_topic`` at ``rate`` events/s (None: as fast as the broker
    acknowledges). ``template``: the path template its layout needs (the truth's
    ``template``). Returns ``{"truth", "events", "messages", "seconds", "events_per_s",
    "initiated": {job: ISO wall time}}`` and writes it (without the truth) to
    ``out/kafka.json``.

    Raises:
        ValueError: a bad spec or rate, or ``out/logs`` already holds files.
        BrokerUnavailable: no broker answers within ``[kafka] connect_timeout``.
    """
    if rate is not None and not rate > 0:
        raise ValueError(f"rate must be more than 0 events/s, not {rate}")
    spec.check()
    check_out(out)
    ensure_topics(config.kafka, on_wait=on_wait)  # before the fleet is made: no broker, no files
    truth = generate(out, spec)
    events, _ = fleet_events(out / "logs", template, rules or RuleSet.load(), truth)
    floors = floors_from(events) if not events.is_empty() else pl.Series("offset", [], pl.Int64)
    # each injected failure's first event: the first event of its job written at or after the failure's first line
    initiating = initiating_rows(events, {job: at for job, j in truth["jobs"].items()
                                          if (at := failure_written(j)) is not None}, time="written")
    if "written" in events.columns:
        events = events.drop("written")
    topic = config.kafka.events_topic
    publisher = Publisher(config.kafka, client_id="ckptwatch-simulate", on_wait=on_wait,
                          compress=config.kafka.events_format != "arrow")
    initiated: dict[str, str] = {}
    messages = sent = 0
    began = clock()
    try:
        partitions = publisher.partitions(topic)
        while sent < events.height:
            # every event due by now, in one publish: a slow acknowledgement makes the next one larger
            due = events.height if rate is None else min(events.height, int((clock() - began) * rate) + 1)
            if due <= sent:
                sleep(min(TICK_S, max(0.0, began + (sent + 1) / rate - clock())))  # type: ignore[operator]
                continue
            end = min(due, sent + MAX_PUBLISH)
            batch = events.slice(sent, end - sent)
            tick_floors = dict(pl.DataFrame({"source_id": batch["source_id"], "floor": floors.slice(sent, end - sent)})
                               .unique("source_id", keep="first", maintain_order=True).iter_rows())
            msgs = event_messages(batch, topic=topic, partitions=partitions, floors=tick_floors,
                                  fmt=config.kafka.events_format)
            publisher.publish(msgs)
            messages += len(msgs)
            acked = dt.datetime.now(dt.timezone.utc).isoformat()
            for i in [i for i in initiating if sent <= i < end]:
                initiated[initiating.pop(i)] = acked
            sent = end
    finally:
        publisher.close()
    seconds = clock() - began
    result = {"events": events.height, "messages": messages, "seconds": round(seconds, 3),
              "events_per_s": round(events.height / seconds) if seconds > 0 else None, "initiated": initiated}
    (out / "kafka.json").write_text(json.dumps(result, indent=1) + "\n")
    return {**result, "truth": truth}
