"""The embedded pipeline: every stage in one process, joined by plain function calls.

``diagnose`` reads files once and returns incidents; ``run`` (see :mod:`ckptwatch.embedded`)
tails a directory continuously and writes DuckDB. Both use the same stages:
:class:`~ckptwatch.ingest.watcher.SourceWatcher` -> :class:`~ckptwatch.rules.RuleSet` ->
:class:`~ckptwatch.detectors.Detector`.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

import polars as pl

from ckptwatch.detectors import Detector, DetectorConfig, Incident
from ckptwatch.ingest.stats import Stats
from ckptwatch.ingest.watcher import SourceWatcher
from ckptwatch.rules import RuleSet
from ckptwatch.schema import empty_events

__all__ = ["PipelineOptions", "Stats", "diagnose", "extract_events"]


@dataclass
class PipelineOptions:
    """Options shared by ``diagnose`` and ``run``.

    ``template``: a compiled path template (see :mod:`ckptwatch.ingest.layout`);
    ``boot_time``: UTC boot time for kernel ``[seconds]`` stamps; ``rule_files``: extra
    rule packs (files or directories) loaded after the packaged ones.
    """

    template: re.Pattern[str] | None = None
    boot_time: dt.datetime | None = None
    rule_files: tuple[str, ...] = ()
    detector: DetectorConfig = field(default_factory=DetectorConfig)


def extract_events(rules: RuleSet, records: pl.DataFrame, stats: Stats) -> pl.DataFrame:
    """Apply the rules to a batch of records; counts records that matched no rule."""
    if records.is_empty():
        return empty_events()
    events = rules.apply(records)
    stats.events += events.height
    stats.skip("no_rule_matched", records.height - events.height)
    return events


def diagnose(paths: Iterable[str], options: PipelineOptions | None = None) -> tuple[list[Incident], Stats]:
    """Run every stage once over ``paths`` (files, directories and/or glob patterns).

    Returns the incidents (ordered by first_ts) and the run's stats. Problems with
    individual files end up in ``stats.errors``; a path that does not exist too.

    Raises:
        RuleError: a rule file is broken (names the file, the rule and the reason).
    """
    options = options or PipelineOptions()
    rules = RuleSet.load(options.rule_files)
    watcher = SourceWatcher(list(paths), template=options.template, boot_time=options.boot_time)
    try:
        records = watcher.poll(final=True)
    finally:
        watcher.close()
    stats = watcher.stats
    events = extract_events(rules, records, stats)
    detector = Detector(options.detector)
    detector.process(events.iter_rows(named=True))
    detector.advance(final=True)
    stats.duplicate_events = detector.stats.duplicates
    return [i for i in detector.incidents() if i.status != "superseded"], stats
