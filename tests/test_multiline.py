"""Multiline grouping and console demultiplexing, on real corpus text."""

from __future__ import annotations

import polars as pl

from ckptwatch.ingest.multiline import group_lines
from ckptwatch.ingest.tail import FileTail
from conftest import CORPUS


def _lines(texts, stream="s"):
    return pl.DataFrame({"stream_key": [stream] * len(texts), "offset": list(range(len(texts))), "line": texts})


def test_traceback_with_dcp_rank_subtracebacks_is_one_record():
    texts = [
        "2026-11-30 10:23:28,837 INFO [rank0/4] train: loading checkpoint from /c/step_0000040",
        "Traceback (most recent call last):",
        '  File "/x/state_dict_loader.py", line 183, in load',
        "    _load_state_dict(",
        "torch.distributed.checkpoint.api.CheckpointException: CheckpointException ranks:dict_keys([0, 1])",
        "Traceback (most recent call last): (RANK 0)",
        '  File "/x/utils.py", line 193, in reduce_scatter',
        "AssertionError: metadata is None",
        "",
        "During handling of the above exception, another exception occurred:",
        "",
        "Traceback (most recent call last):",
        "RuntimeError: boom",
        "2026-11-30 10:23:29,000 INFO [rank0/4] train: next",
    ]
    recs, held = group_lines(_lines(texts), final=True)
    assert recs["line"].str.split("\n").list.len().to_list() == [1, 10, 1]
    assert recs["offset"].to_list() == [0, 1, 13]
    assert held.is_empty()


def test_torchrun_failure_entries_are_one_record_each():
    path = CORPUS / "02-sigkill-mid-save/logs/attempt-1-train/console.log"
    recs = FileTail(str(path)).poll(final=True)
    entries = recs.filter(pl.col("line").str.contains("exitcode  :"))["line"].to_list()
    assert len(entries) == 4
    assert entries[-1].startswith("Root Cause (first observed failure):\n[0]:\n  time      : 2026-11-30_10:21:21")
    assert entries[0].startswith("Failures:\n[1]:")


def test_last_record_is_held_back_until_final():
    recs, held = group_lines(_lines(["Traceback (most recent call last):", '  File "a.py", line 1']), final=False)
    assert recs.is_empty() and held.height == 2


def test_console_prefixes_are_demultiplexed_per_rank(tmp_path):
    p = tmp_path / "console.log"
    p.write_text(
        "[default0]:[rank0]: Traceback (most recent call last):\n"
        "[default1]:2026-11-30 10:00:00,000 INFO [rank1/2] train: step 1 | loss 0.5\n"
        "[default0]:[rank0]:   File \"t.py\", line 3, in <module>\n"
        "[default0]:[rank0]: RuntimeError: boom\n"
    )
    recs = FileTail(str(p)).poll(final=True)
    assert recs.select("rank", "local_rank").rows() == [(0, 0), (1, 1)]
    assert recs["line"][0] == 'Traceback (most recent call last):\n  File "t.py", line 3, in <module>\nRuntimeError: boom'
    assert recs["source_kind"][0] == "console"
