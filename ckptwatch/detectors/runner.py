"""The detector runner: routes events to per-job state, keeps the watermark, and emits
incidents that are new or changed. It holds no detection logic of its own.

Event time, not arrival time, and per job: a job's watermark is its newest event time
minus ``allowed_lateness``; when none of its events arrives, it moves on with wall time
(``now`` passed to :meth:`Detector.advance`), so a save on a source that went silent is
still concluded. A job's watermark never depends on another job's lines, so one host
clock far ahead or one future-dated line concludes nothing outside its own job; event
times more than :data:`MAX_AHEAD` past the wall clock do not move any watermark. Within a
job, hosts' clocks differ: a rank missing from a save is judged late by its own host's clock
(:mod:`.own_clock`), not only by the job's watermark.
Every incident is a function of the events alone, so re-running over the same events
(after a restart, or in another process) yields the same incidents with the same ids.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from ckptwatch.detectors import integrity_incidents, resume_incidents, retire, save_incidents
from ckptwatch.detectors.checkpoints import CheckpointRegistry, SaveFact, checkpoint_key
from ckptwatch.detectors.commands import commands as commands_of
from ckptwatch.detectors.regression import RegressionSettings, saver_windows
from ckptwatch.detectors.events import LOADING_KINDS, Ev, is_host_event
from ckptwatch.detectors.incident import Incident
from ckptwatch.detectors.jobstate import MAX_PROGRESS, PAYLOAD_KEEP, SETTLE_ROWS, JobState
from ckptwatch.detectors.saves import UNKNOWN_STEP, SaveState, saves_of

UNKNOWN_JOB = "unknown"
MAX_AHEAD = dt.timedelta(days=1)
#: seconds: a kernel OOM kill of the very pid a death by signal of a job reports, this close
#: in time, is that death's cause though no host label joins them (see Detector._host_events_for)
OOM_PID_WINDOW = 60.0


@dataclass(frozen=True)
class DetectorConfig:
    """Seconds: ``allowed_lateness`` behind the newest event time; save windows in ``windows``;
    the post-resume loss comparison in ``regression``.

    Bounded state (seconds): a job concluded (evaluated, no open save, no load waiting) whose
    last event arrived ``release_after`` ago is *released*: its events and incidents leave
    memory, and only a tombstone (its newest event time) stays, for ``tombstone_ttl``:
    events of the job no newer than it are dropped (re-deliveries, or too late to matter),
    newer ones start the job afresh (a relaunch). Host events that arrived ``release_after``
    ago and are that much older than the oldest live job's newest event go too. The checkpoint registry keeps saves and
    bad marks of the last ``registry_horizon`` of event time (at most
    :data:`~ckptwatch.detectors.checkpoints.MAX_PER_ROOT` steps per checkpoint root)."""

    allowed_lateness: float = 5.0
    windows: save_incidents.SaveWindows = field(default_factory=save_incidents.SaveWindows)
    regression: RegressionSettings = field(default_factory=RegressionSettings)
    release_after: float = 3600.0
    tombstone_ttl: float = 7 * 86400.0
    registry_horizon: float = 30 * 86400.0
    #: seconds; None: a job's watermark follows its newest event. Set: its *low* watermark,
    #: which waits for each of its sources still being read (silent ones for at most this
    #: long; see :meth:`JobState.watermark <ckptwatch.detectors.jobstate.JobState.watermark>`).
    #: The fleet detector and ``ckptwatch run`` set it (``[detect] source_idle``): sources
    #: arrive out of step (a collector catching up publishes one file after another; a live
    #: tail reads a rank's file a poll behind another's). ``diagnose`` reads every file to
    #: its end before it concludes, and leaves it off.
    source_idle: float | None = None
    #: per rank, the progress lines kept (times and steps) and how many of the newest keep
    #: their text: a job's memory does not grow with its length (:meth:`JobState._prune
    #: <ckptwatch.detectors.jobstate.JobState._prune>`)
    progress_cap: int = MAX_PROGRESS
    payload_keep: int = PAYLOAD_KEEP
    #: the job of the events that name none (no path label, line or ``--job``): ``run`` and
    #: ``diagnose`` name it after the directory they read (:func:`ckptwatch.pipeline.unlabelled_job`),
    #: so two directories read into one database are two jobs; the fleet's detectors keep
    #: :data:`UNKNOWN_JOB`. Folded into the one named job when there is one (:meth:`Detector.adopt_unlabelled`).
    unlabelled_job: str = "unknown"


@dataclass
class DetectorStats:
    events: int = 0
    duplicates: int = 0
    jobs: int = 0
    #: jobs released (see :class:`DetectorConfig`), and events dropped as older than their tombstone
    released: int = 0
    after_release: int = 0
    #: save lines of finished saves let go (:mod:`~ckptwatch.detectors.retire`)
    retired: int = 0
    #: events that came after their job was concluded (:meth:`Detector.conclude`): its lines,
    #: or a host's (kernel, storage) on a host it ran on or naming none. Its incidents may
    #: lack them: ``diagnose`` reads again without concluding
    after_conclusion: int = 0


class Detector:
    """Per-job detection over a stream of events. Feed with :meth:`process`, then call
    :meth:`advance` to get incidents that are new or changed since the last call."""

    def __init__(self, config: DetectorConfig | None = None) -> None:
        self.config = config or DetectorConfig()
        self._unlabelled = self.config.unlabelled_job  # the job of the events that name none
        #: the one named job the events naming none were last folded into (:meth:`adopt_unlabelled`)
        self.adopted_into: str | None = None
        self.jobs: dict[str, JobState] = {}
        self.host_events: dict[str, Ev] = {}
        self._host_arrival: dict[str, dt.datetime] = {}  # dedup key -> wall time it arrived
        self.max_ts: dt.datetime | None = None
        self.last_arrival: dt.datetime | None = None
        self._pending_rows = 0  # progress lines given to jobs since they were last all filed
        self.stats = DetectorStats()
        self._emitted: dict[str, tuple[str, Incident]] = {}  # id -> (fingerprint, incident)
        self._by_save: dict[tuple[str | None, int | None], str] = {}  # (job, step) -> incident id
        self._by_load: dict[tuple[str | None, int | None, str | None], str] = {}  # (job, step, path) -> id
        self._dirty: set[str] = set()  # jobs to evaluate (new input, or saves still open)
        # jobs with input since they were last evaluated, and the watermark they were evaluated
        # at: a dirty job with neither new input nor a new watermark would give the same result
        self._fresh: set[str] = set()
        self._evaluated_at: dict[str, dt.datetime] = {}
        self.registry = CheckpointRegistry()  # checkpoints across jobs: saves seen, marked bad
        self._loading: set[str] = set()  # jobs that logged a load, a resume or a load error
        self._loads_dirty: set[str] = set()
        # facts of our own saves not yet taken by take_save_facts, by checkpoint (bounded like the registry)
        self._new_saves: dict[tuple[str | None, int | None], SaveFact] = {}
        self._open_saves: dict[str, int] = {}  # job -> its open saves at its last evaluation
        self._unfinished: dict[str, list[tuple[int, str | None]]] = {}  # job -> (step, path) of those, no incident
        #: released jobs: job -> (newest event time, wall time of the release), UTC
        self.released: dict[str, tuple[dt.datetime, dt.datetime]] = {}
        self._newly_released: list[tuple[str, dt.datetime]] = []
        self._retire_at: dict[str, int] = {}  # job -> events it holds before its saves are looked at again
        self._concluded: set[str] = set()  # jobs let go by conclude(), their incidents kept
        self._concluded_hosts: set[str] = set()  # the hosts they ran on

    def process(self, rows: Iterable[dict[str, Any]], *, now: dt.datetime | None = None) -> None:
        """Take events (dicts with EVENT_SCHEMA keys, e.g. ``df.iter_rows(named=True)``);
        ``now`` is the wall time they arrived (UTC; default: now)."""
        arrival = now or dt.datetime.now(dt.timezone.utc)
        limit = arrival + MAX_AHEAD
        for row in rows:
            ev = Ev.from_row(row)
            self.stats.events += 1
            if (self.max_ts is None or ev.ts > self.max_ts) and ev.ts <= limit:
                self.max_ts = ev.ts
            if is_host_event(ev.kind, ev.rank, ev.local_rank):
                if self._concluded and (ev.host is None or ev.host in self._concluded_hosts):
                    self.stats.after_conclusion += 1
                if ev.dedup_key in self.host_events:
                    self.stats.duplicates += 1
                self.host_events[ev.dedup_key] = ev
                self._host_arrival[ev.dedup_key] = arrival
                self._dirty.update(self.jobs)
                self._fresh.update(self.jobs)
                if ev.attrs.get("scope") == "host":
                    if ev.job is not None and ev.host:  # a kernel log among a job's own files: its host
                        self._job_state(ev.job).saw_host(ev.host)
                    continue
                # a rank-less storage error or OOM report in a job's own files is that job's too
            job = ev.job or self._unlabelled
            if job in self._concluded:
                self.stats.after_conclusion += 1
            tomb = self.released.get(job)
            if tomb is not None and ev.ts <= tomb[0]:
                self.stats.after_release += 1
                continue
            state = self._job_state(job)
            if not state.add(ev, ts_limit=limit):
                self.stats.duplicates += 1
            state.arrived(ev, arrival, ts_limit=limit)
            state.last_arrival = arrival
            self._dirty.add(job)
            self._fresh.add(job)
            if ev.kind in LOADING_KINDS:
                self._loading.add(job)
                self._loads_dirty.add(job)
            elif ev.kind == "metric" and job in self._loading:
                self._loads_dirty.add(job)  # losses after a resume: post_resume_regression
        self.last_arrival = arrival

    def _new_job(self, job: str) -> JobState:
        # the events that name no job may be folded into a named job (adopt_unlabelled): their
        # progress lines keep their labels and attrs, to be filed and read there again
        keep = self.config.progress_cap if job == self._unlabelled else self.config.payload_keep
        return JobState(job, progress_cap=self.config.progress_cap, payload_keep=keep)

    def process_frame(self, events: pl.DataFrame, *, now: dt.datetime | None = None) -> None:
        """:meth:`process` for a frame of events (EVENT_SCHEMA columns), with the same result:
        progress lines (kind ``metric``: nearly every event of a training log) are taken per
        batch and per job (:meth:`JobState.add_metrics
        <ckptwatch.detectors.jobstate.JobState.add_metrics>`), never as one :class:`Ev`
        each; the other events go through :meth:`process` first, so the ranks they name are
        known when the progress lines are filed."""
        if events.is_empty():
            return
        bulk = (pl.col("kind") == "metric") & ~pl.col("rule_id").str.starts_with("ckptwatch.")
        self.process(events.filter(~bulk).iter_rows(named=True), now=now)
        metrics = events.filter(bulk)
        if metrics.is_empty():
            return
        arrival = now or dt.datetime.now(dt.timezone.utc)
        limit = arrival + MAX_AHEAD
        self.stats.events += metrics.height
        newest = metrics.filter(pl.col("ts") <= limit)["ts"].max()
        if newest is not None and (self.max_ts is None or newest > self.max_ts):
            self.max_ts = newest
        metrics = metrics.with_columns(pl.col("job").fill_null(self._unlabelled))
        for (job,), rows in metrics.group_by("job", maintain_order=True):
            if job in self._concluded:
                self.stats.after_conclusion += rows.height
            tomb = self.released.get(job)
            if tomb is not None:
                cut = pl.lit(tomb[0]).cast(rows["ts"].dtype)  # a time read back from DuckDB is Etc/UTC
                late = rows.filter(pl.col("ts") <= cut)
                self.stats.after_release += late.height
                rows = rows.filter(pl.col("ts") > cut)
                if rows.is_empty():
                    continue
            state = self.jobs.get(job)
            if state is None:
                state = self.jobs[job] = self._new_job(job)
                self.stats.jobs += 1
            state.add_metrics(rows, arrival, ts_limit=limit)
            self._pending_rows += rows.height
            self._dirty.add(job)
            self._fresh.add(job)
            if job in self._loading:
                self._loads_dirty.add(job)  # losses after a resume: post_resume_regression
        self.last_arrival = arrival
        if self._pending_rows > SETTLE_ROWS:  # many small jobs: each under the bound, together not
            for state in self.jobs.values():
                state.settle()
            self._pending_rows = 0

    def adopt_unlabelled(self, *, live: bool = False, others: Iterable[JobState] = ()) -> bool:
        """When every event that names a job names the same one, the events that name none
        (a launcher's or kernel's file beside rank files whose labels come from a template or
        from lines inside them) are that job's: fold job ``unknown`` into it. True if it did.

        ``diagnose`` calls it once, before its final advance; ``ckptwatch run`` before each
        advance with the files read to their end (``live=True``) and before the final one;
        the fleet detector when one member reads every partition, with the ``unknown`` jobs
        of the other partitions' detectors as ``others`` (:meth:`take_unlabelled`). Folding
        again is harmless: events already in the job are not added twice (their dedup key),
        so unlabelled events arriving later are folded as they come. ``live``: a job
        released (see :class:`DetectorConfig`) whose newest event is not older than the
        oldest unlabelled event makes it ambiguous: nothing is folded."""
        named = [j for j in self.jobs if j != self._unlabelled]
        unknowns = [u for u in (self.jobs.get(self._unlabelled), *others) if u is not None]
        if not unknowns or len(named) != 1 or self._concluded - set(named):
            return False
        if live and self.released:
            first = min((e.ts for u in unknowns for e in [*u.events.values(), *u.progress]), default=None)
            if first is None or any(ts >= first for job, (ts, _) in self.released.items() if job != named[0]):
                return False
        job = named[0]
        self.adopted_into = job
        state = self.jobs[job]
        for unknown in unknowns:
            for step, r in unknown.retired.items():  # its saves let go while no job was named
                state.note_retired(step, r)
            state.retired_ranks |= unknown.retired_ranks
            state.retired_multi = state.retired_multi or unknown.retired_multi
            for ev in [*unknown.events.values(), *unknown.progress]:
                state.add(ev)
            for sid, (ts, at) in unknown.sources.items():  # its files count for the job's low watermark
                known = state.sources.get(sid)
                state.sources[sid] = (ts, at) if known is None else (max(ts, known[0]), max(at, known[1]))
            state.last_arrival = max(filter(None, (state.last_arrival, unknown.last_arrival)), default=None)
            if unknown.loading:
                self._loading.add(job)
                self._loads_dirty.add(job)
        self.take_unlabelled()
        self._dirty.add(job)
        self._fresh.add(job)
        return True

    def take_unlabelled(self) -> JobState | None:
        """Remove and return job ``unknown`` (the events that name no job), to be folded into
        the one named job another detector holds (:meth:`adopt_unlabelled`'s ``others``)."""
        self._evaluated_at.pop(self._unlabelled, None)
        for ids in (self._loading, self._loads_dirty, self._dirty, self._fresh):
            ids.discard(self._unlabelled)
        for table in (self._open_saves, self._unfinished):
            table.pop(self._unlabelled, None)
        return self.jobs.pop(self._unlabelled, None)

    def watermark(self, now: dt.datetime | None = None) -> dt.datetime | None:
        """Newest event time of any job minus the allowed lateness, advanced by idle wall
        time (what the detector-lag metric reports; each job is judged by its own,
        :meth:`JobState.watermark <ckptwatch.detectors.jobstate.JobState.watermark>`)."""
        if self.max_ts is None:
            return None
        wm = self.max_ts - dt.timedelta(seconds=self.config.allowed_lateness)
        if now is not None and self.last_arrival is not None and now > self.last_arrival:
            wm += now - self.last_arrival
        return wm

    def _job_state(self, job: str) -> JobState:
        state = self.jobs.get(job)
        if state is None:
            state = self.jobs[job] = self._new_job(job)
            self.stats.jobs += 1
        return state

    def _host_events_for(self, state: JobState, events: list[Ev] | None = None) -> list[Ev]:
        """Kernel / storage events joined to ``state``'s job: of its hosts, or of a pid of one
        of its ranks; and a kernel OOM kill of the pid a death by signal of the job reports
        (a launcher's ``failed (exitcode: -9) ... (pid: N)``) within :data:`OOM_PID_WINDOW`,
        its host unknown on either side or the same (a single-node run reads no host label).
        A job that names no host at all (a pasted console beside a pasted ``journalctl -k``)
        also gets a kernel OOM kill within that window of a SIGKILL death that names no pid
        (bash's ``Killed``). And the lines of a kernel log among the job's own files (a fleet
        root read with ``{job}/*`` puts ``kern.log`` under the job; one job's directory read
        alone names its job-less files after it) that name no pid, or any pid when the job's
        lines name no pid and report no death."""
        hosts, pids = state.hosts(), set(state.pid_rank)
        deaths: dict[int, list[tuple[dt.datetime, str | None]]] = {}
        anonymous: list[dt.datetime] = []  # SIGKILL deaths without a pid, in a job without hosts
        if any(e.kind == "oom_kill" and e.pid is not None and e.pid not in pids for e in self.host_events.values()):
            for e in (events if events is not None else state.events.values()):
                if e.pid is not None and e.died_of_signal:
                    deaths.setdefault(e.pid, []).append((e.ts, e.host or state.host_of(state.rank_of(e))))
                elif e.pid is None and not hosts and e.died_of_signal and e.signal == "SIGKILL":
                    anonymous.append(e.ts)
        window = dt.timedelta(seconds=OOM_PID_WINDOW)
        # a job whose lines name no pid and report no death (Keras under nohup: the console
        # just stops): a kernel log among its own files names the process that died
        # (asked only of such a line: it reads every event of the job once)
        memo: list[bool] = []

        def silent() -> bool:
            if not memo:
                memo.append(not pids and not any(e.died_of_signal for e in (
                    events if events is not None else state.events.values())))
            return memo[0]

        def joined(e: Ev) -> bool:
            if (e.host and e.host in hosts) or (e.pid is not None and e.pid in pids):
                return True
            # a kernel log among the job's own files (a job-less one: the files read are one
            # job's, named after their directory): not a pid of another process of it, unless
            # the job's lines name no pid and no death at all (then the kernel names the one)
            if (e.job or self._unlabelled) == state.job and (e.pid is None or silent()):
                return True
            if e.kind == "oom_kill" and any(abs(e.ts - ts) <= window for ts in anonymous):
                return True
            return e.kind == "oom_kill" and any(abs(e.ts - ts) <= window and (not e.host or not h or e.host == h)
                                                for ts, h in deaths.get(e.pid, ()))  # type: ignore[arg-type]

        return sorted((e for e in self.host_events.values() if joined(e)), key=lambda e: (e.ts, e.source_id, e.offset))

    def advance(self, *, final: bool = False, now: dt.datetime | None = None,
                jobs: set[str] | None = None) -> list[Incident]:
        """Evaluate jobs and return incidents that are new or changed (``detected_ts`` set
        on first emission). With ``final=True`` the input is complete: nothing is held
        back for late evidence. With ``jobs``, only those are evaluated (with ``final``, only
        their input is complete), and no job is released."""
        if self.max_ts is None:
            return []
        wall = now or dt.datetime.now(dt.timezone.utc)
        lateness = dt.timedelta(seconds=self.config.allowed_lateness)
        wms: dict[str, dt.datetime] = {}
        changed: list[Incident] = []
        registry_changed = False
        targets = set(self.jobs) if final else set(self._dirty)
        for job in sorted(targets if jobs is None else targets & jobs):
            state = self.jobs[job]
            wm = wms[job] = self._job_watermark(state, lateness, now, final=final)
            if not final and job not in self._fresh and self._evaluated_at.get(job) == wm and not state.integrity:
                continue  # nothing new since it was evaluated at this watermark: the same result
            self._fresh.discard(job)
            self._evaluated_at[job] = wm
            events = state.events_sorted()
            saves = saves_of(state, events)
            registry_changed |= self._record_saves(job, state, saves)
            clock = functools.partial(state.clock_of, lateness=lateness, now=now, source_idle=self.config.source_idle)
            found = save_incidents.evaluate(state, self._host_events_for(state, events), wm, final=final,
                                            windows=self.config.windows, saves=saves, events=events, clock=clock)
            for inc in found:
                registry_changed |= self.registry.record_incident(inc)
            for inc in integrity_incidents.evaluate(state, self.registry) if state.integrity else ():
                registry_changed |= self.registry.record_incident(inc)
                changed += self._emit(inc, wall)
            still_open = False
            for inc in found:
                changed += self._emit(inc, wall)
                still_open = still_open or inc.kind == "stalled_save"
            changed += self._finished_saves(job, {i.id for i in found}, saves)
            # a provisional conclusion is evaluated again as the watermark moves, until it settles
            # (a save of no known step is reported with step None and kept under UNKNOWN_STEP)
            concluded = {UNKNOWN_STEP if i.step is None else i.step for i in found
                         if i.kind != "stalled_save" and not i.provisional}
            open_saves = [s for s in saves.values() if not s.complete and s.step not in concluded]
            self._open_saves[job] = len(open_saves)
            stalled = {UNKNOWN_STEP if i.step is None else i.step for i in found}
            self._unfinished[job] = sorted((s.step, s.path) for s in open_saves if s.step not in stalled)
            if not final:
                self._retire(job, state, saves, wm)
            if not final and (still_open or self._open_saves[job]):
                continue  # keep evaluating as the watermark moves
            self._dirty.discard(job)
        for inc in changed:
            if inc.status == "superseded":
                registry_changed |= self.registry.record_incident(inc)
        # resumes after saves: a load is judged by what is known of its checkpoint, whichever job wrote it
        waiting: set[str] = set()
        loads = self._loading if (registry_changed or final) else self._loads_dirty
        for job in sorted(loads if jobs is None else loads & jobs):
            state = self.jobs[job]
            wm = wms.get(job) or self._job_watermark(state, lateness, now, final=final)
            found, wait = resume_incidents.evaluate(state, self.registry, self.config.regression, wm=wm)
            for inc in found:
                changed += self._emit(inc, wall)
            ids = {i.id for i in found}
            changed += self._withdrawn_resumes([inc for _, inc in self._emitted.values()
                                                if inc.job == job and inc.id not in ids])
            if wait:
                waiting.add(job)  # a load of a save not finished yet: judged once the watermark passes it
        if jobs is not None:
            self._loads_dirty = (self._loads_dirty - jobs) | waiting
            return changed
        if registry_changed or final:  # the resumes of released jobs, kept for this
            changed += self._withdrawn_resumes(
                [inc for _, inc in self._emitted.values() if inc.job in self.released and inc.job not in self.jobs])
        self._loads_dirty = waiting
        self._release(wall)
        return changed

    def conclude(self, jobs: Iterable[str], *, now: dt.datetime | None = None) -> list[Incident]:
        """Evaluate ``jobs`` as finished input (every line of theirs is read: ``diagnose``,
        once every file their paths name is read to its end) and let their state go, keeping
        their incidents (:meth:`incidents`), their saves left unfinished
        (:meth:`unfinished_saves`) and their checkpoints' facts (the registry): memory then
        holds the jobs still being read, not every job read. A job that logged a load,
        resume or load error stays until the end (the checkpoint it loaded may be written in
        a job still to be read), and so do the lines that name no job; while those are there
        and only one job is named, nothing is concluded (they may yet be folded into it,
        :meth:`adopt_unlabelled`). Lines of a concluded job that come after all (a file whose
        lines name another job than its path), and host events of its hosts, are counted in
        ``stats.after_conclusion``. Returns the incidents that changed."""
        targets = {j for j in jobs if j in self.jobs and j != self._unlabelled and j not in self._loading}
        named = {j for j in self.jobs if j != self._unlabelled} | self._concluded
        if not targets or (self._unlabelled in self.jobs and len(named) < 2):
            return []  # the lines that name no job may yet be folded into the one job (adopt_unlabelled)
        wall = now or dt.datetime.now(dt.timezone.utc)
        for job in targets:
            self.jobs[job].settle()
        changed = self.advance(final=True, now=now, jobs=targets)
        for job in sorted(targets):
            self._concluded_hosts |= self.jobs[job].hosts()
            self._release_job(job, self.jobs[job], wall, keep_incidents=True)
            self._concluded.add(job)
        return changed

    def _record_saves(self, job: str, state: JobState, saves: dict[int, SaveState]) -> bool:
        """Put the facts of ``saves`` (of ``job``) in the registry; True if one was new or changed."""
        windows = saver_windows(state.losses, {s.step for s in saves.values()}, self.config.regression.k)
        changed = False
        for key, s in saves.items():
            fact = SaveFact(job, s.step, s.path, s.complete, s.first_ts, state.world_size, windows[s.step],
                            tuple(s.missing))
            if key < 0:  # an attempt a later one of the step replaced: what a load before that one found
                changed |= self.registry.record_earlier(fact)
                continue
            if self.registry.record_save(fact):
                changed = True
                self._new_saves[checkpoint_key(fact.path, fact.step)] = fact
        return changed

    def retire_saves(self, read_position: dt.datetime) -> int:
        """Let go of the finished saves of long jobs (:mod:`~ckptwatch.detectors.retire`)
        older than ``read_position`` (UTC: how far every file still being read has been
        read, :meth:`SourceWatcher.read_position
        <ckptwatch.ingest.watcher.SourceWatcher.read_position>`) less ``allowed_lateness``.
        ``diagnose`` calls it between batches; :meth:`advance` does the same with each job's
        watermark. Returns how many save lines went."""
        cutoff = read_position - dt.timedelta(seconds=self.config.allowed_lateness)
        gone = 0
        for job, state in list(self.jobs.items()):
            if len(state.events) >= self._retire_at.get(job, retire.RETIRE_MIN):
                gone += self._retire(job, state, saves_of(state, state.events_sorted()), cutoff)
        return gone

    def _retire(self, job: str, state: JobState, saves: dict[int, SaveState], cutoff: dt.datetime) -> int:
        """Retire what :func:`retire.retirable` allows of ``job``'s ``saves`` before ``cutoff``
        (UTC), its facts put in the registry first; not while the events that name no job
        may still be folded into it (:meth:`adopt_unlabelled`: they may hold lines of those
        saves), nor theirs while a named job is there to fold them into. Looked at again once
        the job holds twice the events it kept."""
        if len(state.events) < self._retire_at.get(job, retire.RETIRE_MIN):
            return 0
        named = sum(j != self._unlabelled for j in self.jobs)
        if (named if job == self._unlabelled else named == 1 and self._unlabelled in self.jobs):
            return 0
        old = retire.retirable(saves, cutoff)
        if old:
            self._record_saves(job, state, {s.step: s for s in old})
        gone = retire.retire(state, old, cutoff)
        self._retire_at[job] = max(retire.RETIRE_MIN, 2 * len(state.events))
        self.stats.retired += gone
        return gone

    def _release(self, wall: dt.datetime) -> None:
        """Release the jobs concluded and idle for ``release_after`` seconds of wall time,
        expire old tombstones, and prune host events and the registry (see
        :class:`DetectorConfig`)."""
        idle = dt.timedelta(seconds=self.config.release_after)
        for job, state in list(self.jobs.items()):
            if (job in self._dirty or job in self._loads_dirty or self._open_saves.get(job)
                    or state.last_arrival is None or wall - state.last_arrival < idle):
                continue
            self._release_job(job, state, wall)
        ttl = dt.timedelta(seconds=self.config.tombstone_ttl)
        for job in [j for j, (_, at) in self.released.items() if wall - at > ttl]:
            del self.released[job]
            for iid in [i for i, (_, inc) in self._emitted.items() if inc.job == job and job not in self.jobs]:
                del self._emitted[iid]  # an open poisoned resume kept past its job (see _release_job)
        live = [s.max_ts for s in self.jobs.values() if s.max_ts is not None]
        if self.host_events and (live or self.max_ts):
            # only what arrived release_after ago: a job's lines may come long after its
            # host's (another partition's backlog, a collector that was down)
            cutoff = min(live or [self.max_ts]) - idle  # type: ignore[type-var,operator]
            for key in [k for k, e in self.host_events.items()
                        if e.ts < cutoff and wall - self._host_arrival.get(k, wall) >= idle]:
                del self.host_events[key]
                self._host_arrival.pop(key, None)
        if self.max_ts is not None:
            self.registry.prune(self.max_ts - dt.timedelta(seconds=self.config.registry_horizon))

    def _release_job(self, job: str, state: JobState, wall: dt.datetime, *, keep_incidents: bool = False) -> None:
        """Forget ``job``'s events and incidents but its open poisoned resumes; keep a tombstone
        and its checkpoints' facts (evidence dropped from the incidents that mark them bad).
        ``keep_incidents``: its incidents and unfinished saves stay (:meth:`conclude`)."""
        del self.jobs[job]
        self._retire_at.pop(job, None)
        tomb = state.max_ts or wall
        self.released[job] = (tomb, wall)
        if not keep_incidents:  # a concluded job is not released for good: a restart replays it
            self._newly_released.append((job, tomb))
        self._open_saves.pop(job, None)
        if not keep_incidents:
            self._unfinished.pop(job, None)
        self._evaluated_at.pop(job, None)
        for ids in (self._loading, self._loads_dirty, self._dirty, self._fresh):
            ids.discard(job)
        for iid, (_, inc) in [] if keep_incidents else list(self._emitted.items()):
            if inc.job == job and not (inc.kind == "poisoned_resume" and inc.status == "open"):
                del self._emitted[iid]
        # an open poisoned resume stays, until its tombstone expires: a late line of the save
        # it cites may still show the checkpoint whole, and withdraw it
        for by in (self._by_save, self._by_load):
            for key in [k for k in by if k[0] == job]:
                del by[key]
        for key, inc in list(self.registry.bad.items()):
            if inc.job == job and inc.evidence:
                self.registry.bad[key] = dataclasses.replace(inc, evidence=[])
        self.stats.released += 1

    def take_released(self) -> list[tuple[str, dt.datetime]]:
        """``(job, newest event time)`` of the jobs released since the last call (to persist
        as tombstones, with :attr:`registry`, so a restart replays only live jobs)."""
        out, self._newly_released = self._newly_released, []
        return out

    def restore(self, released: Iterable[tuple[str, dt.datetime, dt.datetime]], registry: dict | None) -> None:
        """Start from persisted state instead of a full replay: tombstones ``(job, newest
        event time, wall time released)`` and a registry snapshot
        (:meth:`CheckpointRegistry.to_dict`). Call before :meth:`process`. Raises
        KeyError / ValueError / TypeError on a snapshot of another shape."""
        self.released.update((job, (ts, at)) for job, ts, at in released)
        if registry is not None:
            self.registry = CheckpointRegistry.from_dict(registry)

    def _job_watermark(self, state: JobState, lateness: dt.timedelta, now: dt.datetime | None, *,
                       final: bool) -> dt.datetime:
        """``state``'s watermark; with ``final``, its newest event time (nothing is late any more)."""
        if final:
            return state.max_ts or self.max_ts  # type: ignore[return-value]
        return (state.watermark(lateness, now, source_idle=self.config.source_idle)
                or (self.max_ts - lateness))  # type: ignore[operator]

    def learn(self, incidents: Iterable[Incident]) -> None:
        """Take save incidents found elsewhere (another detector of the group, read back from
        the incidents topic): their checkpoints count as not-good here too, so a resume in
        a job this detector owns is judged by them."""
        for inc in incidents:
            if self.registry.record_incident(inc):
                self._loads_dirty.update(self._loading)

    def learn_saves(self, facts: Iterable[SaveFact]) -> bool:
        """Take save facts found elsewhere (another detector's :meth:`take_save_facts`, read
        back from the saves topic): a resume in a job this detector owns is judged against
        the saver's world size and losses. True if one was new or changed here."""
        changed = False
        for fact in facts:
            if self.registry.record_save(fact):
                changed = True
                self._loads_dirty.update(self._loading)
        return changed

    def take_save_facts(self) -> list[SaveFact]:
        """Facts of this detector's own saves that are new or changed since the last call
        (the latest of each checkpoint), for other detectors to :meth:`learn_saves`."""
        out = list(self._new_saves.values())
        self._new_saves.clear()
        return out

    def _finished_saves(self, job: str, found: set[str], saves: dict[int, SaveState]) -> list[Incident]:
        """Save incidents of ``job`` that evaluation no longer reports because their save is
        now seen complete on every rank (its last end lines arrived late): withdrawn, with
        :func:`save_incidents.withdrawal <ckptwatch.detectors.save_incidents.withdrawal>`'s
        reason (the registry then forgets them), or, for a stall that did last, resolved.
        One whose save is not seen complete stands as it is (the job's watermark fell back
        behind it as new lines arrived: it comes back as the watermark moves on)."""
        out = []
        for iid, (_, inc) in list(self._emitted.items()):
            if inc.job != job or inc.kind not in save_incidents.KINDS or inc.status == "superseded" or iid in found:
                continue
            s = save_incidents.save_of(inc, saves)
            if s is None or not s.complete:
                continue
            reason = save_incidents.withdrawal(inc, s, self.config.windows)
            if reason is not None:
                inc.withdraw(reason)
            elif inc.status == "open":
                inc.status = "resolved"
            else:
                continue
            self._emitted[iid] = (inc.fingerprint(), inc)
            out.append(inc)
        return out

    def _withdrawn_resumes(self, candidates: list[Incident]) -> list[Incident]:
        """Of ``candidates`` (incidents evaluation no longer reports, or of released jobs),
        the open ``poisoned_resume`` ones whose checkpoint turned out whole (late lines
        showed its save finished; a verification found it whole): withdrawn, with
        :func:`resume_incidents.retraction <ckptwatch.detectors.resume_incidents.retraction>`'s
        reason. One whose load merely waits again for the watermark stands."""
        out = []
        for inc in candidates:
            if inc.kind == "poisoned_resume" and inc.status == "open":
                reason = resume_incidents.retraction(inc, self.registry)
                if reason is None:
                    continue
                inc.withdraw(reason)
                self._emitted[inc.id] = (inc.fingerprint(), inc)
                out.append(inc)
        return out

    def adopt(self, incidents: Iterable[Incident]) -> None:
        """Take incidents a predecessor of this detector reported (read back after a restart
        or a rebalance; call before the first :meth:`advance`) as reported: one that later
        lines withdraw or resolve is reported so, though a detector rebuilt from the events
        alone may never find it again (a stall concluded as wall time went by), and a
        re-classified one is superseded. One found again is reported again, with its first
        ``detected_ts`` (the caller tells unchanged versions: the detector service by the
        published fingerprints). Incidents of jobs this detector does not read stay inert."""
        for inc in incidents:
            if inc.id in self._emitted:
                continue
            inc = Incident.from_dict(inc.to_dict())  # ours to withdraw or resolve: the caller's stays as it was
            self._emitted[inc.id] = ("", inc)  # no fingerprint: found again, it is reported again
            by, key = self._slot(inc)
            if inc.status != "superseded" and key:
                by.setdefault(key, inc.id)

    def _slot(self, inc: Incident) -> tuple[dict, tuple]:
        """Where the id of ``inc``'s current incident is kept: one incident per save, and one
        per load (a re-classified one supersedes the old id); none for one per checkpoint."""
        if inc.kind in resume_incidents.LOAD_INCIDENT_KINDS:
            return self._by_load, (inc.job, inc.step, inc.checkpoint_path)
        if inc.kind in ("poisoned_resume", "corrupt_checkpoint"):  # one per checkpoint: the id is the key
            return {}, ()
        return self._by_save, (inc.job, inc.step)

    def _emit(self, inc: Incident, wall: dt.datetime) -> list[Incident]:
        out: list[Incident] = []
        by, key = self._slot(inc)
        prev_id = by.get(key)
        if prev_id and prev_id != inc.id and prev_id in self._emitted:
            _, old = self._emitted[prev_id]
            if old.status != "superseded":
                old.status = "superseded"
                out.append(old)
        by[key] = inc.id
        inc.commands = commands_of(inc)
        fp = inc.fingerprint()
        prev = self._emitted.get(inc.id)
        if prev is not None and prev[0] == fp:
            return out
        inc.detected_ts = prev[1].detected_ts if prev else wall
        self._emitted[inc.id] = (fp, inc)
        out.append(inc)
        return out

    def open_saves(self) -> int:
        """Saves (one per job and step) not finished on every expected rank and not concluded
        by an incident other than ``stalled_save`` (a stalled save may still finish), over
        every job, as of the last :meth:`advance`: what keeps a job under evaluation as the
        watermark moves."""
        return sum(self._open_saves.values())

    def unfinished_saves(self) -> list[tuple[str, int, str | None]]:
        """``(job, step, path)`` of saves seen to start and not to finish on every expected
        rank, with no incident about them (no failure, not stalled long enough), as of the
        last :meth:`advance`."""
        return [(job, step, path) for job, items in sorted(self._unfinished.items()) for step, path in items]

    def incidents(self) -> list[Incident]:
        """Every incident emitted so far (latest version), by first_ts."""
        return sorted((i for _, i in self._emitted.values()), key=lambda i: (i.first_ts, i.id))
