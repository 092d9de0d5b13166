"""An incident's dict (``diagnose --json``, the incidents topic, its fingerprint) names every
field of its root cause and evidence: they are built by hand, not with
``dataclasses.asdict`` (too slow for a fleet's updates), so a field added later must be
added there too."""

from __future__ import annotations

import dataclasses
import datetime as dt

from ckptwatch.detectors.incident import EvidenceItem, Incident, RootCause

T = dt.datetime(2026, 11, 30, 10, 0, tzinfo=dt.timezone.utc)


def test_root_cause_and_evidence_dicts_hold_every_field_and_round_trip():
    rc = RootCause("oom_kill", rank=3, host="node-1", pid=4242, ts=T, rule_id="kernel.oom", line="Out of memory",
                   signal="SIGKILL", note="first", sender="agent")
    ev = EvidenceItem("abc", 17, T, "process_exit", 3, "node-1", "torchelastic.exit", "failed (exitcode: -9)",
                      "root_cause")
    as_dict = rc.to_dict()
    assert set(as_dict) == {f.name for f in dataclasses.fields(RootCause)} - {"cls"} | {"class"}
    assert as_dict["class"] == "oom_kill" and as_dict["ts"] == "2026-11-30T10:00:00+00:00"
    assert set(ev.to_dict()) == {f.name for f in dataclasses.fields(EvidenceItem)} - {"ts_source"}  # own time
    inherited = dataclasses.replace(ev, ts_source="inherited")
    assert inherited.to_dict()["ts_source"] == "inherited" and not inherited.own_time and ev.own_time
    assert Incident.from_dict(Incident("interrupted_save", "j", 1, None, rc, [], {}, None, "r", T,
                                       evidence=[inherited]).to_dict()).evidence == [inherited]
    inc = Incident("interrupted_save", "job-a", 40, "/ckpt/step_40", rc, [0, 1], {"shards": 3}, None, "resume",
                   T, evidence=[ev])
    back = Incident.from_dict(inc.to_dict())
    assert back == inc and back.fingerprint() == inc.fingerprint()
