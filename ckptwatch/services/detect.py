"""``ckptwatch detect``: a member of the detector consumer group, events -> incidents.

State is per partition: one :class:`~ckptwatch.detectors.Detector` per assigned partition of
the events topic (a job's events all land in one partition; host events are in every
partition). Incidents are a function of the events alone, so state needs no changelog of
its own: when a partition is assigned (at start, after a crash, or in a rebalance), the
member replays it from where its live jobs begin (see below). Until the replay reaches the group's
committed offset the detector is only fed, not asked for incidents, so it cannot republish
a stale intermediate version; nor is it asked while the partition has a backlog.

What a resume is judged by crosses partitions: a job often resumes from a checkpoint another
job wrote, and the two jobs' events may live in different partitions. Members share it
through two topics every member follows whole (:class:`TopicReader`): the incidents topic
(save incidents mark checkpoints not-good) and the compacted saves topic (each save's
completeness, world size and the saver's last losses, published by the member that owns
the saving job). What a member's own detectors find is learned at once, in-process; read
back from a topic it is the same or older (the readers lag behind), so versions of a job
this member owns are not learned again from the topics, nor are records the assignment's
read to the end already gave: learning never goes back to an older version (a save
incident withdrawn, a save seen complete, stay so).

What was already published is read back from the incidents topic (id -> fingerprint of the
latest version) when partitions are assigned; an incident is published only when it is new
or its fingerprint changed. A new partition's detector adopts the published incidents
(:meth:`~ckptwatch.detectors.Detector.adopt`): one it would not find again from the events
alone (a stall concluded as wall time went by, before a restart) is still its to withdraw
or resolve when late lines show its save finished. Offsets are committed only after the
incidents that depend on them are acknowledged by the broker. A kill -9 between the two re-publishes at most the
incidents of one step, with the same id and content; the sink upserts them by id.

Sources arrive out of step in a fleet: a collector starting over a backlog publishes one
file after another, and a partition may be read half-way through such a batch. So each job
is judged by its *low* watermark (``DetectorConfig.source_idle``, :data:`SOURCE_IDLE` by
default): never past a source (file) of the job still being read, so rank 1's end-of-save
lines are not judged late by rank 0's time; a source silent for ``source_idle`` seconds (a
dead rank's file) holds nothing. The embedded run needs none: it reads a chunk of every
file before it judges.

A broker restart is waited out: a step that cannot reach the broker (no bootstrap, no
coordinator, a timed-out offset or topic read) says ``waiting for Kafka at ...`` (every few
seconds), rewinds the fetch positions to what was fed, and is tried again; nothing fed,
published or committed is lost or repeated.

What a member cannot take never stops it: a message that is no batch of events, or an
event that fails a check of the codec (see :mod:`ckptwatch.kafka.codec`), is skipped,
counted (``ckptwatch_records_skipped_total{reason="bad_message"}``) and said in one line
naming topic, partition, offset and field; the batch's good events are fed, and the offsets
past it committed (no crash loop, no partition handed from member to member). The sink
keeps such messages in the dead-letter topic. Offsets of a partition that were never
received by any member (retention deleted them before the group read them:
:class:`~ckptwatch.kafka.consumer.OffsetGaps`) are said in one line and counted
(``reason="offsets_lost"``, one per offset). With ``--until-idle``, the member concludes
what waits for late evidence before it exits (:meth:`DetectorMember.finish`), as the
embedded ``run --once`` and ``diagnose`` do.

Replay starts where the previous owner said (:mod:`ckptwatch.services.replay`, committed
with the offset): at the first event of the oldest job still live in the partition, so
jobs its detector released (concluded and idle for ``release_after``) are not replayed;
a partition committed without it is replayed from the start of its retention. Keep
``retention.ms`` of the events topic longer than your longest job plus its save windows
(default 7 days).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass

import polars as pl
from kafka import TopicPartition
from kafka.consumer.fetcher import ConsumerRecord
from kafka.errors import IllegalStateError, KafkaError

from ckptwatch import failpoints
from ckptwatch.config import Config
from ckptwatch import pipeline
from ckptwatch.detectors import Detector, DetectorConfig, Incident
from ckptwatch.detectors.checkpoints import BAD_KINDS
from ckptwatch.kafka.admin import ensure_topics
from ckptwatch.detectors.checkpoints import SaveFact
from ckptwatch.kafka.codec import (DecodeError, decode_events_skipping, decode_incident, decode_save_fact,
                                   encode_incident, encode_save_fact, save_fact_key)
from ckptwatch.kafka.consumer import (GroupMember, LossWatch, LostOffsets, OffsetGaps, Outage, TopicReader,
                                      broker_away, read_to_end)
from ckptwatch.kafka.producer import Message, Publisher
from ckptwatch.services.replay import ReplayStart, decode_metadata, encode_metadata
from ckptwatch.sinks.metrics import Metrics


#: seconds a job's silent source still holds its watermark in the fleet (see the module doc)
SOURCE_IDLE = 30.0
#: seconds at most between two asks for incidents of a partition that never catches up
#: because records keep arriving (a fleet's collectors publish without pause)
LIVE_ASK_S = 1.0
#: a record produced (its Kafka timestamp) at most this many seconds before it was fed is
#: live traffic, not a backlog (a restart's, a replay's)
LIVE_RECORD_S = 5.0


@dataclass
class DetectStats:
    """Counters of one detector member."""

    events: int = 0
    replayed: int = 0
    bad_messages: int = 0
    incidents_published: int = 0
    rebalances: int = 0
    broker_waits: int = 0
    offsets_lost: int = 0


class DetectorMember:
    """One member of ``config.detect.group``. ``on_message`` receives human-readable notes
    (a broker outage, a message that is not an event). ``metrics`` gets incidents first
    published, detector lag, open saves, consumer lag and bad messages every step (a new
    one when None). ``detector_config.source_idle`` None is :data:`SOURCE_IDLE`."""

    def __init__(self, config: Config, *, detector_config: DetectorConfig | None = None,
                 on_message: Callable[[str], None] | None = None, poll_timeout: float = 0.5,
                 metrics: Metrics | None = None) -> None:
        self.config = config
        self.metrics = metrics or Metrics()
        detector_config = detector_config or pipeline.detector_config(config.detect)
        if detector_config.source_idle is None:
            detector_config = dataclasses.replace(detector_config, source_idle=SOURCE_IDLE)
        self.detector_config = detector_config
        self.on_message = on_message or (lambda msg: None)
        self.poll_timeout = poll_timeout
        self.stats = DetectStats()
        self.detectors: dict[TopicPartition, Detector] = {}
        self.replay_until: dict[TopicPartition, int] = {}
        self.position: dict[TopicPartition, int] = {}
        self.committed: dict[TopicPartition, int] = {}  # what this member committed (or found committed)
        self._fed_ms: dict[TopicPartition, int] = {}  # Kafka timestamp (ms) of the last record fed
        self._asked: dict[TopicPartition, float] = {}  # monotonic time its detector was last asked
        self._outage = Outage(config.kafka.bootstrap_servers, self.on_message)
        self._gaps = OffsetGaps()  # offsets no member of the group received
        self.published: dict[str, str] = {}  # incident id -> fingerprint of the latest published version
        self._refresh_published = True
        self._pending: set[TopicPartition] = set()  # assigned; committed offset not looked up yet
        self.joined = False  # until the group coordinator assigned us partitions (maybe none)
        ensure_topics(config.kafka, on_wait=self.on_message)
        self.publisher = Publisher(config.kafka, client_id="ckptwatch-detect", on_wait=self.on_message)
        try:
            self.member = GroupMember(config.kafka, config.detect.group, [config.kafka.events_topic],
                                      client_id="ckptwatch-detect", on_assigned=self._assigned,
                                      on_revoked=self._revoked, on_wait=self.on_message)
            self._losses = LossWatch(self._gaps, self.member, config.kafka.events_topic,
                                     who=f"detector group {config.detect.group}",
                                     consequence="their events are not judged", outage=self._outage,
                                     on_lost=self._lost)
            # save incidents of every member: a resume in a job of ours may load another job's checkpoint
            self.known_bad: dict[str, Incident] = {}
            self.facts = TopicReader(config.kafka, config.kafka.incidents_topic, client_id="ckptwatch-detect-facts",
                                     on_wait=self.on_message)
            # save facts of every member: a resume is compared with the saver's world size and losses
            self.known_saves: dict[bytes, SaveFact] = {}  # by checkpoint
            self.saves = TopicReader(config.kafka, config.kafka.saves_topic, client_id="ckptwatch-detect-saves",
                                     on_wait=self.on_message)
        except BaseException:  # interrupted while waiting for the broker: close what was opened
            for part in ("facts", "member"):
                if hasattr(self, part):
                    getattr(self, part).close()
            self.publisher.close()
            raise
        self._read_upto: dict[tuple[str, int], int] = {}  # (topic, partition) -> next offset _load_published read
        self._adopting: set[TopicPartition] = set()  # new detectors, to adopt what was published
        self.replay_starts: dict[TopicPartition, ReplayStart] = {}  # per partition: where a new owner replays from

    # -- rebalance callbacks (run inside poll) ---------------------------------------------
    def _assigned(self, partitions: set[TopicPartition]) -> None:
        # kafka-python runs this on its IO thread: no blocking call here (committed() is
        # looked up in step()); a seek only marks the partition for reset, so it is allowed.
        self.joined = True
        self.stats.rebalances += 1
        for tp in partitions:
            self.detectors[tp] = Detector(self.detector_config)
            self._adopting.add(tp)
            self.detectors[tp].learn(self.known_bad.values())
            self.detectors[tp].learn_saves(self.known_saves.values())
            self.position[tp] = 0
            self.committed.pop(tp, None)
            self.replay_starts[tp] = ReplayStart()
            self._pending.add(tp)
        self._gaps.forget(partitions)  # expected from the committed offset, once looked up
        if partitions:
            self.member.seek_to_beginning(partitions)
            self._refresh_published = True

    def _revoked(self, partitions: set[TopicPartition]) -> None:
        # step() publishes and commits before it returns, so nothing of these is in flight
        for tp in partitions:
            self.detectors.pop(tp, None)
            self._adopting.discard(tp)
            self.replay_starts.pop(tp, None)
            self.replay_until.pop(tp, None)
            self.position.pop(tp, None)
            self.committed.pop(tp, None)
            self._fed_ms.pop(tp, None)
            self._asked.pop(tp, None)
            self._pending.discard(tp)
        self._gaps.forget(partitions)

    # -- one unit of work ------------------------------------------------------------------
    def _load_published(self) -> None:
        """What is on the incidents topic: the published versions (not to publish again) and
        the save incidents to judge resumes by; and what is on the saves topic. Both learned
        before a new partition is evaluated."""
        incidents = self._mark_read(read_to_end(self.config.kafka, self.config.kafka.incidents_topic,
                                                client_id="ckptwatch-detect"))
        known = [inc for inc in map(self._decode, incidents) if inc is not None]
        for inc in known:
            self.published[inc.id] = inc.fingerprint()
        latest = {inc.id: inc for inc in known}.values()
        for tp in self._adopting & set(self.detectors):
            self.detectors[tp].adopt(latest)  # what its predecessor published stays its to withdraw or resolve
        self._adopting.clear()
        self._learn(known)
        self._learn_saves(self._decode_saves(self._mark_read(read_to_end(self.config.kafka, self.config.kafka.saves_topic,
                                                                         client_id="ckptwatch-detect"))))
        self._refresh_published = False

    def _mark_read(self, records: list[ConsumerRecord]) -> list[ConsumerRecord]:
        """``records`` (a topic read to its end), remembered as read: :meth:`_unread` drops
        them when the topic's reader delivers them again."""
        for r in records:
            key = (r.topic, r.partition)
            self._read_upto[key] = max(self._read_upto.get(key, 0), r.offset + 1)
        return records

    def _unread(self, records: list[ConsumerRecord]) -> list[ConsumerRecord]:
        """What a topic's reader delivered that :meth:`_load_published` did not read already."""
        return [r for r in records if r.offset >= self._read_upto.get((r.topic, r.partition), 0)]

    def _owned(self, job: str | None) -> bool:
        """One of this member's detectors reads ``job``'s events: what they find of it is
        learned in-process, ahead of the topics."""
        return any(job in det.jobs for det in self.detectors.values())

    def _lost(self, lost: LostOffsets) -> None:
        """Count and say offsets of the events topic no member received."""
        self.stats.offsets_lost += lost.n
        self.metrics.count_offsets_lost(lost.topic, lost.partition, lost.first, lost.end)  # once per process
        self.on_message(lost.message)

    def _feed(self, tp: TopicPartition, records: list[ConsumerRecord], now: dt.datetime) -> None:
        self._losses.records(records)
        events, bad, counts = decode_events_skipping([r.value for r in records])
        for i, e in bad:
            self.stats.bad_messages += 1
            self.metrics.count_bad_message(tp.topic, tp.partition, records[i].offset)  # once per process
            self.on_message(f"{tp.topic} partition {tp.partition} offset {records[i].offset}: skipped: {e}")
        # each event's message offset, and each job's span of them: per batch, not per event
        per_message = pl.DataFrame({"o": [r.offset for r in records], "n": counts},
                                   schema={"o": pl.Int64, "n": pl.Int64}).filter(pl.col("n") > 0)
        offsets = per_message.select(pl.col("o").repeat_by("n")).explode("o")["o"]
        self.stats.replayed += int((offsets < self.replay_until.get(tp, 0)).sum())
        self.stats.events += events.height
        spans = (pl.DataFrame({"job": events["job"], "o": offsets}).group_by("job")
                 .agg(pl.col("o").min().alias("first"), pl.col("o").max().alias("last")))
        self.replay_starts[tp].note_spans(spans.iter_rows())
        self.detectors[tp].process_frame(events, now=now)
        self.position[tp] = records[-1].offset + 1
        self._fed_ms[tp] = records[-1].timestamp
        self._asked.setdefault(tp, time.monotonic())

    def replaying(self, tp: TopicPartition) -> bool:
        """True while ``tp`` is being replayed up to the offset committed before assignment."""
        return self.position.get(tp, 0) < self.replay_until.get(tp, 0)

    def caught_up(self, tp: TopicPartition) -> bool:
        """True when everything known to be in ``tp`` was read (its high-water mark), or
        nothing is known."""
        end = self.member.highwater(tp)
        return end is None or self.position.get(tp, 0) >= end

    def behind(self, tp: TopicPartition, *, final: bool = False) -> bool:
        """True while more of ``tp`` is known to be waiting than was read, as a backlog:
        incidents are asked for once a partition is caught up, so a backlog yields one
        version of an incident, not one per batch as its evidence arrives. A partition whose
        records keep arriving may never be caught up (collectors publishing without pause):
        while what it feeds is live (produced within :data:`LIVE_RECORD_S`) it is asked at
        least every :data:`LIVE_ASK_S` all the same, as if caught up; not with ``final``
        (an ask then concludes every save: only once all is read). Record timestamps are the
        producers' clocks: one more than :data:`LIVE_RECORD_S` behind keeps its partitions
        held until caught up (as before), one far ahead makes a backlog look live (incidents
        in more versions while it is read)."""
        if self.caught_up(tp):
            return False
        if final:
            return True
        produced = self._fed_ms.get(tp)
        if produced is None or produced < 0:  # no timestamp known: a backlog
            return True
        live = time.time() * 1000 - produced <= LIVE_RECORD_S * 1000
        return not (live and time.monotonic() - self._asked.get(tp, time.monotonic()) >= LIVE_ASK_S)

    def step(self, *, now: dt.datetime | None = None, final: bool = False) -> int:
        """Poll, feed, publish what changed, commit. Returns the number of records consumed
        (1 while not yet in the group, or while the broker cannot be reached, so that waiting
        is not mistaken for idleness). ``final``: the input is complete (``run --kafka
        --once`` after the collector read every byte and the partitions are drained; the end
        of ``--until-idle``): nothing waits for late evidence any more.

        A broker that went away (a restart) is waited out: the step says so through
        ``on_message`` (every few seconds), rewinds what was fetched and not fed, and
        returns; the next step tries again. Raises KafkaError for a refusal."""
        try:
            consumed = self._step(now=now, final=final)
        except KafkaError as e:
            if not broker_away(e):
                raise
            self._broker_away(e)
            return 1
        if broker_away(self.member.commit_error):  # fed and published; committed at a later step
            self._outage.away(self.member.commit_error)  # type: ignore[arg-type]
        else:
            self._outage.back()
        self.stats.broker_waits = self._outage.waits
        return consumed

    def _broker_away(self, e: KafkaError) -> None:
        """After a step failed for want of the broker: say so (every few seconds), fetch
        again from what was fed (records polled in the failed step were not), and pause a
        little."""
        self._outage.away(e)
        self.stats.broker_waits = self._outage.waits
        assigned = self.member.assignment()
        for tp, pos in self.position.items():
            if tp in assigned:
                try:
                    self.member.seek(tp, pos)
                except (IllegalStateError, AssertionError):  # revoked meanwhile: the new owner reads it
                    pass
        time.sleep(min(1.0, max(self.poll_timeout, 0.1)))

    def finish(self) -> None:
        """The input is complete (``--until-idle`` ended the run): feed what is still
        waiting, then conclude what waits for late evidence (the watermark moves to each
        job's end, as the embedded ``run --once`` and ``diagnose`` do) and publish the
        incidents that follow, before the member leaves the group."""
        while self.step(final=True):
            pass

    def _adopt_unlabelled(self, *, final: bool) -> None:
        """Events that name no job (a launcher's log beside rank files labelled from within)
        are the one job's, as ``diagnose`` and ``run`` take them (:meth:`Detector.adopt_unlabelled`),
        when that is knowable here: this member reads every partition of the events topic,
        each caught up, and its detectors hold one named job between them. They are keyed
        ``unknown`` by the collector, so may sit in another partition than the job's: folded
        into the job's detector. Otherwise (a group of members) they stay job ``unknown``
        (``run --kafka`` names it after the directory it reads, as ``run`` does:
        :attr:`DetectorConfig.unlabelled_job <ckptwatch.detectors.runner.DetectorConfig.unlabelled_job>`)."""
        unlabelled = self.detector_config.unlabelled_job
        if not any(unlabelled in det.jobs for det in self.detectors.values()):
            return
        if any(self.replaying(tp) or not self.caught_up(tp) for tp in self.detectors):
            return  # a fold cannot be undone: only with every partition read to its end
        topic = self.config.kafka.events_topic
        if {tp.partition for tp in self.detectors if tp.topic == topic} != set(self.publisher.partitions(topic)):
            return
        named = {j for det in self.detectors.values() for j in det.jobs if j != unlabelled}
        if len(named) != 1:
            return
        home = next(det for det in self.detectors.values() if named & set(det.jobs))
        others = [det for det in self.detectors.values() if det is not home and unlabelled in det.jobs]
        if home.adopt_unlabelled(live=not final, others=[det.jobs[unlabelled] for det in others]):
            for det in others:
                det.take_unlabelled()

    def _step(self, *, now: dt.datetime | None, final: bool) -> int:
        records = self.member.poll(self.poll_timeout)
        if records:
            self._outage.contact()
        now = now or dt.datetime.now(dt.timezone.utc)
        for tp in list(self._pending):
            committed, meta = self.member.committed_with_metadata(tp)
            self.replay_until[tp] = committed or 0
            if committed is not None:
                self.committed[tp] = committed
            self._gaps.expect(tp, committed)  # a group that never read it: from its first record
            start = decode_metadata(meta)
            if start is not None and 0 < start <= self.replay_until[tp] and tp in self.detectors:
                self.position[tp] = start  # the jobs before it were released: not replayed
                self.replay_starts[tp].begin_at(start)
                self.member.seek(tp, start)
            self._pending.discard(tp)
        by_tp: dict[TopicPartition, list[ConsumerRecord]] = {}
        for r in records:
            tp = TopicPartition(r.topic, r.partition)
            if r.offset >= self.position.get(tp, 0):  # not one fetched before a seek to the replay start
                by_tp.setdefault(tp, []).append(r)
        for tp, recs in by_tp.items():
            if tp in self.detectors:
                self._feed(tp, recs, now)
        if not records and not self._pending:
            self._losses.quiet()
        if self._refresh_published:
            self._load_published()
        self._learn([inc for inc in map(self._decode, self._unread(self.facts.poll()))
                     if inc is not None and not self._owned(inc.job)])
        self._learn_saves([f for f in self._decode_saves(self._unread(self.saves.poll())) if not self._owned(f.job)])
        changed: list[Incident] = []
        facts: dict[bytes, SaveFact] = {}
        asked = [tp for tp in sorted(self.detectors, key=lambda tp: tp.partition)
                 if not self.replaying(tp) and not self.behind(tp, final=final)]
        self._asked.update(dict.fromkeys(asked, time.monotonic()))
        ready = [self.detectors[tp] for tp in asked]
        for _ in range(3):  # a save found in one partition may settle a resume in another
            self._adopt_unlabelled(final=final)
            found = [inc for det in ready for inc in det.advance(now=now, final=final)]
            new_facts = [f for det in ready for f in det.take_save_facts()]
            facts.update((save_fact_key(f), f) for f in new_facts)
            changed += found
            if not (self._learn(found) | self._learn_saves(new_facts)):
                break
        for tp, det in self.detectors.items():
            released = det.take_released()
            if released:
                self.replay_starts[tp].release(job for job, _ in released)
        changed = list({inc.id: inc for inc in changed}.values())  # the latest version of each
        msgs = []
        for inc in changed:
            fp = inc.fingerprint()
            if self.published.get(inc.id) != fp:
                msgs.append((inc.id, fp, Message(self.config.kafka.incidents_topic, inc.id.encode(), encode_incident(inc))))
        first = {iid for iid, _, _ in msgs if iid not in self.published}
        saves_out = [Message(self.config.kafka.saves_topic, key, encode_save_fact(f)) for key, f in facts.items()]
        if msgs or saves_out:
            self.publisher.publish(saves_out + [m for _, _, m in msgs])
            for iid, fp, _ in msgs:
                self.published[iid] = fp
            self.stats.incidents_published += len(msgs)
            failpoints.hit("detect.after_publish")
        # every position not committed yet (also one fed in a step the broker cut short)
        commits = {tp: pos for tp, pos in self.position.items()
                   if tp not in self._pending and pos > max(self.replay_until.get(tp, 0), self.committed.get(tp, -1))}
        if self.member.commit(commits, {tp: encode_metadata(self.replay_starts[tp].start(off))
                                        for tp, off in commits.items() if tp in self.replay_starts}):
            self.committed.update(commits)
        self.metrics.observe_incidents(inc for inc in changed if inc.id in first)
        self.metrics.observe_detectors(self.detectors.values(), now)
        self.metrics.set_consumer_lag(self.config.detect.group, self.member.lag())
        return len(records) if self.joined else 1

    @staticmethod
    def _decode(rec: ConsumerRecord) -> Incident | None:
        try:
            return decode_incident(rec.value)
        except DecodeError:
            return None  # the sink reports bad incident messages

    def _learn(self, incidents: list[Incident]) -> bool:
        """Share save incidents with every detector of this member (its own, at once; other
        members' through the incidents topic). True if one was new or changed."""
        saves = [i for i in incidents if i.kind in BAD_KINDS
                 and (i.id not in self.known_bad or self.known_bad[i.id].fingerprint() != i.fingerprint())]
        if not saves:
            return False
        for inc in saves:
            self.known_bad[inc.id] = inc
        for det in self.detectors.values():
            det.learn(saves)
        return True

    @staticmethod
    def _decode_saves(records: list[ConsumerRecord]) -> list[SaveFact]:
        out = []
        for rec in records:
            try:
                out.append(decode_save_fact(rec.value))
            except DecodeError:
                continue  # not ours to report: the saves topic is written by detectors only
        return out

    def _learn_saves(self, facts: list[SaveFact]) -> bool:
        """Share save facts with every detector of this member. True if one changed anything."""
        if not facts:
            return False
        self.known_saves.update((save_fact_key(f), f) for f in facts)
        changed = False
        for det in self.detectors.values():
            changed |= det.learn_saves(facts)
        return changed

    def close(self) -> None:
        self.member.close()
        self.facts.close()
        self.saves.close()
        self.publisher.close()
