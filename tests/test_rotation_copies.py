"""A ``copytruncate`` copy is the same lines as the generation it was copied from, so it is
read under that generation's id: each line has one ``(source_id, offset)``, whichever file
it was read from and whatever happened in between. Two ways this failed (soak):

* a collector killed after publishing a batch and before saving its offsets
  (``collect.after_publish``), then ``copytruncate`` before its restart: the copy was
  read from the saved offset under a new id, so the batch was published again under
  other pairs, which the sink stored twice;
* ``copytruncate`` then a ``.1 -> .2`` shift and a rename between two polls: the
  truncation is noticed under the rotated name (``train.log.1``), and the copy
  (``train.log.2``), not a rotated name of that, was read again from 0.

Real files in tmp_path; races placed as in ``tests/test_rotation_races.py``.
"""

from __future__ import annotations

import collections
import os
import shutil
from pathlib import Path

import polars as pl
import pytest
from test_rotation import append, at, lines
from test_rotation_races import AfterListing, expected, metric_lines, stored_lines, texts

from ckptwatch.ingest.watcher import SourceWatcher


def shift(log: Path) -> None:
    """logrotate with ``rotate N``: ``.N -> .N+1``, oldest first."""
    gens = sorted((int(p.name.rsplit(".", 1)[1]) for p in log.parent.glob(log.name + ".*")), reverse=True)
    for g in gens:
        os.rename(f"{log}.{g}", f"{log}.{g + 1}")


def copytruncate(log: Path) -> None:
    """logrotate ``copytruncate``: shift, ``cp log log.1``, ``truncate -s0 log``."""
    shift(log)
    shutil.copyfile(log, f"{log}.1")
    with log.open("r+") as f:
        f.truncate(0)


def rename(log: Path) -> None:
    """logrotate's default: shift, ``mv log log.1``, create ``log`` again."""
    shift(log)
    os.rename(log, f"{log}.1")
    log.touch()


def identities(records: list[pl.DataFrame]) -> dict[str, set[tuple[str, int]]]:
    """Each line read (its text after ``INFO``) -> the ``(source_id, offset)`` pairs it was read under."""
    out: dict[str, set[tuple[str, int]]] = collections.defaultdict(set)
    for r in records:
        for line, sid, off in r.select("line", "source_id", "offset").iter_rows():
            out[line.split(" INFO ", 1)[1]].add((sid, off))
    return out


# --- 1. a kill between publishing and saving the offsets, then copytruncate --------------

@pytest.mark.parametrize("watch", ["dir", "live_name"])
@pytest.mark.parametrize("final", [True, False], ids=["once", "follow"])
def test_lines_read_again_from_a_copy_after_a_kill_keep_their_source_id_and_offset(tmp_path, watch, final):
    log = tmp_path / "train.log"
    log.write_text(lines("a", 50))
    paths = [str(tmp_path)] if watch == "dir" else [str(log)]  # the copy is watched / is not
    w = SourceWatcher(paths, flush_after=2)
    published = [w.poll(final=final, now=at(0))]
    saved = {c.source_id: c for c in w.checkpoints()}  # the collector saved these offsets
    append(log, lines("a", 50, start=50))
    published.append(w.poll(final=final, now=at(1)))  # published, then kill -9: nothing saved
    w.close()
    append(log, lines("a", 5, start=100))  # written after the last read, before the copy
    copytruncate(log)
    append(log, lines("b", 10))
    w = SourceWatcher(paths, flush_after=2, committed=saved)
    published += [w.poll(final=final, now=at(t)) for t in (10, 11, 20, 30)]
    w.close()
    ids = identities(published)
    assert collections.Counter(ids.keys()) == expected(("a", 105), ("b", 10))  # none lost
    assert {line: pairs for line, pairs in ids.items() if len(pairs) > 1} == {}  # one identity each
    pairs = [p for r in published for p in zip(r["source_id"], r["offset"], strict=True)]
    assert len(set(pairs)) == len(ids)  # and no pair names two lines


def test_after_a_restart_an_archive_with_the_same_first_line_is_no_copy_while_the_file_itself_is_there(tmp_path):
    """Only a checkpointed source that no file found claims can have been copied: an older
    rotated file that begins with the same banner is not read as its copy."""
    banner = "2026-11-30 10:00:00,000 INFO banner\n"
    log, old = tmp_path / "train.log", tmp_path / "train.log.1"
    old.write_text(banner + lines("old", 20))  # rotated and read before this collector's time
    log.write_text(banner + lines("a", 5))
    w = SourceWatcher([str(log)], flush_after=2)
    got = [w.poll(final=True, now=at(0))]
    saved = {c.source_id: c for c in w.checkpoints()}
    w.close()
    append(log, lines("a", 2, start=5))
    w = SourceWatcher([str(log)], flush_after=2, committed=saved)
    got += [w.poll(final=True, now=at(t)) for t in (10, 20)]
    w.close()
    assert texts(got) == expected(("a", 7)) + collections.Counter(["banner"])


@pytest.mark.kafka
@pytest.mark.parametrize("saved_before", [True, False], ids=["offsets_saved_before", "first_run"])
def test_collector_killed_after_publish_then_copytruncate_stores_each_line_once(saved_before, kafka_bootstrap,
                                                                              tmp_path):
    """The soak's case, end to end: ``collect`` killed at ``collect.after_publish``,
    ``copytruncate``, ``collect`` again, ``sink``. Without offsets saved before (the
    collector's first run), the source is known from the entry saved before publishing."""
    from kafka_support import (cli_env, expected_lines, finish, fresh_config, killed_at, save_lines,
                               stored_lines as sink_lines, ckptwatch, topic_events)

    from ckptwatch.kafka.admin import ensure_topics

    log = tmp_path / "logs" / "job-ct" / "rank0.log"
    log.parent.mkdir(parents=True)
    cfg = fresh_config(kafka_bootstrap, tmp_path, partitions=1)
    ensure_topics(cfg.kafka)
    env = cli_env(cfg, CKPTWATCH_COLLECT_PATH_TEMPLATE="{job}/rank{rank}.log*")
    collect = ["collect", str(tmp_path / "logs"), "--once"]
    n = 0
    if saved_before:
        log.write_text(save_lines(0, 50))
        n = 50
        finish(ckptwatch(collect, env))
    append(log, save_lines(n, 50))
    n += 50
    killed_at("collect.after_publish", collect, env)  # acknowledged by the broker, offsets not saved
    copytruncate(log)
    append(log, save_lines(n, 10))
    n += 10
    finish(ckptwatch(collect, env))
    finish(ckptwatch(["sink", "--until-idle", "2"], env))
    assert sink_lines(cfg.sink.db) == expected_lines(n)
    per_line = collections.defaultdict(set)
    for e in topic_events(kafka_bootstrap, cfg.kafka.events_topic):
        per_line[e["line"]].add((e["source_id"], e["offset"]))
    assert len(per_line) == n and all(len(p) == 1 for p in per_line.values())


# --- 2. copytruncate, then a shift and a rename, between two polls ----------------------

SEQUENCES = {
    "copytruncate,rename": [copytruncate, rename],
    "copytruncate,copytruncate": [copytruncate, copytruncate],
    "copytruncate,rename,copytruncate": [copytruncate, rename, copytruncate],
}


@pytest.mark.parametrize("ops", SEQUENCES.values(), ids=SEQUENCES.keys())
def test_embedded_stores_each_line_once_when_a_copy_is_shifted_and_the_log_renamed_between_polls(tmp_path, ops):
    from ckptwatch.embedded import EmbeddedRunner

    logs, db = tmp_path / "logs", tmp_path / "out.duckdb"
    logs.mkdir()
    log = logs / "train.log"
    log.write_text(metric_lines("a", 50))
    r = EmbeddedRunner(str(logs), str(db))
    r.cycle(now=at(0))  # the pipeline has read lines 0..49 (the last one held back)
    n = 50
    for op in ops:  # no poll in between
        op(log)
        append(log, metric_lines("a", 10, start=n))
        n += 10
    r.cycle(now=at(1))
    r.close()
    r = EmbeddedRunner(str(logs), str(db))  # and nothing again after a restart
    for t in (2, 3, 20):
        r.cycle(now=at(t))
    r.cycle(final=True, now=at(30))
    r.close()
    assert stored_lines(db) == collections.Counter(f"a step={i} loss=0.5" for i in range(n))


@pytest.mark.parametrize("watch", ["dir", "live_and_first_rotation"])
def test_copytruncate_then_rename_after_the_listing_reads_the_copy_from_the_old_offset_once(tmp_path, monkeypatch,
                                                                                            watch):
    race = AfterListing(monkeypatch)
    log = tmp_path / "train.log"
    log.write_text(lines("a", 5))
    paths = [str(tmp_path)] if watch == "dir" else [str(log), f"{log}.1"]  # train.log.2 is not watched
    w = SourceWatcher(paths, flush_after=2)
    got = [w.poll(now=at(0))]
    append(log, lines("a", 2, start=5))  # after the last read, before the copy: read from the copy only

    def logrotate():
        copytruncate(log)
        append(log, lines("b", 3))
        rename(log)  # the truncated file is train.log.1 now, its copy train.log.2
        append(log, lines("c", 2))

    race.action = logrotate
    got += [w.poll(now=at(t)) for t in (1, 2, 20, 30)]
    assert texts(got) == expected(("a", 7), ("b", 3), ("c", 2))
    ckpts = {c.source_id: c for c in w.checkpoints()}
    w.close()
    w = SourceWatcher(paths, flush_after=2, committed=ckpts)  # and nothing again after a restart
    assert texts([w.poll(now=at(t)) for t in (40, 50)]) == collections.Counter()
    w.close()
