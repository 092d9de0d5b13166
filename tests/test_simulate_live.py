"""``ckptwatch simulate --rate``: the fleet's lines appended live in event-time order at a
rate, rotated past a size, with the wall time each failure's first line was written; and a
live ``run`` over it finds every injected failure."""

from __future__ import annotations

import datetime as dt
import json
import signal
import subprocess
import sys
import time

from ckptwatch.simulate import FleetSpec, generate, score
from ckptwatch.simulate_live import write_live
from ckptwatch.sinks.duckdb_store import read_incidents

SPEC = FleetSpec(jobs=4, nodes_per_job=2, ranks_per_node=4, failures=0.5, seed=5, steps=90, save_every=30)


class FakeClock:
    """Time that moves only when slept: the writer's pacing without waiting for it."""

    def __init__(self) -> None:
        self.now, self.slept = 0.0, 0.0

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s
        self.slept += s


def test_live_writes_the_batch_files_bytes_at_the_rate(tmp_path):
    fake = FakeClock()
    live = write_live(tmp_path / "live", SPEC, rate=1000.0, clock=fake.clock, sleep=fake.sleep)
    generate(tmp_path / "batch", SPEC)
    batch_files = sorted(p.relative_to(tmp_path / "batch") for p in (tmp_path / "batch" / "logs").rglob("*.log"))
    live_files = sorted(p.relative_to(tmp_path / "live") for p in (tmp_path / "live" / "logs").rglob("*.log"))
    assert live_files == batch_files and len(batch_files) == 8  # a console per node: 4 jobs x 2
    for rel in batch_files:
        assert (tmp_path / "live" / rel).read_bytes() == (tmp_path / "batch" / rel).read_bytes(), rel
    # paced: the last tick starts lines/rate seconds in (ticks of 50 lines at 1,000 lines/s)
    assert live["lines"] == live["truth"]["lines"] > 1000
    assert abs(fake.slept - (live["lines"] - 1) // 50 * 50 / 1000.0) < 0.06
    failing = {job for job, j in live["truth"]["jobs"].items() if j["failure"]}
    assert set(live["initiated"]) == failing and len(failing) == 2
    assert json.loads((tmp_path / "live" / "live.json").read_text())["initiated"] == live["initiated"]


def test_live_rotates_a_file_past_the_size(tmp_path):
    fake = FakeClock()
    live = write_live(tmp_path, SPEC, rate=2000.0, rotate_bytes=20_000, clock=fake.clock, sleep=fake.sleep)
    rotated = sorted((tmp_path / "logs").rglob("*.log.1"))
    assert live["rotations"] >= len(rotated) > 0
    for old in rotated:  # rotated whole: each ends with a complete line, none past the size by more than a tick
        text = old.read_text()
        assert text.endswith("\n") and 20_000 <= len(text.encode()) < 20_000 + 100 * 400  # 100 lines a tick


def test_a_live_run_finds_what_is_written_live(tmp_path):
    (tmp_path / "logs").mkdir()
    db = tmp_path / "x.duckdb"
    run = subprocess.Popen([sys.executable, "-m", "ckptwatch", "run", "--logs", str(tmp_path / "logs"), "--db",
                            str(db), "--interval", "0.3"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        time.sleep(2.0)
        out = subprocess.run([sys.executable, "-m", "ckptwatch", "simulate", str(tmp_path), "--jobs", "4", "--nodes",
                              "2", "--ranks", "4", "--steps", "90", "--save-every", "30", "--seed", "5", "--rate",
                              "3000"], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert "writing live at 3,000 lines/s" in out.stdout
        time.sleep(15.0)  # the jobs' watermarks pass their saves with wall time
    finally:
        run.send_signal(signal.SIGINT)
        run.wait(timeout=60)
    truth = json.loads((tmp_path / "truth.json").read_text())
    live = json.loads((tmp_path / "live.json").read_text())
    stored = read_incidents(db)
    graded = score(truth, stored)
    assert (graded["injected"], graded["exact"], graded["false"]) == (2, 2, 0), (graded, stored)
    for job, at in live["initiated"].items():  # each incident came after its first line was written
        detected = min(i["detected_ts"] for i in stored if i["job"] == job)
        assert dt.timedelta(0) < detected - dt.datetime.fromisoformat(at) < dt.timedelta(seconds=30)


def test_the_printed_diagnose_command_scores_a_rotated_fleet(tmp_path):
    """Rotation takes away the console's top, where torchrun named the job: the printed
    diagnose command names it by directory, and its diagnosis scores every failure."""
    run = [sys.executable, "-m", "ckptwatch"]
    out = subprocess.run(run + ["simulate", str(tmp_path), "--jobs", "4", "--nodes", "2", "--ranks", "4", "--steps",
                                "90", "--save-every", "30", "--seed", "5", "--rate", "200000", "--rotate-mb", "0.02"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    line = next(x for x in out.stdout.splitlines() if x.startswith("diagnose:"))
    assert "--path-template '{job}/*/*'" in line
    assert json.loads((tmp_path / "live.json").read_text())["rotations"] > 0
    d = subprocess.run(run + ["diagnose", "--json", "--path-template", "{job}/*/*", str(tmp_path / "logs")],
                       capture_output=True, text=True, timeout=120)
    (tmp_path / "d.json").write_text(d.stdout)
    graded = score(json.loads((tmp_path / "truth.json").read_text()), json.loads(d.stdout)["incidents"])
    assert (graded["injected"], graded["exact"], graded["false"]) == (2, 2, 0), graded
