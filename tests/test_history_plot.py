"""The per-rank timeline of an incident (ckptwatch.history.timeline) and its pictures
(ckptwatch.history.plot, `ckptwatch incidents plot`): on the corpus's 4-rank jobs, as an
old database holds them, and on a simulated 64-rank job on 8 hosts."""

from __future__ import annotations

import datetime as dt
import gzip
import json
import re
import shutil
import struct
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ckptwatch import cli
from ckptwatch.history import queries
from ckptwatch.history.read import open_history
from ckptwatch.history.timeline import Lane, build_timeline

V1 = Path(__file__).parent / "fixtures" / "history" / "schema-v1.duckdb.gz"
UTC = dt.timezone.utc


@pytest.fixture(scope="module")
def v1_db(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("plot") / "old.duckdb"
    with gzip.open(V1) as src, open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return str(path)


def timeline_of(db: str, job: str, kind: str = "interrupted_save"):
    with open_history(db) as (con, _):
        frame = queries.list_incidents(con, job=job, kind=kind)
        inc, _ = queries.load_incident(con, frame["id"][0])
        return build_timeline(con, inc)


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


def test_a_sigkill_mid_save_timeline(v1_db):
    tl = timeline_of(v1_db, "job-0201-sigkill")
    assert [lane.label for lane in tl.lanes] == ["job / launcher", "rank 0", "rank 1", "rank 2", "rank 3"]
    assert tl.hosts == ["vm"]
    bars = {(b.lane.rank, b.step): b for b in tl.bars}
    assert sorted(bars) == [(r, s) for r in range(4) for s in (20, 40)]
    assert all(bars[r, 20].outcome == "saved" and bars[r, 20].last_good for r in range(4))
    assert all(bars[r, 40].outcome == "cut" and not bars[r, 40].last_good for r in range(4))
    # rank 2 was killed at 10:21:21.702: its save ends there, at the initiating failure
    assert bars[2, 40].end == dt.datetime(2026, 11, 30, 10, 21, 21, 702000, tzinfo=UTC)
    root = [m for m in tl.marks if m.role == "root_cause"]
    assert [(m.lane.rank, m.kind, m.approx) for m in root] == [(2, "process_exit", False)]
    assert root[0].file == "/tmp/fx/logs/02-sigkill-mid-save/logs/attempt-1-train/console.log"
    assert {m.lane.rank for m in tl.marks if m.role == "collateral"} == {0, 1, 2, 3}
    assert tl.last_good_outside is None


def test_a_collective_timeout_marks_the_silent_rank_and_ends_saves_at_real_times(v1_db):
    tl = timeline_of(v1_db, "job-0301-timeout")
    root = [m for m in tl.marks if m.role == "root_cause"]
    # rank 1 logged nothing of its own: the mark is put on its lane, at the time the detector gave, flagged approximate
    assert [(m.lane, m.kind, m.approx) for m in root] == [(Lane("vm", 1), "collective_timeout", True)]
    bars = {(b.lane.rank, b.step): b for b in tl.bars}
    # the others' timeout reports carry an inherited time (their save's start): their saves
    # end at their exits 20 s later, not at that inherited time
    for r in (0, 2, 3):
        assert bars[r, 40].outcome == "cut"
        assert bars[r, 40].end == dt.datetime(2026, 11, 30, 10, 23, 17, tzinfo=UTC), r
    assert bars[1, 40].end > bars[0, 40].end
    assert any(m.approx and m.kind == "collective_timeout" and m.role == "context" for m in tl.marks)


def test_plot_png_svg_and_a_self_contained_html(v1_db, tmp_path):
    with open_history(v1_db) as (con, _):
        iid = queries.list_incidents(con, job="job-0201-sigkill", kind="interrupted_save")["id"][0]
    out = {kind: tmp_path / f"t.{kind}" for kind in ("png", "svg", "html")}
    for path in out.values():
        res = CliRunner().invoke(cli.app, ["incidents", "plot", iid[:6], "--db", v1_db, "--out", str(path)])
        assert res.exit_code == 0, res.output
        assert res.stdout.strip() == (f"{path}: interrupted_save of job job-0201-sigkill, 4 ranks on 1 host, "
                                      "8 save bars, 21 events")
    width, height = png_size(out["png"])
    assert width > 1200 and 400 < height < 900
    page = out["html"].read_text()
    assert page.count("<svg") == 1 and "root cause   signal (SIGKILL) on rank 2" in page
    assert '<tr class="root_cause">' in page and "console.log" in page
    # nothing fetched: no script, no external stylesheet, image or font (the SVG namespace is a name, not a fetch)
    assert "<script" not in page and not re.search(r"""(src|href)\s*=\s*["']?https?:|url\(\s*["']?https?:""", page)
    assert out["svg"].read_text().startswith("<svg")
    bad = CliRunner().invoke(cli.app, ["incidents", "plot", iid, "--db", v1_db, "--out", str(tmp_path / "t.jpg")])
    assert bad.exit_code == 2 and "name a .png, .svg or .html file" in bad.stderr


def test_a_64_rank_job_on_8_hosts(tmp_path):
    """A simulated fleet job of 8 nodes x 8 ranks with a failure injected mid-save: a lane
    per rank, grouped by host in order, the injected rank marked, a taller picture."""
    runner = CliRunner()
    sim = tmp_path / "sim"
    assert runner.invoke(cli.app, ["simulate", str(sim), "--jobs", "1", "--nodes", "8", "--ranks", "8",
                                   "--failures", "1", "--kind", "sigkill", "--layout", "rank-files",
                                   "--seed", "3"]).exit_code == 0
    truth = json.loads((sim / "truth.json").read_text())
    (job, spec), = truth["jobs"].items()
    want = spec["incidents"][0]
    db = str(tmp_path / "sim.duckdb")
    res = runner.invoke(cli.app, ["run", "--logs", str(sim / "logs"), "--db", db, "--once",
                                  "--path-template", truth["template"]])
    assert res.exit_code == 0, res.output
    tl = timeline_of(db, job, want["kind"])
    ranks = [lane for lane in tl.lanes if lane.rank is not None]
    assert [lane.rank for lane in ranks] == list(range(64))
    assert len(tl.hosts) == 8 and all(
        [lane.rank for lane in ranks if lane.host == h] == list(range(8 * i, 8 * i + 8)) for i, h in enumerate(tl.hosts))
    root = [m for m in tl.marks if m.role == "root_cause"]
    assert [m.lane.rank for m in root] == [want["root_rank"]]
    assert sum(1 for b in tl.bars if b.last_good) == 64  # every rank's part of the last good save
    png = tmp_path / "64.png"
    with open_history(db) as (con, _):
        iid = queries.list_incidents(con, job=job, kind=want["kind"])["id"][0]
    assert runner.invoke(cli.app, ["incidents", "plot", iid, "--db", db, "--out", str(png)]).exit_code == 0
    width, height = png_size(png)
    assert height > 2000  # fixed lane height: 64 lanes make a tall picture, not a squeezed one
