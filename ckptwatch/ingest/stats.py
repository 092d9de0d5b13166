"""Counters of one pipeline run, shared by every stage: ingest counts files, lines,
records, invalid UTF-8 and skipped input; the rules count events; the detector counts
duplicate events. ``errors`` are human-readable messages naming the file and the problem."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Stats:
    """Counters of one pipeline run. ``skipped`` maps reason -> count; ``lines_by_kind``
    maps source kind (console, worker, kernel, log) -> lines read, summing to ``lines``;
    ``errors`` are human-readable messages naming the file and the problem."""

    files: int = 0
    lines: int = 0
    records: int = 0
    events: int = 0
    duplicate_events: int = 0
    invalid_utf8: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    #: records kept but adjusted, by reason: ``timestamp_out_of_range`` (a stamp before 1970
    #: or more than a day ahead, not believed), ``year_from_mtime`` (a year-less stamp dated
    #: with its file's mtime year: no dated line of its job or host was read),
    #: ``kernel_uptime_without_boot_time`` (``[ 8812.23]`` stamps with no ``--boot-time``)
    notes: dict[str, int] = field(default_factory=dict)
    lines_by_kind: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    #: compressed rotated logs found and not read (a live tail leaves them: it read their lines before)
    archives_left: list[str] = field(default_factory=list)
    #: events of a job's own kinds that carry no job, and per job those that carry no rank
    #: (neither rank nor local rank), with a few of their files: see :meth:`label_warnings`
    no_job: int = 0
    #: the job those events are judged as (:func:`ckptwatch.pipeline.unlabelled_job`)
    unlabelled_job: str = "unknown"
    #: they were folded into the one job the other lines name (``unlabelled_job`` is that job)
    unlabelled_folded: bool = False
    #: saves seen to start and not to finish, with no failure, at the end of a one-shot read: (job, step, path)
    open_saves: list[tuple[str, int, str | None]] = field(default_factory=list)
    no_rank: dict[str, int] = field(default_factory=dict)
    unlabelled_files: dict[str, list[str]] = field(default_factory=dict)

    def skip(self, reason: str, n: int = 1) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + n

    def note(self, reason: str, n: int = 1) -> None:
        if n:
            self.notes[reason] = self.notes.get(reason, 0) + n

    def add_lines(self, source_kind: str, n: int) -> None:
        """Count ``n`` lines read from a source of ``source_kind``."""
        if n:
            self.lines += n
            self.lines_by_kind[source_kind] = self.lines_by_kind.get(source_kind, 0) + n

    def label_warnings(self) -> list[str]:
        """One line per labelling gap, with the count and what would fix it."""
        return list(self.label_warning_items().values())

    def label_warning_items(self) -> dict[str, str]:
        """:meth:`label_warnings` by a key that stays the same as the counts grow (``kernel``,
        ``no-job``, ``no-rank:<job>``), for saying each once in a live run."""
        out: dict[str, str] = {}
        if self.notes.get("kernel_uptime_without_boot_time"):
            out["kernel"] = (f"{self.notes['kernel_uptime_without_boot_time']} kernel line(s) dated in seconds since boot "
                       "were given the time of the lines around them: pass the host's boot time with --boot-time "
                       "(e.g. from `uptime -s`), or log with `dmesg -T` / journalctl")
        if self.open_saves:
            shown = "; ".join(f"{_step_words(st)} of job {job}" + (f" ({p})" if p else "")
                              for job, st, p in self.open_saves[:3])
            more = f" and {len(self.open_saves) - 3} more" if len(self.open_saves) > 3 else ""
            out["open-saves"] = (f"{len(self.open_saves)} save(s) started and were not seen to finish before the logs "
                                 f"end, with no failure seen: {shown}{more}. If the job was still running, that is "
                                 "expected; if its logs stop there, treat those checkpoints as incomplete "
                                 "(`ckptwatch verify` tells)")
        if self.archives_left:
            n, some = len(self.archives_left), ", ".join(self.archives_left[:3])
            out["archives"] = (f"{n} compressed log(s) not read (e.g. {some}): `run` follows live logs and leaves "
                               "rotated archives alone (it read their lines before they were compressed); "
                               "`ckptwatch diagnose` reads them, or decompress them into the watched directory")
        if self.no_job and self.files > 1:  # one file or a paste is one job by necessity
            files = ", ".join(self.unlabelled_files.get("", [])[:3])
            why = "the one job the other lines name" if self.unlabelled_folded else "the directory's name"
            out["no-job"] = (f"{self.no_job} event(s) carry no job (e.g. in {files}): they are judged together as job "
                       f"'{self.unlabelled_job}' ({why}); name the job with --job NAME (one run), "
                       "or with --path-template, e.g. '{job}/rank{rank}.log' or "
                       "'{job}/{host}/*.log' (a directory named after the job, read through a template), or "
                       "log torchrun's launch configuration (LOGLEVEL=INFO prints its run_id)")
        for job, n in sorted(self.no_rank.items()):
            files = ", ".join(self.unlabelled_files.get(job, [])[:3])
            out[f"no-rank:{job}"] = (f"job {job}: {n} save/failure event(s) carry no rank (e.g. in {files}): blame and shard "
                       "checks need one; label the files with --path-template '.../rank{rank}.log', or log with "
                       "torchrun --tee 3 / srun --label (a single-process job is rank 0 and needs nothing)")
        return out

    def to_dict(self) -> dict[str, object]:
        return {
            "files": self.files, "lines": self.lines, "records": self.records, "events": self.events,
            "duplicate_events": self.duplicate_events, "invalid_utf8": self.invalid_utf8,
            "skipped": dict(sorted(self.skipped.items())), "notes": dict(sorted(self.notes.items())),
            # the saves the logs end inside are a section of the report of their own (open_saves)
            "errors": list(self.errors),
            "warnings": [m for k, m in self.label_warning_items().items() if k != "open-saves"],
            "open_saves": [{"job": job, "step": None if st < 0 else st, "path": p} for job, st, p in self.open_saves],
        }


def _step_words(step: int) -> str:
    """``step 40``, or for a save whose step the log does not show (a negative key), so."""
    return f"step {step}" if step >= 0 else "a save whose step is not in the logs"
