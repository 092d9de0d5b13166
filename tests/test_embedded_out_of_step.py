"""``ckptwatch run`` tails rank files that are written out of step: one rank's file read a
poll (or a restart's backlog) ahead of another's. Found by the soak (issue 14, seed 1 round
14): rank 0's saves of steps 1200-1240 were judged by rank 0's newest time while rank 1's
end lines were still unread, and five complete saves were paged as ``stalled_save``, then
withdrawn. ``run`` now judges a job by its low watermark (``[detect] source_idle``) like the
fleet detector."""

from __future__ import annotations

import dataclasses
import datetime as dt

import duckdb

from ckptwatch.detectors import DetectorConfig
from ckptwatch.embedded import EmbeddedRunner
from ckptwatch.ingest.layout import compile_template
from ckptwatch.pipeline import PipelineOptions

T0 = dt.datetime(2026, 11, 30, 11, 0, tzinfo=dt.timezone.utc)


def _save_lines(rank: int, steps: range) -> str:
    out = []
    for i, step in enumerate(steps):
        t = T0 + dt.timedelta(seconds=100 * i)
        for dt_s, what in ((0.0, "save_start"), (2.0, "save_end")):
            stamp = (t + dt.timedelta(seconds=dt_s)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            out.append(f"{stamp} ckptwatch event={what} step={step} rank={rank} world_size=2 "
                       f"path=/ckpt/j/step_{step}")
    return "\n".join(out) + "\n"


def _stalls(source_idle: float | None, tmp_path) -> tuple[list[tuple], list[str]]:
    logs = tmp_path / f"logs-{source_idle}"
    (logs / "j").mkdir(parents=True)
    steps = range(10, 310, 10)
    (logs / "j" / "rank0.log").write_text(_save_lines(0, steps))  # rank 0: the whole run, read first
    (logs / "j" / "rank1.log").write_text(_save_lines(1, steps[:3]))  # rank 1: three saves behind
    options = PipelineOptions(template=compile_template("{job}/rank{rank}.log"),
                              detector=dataclasses.replace(DetectorConfig(), source_idle=source_idle))
    db = str(tmp_path / f"r-{source_idle}.duckdb")
    runner = EmbeddedRunner(str(logs), db, options)
    now = dt.datetime.now(dt.timezone.utc)
    paged: list[str] = []
    try:
        for inc in runner.cycle(now=now):  # a live poll: rank 1 is behind
            paged.append(f"{inc.kind} {inc.step} {inc.status}")
        with open(logs / "j" / "rank1.log", "a") as f:  # rank 1 catches up one poll later
            f.write(_save_lines(1, steps).split("\n", 6)[-1])
        for inc in runner.cycle(now=now + dt.timedelta(seconds=1)):
            paged.append(f"{inc.kind} {inc.step} {inc.status}")
    finally:
        runner.close()
    con = duckdb.connect(db, read_only=True)
    rows = con.execute("SELECT kind, step, status FROM incidents ORDER BY step").fetchall()
    con.close()
    return rows, paged


def test_a_rank_file_read_behind_another_does_not_make_complete_saves_stall(tmp_path):
    rows, paged = _stalls(30.0, tmp_path)
    assert rows == [] and paged == []


def test_without_the_low_watermark_the_same_reads_raise_false_stalls(tmp_path):
    # the defect, kept visible: judged by rank 0's newest time, 26 complete saves stalled
    rows, paged = _stalls(None, tmp_path)
    assert rows and {kind for kind, _, _ in rows} == {"stalled_save"}
    assert all(status == "superseded" for _, _, status in rows)  # withdrawn once rank 1 arrived
    assert any(p.endswith(" open") for p in paged)  # but they were open, and would have paged
