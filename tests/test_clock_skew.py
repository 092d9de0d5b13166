"""Clock skew between a job's hosts never pages a healthy save (issue 35, item 12).

Each host stamps its lines with its own clock. A host whose clock is ahead by as much as
its lines are read behind (a collector catching up, a time-ordered merge of the hosts'
logs; and the simulator's live writer, which appended lines in stamp order) looked current
to the job's low watermark, and its ranks' part of a save seemed missing once the watermark
was ``settle`` past the save's first start, stamped by another host's clock: a healthy save
paged as ``partial_checkpoint`` whenever two hosts were more than ~35 s apart, then
withdrawn. A missing rank is now judged late by its own host's clock
(:mod:`ckptwatch.detectors.own_clock`), and the simulator writes (and publishes) lines in
the order they were written, with skewed stamps (``simulate --skew-ms``)."""

from __future__ import annotations

import bisect
import dataclasses
import datetime as dt
import json
import re
import subprocess
import sys

import pytest

from ckptwatch.detectors import Detector, DetectorConfig
from ckptwatch.rules import RuleSet
from ckptwatch.simulate import FleetSpec, failure_written, generate, score
from ckptwatch.simulate_kafka import fleet_events, initiating_rows
from ckptwatch.simulate_live import write_live

#: each host's clock off by up to 150 s either way: two hosts of a job up to 5 minutes apart
SKEW_MS = 150_000
SECOND = dt.timedelta(seconds=1)


def spec(seed: int, failures: float, **kw) -> FleetSpec:
    return FleetSpec(jobs=2, nodes_per_job=2, ranks_per_node=2, steps=120, save_every=40, failures=failures,
                     seed=seed, skew_ms=SKEW_MS, **kw)


def spreads(truth: dict) -> list[float]:
    """Per job, how far apart its hosts' clocks are (s)."""
    return [(max(j["skew_ms"].values()) - min(j["skew_ms"].values())) / 1000 for j in truth["jobs"].values()]


def fed_in_stamp_order(tmp_path, fleet: FleetSpec) -> tuple[dict, set[tuple], Detector]:
    """The fleet's events given to a detector (low watermark, as ``run`` and the fleet use)
    second by second of event time, as a reader merging the hosts' logs by their stamps (or
    catching up on the hosts whose clocks are ahead) delivers them; wall time runs with the
    stamps. Returns the truth, the (job, kind, step) of every incident ever reported open
    and not provisional (a page), and the detector."""
    truth = generate(tmp_path, fleet)
    events, _ = fleet_events(tmp_path / "logs", None, RuleSet.load())  # by event time: stamp order
    times = events["ts"].to_list()
    d = Detector(dataclasses.replace(DetectorConfig(), source_idle=30.0))
    paged: set[tuple] = set()
    t, i = times[0], 0
    while t < times[-1] + dt.timedelta(seconds=90):
        t += SECOND
        j = bisect.bisect_left(times, t)
        d.process_frame(events.slice(i, j - i), now=t)
        i = j
        paged |= {(inc.job, inc.kind, inc.step) for inc in d.advance(now=t)
                  if inc.status == "open" and not inc.provisional}
    return truth, paged, d


def test_hosts_minutes_apart_read_in_stamp_order_page_no_healthy_save(tmp_path):
    truth, paged, d = fed_in_stamp_order(tmp_path, spec(seed=1, failures=0.0))
    assert all(120 <= s <= 300 for s in spreads(truth)), spreads(truth)  # 2 to 5 minutes apart
    # before: the complete saves of steps 40 and 80 of both jobs paged as partial_checkpoint, then withdrawn
    assert paged == set()
    assert d.incidents() == []


def test_a_failure_between_hosts_minutes_apart_is_still_found_with_its_rank(tmp_path):
    truth, paged, d = fed_in_stamp_order(tmp_path, spec(seed=3, failures=1.0))
    assert all(120 <= s <= 300 for s in spreads(truth)), spreads(truth)
    got = [i.to_dict() for i in d.incidents() if i.status != "superseded"]
    graded = score(truth, got)
    assert (graded["injected"], graded["exact"], graded["false"]) == (2, 2, 0), (graded, got)
    # the victim on the host behind in one job and on the host ahead in the other
    victims = {j: (v["failure"]["kind"], v["skew_ms"][v["failure"]["host"]] == max(v["skew_ms"].values()))
               for j, v in truth["jobs"].items()}
    assert sorted(victims.values()) == [("enospc", True), ("oom", False)]
    # nothing else was ever paged (before: the healthy save of step 40 too)
    assert paged == {(job, i["kind"], i["step"]) for job, v in truth["jobs"].items() for i in v["incidents"]}


def stamp(line: str) -> dt.datetime:
    """The time a Megatron line of the simulated console is stamped with."""
    found = re.search(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3})\]", line)
    assert found, line
    return dt.datetime.fromisoformat(found[1])


def test_the_live_writer_writes_lines_when_they_were_written_not_by_their_stamps(tmp_path):
    """Every rank begins a save together: their start lines go out together, stamped minutes
    apart (the writer used to append in stamp order, holding the hosts ahead back)."""
    fleet = FleetSpec(jobs=1, nodes_per_job=2, ranks_per_node=2, steps=120, save_every=40, failures=0.0, seed=1,
                      skew_ms=SKEW_MS)
    logs = tmp_path / "logs"
    order: list[tuple[str, str]] = []  # (host, line) in the order written: one line a tick at 20 lines/s
    seen: dict = {}
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s
        for f in sorted(logs.rglob("*.log")):
            text = f.read_text()
            order.extend((f.parent.name, line) for line in text[seen.get(f, 0):].splitlines())
            seen[f] = len(text)

    live = write_live(tmp_path, fleet, rate=20.0, clock=lambda: now[0], sleep=sleep)
    sleep(0.0)
    (job,) = live["truth"]["jobs"].values()
    assert spreads(live["truth"])[0] >= 120
    assert len(order) == live["lines"]
    for step in (40, 80, 120):
        at = [n for n, (_, line) in enumerate(order) if f"saving checkpoint at iteration {step:8d}" in line]
        stamps = sorted(stamp(order[n][1]) for n in at)
        assert len(at) == 4 and at[-1] - at[0] <= 6, (step, at)  # written together ...
        assert (stamps[-1] - stamps[0]).total_seconds() >= 120  # ... stamped minutes apart
        written = {stamp(order[n][1]) - dt.timedelta(milliseconds=job["skew_ms"][order[n][0]]) for n in at}
        assert max(written) - min(written) < dt.timedelta(milliseconds=20)  # the stamps less each host's offset


def test_the_kafka_publisher_sends_events_when_their_lines_were_written(tmp_path):
    truth = generate(tmp_path, spec(seed=3, failures=1.0))
    events, _ = fleet_events(tmp_path / "logs", None, RuleSet.load(), truth)
    assert events["written"].is_sorted()
    for job in truth["jobs"]:
        starts = events.with_row_index("n").filter((events["job"] == job) & (events["kind"] == "save_start")
                                                   & (events["step"] == 40))
        assert starts.height == 4 and starts["n"].max() - starts["n"].min() <= 6  # sent together
        assert (starts["ts"].max() - starts["ts"].min()).total_seconds() >= 120  # stamped minutes apart
    first = initiating_rows(events, {job: failure_written(j) for job, j in truth["jobs"].items()}, time="written")
    for n, job in first.items():  # each failure's first event is its victim host's, at its first line
        row = events.row(n, named=True)
        host = truth["jobs"][job]["failure"]["host"]
        assert row["written"] >= failure_written(truth["jobs"][job])
        assert row["ts"] - row["written"] == dt.timedelta(milliseconds=truth["jobs"][job]["skew_ms"][host])


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ckptwatch", *args], capture_output=True, text=True, timeout=120)


def test_simulate_takes_the_skew_and_records_each_hosts_offset(tmp_path):
    r = cli("simulate", str(tmp_path), "--jobs", "2", "--nodes", "3", "--ranks", "1", "--failures", "0",
            "--skew-ms", "150000")
    assert r.returncode == 0, r.stderr
    truth = json.loads((tmp_path / "truth.json").read_text())
    assert truth["spec"]["skew_ms"] == SKEW_MS
    for job, j in truth["jobs"].items():
        assert len(j["skew_ms"]) == 3 and all(abs(ms) <= SKEW_MS for ms in j["skew_ms"].values())
        for host, ms in j["skew_ms"].items():  # the agent starts together on every host, stamped by its clock
            first = (tmp_path / "logs" / job / host / "console.log").read_text().split(" ", 2)[1]
            begun = spec(1, 0.0).start + dt.timedelta(seconds=7 * int(job[-4:]), milliseconds=ms)
            assert first == begun.strftime("%H:%M:%S.%f")


@pytest.mark.parametrize("value", ["-1", "86400001"])
def test_a_skew_out_of_range_is_one_line_and_exit_2(tmp_path, value):
    r = cli("simulate", str(tmp_path / "x"), "--skew-ms", value)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip() == f"error: skew_ms must be between 0 and 86400000 (a day), not {value}"
    assert not (tmp_path / "x").exists()


def test_a_live_run_over_a_fleet_written_live_with_skew_pages_only_the_failure(tmp_path):
    """The issue's setting, embedded: ``simulate --rate --skew-ms`` written live into a
    directory a ``run`` tails (in process, wall time simulated): hosts 2-5 minutes apart."""
    from ckptwatch.embedded import EmbeddedRunner
    from ckptwatch.pipeline import PipelineOptions

    (tmp_path / "logs").mkdir()
    options = PipelineOptions(detector=dataclasses.replace(DetectorConfig(), source_idle=30.0))
    runner = EmbeddedRunner(str(tmp_path / "logs"), str(tmp_path / "x.duckdb"), options)
    base = dt.datetime.now(dt.timezone.utc)
    now, cycled = [0.0], [0.0]
    paged: set[tuple] = set()

    def cycle() -> None:
        cycled[0] = now[0]
        for inc in runner.cycle(now=base + dt.timedelta(seconds=now[0])):
            if inc.status == "open" and not inc.provisional:
                paged.add((inc.job, inc.kind, inc.step))

    def sleep(s: float) -> None:  # a poll every 0.5 s of the writer's time
        now[0] += s
        if now[0] - cycled[0] >= 0.5:
            cycle()

    try:
        live = write_live(tmp_path, spec(seed=38, failures=0.5), rate=50.0, clock=lambda: now[0], sleep=sleep)
        for _ in range(30):  # the watermarks pass the last lines with wall time
            sleep(2.0)
    finally:
        runner.close()
    truth = live["truth"]
    assert all(120 <= s <= 300 for s in spreads(truth)), spreads(truth)
    from ckptwatch.sinks.duckdb_store import read_incidents

    stored = [i for i in read_incidents(tmp_path / "x.duckdb") if i["status"] != "superseded"]
    graded = score(truth, stored)
    assert (graded["injected"], graded["exact"], graded["false"]) == (1, 1, 0), (graded, stored)
    assert paged == {(job, i["kind"], i["step"]) for job, v in truth["jobs"].items() for i in v["incidents"]}


def _hung_rank_paged_after(skew_s: float, layout: str) -> int | None:
    """Seconds from the start of the save of step 40 to the ``partial_checkpoint`` page, when
    rank 3 (host b, clock ``skew_s`` off host a's) hangs in it and the others finish and go
    on; lines fed as they are written, a second at a time (None: never paged)."""
    t0 = dt.datetime(2026, 11, 30, 10, 0, tzinfo=dt.timezone.utc)
    offsets = iter(range(10**6))

    def ev(kind: str, at: float, rank: int, step: int) -> dict:
        off = next(offsets)
        source = f"rank{rank}" if layout == "rank-files" else f"console-{'ab'[rank // 2]}"
        return {"ts": t0 + dt.timedelta(seconds=at + (skew_s if rank >= 2 else 0.0)), "ts_source": "line",
                "job": "j", "host": "ab"[rank // 2], "rank": rank, "local_rank": rank % 2, "pid": 100 + rank,
                "kind": kind, "step": step, "path": f"/c/step_{step}" if kind != "metric" else None,
                "rule_id": f"test.{kind}", "attrs": "{}", "source_id": source, "source_kind": "log", "offset": off,
                "line": f"{kind} {rank} {step}", "dedup_key": f"k{off}"}

    d = Detector(dataclasses.replace(DetectorConfig(), source_idle=30.0))
    for sec in range(120):
        batch = []
        for rank in range(4):
            if rank == 3 and sec > 40:
                continue  # hung in the save
            batch.append(ev("metric", sec, rank, sec))
            if sec in (20, 40):
                batch.append(ev("save_start", sec + 0.1, rank, sec))
                if (rank, sec) != (3, 40):
                    batch.append(ev("save_end", sec + 0.5, rank, sec))
        now = t0 + dt.timedelta(seconds=sec + 1)
        d.process(batch, now=now)
        if any(i.kind == "partial_checkpoint" and i.status == "open" for i in d.advance(now=now)):
            (inc,) = [i for i in d.incidents() if i.kind == "partial_checkpoint"]
            assert (inc.step, inc.checkpoint_state["started_not_finished"]) == (40, [3])
            return sec + 1 - 40
    return None


@pytest.mark.parametrize("layout", ["console", "rank-files"])
def test_a_rank_hung_in_a_save_on_a_skewed_host_is_paged_as_soon_as_without_skew(layout):
    unskewed = _hung_rank_paged_after(0.0, layout)
    assert unskewed is not None and unskewed <= 40  # settle (30 s) + lateness (5 s), a poll or two
    for skew_s in (150.0, -150.0):  # host b 2.5 minutes ahead, and behind
        assert _hung_rank_paged_after(skew_s, layout) == unskewed


def test_a_rank_that_keeps_logging_but_never_reaches_the_save_is_reported_at_the_stall_deadline():
    """Its own clock never says it is late (its lines keep coming, none past the save's step):
    it is not waited for past ``stall_after``."""
    t0 = dt.datetime(2026, 11, 30, 10, 0, tzinfo=dt.timezone.utc)
    offsets = iter(range(10**6))

    def ev(kind: str, at: float, rank: int, step: int) -> dict:
        off = next(offsets)
        return {"ts": t0 + dt.timedelta(seconds=at), "ts_source": "line", "job": "j", "host": "h", "rank": rank,
                "local_rank": rank, "pid": 100 + rank, "kind": kind, "step": step,
                "path": f"/c/step_{step}" if kind != "metric" else None, "rule_id": f"test.{kind}", "attrs": "{}",
                "source_id": f"rank{rank}", "source_kind": "log", "offset": off, "line": f"{kind} {rank} {step}",
                "dedup_key": f"k{off}"}

    d = Detector(dataclasses.replace(DetectorConfig(), source_idle=30.0))
    d.process([ev(kind, 1.0, r, 20) for r in range(3) for kind in ("save_start", "save_end")], now=t0)
    d.process([ev(kind, 10.0, r, 40) for r in range(2) for kind in ("save_start", "save_end")], now=t0)
    paged_at = None
    for sec in range(20, 2000, 10):
        now = t0 + dt.timedelta(seconds=sec)
        d.process([ev("metric", sec, 0, 40 + sec), ev("metric", sec, 1, 40 + sec), ev("metric", sec, 2, 5)], now=now)
        if paged_at is None and any(i.kind == "partial_checkpoint" for i in d.advance(now=now)):
            paged_at = sec
    assert paged_at is not None and 1800 <= paged_at - 10 <= 1800 + 5 + 10  # stall_after past its start
