"""A stop request ends the service loop even when the KeyboardInterrupt the CLI raised for
it was swallowed: CI saw ``Exception ignored in: 'line' … KeyboardInterrupt`` from a
``run`` sent SIGINT, which then ran on until the test's 30 s timeout."""

from __future__ import annotations

import threading

import pytest

from ckptwatch.services.loop import run_steps


def test_a_stop_request_ends_the_loop_between_steps():
    stop = threading.Event()
    calls = []

    def step() -> int:
        calls.append(1)
        if len(calls) == 3:
            stop.set()  # as the signal handler does, its KeyboardInterrupt lost
        return 1

    with pytest.raises(KeyboardInterrupt):
        run_steps([step], interval=0.01, until_idle=2.0, stop=stop)
    assert len(calls) == 3


def test_without_a_stop_request_the_loop_runs_until_idle():
    calls = []
    run_steps([lambda: calls.append(1) or 0], interval=0.01, until_idle=0.05, stop=threading.Event())
    assert len(calls) >= 2
