"""One source's clock, as the job's low watermark and its hosts' own clocks both count it
(``JobState.watermark`` with ``source_idle`` and ``JobState.clock_of`` share one helper): a
file's newest event time moved on by the wall time since its last arrival, nothing once it
has been silent ``source_idle`` seconds or more, and not moved back by an arrival stamped
after ``now``."""

from __future__ import annotations

import datetime as dt

from ckptwatch.detectors.jobstate import JobState

UTC = dt.timezone.utc
T = dt.datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
S = dt.timedelta(seconds=1)


def test_the_low_watermark_and_a_hosts_clock_count_each_source_alike():
    job = JobState("job-a", max_ts=T + 100 * S, last_arrival=T + 100 * S)
    job.sources = {"fast": (T + 100 * S, T + 100 * S),   # current
                   "slow": (T + 40 * S, T + 95 * S),     # 60 s behind, heard from 5 s ago
                   "dead": (T + 10 * S, T + 60 * S),     # silent 40 s: idle past 30 s
                   "ahead": (T + 90 * S, T + 101 * S)}   # arrived after "now" (another clock): not moved back
    now, lateness = T + 100 * S, 2 * S
    assert job.clock_of(["slow"], lateness, now, source_idle=30) == T + 43 * S
    assert job.clock_of(["fast", "slow"], lateness, now, source_idle=30) == T + 98 * S
    assert job.clock_of(["ahead"], lateness, now, source_idle=30) == T + 88 * S
    assert job.clock_of(["dead"], lateness, now, source_idle=30) is None
    assert job.clock_of(["dead"], lateness, now, source_idle=None) == T + 48 * S  # never idle: moved on 40 s
    assert job.clock_of(["dead"], lateness, None, source_idle=30) == T + 8 * S  # no wall time: not moved on
    assert job.clock_of(["unknown"], lateness, now, source_idle=30) is None
    # the low watermark is the job's, held back by the slowest source still read
    assert job.watermark(lateness, now, source_idle=30) == T + 43 * S
    assert job.watermark(lateness, now, source_idle=30) == min(
        job.watermark(lateness, now), *(job.clock_of([s], lateness, now, source_idle=30) for s in ("fast", "slow", "ahead")))
    assert job.watermark(lateness, now) == T + 98 * S
    assert job.watermark(lateness, now + 60 * S, source_idle=30) == T + 158 * S  # all silent 30 s or more: none holds
