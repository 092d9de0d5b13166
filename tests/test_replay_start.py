"""Where a detector member's replay of a partition starts: at the oldest live job, moved
back over released jobs that span it, never forward past a job's first event."""

from __future__ import annotations

import pytest

from ckptwatch.services.replay import ReplayStart, decode_metadata, encode_metadata


def test_the_start_is_the_oldest_live_jobs_first_event():
    r = ReplayStart()
    r.note(["a", "a", "b", None, "b", "a"], [10, 11, 12, 13, 14, 15])
    assert r.start(16) == 10
    r.release(["a"])  # a's events span 10..15; b starts at 12, inside a: a must be replayed whole
    assert r.start(16) == 10
    r.release(["b"])
    assert r.start(16) == 16  # nothing live: nothing to replay
    assert r.released == []


def test_a_released_job_that_straddles_the_start_pulls_it_back_to_its_first_event():
    r = ReplayStart()
    r.note(["old", "old", "live", "old"], [0, 5, 7, 9])
    r.release(["old"])
    assert r.start(10) == 0  # "old" spans 0..9 and live starts at 7
    r.note(["new"], [10])
    r.release(["live"])
    assert r.start(11) == 10


def test_the_start_never_moves_back_and_jobless_events_hold_nothing():
    r = ReplayStart()
    r.note([None, None], [0, 1])
    assert r.start(2) == 2
    r.note(["late"], [1])  # an out-of-order note cannot move the start behind what was committed
    assert r.start(3) == 2


@pytest.mark.parametrize("meta, want", [
    (encode_metadata(42), 42), ("", None), (None, None), ("not json", None), ('{"replay_from": -1}', None),
    ('{"replay_from": true}', None), ("[1]", None), ('{"other": 3}', None),
])
def test_metadata_round_trips_and_anything_else_means_replay_from_the_beginning(meta, want):
    assert decode_metadata(meta) == want


def test_spans_noted_per_job_give_the_start_events_noted_one_by_one_give():
    """The detector notes each batch summed up per job (:meth:`ReplayStart.note_spans`):
    the same spans and start as noting every event."""
    import random

    rnd = random.Random(7)
    one, summed = ReplayStart(), ReplayStart()
    for _ in range(50):
        jobs = [rnd.choice(["a", "b", "c", None]) for _ in range(20)]
        offsets = [rnd.randrange(1000) for _ in range(20)]
        one.note(jobs, offsets)
        spans: dict = {}
        for job, off in zip(jobs, offsets, strict=True):
            lo, hi = spans.get(job, (off, off))
            spans[job] = (min(lo, off), max(hi, off))
        summed.note_spans((job, lo, hi) for job, (lo, hi) in spans.items())
        if rnd.random() < 0.2:
            gone = rnd.choice(["a", "b", "c"])
            one.release([gone])
            summed.release([gone])
        assert one.live == summed.live and one.start(1000) == summed.start(1000)
