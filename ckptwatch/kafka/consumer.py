"""A consumer-group member that commits offsets only when told to.

The services call :meth:`GroupMember.commit` after what depends on the consumed records is
durable (incidents produced, a DuckDB transaction committed): at-least-once delivery, made
exactly-once in effect by idempotent keys downstream.

Two helpers the consuming services share: :class:`Outage` says what a service says while
the broker is away (and once it is back), :class:`OffsetGaps` finds offsets a consumer
never received (deleted by retention before it read them).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import NamedTuple, TypeVar

from kafka import ConsumerRebalanceListener, KafkaConsumer, TopicPartition
from kafka.consumer.fetcher import ConsumerRecord
from kafka.errors import CommitFailedError, KafkaError, KafkaTimeoutError
from kafka.structs import OffsetAndMetadata

from ckptwatch.config import KafkaSettings
from ckptwatch.kafka import configuration

T = TypeVar("T")
PartitionsCallback = Callable[[set[TopicPartition]], None]

#: seconds between two "waiting for Kafka" lines while a consumer cannot bootstrap
REPORT_EVERY = 5.0


def _retrying(settings: KafkaSettings, attempt: Callable[[], T], *, why: Callable[[KafkaError], str],
              cleanup: Callable[[], None] | None = None, on_wait: Callable[[str], None] | None = None) -> T:
    """``attempt()`` until it returns, retrying each retriable KafkaError a second later
    (after ``cleanup()``, when given); ``on_wait`` is told "waiting for Kafka at … (why(e))"
    every :data:`REPORT_EVERY` seconds. Raises a KafkaError that is not retriable (a refusal)."""
    said = float("-inf")
    while True:
        try:
            return attempt()
        except KafkaError as e:
            if cleanup is not None:
                cleanup()
            if not getattr(e, "retriable", False):
                raise
            now = time.monotonic()
            if on_wait is not None and now - said >= REPORT_EVERY:
                said = now
                on_wait(f"waiting for Kafka at {settings.bootstrap_servers} ({why(e)})")
            time.sleep(1.0)


def connect(settings: KafkaSettings, client_id: str, group: str | None, *,
            on_wait: Callable[[str], None] | None = None) -> KafkaConsumer:
    """A KafkaConsumer for ``group`` (None: outside any group), waiting while no broker
    answers its bootstrap (a broker restarting after the service started): ``on_wait`` is
    told every :data:`REPORT_EVERY` seconds. Raises KafkaError for a refusal."""
    return _retrying(settings, lambda: KafkaConsumer(**configuration.consumer(settings, client_id, group)),
                     why=lambda e: "no broker answers", on_wait=on_wait)


def broker_away(e: BaseException | None) -> bool:
    """``e`` is what a broker going away (or not back yet) raises: no connection, a timeout,
    no coordinator. Refusals (authorization, a bad setting) are not; nor is None."""
    return isinstance(e, KafkaError) and bool(getattr(e, "retriable", False))


class Outage:
    """What a consuming service says while the broker at ``bootstrap`` is away: ``waiting for
    Kafka at ADDR (why)`` through ``say`` at most every :data:`REPORT_EVERY` seconds
    (:meth:`away`, after each step the broker cut short), and once a step reaches it again
    ``Kafka at ADDR answers again after N s`` (:meth:`back`). ``waits`` counts the steps cut
    short."""

    def __init__(self, bootstrap: str, say: Callable[[str], None]) -> None:
        self.bootstrap, self.say = bootstrap, say
        self.waits = 0
        self._since: float | None = None  # monotonic time the broker went away, while it is
        self._said = float("-inf")
        self._contact = True  # a request reached the broker since it was last found away

    def away(self, e: BaseException) -> None:
        """A step failed (or could not commit) for want of the broker: count it, say so every
        :data:`REPORT_EVERY` seconds."""
        self.waits += 1
        self._contact = False
        t = time.monotonic()
        if self._since is None:
            self._since = t
        if t - self._said >= REPORT_EVERY:
            self._said = t
            self.say(f"waiting for Kafka at {self.bootstrap} ({e})")

    def contact(self) -> None:
        """A request reached the broker (records came, or an offsets request was answered)."""
        self._contact = True

    def back(self) -> None:
        """A step ended without an error: say the broker answers again, if it was away and a
        request has reached it since (an empty poll raises nothing while it is away)."""
        if self._since is not None and self._contact:
            self.say(f"Kafka at {self.bootstrap} answers again after {time.monotonic() - self._since:.0f} s")
            self._since = None


#: seconds between two looks, while polls come back empty, for offsets retention deleted from
#: a quiet partition (:func:`lost_while_quiet`): one request to the broker each
QUIET_CHECK_S = 5.0


class OffsetGaps:
    """Offsets of a partition that a consumer skipped without receiving them. The topics
    here are neither compacted nor transactional, so a partition's offsets are consecutive
    and a jump is records gone: retention (or ``kafka-delete-records``) deleted them before
    they were read, the fetch position got ``OffsetOutOfRange`` and the consumer reset to
    the earliest offset left (``auto_offset_reset``), past them.

    Tell it where each partition is expected to go on (:meth:`expect`: the offset stored or
    committed when it was assigned; unknown: from the first record received) and give it
    every record received, in offset order per partition (:meth:`check`); records below the
    expected offset (a replay) move nothing."""

    def __init__(self) -> None:
        self._next: dict[TopicPartition, int] = {}
        #: partition -> the end of the offsets already found lost: after a broker restart the
        #: expectation goes back to what is stored, and the same gap is not found twice
        self._reported: dict[TopicPartition, int] = {}

    def _new(self, gaps: list[tuple[TopicPartition, int, int]]) -> list[tuple[TopicPartition, int, int]]:
        """The part of each gap not reported before (and remember it)."""
        out = []
        for tp, first, end in gaps:
            first = max(first, self._reported.get(tp, first))
            if first < end:
                out.append((tp, first, end))
                self._reported[tp] = end
        return out

    def expect(self, tp: TopicPartition, offset: int | None) -> None:
        """``tp`` should go on at ``offset`` (None: unknown; learned from its next record)."""
        if offset is None:
            self._next.pop(tp, None)
        else:
            self._next[tp] = offset

    def forget(self, partitions: Iterable[TopicPartition]) -> None:
        """``partitions`` left this consumer (revoked, or assigned afresh)."""
        for tp in partitions:
            self._next.pop(tp, None)

    def behind(self, starts: Mapping[TopicPartition, int]) -> list[tuple[TopicPartition, int, int]]:
        """``(partition, first offset missing, log start)`` for each partition expected to go
        on below the first offset its log still holds (``starts``: each partition's log start
        offset, from the broker): retention deleted what was next before any record came to
        show the jump (a quiet partition). The expectation moves to the log start, so the
        records that come later show no second jump."""
        gaps = []
        for tp, start in starts.items():
            want = self._next.get(tp)
            if want is not None and start > want:
                gaps.append((tp, want, start))
                self._next[tp] = start
        return self._new(gaps)

    def waiting(self) -> set[TopicPartition]:
        """The partitions with a known expected offset."""
        return set(self._next)

    def check(self, records: Iterable[ConsumerRecord]) -> list[tuple[TopicPartition, int, int]]:
        """``(partition, first offset missing, offset received)`` for each jump in
        ``records`` (the offsets ``first .. received - 1`` were never received)."""
        gaps = []
        for r in records:
            tp = TopicPartition(r.topic, r.partition)
            want = self._next.get(tp)
            if want is not None and r.offset > want:
                gaps.append((tp, want, r.offset))
            if want is None or r.offset >= want:
                self._next[tp] = r.offset + 1
        return self._new(gaps)


class LostOffsets(NamedTuple):
    """Offsets ``first`` .. ``end - 1`` of ``topic`` partition ``partition`` that a consumer
    never received, and the line that says so (:func:`lost_offsets`)."""

    topic: str
    partition: int
    first: int
    end: int
    message: str

    @property
    def n(self) -> int:
        """How many offsets were never received."""
        return self.end - self.first


def lost_offsets(gaps: OffsetGaps, records: Iterable[ConsumerRecord], *, who: str,
                 consequence: str) -> list[LostOffsets]:
    """Each jump :meth:`OffsetGaps.check` finds in ``records``: the offsets never received,
    and the line that says so (``who``: the consumer group, e.g. ``sink group g``;
    ``consequence``: what that costs, e.g. ``their events are not stored``). Count them with
    :meth:`Metrics.count_offsets_lost <ckptwatch.sinks.metrics.Metrics.count_offsets_lost>`,
    which counts each offset once per process however many consumers find it lost."""
    return _said(gaps.check(records), who=who, consequence=consequence)


def lost_while_quiet(gaps: OffsetGaps, member: GroupMember, topic: str, *, who: str,
                     consequence: str, outage: Outage | None = None) -> list[LostOffsets]:
    """What :func:`lost_offsets` finds, for the partitions of ``topic`` that received no
    record to show it: each one's expected offset against its log start offset, asked of the
    broker (one request). Call it when a poll came back empty (at most every few seconds),
    so a sink restarted after retention emptied a partition says so before anything new is
    published. An answer is ``outage``'s :meth:`Outage.contact`. Raises what :func:`broker_away` recognizes when the broker does not answer:
    the caller waits it out, as for a poll."""
    parts = [tp for tp in gaps.waiting() if tp.topic == topic and tp in member.assignment()]
    if not parts:
        return []
    starts = member.log_starts(parts)
    if outage is not None and starts:
        outage.contact()
    return _said(gaps.behind(starts), who=who, consequence=consequence)


class LossWatch:
    """A consumer's watch on the events topic's offsets it never received: the gaps in the
    records it gets (:func:`lost_offsets`) and, after empty polls at most every
    :data:`QUIET_CHECK_S` seconds, the gaps retention left in quiet partitions
    (:func:`lost_while_quiet`). Each gap goes to ``on_lost`` once (count it, say it).
    ``who``: the consumer group, e.g. ``sink group g``; ``consequence``: what the loss costs."""

    def __init__(self, gaps: OffsetGaps, member: GroupMember, topic: str, *, who: str, consequence: str,
                 outage: Outage | None, on_lost: Callable[[LostOffsets], None]) -> None:
        self.gaps, self.member, self.topic = gaps, member, topic
        self.who, self.consequence, self.outage, self.on_lost = who, consequence, outage, on_lost
        self._quiet_due = 0.0  # monotonic time of the next look at the quiet partitions

    def records(self, records: Iterable[ConsumerRecord]) -> None:
        """Check ``records`` (of any topic; only the events topic's count) for gaps."""
        for lost in lost_offsets(self.gaps, [r for r in records if r.topic == self.topic], who=self.who,
                                 consequence=self.consequence):
            self.on_lost(lost)

    def quiet(self) -> None:
        """After an empty poll: look at the quiet partitions, if it is time. Raises what
        :func:`broker_away` recognizes when the broker does not answer."""
        now = time.monotonic()
        if now < self._quiet_due:
            return
        self._quiet_due = now + QUIET_CHECK_S
        for lost in lost_while_quiet(self.gaps, self.member, self.topic, who=self.who,
                                     consequence=self.consequence, outage=self.outage):
            self.on_lost(lost)


def _said(found: list[tuple[TopicPartition, int, int]], *, who: str, consequence: str) -> list[LostOffsets]:
    return [LostOffsets(tp.topic, tp.partition, first, received,
                        f"{tp.topic} partition {tp.partition}: offsets {first} to {received - 1} "
                        f"({received - first} message(s)) were never received: the topic's retention deleted them "
                        f"before {who} read them; {consequence}")
            for tp, first, received in found]


class _Listener(ConsumerRebalanceListener):
    def __init__(self, on_assigned: PartitionsCallback, on_revoked: PartitionsCallback) -> None:
        self._assigned, self._revoked = on_assigned, on_revoked

    def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        self._assigned(set(assigned))

    def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        self._revoked(set(revoked))


class GroupMember:
    """Subscribes ``topics`` as a member of ``group``.

    ``on_assigned`` / ``on_revoked`` receive the partitions that moved, inside :meth:`poll`
    (kafka-python runs rebalance callbacks there), before any record of a new partition.
    Waits while no broker answers at construction, telling ``on_wait`` (see :func:`connect`).
    """

    def __init__(self, settings: KafkaSettings, group: str, topics: Sequence[str], *, client_id: str,
                 on_assigned: PartitionsCallback | None = None, on_revoked: PartitionsCallback | None = None,
                 on_wait: Callable[[str], None] | None = None) -> None:
        self.topics = list(topics)
        self.commit_error: KafkaError | None = None  # why the last commit failed, if it did
        self._consumer = connect(settings, client_id, group, on_wait=on_wait)
        self._consumer.subscribe(list(topics), listener=_Listener(on_assigned or (lambda p: None),
                                                                     on_revoked or (lambda p: None)))

    def poll(self, timeout: float) -> list[ConsumerRecord]:
        """Records fetched within ``timeout`` seconds, in offset order per partition."""
        batches = self._consumer.poll(timeout_ms=int(timeout * 1000))
        return [r for tp in sorted(batches, key=lambda t: (t.topic, t.partition)) for r in batches[tp]]

    def committed(self, tp: TopicPartition) -> int | None:
        """The group's committed offset of ``tp`` (the next offset to read), None if none."""
        return self._consumer.committed(tp)

    def committed_with_metadata(self, tp: TopicPartition, timeout: float = 10.0) -> tuple[int | None, str | None]:
        """The group's committed offset of ``tp`` and the metadata committed with it
        (``(None, None)`` if none). Raises KafkaTimeoutError when the group coordinator does
        not answer within ``timeout`` seconds (the broker is away)."""
        got = self._consumer.committed(tp, metadata=True, timeout_ms=int(timeout * 1000))
        return (None, None) if got is None else (got.offset, got.metadata)

    def highwater(self, tp: TopicPartition) -> int | None:
        """The partition's end offset as of the last fetch (no request made); None before one."""
        return self._consumer.highwater(tp)

    def lag(self) -> dict[str, int]:
        """Records waiting per subscribed topic: over this member's assigned partitions,
        the end offset as of the last fetch minus the position (the next offset poll
        returns). A partition not fetched since its assignment counts 0; so does a topic
        with no partition assigned here. Makes no request once positions are known."""
        out = dict.fromkeys(self.topics, 0)
        for tp in self._consumer.assignment():
            end = self._consumer.highwater(tp)
            if end is None:
                continue
            try:
                pos = self._consumer.position(tp, timeout_ms=0)
            except KafkaError:  # revoked meanwhile, or no position yet
                continue
            if pos is not None:
                out[tp.topic] = out.get(tp.topic, 0) + max(0, end - pos)
        return out

    def position(self, tp: TopicPartition, timeout: float = 5.0) -> int | None:
        """The offset :meth:`poll` returns next for ``tp`` (resolving a pending seek to the
        beginning within ``timeout`` seconds); None when it is not known yet (no answer in
        time, or ``tp`` not assigned here any more)."""
        try:
            return self._consumer.position(tp, timeout_ms=int(timeout * 1000))
        except KafkaError:
            return None

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Read ``tp`` from ``offset`` next (allowed inside the assignment callback)."""
        self._consumer.seek(tp, offset)

    def partitions(self, topic: str) -> set[int]:
        """The partition numbers of ``topic`` in the cluster metadata (empty if unknown)."""
        try:
            return set(self._consumer.partitions_for_topic(topic) or ())
        except KafkaError:
            return set()

    def log_starts(self, partitions: Iterable[TopicPartition], timeout: float = 2.0) -> dict[TopicPartition, int]:
        """Each partition's log start offset (the first offset retention left), asked of the
        broker. Raises what :func:`broker_away` recognizes when the broker does not answer
        within ``timeout`` seconds (so an idle consumer notices an outage too); empty for any
        other refusal."""
        try:
            return dict(self._consumer.beginning_offsets(list(partitions), timeout_ms=int(timeout * 1000)))
        except KafkaError as e:
            if broker_away(e):
                raise
            return {}
        except ValueError:  # kafka-python's answer for a partition without a leader
            return {}

    def seek_to_beginning(self, partitions: Iterable[TopicPartition]) -> None:
        self._consumer.seek_to_beginning(*partitions)

    def assignment(self) -> set[TopicPartition]:
        return set(self._consumer.assignment())

    def commit(self, offsets: Mapping[TopicPartition, int], metadata: Mapping[TopicPartition, str] | None = None,
               *, timeout: float = 10.0) -> bool:
        """Commit ``offsets`` (next offset to read, per partition), each with its
        ``metadata`` string if given (at most the broker's ``offset.metadata.max.bytes``,
        4096 by default). Returns False when the group rebalanced meanwhile (the new owner
        re-reads from the last commit: no loss) or the broker could not be reached (commit
        again later: waited for at most ``timeout`` seconds); :attr:`commit_error` is then the
        error, else None."""
        self.commit_error = None
        if not offsets:
            return True
        meta = metadata or {}
        try:
            self._consumer.commit({tp: OffsetAndMetadata(off, meta.get(tp, ""), -1) for tp, off in offsets.items()},
                                  timeout_ms=int(timeout * 1000))
        except (CommitFailedError, KafkaError) as e:
            self.commit_error = e
            return False
        return True

    def close(self) -> None:
        self._consumer.close(autocommit=False)


def read_to_end(settings: KafkaSettings, topic: str, *, client_id: str, timeout: float = 60.0) -> list[ConsumerRecord]:
    """Every record of ``topic`` now present, read outside any group (no offsets committed).

    Raises KafkaError when the topic cannot be read within ``timeout`` seconds."""
    consumer = KafkaConsumer(**configuration.consumer(settings, client_id, None))
    try:
        parts = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        if not tps:
            return []
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        end = consumer.end_offsets(tps, timeout_ms=int(timeout * 1000))
        out: list[ConsumerRecord] = []
        pending = {tp for tp in tps if end[tp] > consumer.position(tp)}
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise KafkaTimeoutError(f"{topic}: could not read to the end within {timeout:.0f} s")
            for tp, recs in consumer.poll(timeout_ms=1000).items():
                out += recs
            pending = {tp for tp in pending if consumer.position(tp) < end[tp]}
        return out
    finally:
        consumer.close(autocommit=False)


class TopicReader:
    """Follows every partition of ``topic`` from its beginning, outside any group (nothing
    committed): for state every member needs whole, such as the incidents all detectors
    learn bad checkpoints from. ``poll`` returns what arrived since the last call. Waits
    while no broker answers at construction, telling ``on_wait`` (see :func:`connect`)."""

    def __init__(self, settings: KafkaSettings, topic: str, *, client_id: str,
                 on_wait: Callable[[str], None] | None = None) -> None:
        def partitions() -> set[int]:
            self._consumer = connect(settings, client_id, None, on_wait=on_wait)
            return self._consumer.partitions_for_topic(topic) or set()

        # the broker may go away between the bootstrap and the metadata request
        parts = _retrying(settings, partitions, why=str,
                          cleanup=lambda: self._consumer.close(autocommit=False), on_wait=on_wait)
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        self._consumer.assign(tps)
        if tps:
            self._consumer.seek_to_beginning(*tps)

    def poll(self, timeout: float = 0.0) -> list[ConsumerRecord]:
        """Records that arrived (``timeout`` in seconds)."""
        out: list[ConsumerRecord] = []
        for recs in self._consumer.poll(timeout_ms=int(timeout * 1000)).values():
            out += recs
        return out

    def close(self) -> None:
        self._consumer.close(autocommit=False)
