"""The embedded pipeline: every stage in one process, joined by plain function calls.

``diagnose`` reads files once and returns incidents; ``run`` (see :mod:`ckptwatch.embedded`)
tails a directory continuously and writes DuckDB. Both use the same stages:
:class:`~ckptwatch.ingest.tail.FileTail` -> :class:`~ckptwatch.rules.RuleSet` ->
:class:`~ckptwatch.detectors.Detector`.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

import polars as pl

from ckptwatch.detectors import Detector, DetectorConfig, Incident
from ckptwatch.ingest import discovery
from ckptwatch.ingest.tail import FileTail, InputError
from ckptwatch.rules import RuleSet
from ckptwatch.schema import empty_events


@dataclass
class Stats:
    """Counters of one pipeline run. ``skipped`` maps reason -> count; ``errors`` are
    human-readable messages naming the file and the problem."""

    files: int = 0
    lines: int = 0
    records: int = 0
    events: int = 0
    duplicate_events: int = 0
    invalid_utf8: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def skip(self, reason: str, n: int = 1) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + n

    def to_dict(self) -> dict[str, object]:
        return {
            "files": self.files, "lines": self.lines, "records": self.records, "events": self.events,
            "duplicate_events": self.duplicate_events, "invalid_utf8": self.invalid_utf8,
            "skipped": dict(sorted(self.skipped.items())), "errors": list(self.errors),
        }


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


def poll_tails(tails: Iterable[FileTail], stats: Stats, *, final: bool,
               now: dt.datetime | None = None) -> pl.DataFrame:
    """Poll every tail once; returns the concatenated records. A file that cannot be read
    is reported in ``stats.errors`` and skipped; the others go on."""
    frames = []
    for t in tails:
        before_lines, before_skip = t.stats.lines, dict(t.stats.skipped)
        before_utf8 = t.stats.invalid_utf8
        try:
            recs = t.poll(final=final, ingest_ts=now)
        except InputError as e:
            stats.errors.append(str(e))
            stats.skip("unreadable_file")
            continue
        stats.lines += t.stats.lines - before_lines
        bad_utf8 = t.stats.invalid_utf8 - before_utf8
        stats.invalid_utf8 += bad_utf8
        if bad_utf8:
            stats.errors.append(f"{t.path}: {bad_utf8} line(s) with invalid UTF-8, read with replacement characters")
        for reason, n in t.stats.skipped.items():
            if n - before_skip.get(reason, 0):
                stats.skip(reason, n - before_skip.get(reason, 0))
                if reason == "line_too_long":
                    stats.errors.append(f"{t.path}: skipped {n - before_skip.get(reason, 0)} line(s) longer than "
                                        f"{t.max_line_bytes} bytes")
        if not recs.is_empty():
            frames.append(recs)
    if not frames:
        return pl.DataFrame()
    records = pl.concat(frames)
    stats.records += records.height
    return records


def extract_events(rules: RuleSet, records: pl.DataFrame, stats: Stats) -> pl.DataFrame:
    """Apply the rules to a batch of records; counts records that matched no rule."""
    if records.is_empty():
        return empty_events()
    events = rules.apply(records)
    stats.events += events.height
    stats.skip("no_rule_matched", records.height - events.height)
    return events


def diagnose(paths: Iterable[str], options: PipelineOptions | None = None) -> tuple[list[Incident], Stats]:
    """Run every stage once over ``paths`` (files and/or directories).

    Returns the incidents (ordered by first_ts) and the run's stats. Problems with
    individual files end up in ``stats.errors``; a path that does not exist too.

    Raises:
        RuleError: a rule file is broken (names the file, the rule and the reason).
    """
    options = options or PipelineOptions()
    rules = RuleSet.load(options.rule_files)
    stats = Stats()
    tails = []
    for found in discovery.discover(paths):
        if found.error:
            stats.errors.append(f"{found.path}: {found.error}")
            continue
        tails.append(FileTail(found.path, template=options.template, boot_time=options.boot_time))
    stats.files = len(tails)
    records = poll_tails(tails, stats, final=True)
    events = extract_events(rules, records, stats)
    detector = Detector(options.detector)
    detector.process(events.iter_rows(named=True))
    detector.advance(final=True)
    stats.duplicate_events = detector.stats.duplicates
    return [i for i in detector.incidents() if i.status != "superseded"], stats
