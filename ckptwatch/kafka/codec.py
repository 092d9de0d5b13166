"""Wire format of the two topics. Plain JSON, one message per event or incident, so any
consumer (``kcat``, a notebook) can read a topic without this package.

* **events topic**: value = one EVENT_SCHEMA row as a JSON object, with ``ts`` as an integer
  of nanoseconds since the Unix epoch (UTC; no precision lost) and ``attrs`` kept as its JSON
  string. Key = the job (UTF-8), or for host-level events (kernel, storage: no rank) the host.
* **incidents topic**: value = :meth:`ckptwatch.detectors.Incident.to_dict` as JSON; key =
  the incident id. The latest message of a key is the incident's current version.
"""

from __future__ import annotations

import io
import json

import polars as pl

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


def decode_events(values: list[bytes]) -> pl.DataFrame:
    """Inverse of :func:`encode_events`: an EVENT_SCHEMA frame.

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
