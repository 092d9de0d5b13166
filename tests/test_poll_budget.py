"""A poll reads a bounded number of bytes over all files (the batch a diagnose or a
backlog holds in memory does not grow with the input), and an idle file costs a poll
nothing but a stat, without losing its held-back last record."""

from __future__ import annotations

import datetime as dt

from ckptwatch.ingest.tail import FileTail
from ckptwatch.ingest.watcher import SourceWatcher
from ckptwatch.pipeline import PipelineOptions, diagnose
from conftest import CORPUS, SCENARIOS, expected, unmatched

T0 = dt.datetime(2026, 11, 30, 10, 0, tzinfo=dt.timezone.utc)


def write_ranks(root, files: int, lines: int) -> int:
    """``files`` rank logs of ``lines`` lines each; returns the bytes written."""
    total = 0
    for r in range(files):
        text = "".join(f"2026-11-30 10:{i // 60 % 60:02d}:{i % 60:02d},000 INFO rank {r} step {i} loss 1.{i:04d}\n"
                       for i in range(lines))
        (root / f"rank{r}.log").write_text(text)
        total += len(text)
    return total


def test_a_poll_reads_about_poll_bytes_and_every_line_once_over_the_polls(tmp_path):
    size = write_ranks(tmp_path, files=40, lines=400)  # ~22 KB a file, ~0.9 MB in all
    w = SourceWatcher([str(tmp_path)], poll_bytes=100_000)
    seen: list[tuple[str, int]] = []
    per_poll: list[int] = []
    while True:
        before = w.bytes_read
        recs = w.poll(final=True)
        per_poll.append(w.bytes_read - before)
        seen += list(zip(recs["file"].to_list(), recs["offset"].to_list(), strict=True))
        if not w.backlog:
            break
    w.close()
    assert w.bytes_read == size
    assert len(seen) == len(set(seen)) == 40 * 400
    # each poll stops at the first file that takes it past the budget: at most one file more
    assert max(per_poll) < 100_000 + size // 40 + 1
    assert len(per_poll) >= size // (100_000 + size // 40)


def test_diagnose_with_a_small_poll_budget_finds_the_same_incidents():
    """Every corpus scenario: the same incidents (kind, job, rank, cause) whether each file is
    read whole in one poll or a few kilobytes at a time over many polls."""
    def found(scenario: str, poll_bytes: int) -> list[dict]:
        return [i.to_dict() for i in diagnose([str(CORPUS / scenario / "logs")],
                                              PipelineOptions(poll_bytes=poll_bytes))[0]]

    def summary(incs: list[dict]) -> list[tuple]:
        return sorted((i["kind"], i["job"], i["step"], str(i["root_cause"]), i["checkpoint_path"]) for i in incs)

    for s in SCENARIOS:
        whole, small = found(s, 0), found(s, 4096)
        assert summary(small) == summary(whole), s
        assert unmatched(expected(s)["incidents"], small) == [], s  # the ground truth, not two equal wrong answers


def test_an_idle_file_keeps_its_held_record_until_it_is_due(tmp_path):
    p = tmp_path / "rank0.log"
    p.write_text("2026-11-30 10:00:00,000 INFO a\n2026-11-30 10:00:01,000 INFO b\n")
    t = FileTail(str(p), flush_after=5.0, settle_after=5.0)  # (a record that cannot go on waits settle_after)
    assert t.poll(ingest_ts=T0)["line"].to_list() == ["2026-11-30 10:00:00,000 INFO a"]  # b held: it may go on
    assert t.poll(ingest_ts=T0 + dt.timedelta(seconds=1)).is_empty()  # unchanged, not due: nothing
    assert t.held.height == 1
    got = t.poll(ingest_ts=T0 + dt.timedelta(seconds=6))  # unchanged, due: flushed
    assert got["line"].to_list() == ["2026-11-30 10:00:01,000 INFO b"]
    assert t.poll(ingest_ts=T0 + dt.timedelta(seconds=7)).is_empty() and t.held.is_empty()
    with p.open("a") as f:  # it grows again: read from where it was
        f.write("2026-11-30 10:00:09,000 INFO c\n")
    assert t.poll(ingest_ts=T0 + dt.timedelta(seconds=8), final=True)["line"].to_list() == [
        "2026-11-30 10:00:09,000 INFO c"]
