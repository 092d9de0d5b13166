"""A poison message on the events topic stops nothing (issue 35, items 9 and 14).

Before: a tombstone raised ``AttributeError`` in the codec, a 0-byte value ``ShapeError`` in
the detector, ``attrs`` that is not JSON ``JSONDecodeError`` (detector) and a DuckDB
``Conversion Error`` (sink), ``offset: null`` a ``NOT NULL constraint`` (sink) and a
``TypeError`` (detector); every member and the sink exited, and again on each restart.
Events at int64 max or before 1970 were stored and judged. Now each field is checked where
it is decoded: what is bad is skipped, counted, said in one line naming topic, partition,
offset and field, and kept in the dead-letter topic; the good events of the partition, also
those after the bad ones, are stored and paged."""

from __future__ import annotations

import dataclasses
import json

import duckdb
import polars as pl
import pytest
from alert_support import sent
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka_support import failing_save, fresh_config, step_until, topic_messages

from ckptwatch.config import AlertSettings
from ckptwatch.detectors.incident import Incident
from ckptwatch.ingest.layout import compile_template
from ckptwatch.kafka import codec, dead_letters
from ckptwatch.kafka.admin import dead_letter_topic, ensure_topics
from ckptwatch.kafka.producer import Message, Publisher
from ckptwatch.rules import RuleSet
from ckptwatch.schema import EVENT_SCHEMA
from ckptwatch.services.collect import Collector
from ckptwatch.services.detect import DetectorMember
from ckptwatch.services.sink import SinkMember
from ckptwatch.sinks.alerts.setup import alerter_from_config
from ckptwatch.sinks.duckdb_store import Store
from ckptwatch.sinks.metrics import Metrics

T0 = 1_764_489_600_000_000_000  # 2025-11-30T08:00:00Z in ns
GOOD = {"ts": T0, "kind": "metric", "job": "job-z", "source_id": "src-z", "offset": 0, "rule_id": "r",
        "line": "step 1 loss 2.0", "attrs": '{"loss": 2.0}', "step": 1}


def ndjson(**changes) -> bytes:
    return json.dumps({**GOOD, **changes}).encode()


def arrow(*rows: dict) -> bytes:
    """One Arrow events message of ``rows`` (GOOD with changes; ``ts`` in ns)."""
    frame = pl.DataFrame([{**{c: None for c in EVENT_SCHEMA}, **GOOD, **r} for r in rows],
                         schema={**EVENT_SCHEMA, "ts": pl.Int64})
    frame = frame.with_columns(pl.from_epoch("ts", time_unit="ns").dt.replace_time_zone("UTC"))
    ((_, value),) = codec.encode_event_batches(frame, [b"job-z"] * frame.height)
    return value


#: each shape of the issue, as one message: (value, the words of its line)
SHAPES = {
    "tombstone": (None, "a tombstone (no value)"),
    "0-byte value": (b"", "an empty value (0 bytes)"),
    "attrs not JSON": (ndjson(attrs="not json"), "field attrs: not a JSON object"),
    "attrs not JSON, Arrow": (arrow({"attrs": "{loss: 2"}), "field attrs: not a JSON object"),
    "offset null": (ndjson(offset=None), "field offset: missing"),
    "offset null, Arrow": (arrow({"offset": None}), "field offset: missing"),
    "time at int64 max": (ndjson(ts=2**63 - 1), "field ts: 9223372036854775807 ns since the epoch is not a time"),
    "time negative, Arrow": (arrow({"ts": -1}), "field ts: -1 ns since the epoch is not a time"),
    "time after 2200": (ndjson(ts=codec.TS_END_NS), "is not a time from 1970 to 2200"),
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_each_bad_shape_is_left_out_named_and_the_next_message_decoded(shape):
    value, words = SHAPES[shape]
    frame, bad, counts = codec.decode_events_skipping([value, ndjson(offset=7), arrow({"offset": 8})])
    assert frame["offset"].to_list() == [7, 8] and counts == [0, 1, 1]
    ((i, e),) = bad
    assert i == 0 and words in str(e) and e.kept == 0
    with pytest.raises(codec.DecodeError) as strict:
        codec.decode_events([value])
    assert words in str(strict.value)


def test_a_batch_keeps_its_good_events_and_names_the_first_bad_one():
    value = arrow({"offset": 1}, {"offset": 2, "ts": -5}, {"offset": 3, "attrs": "[1]"}, {"offset": 4})
    frame, ((i, e),), counts = codec.decode_events_skipping([ndjson(offset=0), value, ndjson(offset=5)])
    assert frame["offset"].to_list() == [0, 1, 4, 5] and counts == [1, 2, 1]
    assert (i, e.kept) == (1, 2)
    assert str(e).startswith("2 of 4 event(s) rejected; event 1 (source_id 'src-z', offset 2): field ts: -5 ns")
    blank_lines = ndjson(offset=9) + b"\n\n" + ndjson(offset=10) + b"\n"  # counted by events, not newlines
    assert codec.decode_events_skipping([blank_lines, ndjson(offset=11)])[2] == [2, 1]


def test_attrs_pattern_takes_what_the_rules_write_and_nothing_duckdb_or_the_detectors_refuse():
    con = duckdb.connect()
    con.execute("CREATE TABLE t (a JSON)")

    def takes(text: str) -> bool:
        return pl.Series([text]).str.contains(codec.ATTRS_PATTERN)[0]

    def duckdb_takes(text: str) -> bool:
        try:
            con.execute("INSERT INTO t VALUES (?)", [text])
            return True
        except duckdb.Error:
            return False

    scalar = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(),
                       st.text(st.characters(exclude_categories=["Cs"]), max_size=5))
    noise = st.text(st.sampled_from(list('{}[]":,\\ \nu0d8c.eE-NaInfty\x00\x1f')), max_size=3)

    @settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.dictionaries(st.text(max_size=4).filter(lambda k: k.encode("utf-8", "ignore").decode() == k), scalar,
                           max_size=3), st.booleans(), st.integers(0, 60), noise, st.integers(0, 2))
    def check(attrs, ascii_only, at, insert, cut):
        text = json.dumps(attrs, ensure_ascii=ascii_only)
        assert takes(text) and duckdb_takes(text)  # every object of scalars Python's json writes
        text = text[:at] + insert + text[at + cut:]
        if takes(text):  # a mutation taken is still an object of scalars both read
            doc = json.loads(text)
            assert isinstance(doc, dict) and not any(isinstance(v, (dict, list)) for v in doc.values())
            assert duckdb_takes(text)

    check()
    for text in ('{"a": "\\ud800"}', '{"a": {"b": 1}}', '{"a": [1]}', '{"a": nan}', '{"a": 1,}', '"s"', "", "{} x"):
        assert not takes(text), text


def test_an_incident_or_save_fact_message_is_checked_field_by_field():
    from alert_support import sigkill_incident

    good = sigkill_incident().to_dict()
    assert codec.decode_incident(json.dumps(good).encode()).id == good["id"]
    for value, words in [
        (None, "a tombstone"),
        (json.dumps({**good, "step": 2**70}).encode(), "field step"),
        (json.dumps({**good, "first_ts": "2026-11-30T10:00:00"}).encode(), "field first_ts"),  # not UTC
        (json.dumps({**good, "collateral": ["x"]}).encode(), "field collateral"),
        (json.dumps({**good, "evidence": [{**good["evidence"][0], "offset": None}]}).encode(), "evidence[0].offset"),
    ]:
        with pytest.raises(codec.DecodeError, match=words.replace("[", r"\[")):
            codec.decode_incident(value)
    with pytest.raises(codec.DecodeError, match="tombstone"):
        codec.decode_save_fact(None)
    assert isinstance(codec.decode_incident(codec.encode_incident(Incident.from_dict(good))), Incident)


def test_detector_and_sink_skip_count_report_and_keep_every_bad_shape_and_page_what_follows(
        kafka_bootstrap, tmp_path, httpserver):
    cfg = fresh_config(kafka_bootstrap, tmp_path, partitions=1)
    cfg = dataclasses.replace(cfg, collect=dataclasses.replace(cfg.collect, paths=[str(tmp_path / "logs")]))
    ensure_topics(cfg.kafka)
    topic = cfg.kafka.events_topic
    mixed = arrow({"offset": 1}, {"offset": 2, "ts": -1}, {"offset": 3, "attrs": "{oops"})
    bad = [v for v, _ in SHAPES.values()] + [mixed]  # offsets 0..9, then job-a's failing save
    pub = Publisher(cfg.kafka, client_id="test-poison")
    try:  # and a tombstone on the incidents topic, which every detector reads back
        pub.publish([Message(topic, b"job-z", v) for v in bad] + [Message(cfg.kafka.incidents_topic, b"gone", None)])
    finally:
        pub.close()
    (tmp_path / "logs" / "job-a").mkdir(parents=True)
    for name, text in failing_save("job-a").items():
        (tmp_path / "logs" / "job-a" / name).write_text(text)
    collector = Collector(cfg, rules=RuleSet.load(), template=compile_template("{job}/rank{rank}.log"))
    collector.step(final=True)
    collector.close()

    metrics, notes = Metrics(), []
    member = DetectorMember(cfg, on_message=notes.append, poll_timeout=0.2, metrics=metrics)  # raised before
    try:
        step_until(member, lambda m: m.joined and m.stats.events >= 9)
        member.finish()
    finally:
        member.close()
    assert member.stats.events == 9 and member.stats.bad_messages == len(bad)  # 8 of job-a, 1 of the mixed batch
    published = [codec.decode_incident(m.value) for m in topic_messages(kafka_bootstrap, cfg.kafka.incidents_topic)
                 if m.value is not None]
    assert [(i.job, i.kind, i.step) for i in published] == [("job-a", "storage_failure_during_save", 30)]
    for offset, (shape, (_, words)) in enumerate(SHAPES.items()):
        assert [n for n in notes if n.startswith(f"{topic} partition 0 offset {offset}: skipped: ") and words in n], shape
    assert f"{topic} partition 0 offset 9: skipped: 2 of 3 event(s) rejected; event 1 " in "\n".join(notes)

    httpserver.expect_request("/hook").respond_with_data("ok")
    store = Store(cfg.sink.db)
    alerter = alerter_from_config(AlertSettings(channels={"hook": {"type": "webhook", "url": httpserver.url_for("/hook")}}),
                                  store, db_path=cfg.sink.db)
    said: list[str] = []
    sink = SinkMember(cfg, store, alerter=alerter, poll_timeout=0.2, on_message=said.append, metrics=metrics)
    try:
        step_until(sink, lambda m: sent(httpserver, "/hook"))
        stored = sorted(store.con.execute('SELECT source_id, "offset" FROM events').fetchall())
        incidents = store.con.execute("SELECT job, kind, step FROM incidents").fetchall()
    finally:
        sink.close()
        store.close()
    assert len(stored) == 9 and ("src-z", 1) in stored and not any(o in (2, 3) for s, o in stored if s == "src-z")
    assert incidents == [("job-a", "storage_failure_during_save", 30)]
    assert [(p["action"], p["incident"]["job"]) for p in sent(httpserver, "/hook")] == [("trigger", "job-a")]
    assert sink.stats.bad_messages == len(bad) + 1
    dlq = dead_letter_topic(cfg.kafka)
    assert f"{cfg.kafka.incidents_topic} partition 0 offset 0: skipped: a tombstone (no value), not an incident; " \
           f"kept in {dlq}" in said
    assert all(n.endswith(f"; kept in {dlq}") for n in said if "skipped" in n)
    # one Metrics for both, as in run --kafka: the 10 events-topic messages both skipped count once,
    # plus the incidents topic's tombstone the sink skipped
    assert 'ckptwatch_records_skipped_total{reason="bad_message"} 11.0' in metrics.exposition()

    kept = topic_messages(kafka_bootstrap, dlq)
    headers = [dict(m.headers) for m in kept]
    where = sorted((h[dead_letters.TOPIC_HEADER].decode(), int(h[dead_letters.OFFSET_HEADER])) for h in headers)
    assert where == sorted([(topic, o) for o in range(10)] + [(cfg.kafka.incidents_topic, 0)])
    by_offset = {int(dict(m.headers)[dead_letters.OFFSET_HEADER]): m for m in kept
                 if dict(m.headers)[dead_letters.TOPIC_HEADER] == topic.encode()}
    assert by_offset[0].value is None and by_offset[1].value == b"" and by_offset[9].value == mixed
    assert b"field offset: missing" in dict(by_offset[4].headers)[dead_letters.ERROR_HEADER]
    assert {h[dead_letters.GROUP_HEADER] for h in headers} == {cfg.sink.group.encode()}


DEEP = b"[" * 100_000  # deeper than Python's stack: json raised RecursionError, not ValueError


@pytest.mark.parametrize("decode", [codec.decode_incident, codec.decode_save_fact, codec.decode_floors,
                                    codec.decode_sources], ids=lambda f: f.__name__)
def test_json_nested_deeper_than_the_stack_is_a_bad_message_not_a_crash(decode):
    """Found by the second attack round: 100,000 ``[`` as an incident, a save fact, or a
    floors or sources header made every detector and the sink exit 1 with RecursionError,
    again on every restart."""
    with pytest.raises(codec.DecodeError):
        decode(DEEP)
    from ckptwatch.services.notification_mirror import decode_state
    with pytest.raises(codec.DecodeError):
        decode_state(DEEP)
    events, bad, counts = codec.decode_events_skipping([DEEP, arrow({"offset": 7})])
    assert [i for i, _ in bad] == [0] and events["offset"].to_list() == [7] and counts == [0, 1]


def test_a_fanout_header_naming_no_partition_stores_its_copy_and_says_so(kafka_bootstrap, tmp_path):
    """Found by the second attack round: ``ckptwatch-fanout: -1`` on a valid event left it
    unstored without a word (every copy waited for a partition -1 that does not exist)."""
    cfg = fresh_config(kafka_bootstrap, tmp_path, partitions=2)
    ensure_topics(cfg.kafka)
    topic = cfg.kafka.events_topic
    shapes = [(b"-1", 20), (b"99", 21), (b"abc", 22), (b"0", 23), (b"1", 24)]  # 24: partition 1's copy is stored
    pub = Publisher(cfg.kafka, client_id="test-fanout")
    try:
        pub.publish([Message(topic, b"node7", ndjson(offset=o, source_id="host-src"), partition=0,
                             headers=((codec.FANOUT_HEADER, v),)) for v, o in shapes])
    finally:
        pub.close()
    store, said = Store(cfg.sink.db), []
    sink = SinkMember(cfg, store, poll_timeout=0.2, on_message=said.append)
    try:
        step_until(sink, lambda m: m.stats.events_received >= 4)
        stored = [o for (o,) in store.con.execute('SELECT "offset" FROM events ORDER BY 1').fetchall()]
    finally:
        sink.close()
        store.close()
    assert stored == [20, 21, 22, 23]
    assert [n.split(": ", 1)[1] for n in said if "names no partition" in n] == [
        f"header {codec.FANOUT_HEADER} {v!r} names no partition of the topic; this copy is stored"
        for v in (b"-1", b"99", b"abc")]


def test_the_third_attack_rounds_shapes_are_bad_messages_not_crash_loops():
    """Each of these passed the codec and then stopped a detector or the sink on every
    restart (OverflowError, AttributeError, DuckDB's surrogate refusal, TypeError), or broke
    ``incidents show``, exports and the console later (RecursionError, a float command)."""
    from alert_support import sigkill_incident

    good = sigkill_incident().to_dict()
    deep: object = {"x": 1}
    for _ in range(700):
        deep = {"d": deep}
    for value, words in [
        ({**good, "remediation": "a\ud800"}, "lone surrogate"),
        ({**good, "root_cause": {**good["root_cause"], "line": "x\udfff"}}, "lone surrogate"),
        ({**good, "checkpoint_state": deep}, "nested deeper than 32"),
        ({**good, "commands": [{"purpose": "p", "command": "c", "framework": [[[[1]]]], "source": 1e308}]},
         r"commands\[0\]"),
    ]:
        with pytest.raises(codec.DecodeError, match=words):
            codec.decode_incident(json.dumps(value).encode())
    fact = {"job": "j", "step": 40, "path": "/ckpt/j/iter_0000040", "complete": True,
            "first_ts": "2026-12-07T18:27:17+00:00", "world_size": 4, "losses": [], "missing": []}
    assert codec.decode_save_fact(json.dumps(fact).encode()).step == 40
    for change in ({"step": 1e400}, {"step": -1e400}, {"world_size": 1e400}, {"missing": [1e400]},
                   {"world_size": 2**70}, {"path": 123}, {"path": ["a"]},
                   {"losses": [["2026-12-07T18:27:17+00:00", 1e400, 1.0]]}):
        with pytest.raises(codec.DecodeError):
            codec.decode_save_fact(json.dumps({**fact, **change}).encode())
    for decode in (codec.decode_floors, codec.decode_sources):  # a header without a value
        with pytest.raises(codec.DecodeError):
            decode(None)


def test_the_fourth_attack_rounds_shapes_are_bad_messages_not_crash_loops():
    """Each passed the codec and stopped the sink (or the detector) on every restart, or was
    stored and broke ``incidents show``, plots, the console and alert channels."""
    import struct

    import pyarrow as pa
    import pyarrow.ipc as ipc

    from alert_support import sigkill_incident

    good = sigkill_incident().to_dict()
    for change, words in [
        ({"id": "c" * 700_000}, "field id"), ({"id": "bb/../x?y#z%"}, "field id"),
        ({"severity": "bogus"}, "field severity"), ({"status": "[/x]"}, "field status"),
        ({"kind": "[/x]"}, "field kind"),
        ({"commands": [{}]}, r"commands\[0\]"),
        ({"commands": [{"purpose": None, "command": None, "framework": None, "source": None}]}, r"commands\[0\]"),
        ({"checkpoint_state": {**good["checkpoint_state"], "finished": 5}}, "checkpoint_state.finished"),
        ({"checkpoint_state": {**good["checkpoint_state"], "expected_ranks": ["[/x]"]}}, "checkpoint_state.expected"),
    ]:
        with pytest.raises(codec.DecodeError, match=words):
            codec.decode_incident(json.dumps({**good, **change}).encode())
    for header in (b'{"s": 9223372036854775808}', b'{"s": 1180591620717411303424}', '{"4162\\ud800": 1}'.encode()):
        with pytest.raises(codec.DecodeError):
            codec.decode_floors(header)
    for header in ('{"host":"vm","files":{"s":"/x\\ud800y"}}', '{"host":"vm","files":{"s":"/a"},"collector":"c\\ud800"}'):
        with pytest.raises(codec.DecodeError):
            codec.decode_sources(header.encode())
    # an Arrow events message whose line column holds bytes that are no UTF-8
    good_value = arrow({"offset": 1})
    t = ipc.open_stream(good_value).read_all().combine_chunks()
    i = t.schema.get_field_index("line")
    bad = b"abc\xff\xfe\xed def"
    column = pa.Array.from_buffers(t.schema.field(i).type, 1, [None, pa.py_buffer(
        struct.pack("<qq" if pa.types.is_large_string(t.schema.field(i).type) else "<ii", 0, len(bad))),
        pa.py_buffer(bad)])
    sink = pa.BufferOutputStream()
    t2 = t.set_column(i, t.schema.field(i), pa.chunked_array([column]))
    with ipc.new_stream(sink, t2.schema) as w:
        w.write_table(t2)
    events, bad_ones, counts = codec.decode_events_skipping([sink.getvalue().to_pybytes(), good_value])
    assert [j for j, _ in bad_ones] == [0] and counts == [0, 1] and events["offset"].to_list() == [1]


def test_markup_in_an_incidents_text_is_printed_as_text():
    from io import StringIO

    from rich.console import Console

    from alert_support import sigkill_incident
    from ckptwatch.sinks import report

    inc = sigkill_incident()
    inc.root_cause.cls, inc.root_cause.signal = "[/x]", "[bold]"
    inc.commands = [{"purpose": "[/x]", "command": "[/y]", "framework": "any", "source": "[/z]"}]
    buf = StringIO()
    report.render_text([inc], Console(file=buf, width=200, emoji=False, color_system=None))
    assert "[/x] ([bold])" in buf.getvalue() and "[/y]  # [/x]: [/z]" in buf.getvalue()


def test_the_fifth_attack_rounds_shapes_are_bad_messages_or_read():
    """Arrow batches whose columns polars rejects or panics on (a struct, a decimal256, an
    interval, a timestamp out of range or in no known zone, a column twice) stopped the sink
    and every detector on every restart; a 600,000-character time in an incident made a dead
    letter over the producer's limit, which stopped the sink; a last good checkpoint without
    its step broke the console channel."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    from alert_support import sigkill_incident
    from kafka.consumer.fetcher import ConsumerRecord

    base = ipc.open_stream(arrow({"offset": 1}, {"offset": 2})).read_all()
    n = base.num_rows

    def value(table: pa.Table) -> bytes:
        out = pa.BufferOutputStream()
        with ipc.new_stream(out, table.schema) as w:
            w.write_table(table)
        return out.getvalue().to_pybytes()

    def swap(name: str, column: pa.Array) -> pa.Table:
        return base.set_column(base.column_names.index(name), name, column)

    ignored = [base.append_column("extra", pa.array([pa.MonthDayNano([1, 1, 1])] * n, pa.month_day_nano_interval())),
               base.append_column("extra", pa.array([1] * n, pa.decimal256(76, 0)))]
    bad = [base.append_column("line", base.column("line")),
           swap("offset", pa.array([{"a": 1}] * n)),
           swap("job", pa.array([10**15] * n, pa.timestamp("s", tz="UTC"))),
           swap("ts", pa.array([10**15] * n, pa.timestamp("s", tz="UTC"))),
           swap("rank", pa.array([1] * n, pa.decimal256(76, 0))),
           swap("ts", pa.array([1] * n, pa.timestamp("s", tz="America/New_York")))]
    events, skipped, counts = codec.decode_events_skipping([value(t) for t in ignored + bad] + [arrow({"offset": 7})])
    assert counts == [n, n] + [0] * len(bad) + [1]
    assert [i for i, _ in skipped] == list(range(2, 2 + len(bad)))
    assert events["offset"].to_list() == [1, 2, 1, 2, 7]

    good = sigkill_incident().to_dict()
    with pytest.raises(codec.DecodeError) as e:
        codec.decode_incident(json.dumps({**good, "first_ts": "A" * 600_000}).encode())
    assert len(str(e.value)) < 1100
    with pytest.raises(codec.DecodeError, match="last_good_checkpoint"):
        codec.decode_incident(json.dumps({**good, "last_good_checkpoint": {"path": "/ckpt/x"}}).encode())
    record = ConsumerRecord("t.incidents", 0, None, 5, 0, 0, b"k", b"v" * 999_000, [("h", b"x" * 2000)], None, 1, 999_000, 0)
    letter = dead_letters.dead_letter(record, "E" * 900_000, topic="t.dlq", group="g")
    headers = dict(letter.headers)
    assert letter.value is None and headers[dead_letters.VALUE_DROPPED_HEADER].startswith(b"999000 bytes")
    assert len(headers[dead_letters.ERROR_HEADER]) == dead_letters.ERROR_BYTES
