"""Tailing through rotation, truncation and restarts: every line is read exactly once, and
no ``(source_id, offset)`` pair names two lines. Real files in tmp_path; time passes only
through the ``now=`` given to each poll."""

from __future__ import annotations

import datetime as dt
import os
import shutil
from pathlib import Path

import duckdb
import polars as pl
import pytest

from ckptwatch.embedded import EmbeddedRunner
from ckptwatch.ingest import identity
from ckptwatch.ingest.checkpoint import CheckpointError, FileCheckpointer, SourceCheckpoint
from ckptwatch.ingest.tail import FileTail
from ckptwatch.ingest.watcher import SourceWatcher

T0 = dt.datetime(2026, 11, 30, 10, 0, tzinfo=dt.timezone.utc)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def lines(tag: str, n: int, start: int = 0) -> str:
    return "".join(f"2026-11-30 10:00:{i % 60:02d},000 INFO {tag} line {i}\n" for i in range(start, start + n))


def append(path: Path, text: str) -> None:
    with path.open("a") as f:
        f.write(text)


def texts(records: pl.DataFrame) -> list[str]:
    return [t.split(" INFO ", 1)[1] for t in records["line"].to_list()]


def assert_no_repeat(records: pl.DataFrame) -> None:
    pairs = list(zip(records["source_id"].to_list(), records["offset"].to_list(), strict=True))
    assert len(pairs) == len(set(pairs)), "a (source_id, offset) pair repeats"


def open_fds(path: Path, *, deleted: bool = False) -> list[str]:
    """Descriptors of this process open on ``path`` (as the kernel names them now), or on a
    file deleted from ``path`` with ``deleted``."""
    want = f"{path} (deleted)" if deleted else str(path)
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == want:
                out.append(fd)
        except OSError:
            continue
    return out


def test_rename_and_create_reads_the_old_file_to_its_end_then_the_new_one(tmp_path):
    log, rotated = tmp_path / "train.log", tmp_path / "train.log.1"
    log.write_text(lines("old", 5))
    w = SourceWatcher([str(log)], flush_after=10)  # the rotated name is not among the paths
    got = [w.poll(now=at(0))]
    (old_id,) = got[0]["source_id"].unique().to_list()
    append(log, lines("old", 2, start=5))  # written just before the rename
    log.rename(rotated)
    log.write_text(lines("new", 3))
    got.append(w.poll(now=at(1)))
    append(rotated, lines("old", 1, start=7))  # the writer has not reopened yet
    got.append(w.poll(now=at(2)))
    assert open_fds(rotated), "the renamed file is still held open while it may grow"
    got.append(w.poll(now=at(13)))  # idle for flush_after seconds: read to the end, then dropped
    assert open_fds(rotated) == []
    records = pl.concat(got)
    assert_no_repeat(records)
    old = records.filter(pl.col("source_id") == old_id)
    new = records.filter(pl.col("source_id") != old_id)
    assert texts(old) == [f"old line {i}" for i in range(8)]
    assert texts(new) == [f"new line {i}" for i in range(3)]
    assert new["offset"].min() == 0 and new["source_id"].n_unique() == 1
    # the dropped file's read offset is kept a few polls (a watched path may hold it after all)
    ckpts = {c.source_id: c.offset for c in w.checkpoints()}
    assert ckpts == {new["source_id"][0]: len(lines("new", 3)),
                     old_id: rotated.stat().st_size}
    for t in range(14, 15 + w.forget_after_polls):
        w.poll(now=at(t))
    assert [c.source_id for c in w.checkpoints()] == new["source_id"].unique().to_list()
    assert w.stats.lines == 11 and w.stats.records == 11 and w.stats.errors == []
    w.close()


def test_copytruncate_gives_the_truncated_file_a_new_id_and_reads_the_copy_from_the_old_offset_under_the_old_id(
        tmp_path):
    log, copy = tmp_path / "train.log", tmp_path / "train.log.1"
    log.write_text(lines("gen1", 5))
    w = SourceWatcher([str(tmp_path / "train.log*")], flush_after=0)
    first = w.poll(now=at(0))
    (orig_id,) = first["source_id"].unique().to_list()
    read_to = log.stat().st_size
    append(log, lines("gen1", 2, start=5))  # after our last read, before the copy
    shutil.copyfile(log, copy)
    os.truncate(log, 0)
    log.write_text(lines("gen1", 1) + lines("gen2", 2, start=1))  # the same first line as before
    second = w.poll(now=at(1))
    records = pl.concat([first, second])
    assert_no_repeat(records)
    from_copy = second.filter(pl.col("file") == str(copy))
    from_log = second.filter(pl.col("file") == str(log))
    assert texts(from_copy) == ["gen1 line 5", "gen1 line 6"]
    assert from_copy["offset"].min() == read_to
    assert texts(from_log) == ["gen1 line 0", "gen2 line 1", "gen2 line 2"]
    assert from_log["offset"].to_list()[0] == 0
    new_id = from_log["source_id"].unique().to_list()
    # the copy goes on under the truncated generation's id: a line has one (source_id, offset)
    # whichever file it is read from (see tests/test_rotation_kill.py)
    assert len(new_id) == 1 and new_id[0] != orig_id and from_copy["source_id"].unique().to_list() == [orig_id]
    append(log, lines("gen2", 1, start=3))
    assert texts(w.poll(now=at(2))) == ["gen2 line 3"]
    assert w.stats.lines == 11
    w.close()


def test_copytruncate_copy_seen_before_the_truncation_is_not_read_twice(tmp_path):
    log, copy = tmp_path / "train.log", tmp_path / "train.log.1"
    log.write_text(lines("gen1", 5))
    w = SourceWatcher([str(tmp_path)], flush_after=0)
    got = [w.poll(now=at(0))]
    append(log, lines("gen1", 2, start=5))
    shutil.copyfile(log, copy)
    got.append(w.poll(now=at(1)))  # logrotate has copied, not truncated yet: the copy waits
    assert got[-1]["file"].unique().to_list() == [str(log)]
    os.truncate(log, 0)
    log.write_text(lines("gen2", 2))
    got.append(w.poll(now=at(2)))
    got.append(w.poll(now=at(3)))
    records = pl.concat(got)
    assert_no_repeat(records)
    assert sorted(texts(records)) == sorted([f"gen1 line {i}" for i in range(7)] + ["gen2 line 0", "gen2 line 1"])
    w.close()


def test_truncated_in_place_and_rewritten_past_the_old_offset_is_read_from_0_under_a_new_id(tmp_path):
    log = tmp_path / "r.log"
    log.write_text(lines("a", 3))
    t = FileTail(str(log), flush_after=0)
    first = t.poll(ingest_ts=at(0))
    old_id, old_offset = t.source_id, t.offset
    with log.open("w") as f:  # ": > r.log", then the writer goes on before our next poll
        f.write(lines("b", 6))
    assert log.stat().st_size > old_offset  # a size check alone would miss it
    second = t.poll(ingest_ts=at(1))
    assert texts(second) == [f"b line {i}" for i in range(6)]
    assert second["offset"][0] == 0 and t.source_id != old_id
    assert [(s.checkpoint.source_id, s.checkpoint.offset) for s in t.superseded] == [(old_id, old_offset)]
    assert_no_repeat(pl.concat([first, second]))
    t.close()


def test_truncated_and_rewritten_with_the_same_first_line_gets_a_new_id(tmp_path):
    log = tmp_path / "r.log"
    banner = "=== worker starting ===\n"
    log.write_text(banner + lines("a", 4))
    t = FileTail(str(log), flush_after=0)
    first = t.poll(ingest_ts=at(0))
    old_id = t.source_id
    log.write_text(banner + lines("b", 1))  # same inode, same first line, shorter
    second = t.poll(ingest_ts=at(1))
    assert t.source_id != old_id and second["offset"].to_list() == [0, len(banner)]
    assert texts(second[1:]) == ["b line 0"]
    assert_no_repeat(pl.concat([first, second]))
    t.close()


def test_deleted_and_recreated_drains_the_old_file_then_reads_the_new_one_from_0(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    log = logs / "rank0.log"
    banner = "=== worker starting ===\n"  # identical first line in both files
    log.write_text(banner + lines("old", 2))
    w = SourceWatcher([str(logs)], flush_after=5)
    got = [w.poll(now=at(0))]
    append(log, lines("old", 1, start=2))
    log.unlink()
    log.write_text(banner + lines("new", 2))
    got.append(w.poll(now=at(1)))
    assert open_fds(log, deleted=True), "the deleted file is held open until it has been idle"
    got.append(w.poll(now=at(10)))
    assert open_fds(log, deleted=True) == []
    records = pl.concat(got)
    assert_no_repeat(records)
    ids = records["source_id"].unique(maintain_order=True).to_list()
    assert len(ids) == 2
    old, new = (records.filter(pl.col("source_id") == i) for i in ids)
    assert old["line"].to_list() == [banner.strip()] + [f"2026-11-30 10:00:0{i},000 INFO old line {i}" for i in range(3)]
    assert new["line"].to_list()[0] == banner.strip() and texts(new[1:]) == ["new line 0", "new line 1"]
    assert new["offset"][0] == 0
    assert len(w.checkpoints()) == 1
    w.close()


def test_a_reused_inode_with_the_same_first_line_gets_a_new_id(tmp_path):
    log = tmp_path / "rank0.log"
    banner = "=== worker starting ===\n"
    log.write_text(banner + lines("old", 2))
    w = SourceWatcher([str(tmp_path)], flush_after=0)
    got = [w.poll(now=at(0))]
    old_inode = log.stat().st_ino
    log.unlink()
    got.append(w.poll(now=at(1)))  # drained and dropped: its descriptor is closed, the inode freed
    log.write_text(banner + lines("new", 1))  # ext4 tends to hand out the freed inode again
    got.append(w.poll(now=at(2)))
    records = pl.concat(got)
    assert_no_repeat(records)
    assert records["source_id"].n_unique() == 2, f"inode reused: {log.stat().st_ino == old_inode}"
    assert texts(got[-1][1:]) == ["new line 0"]
    w.close()


def test_last_line_without_newline_is_not_emitted_nor_committed_across_a_restart(tmp_path):
    log = tmp_path / "r.log"
    ckpt = FileCheckpointer(str(tmp_path / "state" / "ckpt.json"))
    (tmp_path / "state").mkdir()
    log.write_text("2026-11-30 10:00:00,000 INFO a\n2026-11-30 10:00:01,000 INFO b")
    w = SourceWatcher([str(log)], flush_after=0)
    first = w.poll(now=at(0))
    assert first["line"].to_list() == ["2026-11-30 10:00:00,000 INFO a"]
    ckpt.save(w.checkpoints())
    w.close()
    (entry,) = ckpt.load().values()
    assert entry.offset == len("2026-11-30 10:00:00,000 INFO a\n")
    append(log, " continued\n")
    w = SourceWatcher([str(log)], committed=ckpt.load(), flush_after=0)
    second = w.poll(now=at(1))
    assert second["line"].to_list() == ["2026-11-30 10:00:01,000 INFO b continued"]
    assert second["source_id"][0] == first["source_id"][0]
    assert_no_repeat(pl.concat([first, second]))
    w.close()


def test_restart_from_checkpoint_loses_and_repeats_nothing(tmp_path):
    logs = tmp_path / "logs"
    (logs / "a").mkdir(parents=True)
    files = [logs / "a" / "rank0.log", logs / "rank1.log"]
    ckpt = FileCheckpointer(str(tmp_path / "ckpt.json"))
    got = []
    w = SourceWatcher([str(logs)], flush_after=30)
    for step in range(6):
        for k, f in enumerate(files):
            append(f, lines(f"r{k}", 3, start=3 * step))
        records = w.poll(now=at(step))
        if step == 2:  # "kill -9" before these records were durable: they are read again
            w.close()
            w = SourceWatcher([str(logs)], committed=ckpt.load(), flush_after=30)
            continue
        got.append(records)
        ckpt.save(w.checkpoints())
    got.append(w.poll(final=True, now=at(10)))
    w.close()
    records = pl.concat(got)
    assert_no_repeat(records)
    assert sorted(texts(records)) == sorted(f"r{k} line {i}" for k in range(2) for i in range(18))


def test_restart_finds_a_file_renamed_while_down_to_a_name_not_watched(tmp_path):
    log, rotated = tmp_path / "train.log", tmp_path / "train.log.1"
    ckpt = FileCheckpointer(str(tmp_path / "ckpt.json"))
    log.write_text(lines("old", 4))
    w = SourceWatcher([str(log)], flush_after=0)
    first = w.poll(now=at(0))
    ckpt.save(w.checkpoints())
    w.close()
    append(log, lines("old", 2, start=4))  # while we were down
    log.rename(rotated)
    log.write_text(lines("new", 2))
    w = SourceWatcher([str(log)], committed=ckpt.load(), flush_after=0)
    second = w.poll(now=at(1))
    records = pl.concat([first, second])
    assert_no_repeat(records)
    assert sorted(texts(second)) == sorted(["old line 4", "old line 5", "new line 0", "new line 1"])
    assert open_fds(rotated) == []  # read to its end and dropped; its end offset kept a few polls
    assert {c.path: c.offset for c in w.checkpoints()} == {str(log): len(lines("new", 2)),
                                                            str(rotated): len(lines("old", 6))}
    w.close()


@pytest.mark.parametrize("same_first_line", [False, True])
def test_restart_recognizes_a_copytruncate_copy_made_while_down(tmp_path, same_first_line):
    log, copy = tmp_path / "train.log", tmp_path / "train.log.1"
    ckpt = FileCheckpointer(str(tmp_path / "ckpt.json"))
    log.write_text(lines("gen1", 4))
    w = SourceWatcher([str(tmp_path / "train.log*")], flush_after=0)
    first = w.poll(now=at(0))
    ckpt.save(w.checkpoints())
    w.close()
    append(log, lines("gen1", 1, start=4))
    shutil.copyfile(log, copy)
    log.write_text(lines("gen1" if same_first_line else "gen2", 1) + lines("gen2", 1, start=1))
    w = SourceWatcher([str(tmp_path / "train.log*")], committed=ckpt.load(), flush_after=0)
    second = w.poll(now=at(1))
    w.close()
    assert_no_repeat(pl.concat([first, second]))
    assert texts(second.filter(pl.col("file") == str(copy))) == ["gen1 line 4"]
    assert len(second.filter(pl.col("file") == str(log))) == 2


def test_glob_patterns_pick_up_nested_and_new_files_and_exclude_works(tmp_path):
    (tmp_path / "logs" / "j1" / "h1").mkdir(parents=True)
    (tmp_path / "logs" / "j1" / "h1" / "rank0.log").write_text(lines("a", 1))
    (tmp_path / "logs" / "top.log").write_text(lines("b", 1))
    (tmp_path / "logs" / "notes.txt").write_text(lines("c", 1))
    (tmp_path / "logs" / "skip.log").write_text(lines("d", 1))
    w = SourceWatcher([str(tmp_path / "logs" / "**" / "*.log")], exclude=lambda p: p.endswith("skip.log"),
                      flush_after=0)
    assert sorted(texts(w.poll(now=at(0)))) == ["a line 0", "b line 0"]
    (tmp_path / "logs" / "j1" / "h1" / "rank1.log").write_text(lines("e", 1))
    assert texts(w.poll(now=at(1))) == ["e line 0"]
    assert w.stats.files == 3 and w.stats.errors == []
    w.close()


def test_known_unchanged_files_are_not_read_again(tmp_path, monkeypatch):
    log = tmp_path / "r.log"
    log.write_text(lines("a", 3))
    w = SourceWatcher([str(tmp_path)], flush_after=0)
    w.poll(now=at(0))
    calls = []
    real = identity.read_head
    monkeypatch.setattr(identity, "read_head", lambda f, **kw: calls.append(f) or real(f, **kw))
    w.poll(now=at(1))
    w.poll(now=at(2))
    assert calls == []  # stat says nothing changed: no first line read, no id computed
    append(log, lines("a", 1, start=3))
    assert texts(w.poll(now=at(3))) == ["a line 3"]
    assert len(calls) == 1  # grown: one look at the first line (truncated and rewritten?)
    w.close()


def test_a_final_poll_leaves_no_file_open_and_a_later_poll_goes_on(tmp_path):
    logs = [tmp_path / f"rank{i}.log" for i in range(3)]
    for p in logs:
        p.write_text(lines(p.stem, 2))
    w = SourceWatcher([str(tmp_path)], flush_after=0)
    assert len(w.poll(final=True, now=at(0))) == 6
    assert all(open_fds(p) == [] for p in logs)  # diagnose over many files holds none open
    append(logs[0], lines("rank0", 1, start=2))
    assert texts(w.poll(now=at(1))) == ["rank0 line 2"]
    w.close()


def test_unreadable_file_is_reported_once(tmp_path):
    (tmp_path / "core.log").write_bytes(b"\x00\x01binary")
    (tmp_path / "ok.log").write_text(lines("a", 1))
    w = SourceWatcher([str(tmp_path)], flush_after=0)
    for i in range(3):
        w.poll(now=at(i))
    assert w.stats.skipped == {"unreadable_file": 1} and w.stats.files == 2
    assert len(w.stats.errors) == 1 and "core.log: binary data" in w.stats.errors[0]
    w.close()


def test_checkpoint_file_round_trips_atomically(tmp_path):
    ckpt = FileCheckpointer(str(tmp_path / "ckpt.json"))
    assert ckpt.load() == {}
    entries = [SourceCheckpoint("a" * 16, "/l/x.log", 10, "job-1", "f" * 64),
               SourceCheckpoint("b" * 16, "/l/y.log", 0, None, "e" * 64)]
    ckpt.save(entries)
    ckpt.save(entries[:1])
    assert ckpt.load() == {"a" * 16: entries[0]}
    assert os.listdir(tmp_path) == ["ckpt.json"]  # no temporary file left behind


@pytest.mark.parametrize("content, problem", [
    ("{not json", "not valid JSON"),
    ('{"version": 1, "sources": [{"source_id": "x"}]}', "sources[0].path"),
    ('{"version": 1, "sources": [{"source_id": "x", "path": "p", "offset": -1, "job": null, "head_hash": "h"}]}',
     "negative"),
    ('{"version": 7, "sources": []}', "unsupported version"),
    ("[]", "\"sources\" list"),
])
def test_corrupt_checkpoint_file_is_a_clear_error(tmp_path, content, problem):
    path = tmp_path / "ckpt.json"
    path.write_text(content)
    with pytest.raises(CheckpointError) as e:
        FileCheckpointer(str(path)).load()
    assert str(path) in str(e.value) and problem in str(e.value)


def test_checkpoint_file_that_cannot_be_read_or_written_is_a_clear_error(tmp_path):
    (tmp_path / "dir.json").mkdir()
    with pytest.raises(CheckpointError, match="dir.json: cannot read"):
        FileCheckpointer(str(tmp_path / "dir.json")).load()
    with pytest.raises(CheckpointError, match="cannot write"):
        FileCheckpointer(str(tmp_path / "missing" / "ckpt.json")).save([])


def test_embedded_runner_survives_copytruncate_and_restart(tmp_path):
    logs, db = tmp_path / "logs", str(tmp_path / "x.duckdb")
    logs.mkdir()
    log = logs / "rank0.log"

    def saves(start: int, n: int) -> str:
        return "".join(f"2026-11-30 10:00:{i:02d},000 INFO [rank0/1] train: saving checkpoint step {i} to /c/step_{i}\n"
                       f"2026-11-30 10:00:{i:02d},500 INFO [rank0/1] train: saved checkpoint step {i} (0.1s)\n"
                       for i in range(start, start + n))

    log.write_text(saves(0, 3))
    r = EmbeddedRunner(str(logs), db)
    r.cycle(now=at(0))
    append(log, saves(3, 2))
    shutil.copyfile(log, logs / "rank0.log.1")
    os.truncate(log, 0)
    log.write_text(saves(5, 2))
    r.cycle(now=at(1))
    r.close()
    append(log, saves(7, 1))
    r = EmbeddedRunner(str(logs), db)  # restart
    r.cycle(final=True, now=at(2))
    r.close()
    con = duckdb.connect(db)
    steps = sorted(s for (s,) in con.execute("SELECT step FROM events WHERE kind = 'save_start'").fetchall())
    heads = con.execute("SELECT count(*) FROM sources WHERE head_hash IS NOT NULL").fetchone()[0]
    con.close()
    assert steps == list(range(8)) and heads >= 2


def test_checkpoints_keep_an_unfollowed_source_for_a_few_polls_only(tmp_path):
    log = tmp_path / "r.log"
    log.write_text(lines("a", 2))
    w = SourceWatcher([str(log)], flush_after=0, forget_after_polls=2)
    w.poll(now=at(0))
    old_id = w.checkpoints()[0].source_id
    log.write_text(lines("b", 1))  # truncated: the old generation may still show up as a copy
    for i in range(1, 5):
        w.poll(now=at(i))
        kept = old_id in {c.source_id for c in w.checkpoints()}
        assert kept == (i <= 3), i
    w.close()


def test_copytruncate_copy_under_a_name_the_paths_do_not_match_is_read_from_the_old_offset(tmp_path):
    log, copy = tmp_path / "rank0.log", tmp_path / "rank0.log.1"
    log.write_text(lines("gen1", 3))
    w = SourceWatcher([str(tmp_path / "*.log")], flush_after=0)  # the copy's name is not matched
    got = [w.poll(now=at(0))]
    append(log, lines("gen1", 2, start=3))  # after our last read, before the copy
    shutil.copyfile(log, copy)
    os.truncate(log, 0)
    log.write_text(lines("gen2", 2))
    got.append(w.poll(now=at(1)))
    assert texts(got[-1].filter(pl.col("file") == str(copy))) == ["gen1 line 3", "gen1 line 4"]
    assert open_fds(copy) == []  # read to its end and dropped: it may be rewritten at the next rotation
    append(log, lines("gen2", 1, start=2))
    got.append(w.poll(now=at(2)))
    append(log, lines("gen2", 2, start=3))
    inode = copy.stat().st_ino
    shutil.copyfile(log, copy)  # rewritten in place: the same inode as the first copy
    assert copy.stat().st_ino == inode
    os.truncate(log, 0)
    log.write_text(lines("gen3", 1))
    got.append(w.poll(now=at(3)))
    assert texts(got[-1].filter(pl.col("file") == str(copy))) == ["gen2 line 3", "gen2 line 4"]
    got.append(w.poll(now=at(4)))
    records = pl.concat(got)
    assert_no_repeat(records)
    assert sorted(texts(records)) == sorted([f"gen1 line {i}" for i in range(5)] + [f"gen2 line {i}" for i in range(5)]
                                            + ["gen3 line 0"])
    assert w.stats.errors == []
    w.close()


def test_copytruncate_twice_between_two_polls_reads_both_copies_once(tmp_path):
    log, copy1, copy2 = tmp_path / "rank0.log", tmp_path / "rank0.log.1", tmp_path / "rank0.log.2"
    copy2.write_text(lines("archive", 2))  # an old rotation from before we started: not read
    os.utime(copy2, ns=(0, 0))
    log.write_text(lines("gen1", 3))
    w = SourceWatcher([str(tmp_path / "*.log")], flush_after=0)
    got = [w.poll(now=at(0))]
    append(log, lines("gen1", 1, start=3))
    os.utime(log, ns=(10**9, 10**9))  # the mtime our poll sees, older than every copy made since
    got.append(w.poll(now=at(1)))
    for gen, start in (("gen1", 4), ("gen2", 0)):  # logrotate twice, as the collector was blocked
        append(log, lines(gen, 2, start=start))
        if copy1.exists():
            copy2.unlink()
            copy1.rename(copy2)
        shutil.copyfile(log, copy1)
        os.truncate(log, 0)
    log.write_text(lines("gen3", 1))
    got.append(w.poll(now=at(2)))
    got.append(w.poll(now=at(3)))
    records = pl.concat(got)
    assert_no_repeat(records)
    assert sorted(texts(records)) == sorted([f"gen1 line {i}" for i in range(6)] + ["gen2 line 0", "gen2 line 1",
                                                                                    "gen3 line 0"])
    assert open_fds(copy1) == open_fds(copy2) == []
    w.close()


def test_a_file_created_and_renamed_away_between_two_polls_is_read(tmp_path):
    log, rotated, old = tmp_path / "rank0.log", tmp_path / "rank0.log.1", tmp_path / "rank0.log.9"
    old.write_text(lines("archive", 2))  # rotated before we started: not read
    os.utime(old, ns=(0, 0))
    log.write_text(lines("f1", 2))
    w = SourceWatcher([str(tmp_path / "*.log")], flush_after=5)  # rotated names are not matched
    got = [w.poll(now=at(0))]
    append(log, lines("f1", 1, start=2))
    for tag in ("f2", "f3"):  # rename + create twice before the next poll (the collector was blocked)
        log.rename(rotated)  # the second rename replaces f1's name: only our descriptor still reaches it
        log.write_text(lines(tag, 2))
    got.append(w.poll(now=at(1)))
    assert open_fds(rotated), "f2 is followed until idle: the writer may not have reopened yet"
    append(rotated, lines("f2", 1, start=2))
    got.append(w.poll(now=at(2)))
    got.append(w.poll(now=at(10)))
    assert open_fds(rotated) == []
    records = pl.concat(got)
    assert_no_repeat(records)
    assert sorted(texts(records)) == sorted([f"f1 line {i}" for i in range(3)] + [f"f2 line {i}" for i in range(3)]
                                            + ["f3 line 0", "f3 line 1"])
    assert records["source_id"].n_unique() == 3 and w.stats.errors == []
    w.close()


def test_a_file_renamed_between_its_discovery_and_its_opening_is_read(tmp_path, monkeypatch):
    log, rotated = tmp_path / "rank0.log", tmp_path / "rank0.log.1"
    log.write_text(lines("f1", 2))
    w = SourceWatcher([str(tmp_path / "*.log")], flush_after=5)
    got = [w.poll(now=at(0))]
    log.rename(rotated)
    log.write_text(lines("f2", 2))  # the next poll lists f2 at rank0.log ...
    listed = SourceWatcher._discover

    def racing(self):
        found = listed(self)
        append(log, lines("f2", 1, start=2))
        log.rename(rotated)  # ... and before it opens it, f2 is rotated too
        log.write_text(lines("f3", 1))
        monkeypatch.setattr(SourceWatcher, "_discover", listed)
        return found

    monkeypatch.setattr(SourceWatcher, "_discover", racing)
    got.append(w.poll(now=at(1)))
    got.append(w.poll(now=at(2)))
    got.append(w.poll(now=at(10)))
    records = pl.concat(got)
    assert_no_repeat(records)
    assert sorted(texts(records)) == sorted(["f1 line 0", "f1 line 1"] + [f"f2 line {i}" for i in range(3)]
                                            + ["f3 line 0"])
    assert open_fds(rotated) == [] and w.stats.errors == []
    w.close()


@pytest.mark.parametrize("mode", ["rename", "copytruncate"])
def test_rotation_while_a_thread_writes_loses_and_repeats_no_line(tmp_path, mode):
    """In process, the scenario of tests/test_kafka_rotation.py: a glob that matches only the
    live name, 3000 lines written in chunks, rotated at lines 1000 and 2000."""
    import re
    import threading
    import time

    from kafka_support import expected_lines, save_lines

    log = tmp_path / "logs" / "job-rotate" / "rank0.log"
    log.parent.mkdir(parents=True)
    log.write_text("")
    w = SourceWatcher([str(tmp_path / "logs" / "*" / "*.log")])
    lock = threading.Lock()

    def writer():
        f = open(log, "a")
        for first in range(0, 3000, 50):
            with lock:
                if first in (1000, 2000):
                    if mode == "rename":
                        os.rename(log, f"{log}.1")
                        f.close()
                        f = open(log, "a")
                    else:
                        shutil.copyfile(log, f"{log}.1")
                        os.truncate(log, 0)
                f.write(save_lines(first, 50))
                f.flush()
            time.sleep(0.02)
        f.close()

    t = threading.Thread(target=writer)
    t.start()
    got = []
    while t.is_alive():
        got.append(w.poll())
        time.sleep(0.1)
    got.append(w.poll(final=True))
    w.close()
    records = pl.concat(got)
    assert_no_repeat(records)
    kinds = sorted(("save_end" if "save_end" in s else "save_start", int(re.search(r"step=(\d+)", s).group(1)))
                   for s in records["line"].to_list())
    assert kinds == expected_lines(3000)
