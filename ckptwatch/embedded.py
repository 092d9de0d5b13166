"""``ckptwatch run``: the embedded pipeline, tailing a directory into DuckDB.

Each cycle: discover and poll the files (new ones, renamed, truncated and copied ones:
see :mod:`ckptwatch.ingest.watcher`) -> rules -> store the events and the sources'
committed offsets in one DuckDB transaction -> detector -> upsert changed incidents ->
print them. On a full disk a cycle waits in the store until there is space again (see
:mod:`ckptwatch.sinks.duckdb_store`), so nothing read is lost. On start, the detector is rebuilt from the events already in the database
and every source resumes at its committed offset, so a restart neither loses nor
duplicates a line, and re-running over the same files adds no row.
"""

from __future__ import annotations

import datetime as dt
import os
import threading
from collections.abc import Callable

from ckptwatch.detectors import Detector, Incident
from ckptwatch.ingest.checkpoint import SourceCheckpoint
from ckptwatch.ingest.watcher import SourceWatcher
from ckptwatch.integrity.watch import CheckpointWatcher
from ckptwatch.pipeline import PipelineOptions, extract_events
from ckptwatch.rules import RuleSet
from ckptwatch.services.loop import run_steps
from ckptwatch.sinks.alerts.dispatcher import Alerter
from ckptwatch.sinks.duckdb_store import Store
from ckptwatch.sinks.metrics import Metrics


class EmbeddedRunner:
    """One embedded pipeline over ``logs_dir`` writing ``db_path``.

    ``on_incident`` is called with each new or changed incident (the console channel);
    ``on_warning`` once with each labelling gap found (events without job or rank, kernel
    stamps without a boot time: :meth:`Stats.label_warning_items`).
    ``metrics`` is updated every cycle (a new :class:`Metrics` when None). ``alerter``
    builds the :class:`~ckptwatch.sinks.alerts.dispatcher.Alerter` on the runner's store:
    changed incidents are queued for alerting in the transaction that stores them, and
    every cycle delivers what is due.

    Bounded state: jobs the detector releases (concluded and idle, see
    :class:`~ckptwatch.detectors.runner.DetectorConfig`) are recorded with the checkpoint
    registry, so a restart replays only the live jobs' events; with ``retention``, events
    older than that (of released jobs and of no job) are deleted, at most once an hour.
    """

    def __init__(self, logs_dir: str, db_path: str, options: PipelineOptions | None = None,
                 on_incident: Callable[[Incident], None] | None = None, *, metrics: Metrics | None = None,
                 alerter: Callable[[Store, Metrics], Alerter] | None = None,
                 checkpoints: CheckpointWatcher | None = None,
                 on_warning: Callable[[str], None] | None = None,
                 retention: dt.timedelta | None = None) -> None:
        self.logs_dir = logs_dir
        self.metrics = metrics or Metrics()
        self.options = options or PipelineOptions()
        self.rules = RuleSet.load(self.options.rule_files)
        self.on_incident = on_incident or (lambda inc: None)
        self.on_warning = on_warning or (lambda msg: None)
        # on a full disk the store waits for space (saying so through on_warning, or on
        # standard error without one): a cycle then takes as long, and loses nothing
        self.store = Store(db_path, say=on_warning)
        self.alerter = alerter(self.store, self.metrics) if alerter else None
        # run --once: the latest version of each changed incident, told to the alerter at the
        # end (None: told as stored)
        self._deferred: dict[str, Incident] | None = None
        self._warned: set[str] = set()  # label warnings said already (each once per run)
        self._stored = {sid: SourceCheckpoint(sid, file or "", off, job, head or "")
                        for sid, file, off, job, head in self.store.sources()}
        db = os.path.abspath(db_path)
        self.checkpoints = checkpoints  # its verification log is tailed with the logs
        extra = [str(checkpoints.log)] if checkpoints else []
        self._roots = [os.path.abspath(p) for p in (logs_dir, *extra)]
        self._detector_config = self.options.detector_for([logs_dir])
        self.watcher = SourceWatcher([logs_dir, *extra], template=self.options.template, boot_time=self.options.boot_time,
                                     line_prefix=self.options.line_prefix, poll_bytes=self.options.poll_bytes,
                                     committed=self._stored, exclude=lambda p: os.path.abspath(p) == db,
                                     max_open_files=self.options.max_open_files, job=self.options.job)
        self.stats = self.watcher.stats
        self.stats.unlabelled_job = self._detector_config.unlabelled_job
        self.retention = retention
        self._retention_due: dt.datetime | None = None
        self.detector = self._restored_detector()

    def _restored_detector(self) -> Detector:
        """A detector rebuilt from the store: its tombstones and checkpoint registry, the live
        jobs' events replayed (bounded by them, not by history), and the open incidents
        adopted (still its to withdraw or resolve when late lines come)."""
        detector = Detector(self._detector_config)
        released, registry = self.store.released()
        detector.restore(released, registry)
        # the job-less lines of the files this run reads: another directory's are another job's
        stored = self.store.events_to_replay(self._detector_config.unlabelled_job, self._roots)
        if not stored.is_empty():
            detector.process_frame(stored)
        detector.adopt(self.store.open_incidents())
        return detector

    def cycle(self, *, final: bool = False, now: dt.datetime | None = None, conclude: bool = False) -> list[Incident]:
        """One pass: read (a chunk of each file), match, store, detect. Returns the
        incidents that changed. With ``final``, the input is complete only once
        ``watcher.backlog`` is False after the read: until then incidents are concluded
        as the watermark passes them, like a live run, and stored as they are. ``now``
        (UTC, default: the wall clock) moves the watermark of a job that went silent.
        ``conclude`` (with ``final``: ``run --once``): a job every file of which is read is
        judged and its lines let go, as ``diagnose`` does (:func:`ckptwatch.pipeline.diagnose`),
        so memory holds the jobs still being read."""
        now = now or dt.datetime.now(dt.timezone.utc)
        if self.checkpoints:
            self.checkpoints.poll(wait=final)
        records = self.watcher.poll(final=final, now=now)
        events = extract_events(self.rules, records, self.stats)
        self.metrics.observe_ingest(self.stats, events)
        current = self.watcher.checkpoints()
        changed_sources = [c for c in current if self._stored.get(c.source_id) != c]
        rows = [(c.source_id, c.path, c.offset, c.job, c.head_hash) for c in changed_sources]
        forgotten = set(self._stored) - {c.source_id for c in current}  # as a checkpoint file is replaced
        self.store.commit_batch(events, rows, unfollowed=forgotten)
        self._stored.update((c.source_id, c) for c in changed_sources)
        for sid in forgotten:
            del self._stored[sid]
        if not events.is_empty():
            self.detector.process_frame(events, now=now)
        done = final and not self.watcher.backlog
        # lines that name no job (a launcher's log beside rank files labelled from within):
        # the one job's, as diagnose takes them; live too, once one job is known
        # (live only once every file is read to its end: a backlog may still hold another job)
        if not self.watcher.backlog and self.detector.adopt_unlabelled(live=not done):
            self.stats.unlabelled_job, self.stats.unlabelled_folded = self.detector.adopted_into or "unknown", True
        changed = self.detector.advance(final=done, now=now)
        if conclude and final:
            read = self.watcher.jobs_read()
            if read:  # an incident changed by both passes is stored, told and shown once, as it ends
                changed = list({inc.id: inc for inc in changed + self.detector.conclude(read, now=now)}.values())
            position = self.watcher.read_position()
            if position is not None:
                self.detector.retire_saves(position)
        released = self.detector.take_released()
        # the registry is kept with each release, and at the end of a one-shot run, whose jobs
        # are judged and let go unreleased: the next run into this database (another job that
        # resumes from this one's torn checkpoint) knows which checkpoints are not good
        if released or (conclude and final and not self.watcher.backlog):
            self.store.save_released(released, self.detector.registry.to_dict())
        if self.retention is not None and (self._retention_due is None or now >= self._retention_due):
            self.store.delete_events_before(now - self.retention)
            self._retention_due = now + dt.timedelta(hours=1)
        self._store_changed(changed)
        self.stats.duplicate_events = self.detector.stats.duplicates
        for key, msg in self.stats.label_warning_items().items():
            if key not in self._warned:
                self._warned.add(key)
                self.on_warning(msg)
        self.metrics.observe_incidents(changed)
        self.metrics.observe_detectors([self.detector], now)
        return changed

    def run(self, *, once: bool = False, interval: float = 1.0, until_idle: float | None = None,
            drain: float = 30.0, stop: threading.Event | None = None) -> None:
        """Cycle until interrupted (or once, with everything flushed, for ``--once``; or
        until no line was read and no alert was in flight for ``until_idle`` seconds).
        ``interval`` is in seconds. With ``once``, alerts are delivered for at most ``drain``
        seconds before returning; what is still failing stays queued for the next run.
        ``stop``: a stop request (:func:`ckptwatch.services.loop.run_steps`). The caller owns
        the store and closes it (:meth:`close`)."""
        if once:
            # alerts wait for the end, each incident as it ends: one judged again, or withdrawn
            # by a later line, pages once with its last version (or not at all)
            self._deferred = {}
            try:
                self.cycle(final=True, conclude=True)
                while self.watcher.backlog:  # a backlog streams: each chunk is stored and judged before the next
                    self.cycle(final=True, conclude=True)
                if self.detector.stats.after_conclusion:
                    self._judge_again()
            finally:
                deferred, self._deferred = self._deferred, None
            if self.alerter and deferred:
                with self.store.transaction():
                    self.alerter.notify(deferred.values())
            if self.alerter:
                self.alerter.drain(drain)
            return
        run_steps([self._step], interval=interval, until_idle=until_idle, pace=True, stop=stop)

    def _judge_again(self) -> None:
        """Lines reached a job after it was concluded (a file whose lines name another job
        than its path): judge every stored event again with a detector that concludes
        nothing, as :func:`ckptwatch.pipeline.diagnose` reads again, and store what changed.
        Memory then holds every job's events, as before conclusion."""
        late = self.detector.stats.after_conclusion
        self.detector = self._restored_detector()
        self.detector.adopt_unlabelled()
        changed = self.detector.advance(final=True)
        self._store_changed(changed)
        self.metrics.observe_incidents(changed)
        self.stats.note("judged_again_unconcluded", late)

    def _store_changed(self, changed: list[Incident]) -> None:
        """Store ``changed`` incidents and queue their alerts in one transaction, then show them."""
        if not changed:
            return
        with self.store.transaction():
            self.store.upsert_incidents(changed)
            self._notify(changed)
        for inc in changed:
            self.on_incident(inc)

    def _notify(self, changed: list[Incident]) -> None:
        """Queue alerts for ``changed`` (inside the transaction that stores them), or keep
        their latest versions for the end of ``run --once``."""
        if self.alerter is None:
            return
        if self._deferred is None:
            self.alerter.notify(changed)
        else:
            self._deferred.update((inc.id, inc) for inc in changed)

    def _step(self) -> int:
        """One cycle; returns the number of lines it read plus the alert deliveries done or
        in flight (the work :func:`run_steps` counts)."""
        lines = self.stats.lines
        self.cycle()
        return self.stats.lines - lines + (self.alerter.step() if self.alerter else 0)

    def close(self) -> None:
        """Waits for alerts in flight, then closes the files and the database (closed even
        when an earlier step fails)."""
        try:
            if self.alerter:
                self.alerter.close()
            if self.checkpoints:
                self.checkpoints.close()
            self.watcher.close()
        finally:
            self.store.close()
