"""The embedded pipeline: every stage in one process, joined by plain function calls.

``diagnose`` reads files once and returns incidents; ``run`` (see :mod:`ckptwatch.embedded`)
tails a directory continuously and writes DuckDB. Both use the same stages:
:class:`~ckptwatch.ingest.watcher.SourceWatcher` -> :class:`~ckptwatch.rules.RuleSet` ->
:class:`~ckptwatch.detectors.Detector`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import polars as pl

from ckptwatch.config import DetectSettings
from ckptwatch.detectors import Detector, DetectorConfig, Incident
from ckptwatch.detectors.events import HOST_KINDS
from ckptwatch.ingest.stats import Stats
from ckptwatch.ingest.watcher import DEFAULT_POLL_BYTES, SourceWatcher
from ckptwatch.rules import RuleSet
from ckptwatch.schema import empty_events

__all__ = ["PipelineOptions", "Stats", "diagnose", "extract_events"]


@dataclass
class PipelineOptions:
    """Options shared by ``diagnose`` and ``run``.

    ``template``: a compiled path template (see :mod:`ckptwatch.ingest.layout`);
    ``boot_time``: UTC boot time for kernel ``[seconds]`` stamps; ``rule_files``: extra
    rule packs (files or directories) loaded after the packaged ones; ``line_prefix``: the
    torchrun ``--log-line-prefix-template`` the consoles were written with
    (:func:`ckptwatch.ingest.prefix.compile_line_prefix`); ``poll_bytes``: bytes one batch
    reads at most over all files (see :class:`~ckptwatch.ingest.watcher.SourceWatcher`);
    ``rule_scopes``: load only the packaged packs of these scopes
    (:data:`ckptwatch.rules.engine.SCOPES`; None: every pack); ``max_open_files``: log files
    held open at most, the others read in turns (None: the open-file limit minus
    :data:`~ckptwatch.ingest.handles.HEADROOM`; see :mod:`ckptwatch.ingest.handles`);
    ``job``: the job of every file whose path the template names none (``--job``: one
    job's paste, or one run's directory). ``name_unlabelled``: the lines that name no job
    are judged as the job named after the directory read (:func:`unlabelled_job`); off
    for a paste on standard input, whose lines are job ``unknown``.
    """

    template: re.Pattern[str] | None = None
    boot_time: dt.datetime | None = None
    rule_files: tuple[str, ...] = ()
    line_prefix: str | None = None
    detector: DetectorConfig = field(default_factory=DetectorConfig)
    poll_bytes: int = DEFAULT_POLL_BYTES
    rule_scopes: tuple[str, ...] | None = None
    max_open_files: int | None = None
    job: str | None = None
    name_unlabelled: bool = True

    def detector_for(self, paths: Iterable[str]) -> DetectorConfig:
        """:attr:`detector`, judging the lines that name no job as the job named after
        ``paths`` (:func:`unlabelled_job`) when :attr:`name_unlabelled`."""
        if not self.name_unlabelled:
            return self.detector
        return dataclasses.replace(self.detector, unlabelled_job=unlabelled_job(paths))


#: event kinds that belong to one rank of a job: without a rank, blame and shard checks are blind
RANKED_KINDS = ("save_start", "save_end", "save_error", "process_exit", "collective_timeout", "collective_error",
                "load_error")


def unlabelled_job(paths: Iterable[str]) -> str:
    """The job of lines that no path label, line or ``--job`` names: the name of the
    directory read (``run --logs /data/llama-7b`` or ``diagnose llama-7b/``: ``llama-7b``);
    a directory named for what it holds (``logs``, ``output``: :data:`GENERIC_DIRS`) is
    named with its parent (``llama-7b/logs``); of one file given, its name without
    extensions (``diagnose job123.log``: ``job123``); of several files, the directory that
    holds them. Two directories read one after the other
    into one database are then two jobs, as they were two runs. ``unknown`` when the paths
    given are in directories of different names, or at the file system's root."""
    paths = [os.path.abspath(p) for p in paths]
    if len(paths) == 1 and not os.path.isdir(paths[0]):
        stem = os.path.basename(paths[0]).split(".", 1)[0]
        if stem:
            return stem
    names = {_directory_name(p if os.path.isdir(p) else os.path.dirname(p)) for p in paths}
    return names.pop() if len(names) == 1 and "" not in names else "unknown"


#: directory names that say what a directory holds, not which run: named with their parent
GENERIC_DIRS = frozenset({"log", "logs", "out", "output", "outputs", "stdout", "console", "consoles", "run", "runs",
                          "train", "training", "job", "jobs", "tmp"})


def _directory_name(path: str) -> str:
    """``path``'s last component; ``a/logs`` for a generic one (:data:`GENERIC_DIRS`)."""
    name = os.path.basename(path)
    parent = os.path.basename(os.path.dirname(path))
    return f"{parent}/{name}" if name.lower() in GENERIC_DIRS and parent else name


def detector_config(detect: DetectSettings, base: DetectorConfig | None = None) -> DetectorConfig:
    """``base`` (default: :class:`DetectorConfig`'s defaults) judged as the ``[detect]`` table
    says: ``allowed_lateness``, ``source_idle`` and the save windows ``settle`` / ``confirm``
    (seconds), as ``run`` and the fleet's detectors judge."""
    base = base or DetectorConfig()
    windows = dataclasses.replace(base.windows, settle=detect.settle, confirm=detect.confirm)
    return dataclasses.replace(base, allowed_lateness=detect.allowed_lateness, source_idle=detect.source_idle,
                               windows=windows)


def extract_events(rules: RuleSet, records: pl.DataFrame, stats: Stats) -> pl.DataFrame:
    """Apply the rules to a batch of records; counts records that matched no rule, and
    events that carry no job or no rank (:meth:`Stats.label_warnings`)."""
    if records.is_empty():
        return empty_events()
    events = rules.apply(records)
    stats.events += events.height
    stats.skip("no_rule_matched", records.height - events.height)
    if not events.is_empty():
        files = dict(records.select("source_id", "file").unique("source_id").iter_rows())
        _audit_labels(events, stats, files)
    return events


def _audit_labels(events: pl.DataFrame, stats: Stats, files: dict[str, str]) -> None:
    """Count the job's own events (not host-level kernel/storage lines) that carry no job,
    and the ranked ones that carry no rank, per job, remembering a few of their files."""
    own = events.filter(~pl.col("kind").is_in(sorted(HOST_KINDS))
                        | pl.col("rank").is_not_null() | pl.col("local_rank").is_not_null())
    no_job = own.filter(pl.col("job").is_null())
    if no_job.height:
        stats.no_job += no_job.height
        _remember_files(stats, "", no_job, files)
    no_rank = own.filter(pl.col("job").is_not_null() & pl.col("kind").is_in(RANKED_KINDS)
                         & pl.col("rank").is_null() & pl.col("local_rank").is_null() & pl.col("pid").is_null())
    for (job,), part in no_rank.group_by("job"):
        stats.no_rank[job] = stats.no_rank.get(job, 0) + part.height
        _remember_files(stats, job, part, files)


def _remember_files(stats: Stats, key: str, events: pl.DataFrame, files: dict[str, str]) -> None:
    seen = stats.unlabelled_files.setdefault(key, [])
    for sid in events["source_id"].unique(maintain_order=True).to_list():
        if len(seen) >= 3:
            break
        if files.get(sid, sid) not in seen:
            seen.append(files.get(sid, sid))


def diagnose(paths: Iterable[str], options: PipelineOptions | None = None,
             progress: Callable[[Stats, int], None] | None = None) -> tuple[list[Incident], Stats]:
    """Run every stage once over ``paths`` (files, directories and/or glob patterns), reading
    every byte of every file: a chunk of each file per batch, each batch matched and fed to
    the detector before the next is read (memory holds one batch of records, not the logs).
    A job is concluded as soon as every file its path names (``--path-template``, a
    launcher's log directory) is read and every file whose path names no job is too (those
    are read first): its incidents are kept and its lines let go (:meth:`Detector.conclude
    <ckptwatch.detectors.runner.Detector.conclude>`).

    ``progress`` is called after each batch with the stats so far and the bytes read.
    Returns the incidents (ordered by first_ts) and the run's stats. Problems with
    individual files end up in ``stats.errors``; a path that does not exist too.

    A line that reaches a job already concluded (a file whose lines name another job than its
    path; a host's kernel or storage log filed under another job) makes the run read
    everything again without concluding (``stats.notes["read_again_unconcluded"]``).

    Raises:
        RuleError: a rule file is broken (names the file, the rule and the reason).
    """
    paths, options = list(paths), options or PipelineOptions()
    incidents, stats, late = _diagnose(paths, options, progress, conclude=True)
    if late:
        incidents, stats, _ = _diagnose(paths, options, progress, conclude=False)
        stats.note("read_again_unconcluded", late)
    return incidents, stats


def _diagnose(paths: list[str], options: PipelineOptions, progress: Callable[[Stats, int], None] | None, *,
              conclude: bool) -> tuple[list[Incident], Stats, int]:
    """:func:`diagnose`'s one reading, concluding jobs or not; also returns how many events
    came after their job was concluded."""
    rules = RuleSet.load(options.rule_files, scopes=options.rule_scopes)
    watcher = SourceWatcher(list(paths), template=options.template, boot_time=options.boot_time,
                            line_prefix=options.line_prefix, archives=True, poll_bytes=options.poll_bytes,
                            max_open_files=options.max_open_files, job=options.job)
    stats = watcher.stats
    detector = Detector(options.detector_for(paths))
    stats.unlabelled_job = detector.config.unlabelled_job
    try:
        while True:
            records = watcher.poll(final=True)
            events = extract_events(rules, records, stats)
            detector.process_frame(events)
            read = watcher.jobs_read() if conclude else None
            if read:  # every file of these is read: conclude them (those still held), let their lines go
                detector.conclude(read)
            position = watcher.read_position()
            if position is not None:  # a long job's finished saves older than every file's place may go
                detector.retire_saves(position)
            if progress is not None:
                progress(stats, watcher.bytes_read)
            if not watcher.backlog:
                break
    finally:
        watcher.close()
    if detector.adopt_unlabelled():
        stats.unlabelled_job, stats.unlabelled_folded = detector.adopted_into or stats.unlabelled_job, True
    detector.advance(final=True)
    stats.duplicate_events = detector.stats.duplicates
    stats.open_saves = detector.unfinished_saves()
    return [i for i in detector.incidents() if i.status != "superseded"], stats, detector.stats.after_conclusion
