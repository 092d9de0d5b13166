"""``ckptwatch collect``: one host's log files -> the events topic.

Each :meth:`Collector.step` polls every source (new lines, rotation, truncation: see
:mod:`ckptwatch.ingest.watcher`), applies the rules, publishes the events and waits for
the broker's acknowledgement (``acks=all``), and only then saves the sources' offsets to
the checkpoint file (atomically). A kill at any point re-reads at most the lines published
since the last checkpoint; consumers drop those by ``(source_id, offset)``.

Routing: job events are keyed by job, so one job's events stay in one partition, in order;
each step publishes one message per key holding its events as an Arrow (or NDJSON) batch
(:func:`~ckptwatch.kafka.codec.encode_event_batches`).
Host-level events (kernel, storage: lines that name no rank) are keyed by host and sent to
*every* partition of the events topic, so whichever detector owns a job also sees the
kernel OOM kill or NFS error of the hosts it runs on and joins them by host, pid and time,
as the embedded detector does. They are rare (only lines a rule matches), so the copies
cost little; the sink stores one (the first partition's, as their header says). Every
message says, per source, the offset saved for it when sent (a floor: no event of
the source below it is sent again), which lets the sink drop repeats in bounded memory
(:mod:`ckptwatch.sinks.stored_offsets`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import re
import socket
from collections.abc import Callable, Mapping, Sequence

import polars as pl

from ckptwatch import failpoints
from ckptwatch.config import Config
from ckptwatch.detectors.events import host_event_expr
from ckptwatch.ingest.checkpoint import FileCheckpointer, SourceCheckpoint
from ckptwatch.integrity.watch import CheckpointWatcher
from ckptwatch.ingest.watcher import SourceWatcher
from ckptwatch.kafka.admin import ensure_topics
from ckptwatch.kafka.codec import (FANOUT_HEADER, FLOORS_HEADER, SOURCES_HEADER, encode_event_batches,
                                   encode_floors, encode_sources)
from ckptwatch.kafka.producer import Message, Publisher
from ckptwatch.pipeline import extract_events
from ckptwatch.rules import RuleSet
from ckptwatch.sinks.metrics import Metrics

UNKNOWN_JOB = b"unknown"
_HOST_MARK = "\x00host:"


class Collector:
    """Tails ``config.collect.paths`` and publishes their events to ``config.kafka.events_topic``.

    Raises CheckpointError (from :class:`FileCheckpointer`) when the checkpoint file exists
    but cannot be read; BrokerUnavailable when no broker answers at start within
    ``[kafka] connect_timeout`` seconds (a minute by default; see
    :func:`~ckptwatch.kafka.admin.ensure_topics`).
    ``metrics`` gets lines, events and skipped input every step (a new one when None).
    ``job``: the job of every file whose path the template names none (``--job``).
    """

    def __init__(self, config: Config, *, rules: RuleSet, template: re.Pattern[str] | None = None,
                 boot_time: dt.datetime | None = None, line_prefix: str | None = None,
                 on_wait: Callable[[str], None] | None = None, metrics: Metrics | None = None,
                 job: str | None = None) -> None:
        self.config = config
        self.metrics = metrics or Metrics()
        self.rules = rules
        self.checkpointer = FileCheckpointer(config.collect.checkpoint)
        own = os.path.abspath(config.collect.checkpoint)
        self.checkpoints = CheckpointWatcher.from_settings(config.collect)
        extra = [str(self.checkpoints.log)] if self.checkpoints else []
        committed = self.checkpointer.load()
        self._saved = dict(committed)  # what the checkpoint file holds, by source id
        self.watcher = SourceWatcher(
            config.collect.paths + extra, template=template, boot_time=boot_time, line_prefix=line_prefix,
            committed=committed,
            exclude=lambda p: os.path.abspath(p).startswith(own), job=job,
        )
        self.stats = self.watcher.stats
        try:
            ensure_topics(config.kafka, on_wait=on_wait)
            self.publisher = Publisher(config.kafka, client_id="ckptwatch-collect", on_wait=on_wait,
                                       compress=config.kafka.events_format != "arrow")
        except BaseException:  # no broker (BrokerUnavailable), or interrupted while waiting for one
            self._close_sources()
            raise
        self.published = 0
        #: this machine's name, sent with the files' paths (the sink's ``sources.host``)
        self.host = socket.gethostname()
        #: this collector, as the sink names it when another one follows the same file: its
        #: host and offsets file (the same across restarts, another for every other collector)
        self.collector_id = f"{self.host}:{os.path.realpath(own)}"

    def messages(self, events: pl.DataFrame) -> list[Message]:
        """The events as messages (:func:`event_messages`), each with the offsets saved for
        its sources as floors: no event below is sent again."""
        if events.is_empty():
            return []
        topic = self.config.kafka.events_topic
        saved = {sid: c.offset for sid, c in self._saved.items()}
        return event_messages(events, topic=topic, partitions=self.publisher.partitions(topic), floors=saved,
                              fmt=self.config.kafka.events_format,
                              files={sid: c.path for sid, c in self._saved.items()}, host=self.host,
                              collector=self.collector_id)

    def step(self, *, final: bool = False, now: dt.datetime | None = None) -> int:
        """Read, match, publish, checkpoint. Returns the number of events published.
        ``final``: the files will not grow (``--once``): flush held-back lines too."""
        if self.checkpoints:
            self.checkpoints.poll(wait=final)
        records = self.watcher.poll(final=final, now=now)
        events = extract_events(self.rules, records, self.stats) if not records.is_empty() else pl.DataFrame()
        self.metrics.observe_ingest(self.stats, events)
        if not events.is_empty():
            self._checkpoint_new_sources()  # before the messages: their floors are what is saved
        msgs = self.messages(events) if not events.is_empty() else []
        if msgs:
            self.publisher.publish(msgs)
            failpoints.hit("collect.after_publish")
        self._save(self.watcher.checkpoints())
        self.published += events.height
        return events.height

    def _checkpoint_new_sources(self) -> None:
        """Before publishing: add the sources the checkpoint file does not hold yet (first
        read in this step), at offset 0, to what it holds. A collector killed after the
        broker acknowledged their lines, before their offsets were saved, then knows them
        at restart: a copy made meanwhile by ``copytruncate`` (``train.log.1``) is read
        again under the source's id, so the lines published twice carry the same
        ``(source_id, offset)`` and consumers drop them (see :mod:`ckptwatch.ingest.rotation`).
        One more save, only in steps that find a new file or generation."""
        current = self.watcher.checkpoints()
        new = [dataclasses.replace(c, offset=0) for c in current if c.source_id not in self._saved]
        if new:
            self._save([*self._saved.values(), *new])

    def _save(self, entries: list[SourceCheckpoint]) -> None:
        """Save ``entries`` as the checkpoint file's content and remember them."""
        self.checkpointer.save(entries)
        self._saved = {c.source_id: c for c in entries}

    def close(self) -> None:
        """Close the checkpoint verifier, flush and close the producer (what is still
        unacknowledged is read again next time: its offsets were not saved), close the files."""
        self._close_sources(publisher=True)

    def _close_sources(self, *, publisher: bool = False) -> None:
        if self.checkpoints:
            self.checkpoints.close()
        if publisher:
            self.publisher.close()
        self.watcher.close()


def event_messages(events: pl.DataFrame, *, topic: str, partitions: Sequence[int], floors: Mapping[str, int],
                   fmt: str = "arrow", files: Mapping[str, str] | None = None,
                   host: str | None = None, collector: str | None = None) -> list[Message]:
    """``events`` (EVENT_SCHEMA) as messages of ``topic``: batches keyed by job (events of
    no job under ``unknown``), host events' batches keyed by host and copied to every one of
    ``partitions`` (the first one's copy named in :data:`~ckptwatch.kafka.codec.FANOUT_HEADER`,
    the one the sink stores), each message with the ``floors`` of its sources in
    :data:`~ckptwatch.kafka.codec.FLOORS_HEADER` (``source_id`` -> offset below which no
    event of the source is sent again; sources missing from ``floors`` get none), and the
    paths ``files`` gives its sources (``source_id`` -> path, read on ``host``) in
    :data:`~ckptwatch.kafka.codec.SOURCES_HEADER`, with the ``collector``'s id. Values are
    :func:`~ckptwatch.kafka.codec.encode_event_batches` in format ``fmt``."""
    if events.is_empty():
        return []
    job = pl.col("job").fill_null("")
    keys = events.select(  # a host key is marked apart from a job of the same name (no job name has a NUL)
        pl.when(host_event_expr()).then(pl.lit(_HOST_MARK) + pl.col("host").fill_null(""))
        .when(job == "").then(pl.lit(UNKNOWN_JOB.decode())).otherwise(job).cast(pl.Binary).alias("key"))["key"]
    sources = pl.DataFrame({"key": keys, "source_id": events["source_id"]}).unique(maintain_order=True)
    headers: dict[bytes, tuple[tuple[str, bytes], ...]] = {}
    for (key,), rows in sources.partition_by("key", as_dict=True).items():
        given = {sid: floors[sid] for sid in rows["source_id"] if sid in floors}
        named = {sid: files[sid] for sid in rows["source_id"] if sid in files} if files else {}
        headers[key] = (((FLOORS_HEADER, encode_floors(given)),) if given else ()) + (
            ((SOURCES_HEADER, encode_sources(host or "", named, collector)),) if named else ())
    out: list[Message] = []
    for key, value in encode_event_batches(events, keys, fmt=fmt):
        if key.startswith(_HOST_MARK.encode()):  # the sink stores one copy (floors hold for one)
            mark = ((FANOUT_HEADER, str(partitions[0]).encode()), *headers[key])
            out += [Message(topic, key.removeprefix(_HOST_MARK.encode()), value, partition=p, headers=mark)
                    for p in partitions]
        else:
            out.append(Message(topic, key, value, headers=headers[key]))
    return out
