"""Rotation races, reproduced deterministically: logrotate acting between one poll's
directory listing and its ``stat`` calls, or between the listing and the tail reads, and
restarts right after. The property is the events table's: every line is read exactly
once, under one ``(source_id, offset)``. Real files in tmp_path; the race is placed by
running logrotate's steps from inside :func:`ckptwatch.ingest.discovery.discover`, after
it listed the directory."""

from __future__ import annotations

import collections
import shutil
from pathlib import Path

import polars as pl
import pytest

from test_rotation import append, at, lines

from ckptwatch.ingest import discovery
from ckptwatch.ingest.watcher import SourceWatcher


def texts(records: list[pl.DataFrame]) -> collections.Counter[str]:
    frames = [r for r in records if not r.is_empty()]
    got = pl.concat(frames) if frames else pl.DataFrame({"line": []}, schema={"line": pl.Utf8})
    return collections.Counter(t.split(" INFO ", 1)[1] for t in got["line"].to_list())


def expected(*groups: tuple[str, int]) -> collections.Counter[str]:
    return collections.Counter(f"{tag} line {i}" for tag, n in groups for i in range(n))


class AfterListing:
    """Runs ``action`` once, inside the next :func:`discovery.discover`, after the listing."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.action = None
        real = discovery.discover

        def discover(paths, **kw):
            found = real(paths, **kw)
            if self.action is not None:
                action, self.action = self.action, None
                action()
            return found

        monkeypatch.setattr("ckptwatch.ingest.watcher.discovery.discover", discover)


def rotate_shift(log: Path, keep: int, new_text: str) -> None:
    """logrotate's ``rotate keep`` (no copytruncate): drop ``.keep``, shift ``.N -> .N+1``,
    the live file to ``.1``, and create it again."""
    last = log.with_name(f"{log.name}.{keep}")
    if last.exists():
        last.unlink()
    for n in range(keep - 1, 0, -1):
        src = log.with_name(f"{log.name}.{n}")
        if src.exists():
            src.rename(log.with_name(f"{log.name}.{n + 1}"))
    log.rename(log.with_name(f"{log.name}.1"))
    log.write_text(new_text)


def copytruncate(log: Path, new_text: str) -> None:
    shutil.copy2(log, log.with_name(log.name + ".1"))
    with log.open("r+") as f:
        f.truncate(0)
    append(log, new_text)


def restart(w: SourceWatcher, logs: Path) -> SourceWatcher:
    ckpts = {c.source_id: c for c in w.checkpoints()}
    w.close()
    return SourceWatcher([str(logs)], flush_after=2, committed=ckpts)


def test_an_idle_rotated_file_shifted_between_listing_and_stat_is_not_read_again(tmp_path, monkeypatch):
    race = AfterListing(monkeypatch)
    log = tmp_path / "train.log"
    log.write_text(lines("a", 5))
    (tmp_path / "train.log.1").write_text(lines("b", 5))
    (tmp_path / "train.log.2").write_text(lines("c", 5))
    w = SourceWatcher([str(tmp_path)], flush_after=2)
    got = [w.poll(now=at(0))]
    race.action = lambda: rotate_shift(log, 3, lines("d", 3))  # .2 -> .3 unseen by this pass
    got += [w.poll(now=at(10)), w.poll(now=at(11)), w.poll(now=at(30))]
    w = restart(w, tmp_path)
    got += [w.poll(now=at(40)), w.poll(now=at(50))]
    assert texts(got) == expected(("a", 5), ("b", 5), ("c", 5), ("d", 3))


def test_rotate_shift_in_a_final_pass_then_a_restart_reads_nothing_twice(tmp_path, monkeypatch):
    race = AfterListing(monkeypatch)
    log = tmp_path / "train.log"
    log.write_text(lines("a", 4))
    (tmp_path / "train.log.1").write_text(lines("b", 4))
    w = SourceWatcher([str(tmp_path)], flush_after=2)
    got = [w.poll(final=True, now=at(0))]
    race.action = lambda: rotate_shift(log, 4, lines("d", 2))
    got += [w.poll(final=True, now=at(10))]
    w = restart(w, tmp_path)
    got += [w.poll(final=True, now=at(20)), w.poll(final=True, now=at(30))]
    assert texts(got) == expected(("a", 4), ("b", 4), ("d", 2))


def test_a_copytruncate_between_listing_and_poll_reads_the_copy_once_across_a_restart(tmp_path, monkeypatch):
    race = AfterListing(monkeypatch)
    log = tmp_path / "train.log"
    log.write_text(lines("a", 5))
    w = SourceWatcher([str(tmp_path)], flush_after=2)
    got = [w.poll(now=at(0))]
    append(log, lines("a", 2, start=5))  # written after the last read, before the copy
    race.action = lambda: copytruncate(log, lines("b", 3))
    got += [w.poll(now=at(1)), w.poll(now=at(2)), w.poll(now=at(20))]
    w = restart(w, tmp_path)
    got += [w.poll(now=at(30)), w.poll(now=at(40))]
    assert texts(got) == expected(("a", 7), ("b", 3))


def test_a_truncated_generation_and_its_copy_are_not_read_again_after_a_restart(tmp_path):
    log = tmp_path / "train.log"
    log.write_text(lines("a", 5))
    w = SourceWatcher([str(tmp_path)], flush_after=2)
    got = [w.poll(now=at(0))]
    append(log, lines("a", 1, start=5))
    copytruncate(log, lines("b", 2))
    got += [w.poll(now=at(1))]
    w = restart(w, tmp_path)
    got += [w.poll(now=at(2)), w.poll(now=at(20))]
    assert texts(got) == expected(("a", 6), ("b", 2))


def metric_lines(tag: str, n: int, start: int = 0) -> str:
    return "".join(f"2026-11-30 10:00:{i % 60:02d},000 INFO {tag} step={i} loss=0.5\n" for i in range(start, start + n))


def stored_lines(db: Path) -> collections.Counter[str]:
    import duckdb
    con = duckdb.connect(str(db), read_only=True)
    try:
        return collections.Counter(r[0].split(" INFO ", 1)[1] for r in con.execute("SELECT line FROM events").fetchall())
    finally:
        con.close()


def test_embedded_events_table_holds_each_line_once_across_copytruncate_and_restart(tmp_path):
    from ckptwatch.embedded import EmbeddedRunner

    logs, db = tmp_path / "logs", tmp_path / "out.duckdb"
    logs.mkdir()
    log = logs / "train.log"
    log.write_text(metric_lines("a", 5))
    r = EmbeddedRunner(str(logs), str(db))
    r.cycle(now=at(0))  # the last line is held back (it may go on)
    append(log, metric_lines("a", 1, start=5))
    copytruncate(log, metric_lines("b", 2))
    r.cycle(now=at(1))
    r.close()
    r = EmbeddedRunner(str(logs), str(db))
    r.cycle(now=at(2))
    r.cycle(now=at(20))
    r.close()
    want = collections.Counter(f"{t} step={i} loss=0.5" for t, n in (("a", 6), ("b", 2)) for i in range(n))
    assert stored_lines(db) == want


def test_embedded_resumes_only_what_tailing_still_follows(tmp_path):
    """The sources table is the embedded pipeline's checkpoint file: an entry tailing forgot
    (a truncated generation whose copy took over, at the offset it had before the
    truncation) must not be resumed by a restart, or the copy's lines after it come again."""
    from ckptwatch.embedded import EmbeddedRunner

    logs, db = tmp_path / "logs", tmp_path / "out.duckdb"
    logs.mkdir()
    log = logs / "train.log"
    log.write_text(metric_lines("a", 5))
    r = EmbeddedRunner(str(logs), str(db))
    r.cycle(now=at(0))
    append(log, metric_lines("a", 1, start=5))
    copytruncate(log, metric_lines("b", 2))
    for t in range(1, 9):
        r.cycle(now=at(t))
    live = {c.source_id: c.offset for c in r.watcher.checkpoints()}
    assert {sid: off for sid, _f, off, _j, _h in r.store.sources()} == live
    assert sorted(live.values()) == [len(metric_lines("b", 2)), len(metric_lines("a", 6))]
    r.close()


def test_a_copytruncate_right_after_a_read_still_finds_the_copy(tmp_path, monkeypatch):
    """logrotate copies and truncates the file just after a poll read its lines (the
    collector does not take the writer's lock). The bytes read are what the copy must
    match, not the file read again: that reads the new generation, the copy then looks
    foreign and is read from 0 under an id of its own, so every line of the first
    generation arrives twice (a CI run of test_kafka_rotation caught it)."""
    from ckptwatch.ingest import reader

    log = tmp_path / "train.log"
    log.write_text(lines("a", 40))
    real = reader.read_lines
    armed = [True]

    def read_then_rotate(*args, **kw):
        res = real(*args, **kw)
        if armed[0] and res.count:
            armed[0] = False
            copytruncate(log, lines("b", 3))
        return res

    monkeypatch.setattr("ckptwatch.ingest.tail.reader.read_lines", read_then_rotate)
    w = SourceWatcher([str(tmp_path / "*.log")], flush_after=2)
    got = [w.poll(now=at(0)), w.poll(now=at(1)), w.poll(now=at(2)), w.poll(now=at(20))]
    assert texts(got) == expected(("a", 40), ("b", 3))
