"""``ckptwatch run``: the embedded pipeline, tailing a directory into DuckDB.

Each cycle: discover files (new files included) -> poll every tail -> rules -> store the
events and the sources' committed offsets in one DuckDB transaction -> detector ->
upsert changed incidents -> print them. On start, the detector is rebuilt from the
events already in the database and every tail resumes at its committed offset, so a
restart neither loses nor duplicates a line, and re-running over the same files adds
no row.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from collections.abc import Callable

from ckptwatch.detectors import Detector, Incident
from ckptwatch.ingest import discovery, identity
from ckptwatch.ingest.tail import FileTail
from ckptwatch.pipeline import PipelineOptions, Stats, extract_events, poll_tails
from ckptwatch.rules import RuleSet
from ckptwatch.sinks.duckdb_store import Store


class EmbeddedRunner:
    """One embedded pipeline over ``logs_dir`` writing ``db_path``.

    ``on_incident`` is called with each new or changed incident (the console channel).
    """

    def __init__(self, logs_dir: str, db_path: str, options: PipelineOptions | None = None,
                 on_incident: Callable[[Incident], None] | None = None) -> None:
        self.logs_dir = logs_dir
        self.options = options or PipelineOptions()
        self.rules = RuleSet.load(self.options.rule_files)
        self.store = Store(db_path)
        self.detector = Detector(self.options.detector)
        self.on_incident = on_incident or (lambda inc: None)
        self.stats = Stats()
        self.tails: dict[str, FileTail] = {}
        self._committed = self.store.committed_offsets()
        self._reported_errors: set[str] = set()
        stored = self.store.events()
        if not stored.is_empty():
            self.detector.process(stored.iter_rows(named=True))

    def _discover(self) -> None:
        for found in discovery.discover([self.logs_dir]):
            if found.error:
                self._error(f"{found.path}: {found.error}")
                continue
            if os.path.abspath(found.path) == os.path.abspath(self.store.path):
                continue
            known = self.tails.get(found.path)
            try:
                sid = identity.source_id(found.path, final=False)
            except OSError as e:
                self._error(f"{found.path}: cannot read: {e.strerror or e}")
                continue
            if known is not None and (known.source_id is None or known.source_id == sid):
                continue
            offset, job = self._committed.get(sid, (0, None)) if sid else (0, None)
            tail = FileTail(found.path, template=self.options.template, boot_time=self.options.boot_time,
                            offset=offset, job=job)
            self.tails[found.path] = tail
        self.stats.files = len(self.tails)

    def _error(self, msg: str) -> None:
        if msg not in self._reported_errors:
            self._reported_errors.add(msg)
            self.stats.errors.append(msg)

    def cycle(self, *, final: bool = False, now: dt.datetime | None = None) -> list[Incident]:
        """One pass: read, match, store, detect. Returns the incidents that changed."""
        self._discover()
        tails = list(self.tails.values())
        before = len(self.stats.errors)
        records = poll_tails(tails, self.stats, final=final, now=now)
        for msg in self.stats.errors[before:]:
            self._reported_errors.add(msg)
        events = extract_events(self.rules, records, self.stats)
        offsets = [(t.source_id, t.path, t.committed_offset, t.job) for t in tails if t.source_id]
        self.store.commit_batch(events, offsets)
        if not events.is_empty():
            self.detector.process(events.iter_rows(named=True), now=now)
        changed = self.detector.advance(final=final, now=now)
        if changed:
            self.store.upsert_incidents(changed)
            for inc in changed:
                self.on_incident(inc)
        self.stats.duplicate_events = self.detector.stats.duplicates
        return changed

    def run(self, *, once: bool = False, interval: float = 1.0, max_cycles: int | None = None) -> None:
        """Cycle until interrupted (or once, with everything flushed, for ``--once``).
        The caller owns the store and closes it (:meth:`close`)."""
        if once:
            self.cycle(final=True)
            return
        n = 0
        while max_cycles is None or n < max_cycles:
            self.cycle()
            n += 1
            time.sleep(interval)

    def close(self) -> None:
        self.store.close()
