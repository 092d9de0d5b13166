"""``ckptwatch sink``: the events and incidents topics -> DuckDB.

Each :meth:`SinkMember.step` polls both topics and, in one DuckDB transaction, inserts the
events (each ``(source_id, offset)`` once: a re-delivered event is dropped by the floors
its message carries, see :mod:`ckptwatch.sinks.stored_offsets`; of a host event's copies,
only the one on the partition its header names is stored), upserts the incidents by id (``detected_ts`` keeps its first value) and
records how far each partition was read (table ``kafka_offsets``). The database, not the
consumer group, is the authority on where to resume: on assignment each partition is
sought to the offset stored in the database, or to its beginning for a database that never
saw it (a new or moved file gets everything, not nothing). The group's offsets are
committed after the transaction too, for lag monitoring; and, after an assignment (a
restart, a crash, a rebalance), the resumed positions are committed at once, so the group's
offsets (what lag monitors read) are right before any new record arrives. One sink process owns the database
file (DuckDB allows one writer). With an alerter, the incidents' notifications are queued
in that same transaction and delivered from each step; each one delivered is mirrored to
the compacted notifications topic, which a sink on a new database restores its
notification log from before it consumes (:mod:`ckptwatch.services.notification_mirror`).

What the sink cannot take never stops it: a message that is no batch of events or no
incident, or an event of a batch that fails a check of the codec (a tombstone, 0 bytes,
``attrs`` not JSON, ``offset`` null, a time out of range: see :mod:`ckptwatch.kafka.codec`)
is skipped, counted (``ckptwatch_records_skipped_total{reason="bad_message"}``), said in one
line naming topic, partition, offset and field, and kept in the dead-letter topic
(:mod:`ckptwatch.kafka.dead_letters`) before the offsets past it are committed; the good
events of a batch are stored. Offsets of the events topic that were never received
(retention deleted them before the sink read them: :class:`~ckptwatch.kafka.consumer.OffsetGaps`)
are said in one line and counted (``reason="offsets_lost"``, one per offset). A broker
restart is waited out as the detector does: a step that cannot reach the broker says
``waiting for Kafka at ...`` (every few seconds), rewinds the fetch positions to what is
stored, and is tried again; ``answers again`` once it is back.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from kafka import TopicPartition
from kafka.errors import IllegalStateError, KafkaError
from kafka.consumer.fetcher import ConsumerRecord

from ckptwatch import failpoints
from ckptwatch.config import Config
from ckptwatch.detectors import Incident
from ckptwatch.kafka.admin import dead_letter_topic, ensure_topics
from ckptwatch.kafka.codec import (FANOUT_HEADER, FLOORS_HEADER, SOURCES_HEADER, DecodeError, decode_events_skipping,
                                   decode_floors, decode_incident, decode_sources)
from ckptwatch.kafka.consumer import GroupMember, LossWatch, LostOffsets, OffsetGaps, Outage, broker_away
from ckptwatch.kafka.dead_letters import dead_letter
from ckptwatch.kafka.producer import Publisher
from ckptwatch.services import notification_mirror
from ckptwatch.sinks.alerts.dispatcher import Alerter
from ckptwatch.sinks.duckdb_store import Store
from ckptwatch.sinks.metrics import Metrics
from ckptwatch.sinks.shared_sources import SharedSources


@dataclass
class SinkStats:
    """Counters of the sink: rows written, messages skipped (wholly or in part: each kept in
    the dead-letter topic), offsets of the events topic never received, steps the broker
    cut short."""

    events_received: int = 0
    events_inserted: int = 0
    incidents_upserted: int = 0
    bad_messages: int = 0
    offsets_lost: int = 0
    broker_waits: int = 0
    #: files found followed by two collectors (:mod:`ckptwatch.sinks.shared_sources`)
    sources_shared: int = 0


class _ToStore(NamedTuple):
    """What :meth:`SinkMember._to_store` finds in a batch of events records."""

    records: list[ConsumerRecord]  # the records to store
    floors: dict[str, int]  # source -> the lowest floor the headers give
    floored: list[bool]  # per record kept: it gave floors
    files: dict[str, tuple[str, str | None]]  # source -> (path, host)
    collectors: dict[str, str]  # source -> its first collector


class SinkMember:
    """Consumes ``config.kafka`` topics as group ``config.sink.group`` into ``store``.
    ``on_incident`` is called with each incident written (the console channel). ``metrics``
    gets the consumer lag and bad messages every step (a new one when None)."""

    def __init__(self, config: Config, store: Store, *, on_message: Callable[[str], None] | None = None,
                 alerter: Alerter | None = None,
                 on_incident: Callable[[Incident], None] | None = None, poll_timeout: float = 0.5,
                 metrics: Metrics | None = None) -> None:
        self.config = config
        days = config.sink.retention_days
        self.retention = dt.timedelta(days=days) if days > 0 else None  # raw events kept (None: all)
        self._retention_due: dt.datetime | None = None
        self.metrics = metrics or Metrics()
        self.store = store
        self._stored = store.kafka_offsets()  # (topic, partition) -> next offset, as in the database
        self.on_message = on_message or (lambda msg: None)
        self.on_incident = on_incident or (lambda inc: None)
        self.alerter = alerter
        self.poll_timeout = poll_timeout
        self.stats = SinkStats()
        ensure_topics(config.kafka, on_wait=self.on_message)
        k = config.kafka
        self.mirror: notification_mirror.Mirror | None = None
        if alerter is not None:  # a new database does not page again what was paged
            try:
                restored = notification_mirror.restore(k, alerter.log, say=self.on_message)
            except KafkaError as e:  # paging twice beats not starting: say so, go on
                restored = 0
                self.on_message(f"sink: could not read {k.notifications_topic} ({e}): the notification log "
                                "stays empty, so incidents paged by an earlier database may be paged again")
            if restored:
                self.on_message(f"sink: the notification log is new: {restored} notification(s) already sent "
                                f"restored from {k.notifications_topic}; they are not sent again")
            self.mirror = notification_mirror.Mirror(k, Publisher(k, client_id="ckptwatch-sink",
                                                                  on_wait=self.on_message), alerter.log)
            alerter.on_sent = self.mirror.sent
        self.joined = False  # until the group coordinator assigned us partitions
        self._resumed: set[TopicPartition] = set()  # assigned; their resumed position not committed yet
        self.dead_letters = dead_letter_topic(k)
        self._dlq: Publisher | None = None  # opened at the first dead letter
        self._gaps = OffsetGaps()  # of the events topic
        self.shared_sources = SharedSources()  # which collector publishes each file
        self._fanout_known: set[int] = set()  # partitions of the events topic, as last looked up
        self._outage = Outage(k.bootstrap_servers, self.on_message)
        self.member = GroupMember(k, config.sink.group, [k.events_topic, k.incidents_topic], client_id="ckptwatch-sink",
                                  on_assigned=self._assigned, on_revoked=self._revoked, on_wait=self.on_message)
        self._losses = LossWatch(self._gaps, self.member, k.events_topic, who=f"sink group {config.sink.group}",
                                 consequence="their events are not stored", outage=self._outage,
                                 on_lost=self._lost)

    def _assigned(self, partitions: set[TopicPartition]) -> None:
        # runs on kafka-python's IO thread: seeks only (offsets from memory), no blocking call
        self.joined = True
        self._resumed |= partitions
        for tp in partitions:
            where = self._stored.get((tp.topic, tp.partition))
            self._gaps.expect(tp, where)  # a database that never saw it: from its first record
            if where is None:
                self.member.seek_to_beginning([tp])
            else:
                self.member.seek(tp, where)

    def _revoked(self, partitions: set[TopicPartition]) -> None:
        self._resumed -= partitions
        self._gaps.forget(partitions)

    def _commit_resumed(self, records: list[ConsumerRecord]) -> None:
        """Commit where each newly assigned partition resumed (the offset stored in the
        database, or the beginning for one it never saw): what lag monitors read is right
        even while no record arrives. Partitions with records in this poll are committed
        after their transaction instead; one whose position is not known yet is tried
        again next step."""
        self._resumed -= {TopicPartition(r.topic, r.partition) for r in records}
        where: dict[TopicPartition, int] = {}
        for tp in sorted(self._resumed, key=lambda t: (t.topic, t.partition)):
            off = self.member.position(tp)
            if off is None:
                break  # no answer (the broker is away): the rest next step, not one timeout each
            where[tp] = off
        if where and self.member.commit(where):
            self._resumed -= set(where)

    def _dead_letters(self, bad: list[tuple[ConsumerRecord, DecodeError]]) -> None:
        """Skip, count, say and keep each message of ``bad`` (what it could not take, and
        why): published to the dead-letter topic, acknowledged before this returns (so
        before the offsets past it are committed)."""
        if not bad:
            return
        for r, e in bad:
            self.stats.bad_messages += 1
            self.metrics.count_bad_message(r.topic, r.partition, r.offset)  # once per process
            self.on_message(f"{r.topic} partition {r.partition} offset {r.offset}: skipped: {e}; "
                            f"kept in {self.dead_letters}")
        if self._dlq is None:
            self._dlq = Publisher(self.config.kafka, client_id="ckptwatch-sink-dlq", on_wait=self.on_message)
        self._dlq.publish([dead_letter(r, str(e), topic=self.dead_letters, group=self.config.sink.group)
                           for r, e in bad])

    def _lost(self, lost: LostOffsets) -> None:
        """Count and say offsets of the events topic never received."""
        self.stats.offsets_lost += lost.n
        self.metrics.count_offsets_lost(lost.topic, lost.partition, lost.first, lost.end)  # once per process
        self.on_message(lost.message)

    def step(self) -> int:
        """Poll, write, commit, deliver alerts. Returns the number of records consumed plus
        alert deliveries done or in flight (1 while not yet in the group, or while the
        broker cannot be reached, so that waiting is not mistaken for idleness).

        A broker that went away (a restart) is waited out: the step says so through
        ``on_message`` (every few seconds), rewinds the fetch positions to what is stored,
        and returns; the next step tries again. Raises KafkaError for a refusal."""
        alerts = self.alerter.step() if self.alerter else 0
        if self.mirror is not None:
            self.mirror.flush()
        self._retain()
        try:
            consumed = self._consume()
        except KafkaError as e:
            if not broker_away(e):
                raise
            self._broker_away(e)
            return 1 + alerts
        if broker_away(self.member.commit_error):  # stored; the group's offsets are committed later
            self._outage.away(self.member.commit_error)  # type: ignore[arg-type]
        else:
            self._outage.back()
        self.stats.broker_waits = self._outage.waits
        return consumed + alerts

    def _broker_away(self, e: KafkaError) -> None:
        """After a step failed for want of the broker: say so (every few seconds), fetch
        again from what is stored (records polled in the failed step were not), and pause
        a little."""
        self._outage.away(e)
        self.stats.broker_waits = self._outage.waits
        for tp in self.member.assignment():
            where = self._stored.get((tp.topic, tp.partition))
            try:
                if where is None:
                    self.member.seek_to_beginning([tp])
                else:
                    self.member.seek(tp, where)
            except (IllegalStateError, AssertionError):  # revoked meanwhile: the new owner reads it
                pass
            self._gaps.expect(tp, where)
        time.sleep(min(1.0, max(self.poll_timeout, 0.1)))

    def _retain(self) -> None:
        """Once an hour, delete raw events older than ``[sink] retention_days`` of jobs
        quiet that long (:meth:`Store.delete_events_before`)."""
        now = dt.datetime.now(dt.timezone.utc)
        if self.retention is None or (self._retention_due is not None and now < self._retention_due):
            return
        self._retention_due = now + dt.timedelta(hours=1)
        gone = self.store.delete_events_before(now - self.retention, quiet_jobs=True)
        if gone:
            self.on_message(f"sink: retention deleted {gone} events older than {self.retention.days} days")

    def _consume(self) -> int:
        records = self.member.poll(self.poll_timeout)
        if records:
            self._outage.contact()
        self._commit_resumed(records)
        self.metrics.set_consumer_lag(self.config.sink.group, self.member.lag())
        if not records:
            self._losses.quiet()
            return 0 if self.joined else 1
        self._losses.records(records)
        event_recs = []
        incidents: dict[str, Incident] = {}
        offsets: dict[TopicPartition, int] = {}
        bad: list[tuple[ConsumerRecord, DecodeError]] = []
        for r in records:
            offsets[TopicPartition(r.topic, r.partition)] = r.offset + 1
            if r.topic == self.config.kafka.events_topic:
                event_recs.append(r)
            else:
                try:
                    inc = decode_incident(r.value)
                    incidents[inc.id] = inc  # the latest version of each id wins
                except DecodeError as e:
                    bad.append((r, e))
        event_recs, floors, floored, files, claimed = self._to_store(event_recs)
        events, bad_events, counts = decode_events_skipping([r.value for r in event_recs])
        bad += [(event_recs[i], e) for i, e in bad_events]
        self._dead_letters(sorted(bad, key=lambda b: (b[0].topic, b[0].partition, b[0].offset)))
        unfloored: set[str] = set()  # sources with events that came without a floor: checked in the table
        start = 0
        for has_floor, n in zip(floored, counts, strict=True):
            if not has_floor and n:
                unfloored.update(events["source_id"].slice(start, n).unique().to_list())
            start += n
        self.stats.events_received += events.height
        done = {(tp.topic, tp.partition): off for tp, off in offsets.items()}
        with self.store.transaction():
            added, written = self.store.commit_kafka_batch(events, incidents.values(), done, floors, unfloored,
                                                           files=files, collectors=claimed)
            if self.alerter:
                self.alerter.notify(incidents.values())
        self._stored.update(done)
        self.stats.events_inserted += added
        self.stats.incidents_upserted += written
        for inc in incidents.values():
            self.on_incident(inc)
        failpoints.hit("sink.after_write")
        self.member.commit(offsets)
        return len(records)

    def _to_store(self, records: list[ConsumerRecord]) -> _ToStore:
        """The events records to store (of a host key's copies, the one its
        :data:`~ckptwatch.kafka.codec.FANOUT_HEADER` names), the sources' floors their
        headers give (the lowest when several messages give one; see
        :mod:`ckptwatch.sinks.stored_offsets`), whether each record kept gave floors,
        the sources' ``(path, host)`` their :data:`~ckptwatch.kafka.codec.SOURCES_HEADER`
        names (the newest message's), and the first collector of each source it names."""
        keep: list[ConsumerRecord] = []
        floors: dict[str, int] = {}
        floored: list[bool] = []
        files: dict[str, tuple[str, str | None]] = {}
        claims: list[tuple[str, dict[str, str]]] = []  # (collector, the sources it named)
        for r in records:
            headers = dict(r.headers or ())
            if FANOUT_HEADER in headers:
                fanout = self._fanout(r, headers[FANOUT_HEADER])
                if fanout is not None and fanout != r.partition:
                    continue  # another partition's copy is stored
            given = False
            if FLOORS_HEADER in headers:
                try:
                    for sid, floor in decode_floors(headers[FLOORS_HEADER]).items():
                        floors[sid] = min(floor, floors.get(sid, floor))
                    given = True
                except DecodeError as e:  # the events are stored all the same, checked against the table
                    self.on_message(f"{r.topic} partition {r.partition} offset {r.offset}: {e}; ignored")
            if SOURCES_HEADER in headers:
                try:
                    host, named, collector = decode_sources(headers[SOURCES_HEADER])
                    files.update((sid, (path, host or None)) for sid, path in named.items())
                    if collector is not None:
                        claims.append((collector, named))
                except DecodeError as e:  # the events are stored all the same, their files unnamed
                    self.on_message(f"{r.topic} partition {r.partition} offset {r.offset}: {e}; ignored")
            keep.append(r)
            floored.append(given)
        return _ToStore(keep, floors, floored, files, self._collectors(claims))

    def _collectors(self, claims: list[tuple[str, dict[str, str]]]) -> dict[str, str]:
        """Note which collector published each source (``claims``, in message order): the
        first one of a source, looked up in the database when this process has not seen it
        (it may have been published before a restart), is kept there by the next commit. A
        source published by another collector is said (once per pair of collectors), and
        counted (``ckptwatch_sources_shared_total``). Returns each named source's first
        collector, to keep in the store."""
        if not claims:
            return {}
        seen = {sid for _, named in claims for sid in named}
        self.shared_sources.learn(self.store.collectors_of(self.shared_sources.unknown(seen)))
        for collector, named in claims:
            for shared in self.shared_sources.published(collector, named):
                self.stats.sources_shared += 1
                self.metrics.sources_shared.inc()
                if shared.new_pair:  # one line per pair of collectors, the rest counted
                    self.on_message(shared.message())
        first = {sid: self.shared_sources.collector_of(sid) for sid in seen}
        return {sid: c for sid, c in first.items() if c}

    def _fanout(self, r: ConsumerRecord, value: bytes | None) -> int | None:
        """The partition whose copy of a host event is stored, as ``r``'s
        :data:`~ckptwatch.kafka.codec.FANOUT_HEADER` ``value`` names it; None (this copy is
        stored, and checked against the table) when it names no partition of the topic, which
        would otherwise leave every copy unstored, said in one line."""
        try:
            fanout = int(value)
        except (ValueError, TypeError):  # TypeError: a header without a value (None)
            fanout = None
        if fanout is not None and fanout not in self._fanout_known:
            self._fanout_known = self.member.partitions(r.topic)  # partitions may have been added
        if fanout is None or fanout not in self._fanout_known:
            shown = "without a value" if value is None else repr(value[:40])
            self.on_message(f"{r.topic} partition {r.partition} offset {r.offset}: header {FANOUT_HEADER} "
                            f"{shown} names no partition of the topic; this copy is stored")
            return None
        return fanout

    def close(self) -> None:
        """Leaves the group; waits for alerts in flight."""
        if self.alerter:
            self.alerter.close()
        if self.mirror is not None:
            self.mirror.flush()
            self.mirror.publisher.close()
        if self._dlq is not None:
            self._dlq.close()
        self.member.close()
