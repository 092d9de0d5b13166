"""The wire format round-trips exactly, and a foreign message is named, not a traceback."""

from __future__ import annotations

import pytest

from ckptwatch.kafka import codec
from ckptwatch.pipeline import diagnose


def test_events_and_incidents_round_trip(copy_scenario):
    from ckptwatch.ingest.watcher import SourceWatcher
    from ckptwatch.pipeline import extract_events
    from ckptwatch.rules import RuleSet

    logs = copy_scenario("02-sigkill-mid-save")
    w = SourceWatcher([str(logs)])
    events = extract_events(RuleSet.load(()), w.poll(final=True), w.stats)
    w.close()
    values = codec.encode_events(events)
    assert len(values) == events.height == 815
    assert codec.decode_events(values).equals(events)  # ns timestamps, nulls, attrs JSON: all kept
    incidents, _ = diagnose([str(logs)])
    for inc in incidents:
        back = codec.decode_incident(codec.encode_incident(inc))
        assert back.to_dict() == inc.to_dict()


def test_bad_messages_are_skipped_and_named():
    good = b'{"ts": 1, "kind": "save_start", "source_id": "s", "offset": 0, "rule_id": "r", "line": "x"}'
    frame, bad = codec.decode_events_skipping([good, b"true", b'{"kind": "x"}'])
    assert frame.height == 1 and frame["kind"].to_list() == ["save_start"]
    assert [i for i, _ in bad] == [1, 2]
    assert "not a ckptwatch event" in str(bad[0][1]) and "b'true'" in str(bad[0][1])
    assert "needs kind, source_id and ts" in str(bad[1][1])


@pytest.mark.parametrize("value, message", [
    (b"nope", "not JSON: b'nope'"),
    (b'{"id": "x"}', "not a ckptwatch incident: no field 'kind'"),
])
def test_bad_incident_message(value, message):
    with pytest.raises(codec.DecodeError, match=message):
        codec.decode_incident(value)
