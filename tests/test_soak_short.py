"""Issue 14, the short soak for CI: ``benchmarks/soak.py`` with a fixed seed, one embedded
round and one fleet round (real broker). Each round writes lines (every one an event)
while ``ckptwatch run`` or ``collect | detect | sink`` tail them as subprocesses, and injects
faults picked from the seed: kill -9 of a stage (at random moments and at failpoints),
logrotate in both styles during the writes, a full disk under DuckDB or the collector's
offsets file, alert receivers (real HTTP servers on 127.0.0.1) that are slow, answer 429 or
5xx, or drop the connection. After each round: every line stored once (0 lost, 0
duplicated), the incidents of the fault-free run of the same lines, every alert delivered
(duplicates allowed: delivery is at least once). About a minute on 2 cores, broker start aside.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SEED = 14
LINES = 300


def _soak():
    spec = importlib.util.spec_from_file_location("ckptwatch_soak", ROOT / "benchmarks" / "soak.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


soak = _soak()


def _assert_clean(r) -> None:
    print(soak.HEADER)
    print(soak.row(r))
    assert (r.lost, r.duplicated) == (0, 0), r.notes
    assert r.stored == r.written > 0
    assert r.incidents_equal, r.notes
    assert r.undelivered == 0, r.notes


def test_an_embedded_round_loses_nothing_repeats_nothing_and_finds_the_same_incidents(tmp_path):
    # round 2 of this seed: run killed twice, a copytruncate rotation, a full disk under DuckDB,
    # a receiver dropping connections (make soak runs ten embedded rounds)
    s = soak.Soak(SEED, LINES, tmp_path, broker=None, duration=3.0)
    r = s.round(2, "embedded")
    assert {f.kind for f in r.plan} >= {"kill_run", "rotate_copytruncate", "disk_full_db"}
    _assert_clean(r)


@pytest.mark.kafka
@pytest.mark.slow  # about 2 minutes: `make test-slow` and `make soak` run it; the embedded round stays in CI
def test_a_fleet_round_loses_nothing_repeats_nothing_and_finds_the_same_incidents(kafka_bootstrap, tmp_path):
    # the reference is the fault-free embedded run (same lines): fleet and embedded find the same
    # incidents (README, "equivalence"), and one fleet run less keeps this test short
    s = soak.Soak(SEED, LINES, tmp_path, broker=soak.Broker(bootstrap=kafka_bootstrap), duration=3.0,
                  reference_mode="embedded")
    # round 22 of this seed: the collector killed after publishing and before saving its
    # offsets, a copytruncate and a rename rotation, the sink killed after its write, its
    # DuckDB on a full disk, a webhook that drops connections: the combination that stored
    # lines twice before the copy kept its generation's id (issue 14)
    r = s.round(22, "fleet")
    assert {f.kind for f in r.plan} >= {"failpoint_collect", "failpoint_sink", "rotate_copytruncate",
                                        "rotate_rename", "disk_full_db"}
    _assert_clean(r)
