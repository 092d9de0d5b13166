"""The last record of a file that stopped growing: out after ``settle_after``, unless it
may go on.

A rank that dies leaves its last line at the end of a file that never grows again, and
that line is usually what the incident needs first. A tail holds a file's last record
back because the next line may continue it; it lets it go once the file has not grown
over two polls ``settle_after`` apart (0.25 s), except a record that may still go on (a
traceback's header or frame, a line ending in ``:``), which waits ``flush_after`` (2 s).
"""

from __future__ import annotations

import datetime as dt

import pytest

from ckptwatch.ingest.tail import FileTail
from ckptwatch.ingest.watcher import SourceWatcher

T0 = dt.datetime(2026, 12, 1, 8, 0, tzinfo=dt.timezone.utc)
KILLED = "[2026-12-01 07:59:59] [rank3] saving checkpoint to /ckpt/step_40\n"


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def lines_of(t: FileTail, seconds: float) -> list[str]:
    return t.poll(ingest_ts=at(seconds))["line"].to_list()


def test_a_dead_ranks_last_line_is_out_after_settle_after_not_flush_after(tmp_path):
    p = tmp_path / "rank3.log"
    p.write_text("[2026-12-01 07:59:58] [rank3] step 39 loss 2.1\n" + KILLED)
    t = FileTail(str(p), flush_after=2.0, settle_after=0.25)
    assert lines_of(t, 0.0) == ["[2026-12-01 07:59:58] [rank3] step 39 loss 2.1"]
    assert lines_of(t, 0.1) == []  # quiet for 0.1 s only: the writer may be mid-write
    assert lines_of(t, 0.3) == [KILLED.rstrip("\n")]
    assert lines_of(t, 5.0) == []  # out once


def test_a_file_that_grew_since_the_last_poll_has_not_settled(tmp_path):
    p = tmp_path / "rank3.log"
    p.write_text("[2026-12-01 07:59:58] [rank3] step 39 loss 2.1\n")
    t = FileTail(str(p), settle_after=0.25)
    assert lines_of(t, 0.0) == []
    with p.open("a") as f:  # a byte came since the last poll: the next line may be on its way
        f.write("  ")
    assert lines_of(t, 1.0) == []
    with p.open("a") as f:
        f.write("File \"train.py\", line 3, in <module>\n")
    assert lines_of(t, 1.1) == []  # the indented line continues the record: still held
    assert lines_of(t, 3.5) == ['[2026-12-01 07:59:58] [rank3] step 39 loss 2.1\n  File "train.py", line 3, in <module>']


@pytest.mark.parametrize("open_ended", [
    "Traceback (most recent call last):",
    '  File "/opt/train.py", line 88, in save',
    "Root Cause (first observed failure):",
    "During handling of the above exception, another exception occurred:",
])
def test_a_record_that_may_go_on_waits_flush_after(tmp_path, open_ended):
    p = tmp_path / "rank3.log"
    p.write_text(KILLED + open_ended + "\n")
    t = FileTail(str(p), flush_after=2.0, settle_after=0.25)
    first = lines_of(t, 0.0) + lines_of(t, 0.5) + lines_of(t, 1.9)
    assert open_ended not in "\n".join(first)
    assert open_ended in "\n".join(lines_of(t, 2.1))


def test_a_traceback_written_between_two_polls_stays_one_record(tmp_path):
    p = tmp_path / "rank3.log"
    p.write_text(KILLED + "Traceback (most recent call last):\n")
    t = FileTail(str(p), flush_after=2.0, settle_after=0.25)
    assert lines_of(t, 0.0) + lines_of(t, 0.5) == [KILLED.rstrip("\n")]
    with p.open("a") as f:
        f.write('  File "/opt/train.py", line 88, in save\n    torch.save(state, path)\n'
                "OSError: [Errno 28] No space left on device\n")
    assert lines_of(t, 1.0) == []  # it grew: not settled yet
    assert lines_of(t, 1.5) == ['Traceback (most recent call last):\n  File "/opt/train.py", line 88, in save\n'
                                "    torch.save(state, path)\nOSError: [Errno 28] No space left on device"]


def test_the_watcher_passes_settle_after_to_its_files(tmp_path):
    (tmp_path / "rank3.log").write_text(KILLED)
    w = SourceWatcher([str(tmp_path)], settle_after=0.5)
    try:
        assert w.poll(now=at(0.0)).height == 0
        assert w.poll(now=at(0.4)).height == 0
        assert w.poll(now=at(0.6))["line"].to_list() == [KILLED.rstrip("\n")]
    finally:
        w.close()
