"""Wire format of the three topics. Plain JSON, so any consumer (``kcat``, a notebook) can
read a topic without this package.

* **events topic**: value = newline-delimited JSON (NDJSON), one EVENT_SCHEMA row per line
  as a JSON object, with ``ts`` as an integer of nanoseconds since the Unix epoch (UTC; no
  precision lost) and ``attrs`` kept as its JSON string. One message carries a batch of
  one key's events, in order, up to :data:`MAX_BATCH_BYTES` (a single event is a batch of
  one line): the per-record cost of a producer send and of a consumer record is paid per
  batch, not per event. Key = the job (UTF-8), or for host-level events (kernel, storage:
  no rank) the host.
* **incidents topic**: value = :meth:`ckptwatch.detectors.Incident.to_dict` as JSON; key =
  the incident id. The latest message of a key is the incident's current version.
* **saves topic**: value = one :class:`~ckptwatch.detectors.checkpoints.SaveFact` as JSON
  (``first_ts`` and loss times as ISO 8601 UTC strings; ``losses`` as ``[time, step, loss]``
  triples, a non-finite loss as the JSON extension ``NaN`` / ``Infinity`` that Python's json
  reads); key = the checkpoint's ``root|step``. The latest message of a key is what the
  detectors know of that checkpoint's save.
"""

from __future__ import annotations

import datetime as dt
import io
import json

import polars as pl

from ckptwatch.detectors.checkpoints import SaveFact, checkpoint_key
from ckptwatch.detectors.incident import Incident
from ckptwatch.schema import EVENT_SCHEMA, TS

_WIRE_SCHEMA = {**EVENT_SCHEMA, "ts": pl.Int64}


class DecodeError(Exception):
    """A message that is not what the topic carries; names topic, partition and offset."""


def encode_events(events: pl.DataFrame) -> list[bytes]:
    """One JSON document per row of an EVENT_SCHEMA frame, in row order."""
    if events.is_empty():
        return []
    wire = events.select(list(EVENT_SCHEMA)).with_columns(pl.col("ts").dt.epoch("ns"))
    return [line.encode() for line in wire.write_ndjson().splitlines()]


#: bytes of one events message at most (a single larger event goes alone): well under the
#: broker's default ``message.max.bytes`` (1 MiB) and the producer's ``max_request_size``
MAX_BATCH_BYTES = 256 << 10


def encode_event_batches(events: pl.DataFrame, keys: list[bytes],
                         max_bytes: int = MAX_BATCH_BYTES) -> list[tuple[bytes, bytes]]:
    """``(key, value)`` messages for an EVENT_SCHEMA frame whose row ``i`` goes under
    ``keys[i]``: each value is the NDJSON of consecutive rows of one key (row order kept
    within a key), at most ``max_bytes`` unless one row alone is larger. Keys appear in the
    order of their first row."""
    if events.is_empty():
        return []
    if len(keys) != events.height:
        raise ValueError(f"{len(keys)} keys for {events.height} events")
    lines = encode_events(events)
    groups: dict[bytes, list[list[bytes]]] = {}
    sizes: dict[bytes, int] = {}
    for key, line in zip(keys, lines, strict=True):
        batches = groups.setdefault(key, [[]])
        if batches[-1] and sizes[key] + len(line) + 1 > max_bytes:
            batches.append([])
            sizes[key] = 0
        batches[-1].append(line)
        sizes[key] = sizes.get(key, 0) + len(line) + 1
    return [(key, b"\n".join(batch)) for key, batches in groups.items() for batch in batches]


def decode_events(values: list[bytes]) -> pl.DataFrame:
    """Inverse of :func:`encode_events` and :func:`encode_event_batches`: an EVENT_SCHEMA
    frame of every event of ``values`` (each value one event or an NDJSON batch of them).

    Raises DecodeError when a value is not a JSON event (the caller names the message)."""
    if not values:
        return pl.DataFrame(schema=EVENT_SCHEMA)
    what = f"{values[0][:80]!r}" if len(values) == 1 else f"a batch of {len(values)} messages"
    try:
        wire = pl.read_ndjson(io.BytesIO(b"\n".join(values)), schema=_WIRE_SCHEMA)
    except Exception:  # polars raises several types for bad JSON
        raise DecodeError(f"not a ckptwatch event (a JSON object with ts, kind, source_id, offset, ...): {what}") from None
    if wire["kind"].null_count() or wire["source_id"].null_count() or wire["ts"].null_count():
        raise DecodeError(f"a ckptwatch event needs kind, source_id and ts: {what}")
    return wire.with_columns(pl.from_epoch(pl.col("ts"), time_unit="ns").cast(TS))


def encode_incident(inc: Incident) -> bytes:
    return json.dumps(inc.to_dict()).encode()


def decode_incident(value: bytes) -> Incident:
    """Raises DecodeError when the value is not an incident."""
    try:
        d = json.loads(value)
    except ValueError:
        raise DecodeError(f"not JSON: {value[:80]!r}") from None
    try:
        return Incident.from_dict(d)
    except KeyError as e:
        raise DecodeError(f"not a ckptwatch incident: no field {e}") from None
    except (ValueError, TypeError, AttributeError) as e:
        raise DecodeError(f"not a ckptwatch incident: {e}") from None


def save_fact_key(fact: SaveFact) -> bytes:
    """The saves-topic key of ``fact``: its checkpoint, ``root|step`` (UTF-8)."""
    root, step = checkpoint_key(fact.path, fact.step)
    return f"{root or ''}|{'' if step is None else step}".encode()


def encode_save_fact(fact: SaveFact) -> bytes:
    """One saves-topic value (see the module docstring)."""
    return json.dumps({
        "job": fact.job, "step": fact.step, "path": fact.path, "complete": fact.complete,
        "first_ts": fact.first_ts.isoformat() if fact.first_ts else None, "world_size": fact.world_size,
        "losses": [[ts.isoformat(), s, v] for ts, s, v in fact.losses], "missing": list(fact.missing),
    }).encode()


def decode_save_fact(value: bytes) -> SaveFact:
    """Inverse of :func:`encode_save_fact`. Raises DecodeError when the value is not a save fact."""
    try:
        d = json.loads(value)
        first = d["first_ts"]
        return SaveFact(
            job=str(d["job"]), step=int(d["step"]), path=d["path"], complete=bool(d["complete"]),
            first_ts=dt.datetime.fromisoformat(first) if first else None,
            world_size=None if d["world_size"] is None else int(d["world_size"]),
            losses=tuple((dt.datetime.fromisoformat(ts), int(s), float(v)) for ts, s, v in d["losses"]),
            missing=tuple(int(r) for r in d.get("missing", ())),
        )
    except KeyError as e:
        raise DecodeError(f"not a ckptwatch save fact: no field {e}") from None
    except (ValueError, TypeError, AttributeError) as e:
        raise DecodeError(f"not a ckptwatch save fact: {e}") from None


def decode_events_skipping(values: list[bytes]) -> tuple[pl.DataFrame, list[tuple[int, DecodeError]]]:
    """Like :func:`decode_events`, but a bad value is left out instead of failing the batch.
    Returns the frame of the good ones and ``(index in values, error)`` for each bad one."""
    try:
        return decode_events(values), []
    except DecodeError:
        pass
    good, bad = [], []
    for i, v in enumerate(values):
        try:
            decode_events([v])
            good.append(v)
        except DecodeError as e:
            bad.append((i, e))
    return decode_events(good), bad
