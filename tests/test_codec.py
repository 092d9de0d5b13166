"""The wire format round-trips exactly, and a foreign message is named, not a traceback."""

from __future__ import annotations

import polars as pl
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
    assert len(values) == events.height == 818  # with the 3 agents' global_ranks=[…] lines (a node's ranks)
    assert codec.decode_events(values).equals(events)  # ns timestamps, nulls, attrs JSON: all kept
    incidents, _ = diagnose([str(logs)])
    for inc in incidents:
        back = codec.decode_incident(codec.encode_incident(inc))
        assert back.to_dict() == inc.to_dict()


@pytest.mark.parametrize(("fmt", "max_bytes"), [("ndjson", 20_000), ("arrow", 6_000)])
def test_event_batches_keep_each_keys_order_and_size_and_decode_to_the_same_rows(copy_scenario, fmt, max_bytes):
    from ckptwatch.ingest.watcher import SourceWatcher
    from ckptwatch.pipeline import extract_events
    from ckptwatch.rules import RuleSet

    w = SourceWatcher([str(copy_scenario("02-sigkill-mid-save"))])
    events = extract_events(RuleSet.load(()), w.poll(final=True), w.stats)
    w.close()
    keys = [f"k{r % 3}".encode() for r in range(events.height)]  # three keys, interleaved
    batches = codec.encode_event_batches(events, keys, max_bytes=max_bytes, fmt=fmt)
    assert list(dict.fromkeys(k for k, _ in batches)) == [b"k0", b"k1", b"k2"]
    assert all(len(v) <= max_bytes for _, v in batches)
    assert 815 // 40 < len(batches) < 815 // 5  # many events per message, split by size
    for key in (b"k0", b"k1", b"k2"):  # one key's messages, in order, are its rows, in order
        mine = events.filter(pl.Series([k == key for k in keys]))
        assert codec.decode_events([v for k, v in batches if k == key]).equals(mine)
    alone = codec.encode_event_batches(events.head(2), [b"a", b"a"], max_bytes=10, fmt=fmt)  # over the bound: alone
    assert [k for k, _ in alone] == [b"a", b"a"]
    assert [codec.decode_events([v]).height for _, v in alone] == [1, 1]
    with pytest.raises(ValueError, match="1 keys for 2 events"):
        codec.encode_event_batches(events.head(2), [b"a"], fmt=fmt)


def test_a_topic_of_both_formats_decodes_in_order_and_a_broken_arrow_batch_is_named(copy_scenario):
    """An upgrade leaves NDJSON messages before Arrow ones in a partition: both are read."""
    from ckptwatch.ingest.watcher import SourceWatcher
    from ckptwatch.pipeline import extract_events
    from ckptwatch.rules import RuleSet

    w = SourceWatcher([str(copy_scenario("02-sigkill-mid-save"))])
    events = extract_events(RuleSet.load(()), w.poll(final=True), w.stats)
    w.close()
    parts = [events.slice(0, 300), events.slice(300, 300), events.slice(600)]
    values = [v for i, part in enumerate(parts) for _, v in codec.encode_event_batches(
        part, [b"j"] * part.height, fmt=("ndjson", "arrow")[i % 2])]
    assert {v[:1] for v in values} == {b"{", b"\xff"}
    assert codec.decode_events(values).equals(events)
    frame, counts = codec.decode_event_messages(values)  # each message's events: what offsets are told by
    assert counts == [codec.decode_events([v]).height for v in values] and sum(counts) == frame.height
    arrow = codec.encode_event_batches(parts[1], [b"j"] * 300)[0][1]
    frame, bad, counts = codec.decode_events_skipping([arrow[: len(arrow) // 2], arrow])
    assert counts == [0, 300]
    assert frame.equals(parts[1]) and [i for i, _ in bad] == [0]
    assert "not a ckptwatch events batch (an Arrow IPC stream)" in str(bad[0][1])
    with pytest.raises(ValueError, match="events format must be one of arrow, ndjson"):
        codec.encode_event_batches(parts[0], [b"j"] * 300, fmt="avro")


def test_bad_messages_are_skipped_and_named():
    good = b'{"ts": 1, "kind": "save_start", "source_id": "s", "offset": 0, "rule_id": "r", "line": "x"}'
    frame, bad, counts = codec.decode_events_skipping([good, b"true", b'{"kind": "x"}'])
    assert counts == [1, 0, 0]
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


def test_save_fact_round_trip_keeps_nan_losses_equal():
    """A fact read back from the saves topic is the same fact (a NaN loss included), so a
    member learning its own facts back changes nothing."""
    import datetime as dt
    import math

    from ckptwatch.detectors.checkpoints import CheckpointRegistry, SaveFact
    from ckptwatch.kafka.codec import decode_save_fact, encode_save_fact, save_fact_key

    t = dt.datetime(2026, 11, 30, 10, 30, 24, 617000, tzinfo=dt.timezone.utc)
    fact = SaveFact("gpt-0601", 40, "/ckpt/gpt/iter_0000040", True, t, 4,
                    ((t, 39, 1.859321), (t + dt.timedelta(seconds=1), 40, math.nan)))
    back = decode_save_fact(encode_save_fact(fact))
    assert save_fact_key(back) == b"/ckpt/gpt|40"
    assert (back.job, back.step, back.path, back.complete, back.first_ts, back.world_size) == \
        ("gpt-0601", 40, "/ckpt/gpt/iter_0000040", True, t, 4)
    assert back.losses[0] == (t, 39, 1.859321) and math.isnan(back.losses[1][2])
    registry = CheckpointRegistry()
    assert registry.record_save(fact) is True
    assert registry.record_save(back) is False


def test_save_fact_decode_names_the_problem():
    from ckptwatch.kafka.codec import DecodeError, decode_save_fact

    with pytest.raises(DecodeError, match="no field 'losses'"):
        decode_save_fact(b'{"job": "j", "step": 1, "path": null, "complete": true, "first_ts": null, "world_size": 2}')
    with pytest.raises(DecodeError, match="not a ckptwatch save fact"):
        decode_save_fact(b"[1, 2]")


def test_a_run_of_arrow_messages_decodes_as_one_frame_zstd_written_ones_too(copy_scenario):
    """Consecutive Arrow messages are read into one frame, with each one's count; those an
    earlier version wrote with zstd read alike, and a foreign producer's batch whose column
    types do not unify with ours is still read."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    from ckptwatch.ingest.watcher import SourceWatcher
    from ckptwatch.pipeline import extract_events
    from ckptwatch.rules import RuleSet

    w = SourceWatcher([str(copy_scenario("02-sigkill-mid-save"))])
    events = extract_events(RuleSet.load(()), w.poll(final=True), w.stats)
    w.close()
    ours = [v for _, v in codec.encode_event_batches(events, [b"j"] * events.height, max_bytes=20_000)]
    assert len(ours) > 2
    sink = pa.BufferOutputStream()
    table = events.head(20).to_arrow()
    with ipc.new_stream(sink, table.schema, options=ipc.IpcWriteOptions(compression="zstd")) as writer:
        writer.write_table(table)
    older = sink.getvalue().to_pybytes()
    frame, counts = codec.decode_event_messages([older, *ours, older])
    assert counts == [20, *(codec.decode_events([v]).height for v in ours), 20]
    assert sum(counts[1:-1]) == events.height
    assert frame.equals(pl.concat([events.head(20), events, events.head(20)]))
    foreign = events.head(3).with_columns(pl.col("rank").cast(pl.Utf8))
    odd = codec.encode_event_batches(foreign, [b"j"] * 3)[0][1]
    frame, counts = codec.decode_event_messages([older, odd])
    assert counts == [20, 3] and frame.equals(pl.concat([events.head(20), events.head(3)]))


def test_small_batches_are_lz4_and_large_ones_zstd(copy_scenario):
    """A live collector's small batches decode fastest with LZ4; a backlog's large ones
    travel in half the bytes with zstd (see the module docstring). Each compressed buffer
    is a frame of its codec, which starts with the codec's magic number."""
    from ckptwatch.ingest.watcher import SourceWatcher
    from ckptwatch.pipeline import extract_events
    from ckptwatch.rules import RuleSet

    lz4_frame, zstd_frame = b"\x04\x22\x4d\x18", b"\x28\xb5\x2f\xfd"  # LZ4 frame format; RFC 8878
    w = SourceWatcher([str(copy_scenario("02-sigkill-mid-save"))])
    events = extract_events(RuleSet.load(()), w.poll(final=True), w.stats)
    w.close()
    small, large = events.head(20), events
    assert small.to_arrow().nbytes < codec.ZSTD_FROM_BYTES <= large.to_arrow().nbytes
    ((_, value),) = codec.encode_event_batches(small, [b"j"] * small.height)
    assert value.count(lz4_frame) > 10 and zstd_frame not in value
    ((_, value),) = codec.encode_event_batches(large, [b"j"] * large.height, max_bytes=1 << 30)
    assert value.count(zstd_frame) > 10 and lz4_frame not in value
    assert codec.decode_events([value]).equals(large)
