"""Wire format of the three topics.

* **events topic**: value = a batch of one key's events, in order, in one of two formats
  (:data:`EVENT_FORMATS`; consumers read both, so a topic may hold either):

  - ``arrow`` (the default): an Apache Arrow IPC stream (the Arrow columnar format's
    "IPC streaming format": schema message, record batches, end-of-stream marker) of
    EVENT_SCHEMA rows, ``ts`` a UTC timestamp, its buffers compressed (Arrow's own IPC body
    compression): with zstd from :data:`ZSTD_FROM_BYTES` of buffers, with LZ4 (LZ4_FRAME)
    below. A live collector's batches are small (a job's events of one poll: tens of
    rows), and there zstd's fixed cost per buffer dominated a detector's time: 16 us an
    event to decode at 27 rows against 6 with LZ4, for 204 bytes an event against 254 (the
    corpus's events); a backlog's batches are large, and there zstd's half the bytes (50
    an event against 102 at 400 rows) is worth more than its decoding. Read it with any
    Arrow library, e.g. ``pyarrow.ipc.open_stream(value).read_all()``. A batch's rows are encoded, decoded and
    compressed column by column in C++, with no work per event in Python: what lets one
    collector carry 100,000 events/s (``benchmarks/kafka_transport.py``).
  - ``ndjson``: newline-delimited JSON, one EVENT_SCHEMA row per line as a JSON object,
    ``ts`` an integer of nanoseconds since the Unix epoch (UTC; no precision lost), ``attrs``
    its JSON string: readable with ``kcat`` and no Arrow library, at about a quarter of the
    rate.

  One message holds at most :data:`MAX_BATCH_BYTES` (a single larger event goes alone), so
  the per-record cost of a producer send and of a consumer record is paid per batch, not
  per event. Key = the job (UTF-8), or for host-level events (kernel, storage: no rank) the
  host. Two record headers help the sink store each event once in bounded memory (see
  :mod:`ckptwatch.sinks.stored_offsets`): :data:`FLOORS_HEADER`, a JSON object
  ``{source_id: floor}`` for the message's sources, each the offset the collector had saved
  for it when it sent the message (it never sends an event of that source below it again);
  :data:`FANOUT_HEADER` on a host key's copies, the partition whose copy the sink stores.
  Both are optional: the events of a message without floors are checked against what is
  stored. :data:`SOURCES_HEADER` (optional too) names where the message's sources were read:
  JSON ``{"host": collector's hostname, "files": {source_id: path}, "collector": id}``,
  recorded in the sink's ``sources`` table so every evidence row names its file; ``collector``
  (optional) names the collector (its host and offsets file), so the sink can tell when two
  collectors follow the same file (:mod:`ckptwatch.sinks.shared_sources`).

  Every field is checked where it is decoded (:func:`decode_events_skipping`), so nothing a
  detector or the sink cannot take gets past the codec: a value that is no batch at all (a
  tombstone, 0 bytes, not Arrow nor JSON, a column that does not cast to EVENT_SCHEMA's
  type) is left out whole; an event of a batch is left out (the batch's others kept) when it
  lacks one of :data:`REQUIRED` (``offset`` names the event; ``rule_id`` and ``line`` are
  what a detector reads it by), when ``kind`` or ``source_id`` is empty, ``offset`` negative,
  ``ts`` outside [1970, 2200) (:data:`TS_MIN_NS`, :data:`TS_END_NS`), or ``attrs`` not null
  and not a JSON object of strings, numbers (``NaN`` and ``Infinity`` as Python's ``json``
  writes them), booleans and nulls (:data:`ATTRS_PATTERN`). An event ``kind`` not in
  :data:`~ckptwatch.schema.EVENT_KINDS` passes (a newer collector's kind is stored, and
  ignored by detectors that do not know it).
* **incidents topic**: value = :meth:`ckptwatch.detectors.Incident.to_dict` as JSON; key =
  the incident id. The latest message of a key is the incident's current version.
  :func:`decode_incident` checks the type of every field the sink stores or a detector
  reads (and that times are UTC and in range).
* **saves topic**: value = one :class:`~ckptwatch.detectors.checkpoints.SaveFact` as JSON
  (``first_ts`` and loss times as ISO 8601 UTC strings; ``losses`` as ``[time, step, loss]``
  triples, a non-finite loss as the JSON extension ``NaN`` / ``Infinity`` that Python's json
  reads); key = the checkpoint's ``root|step``. The latest message of a key is what the
  detectors know of that checkpoint's save.
"""

from __future__ import annotations

import datetime as dt
import io
import itertools
import json
import re
from collections.abc import Callable
from typing import Any, NamedTuple

import polars as pl
import pyarrow as pa
import pyarrow.ipc as ipc

from ckptwatch.detectors.checkpoints import SaveFact, checkpoint_key
from ckptwatch.detectors.incident import SEVERITIES, STATUSES, Incident
from ckptwatch.schema import EVENT_SCHEMA, TS

_WIRE_SCHEMA = {**EVENT_SCHEMA, "ts": pl.Int64}

#: the formats of an events message (see the module docstring)
EVENT_FORMATS = ("arrow", "ndjson")
#: an Arrow IPC stream's first message starts with the continuation marker 0xFFFFFFFF (Arrow
#: columnar format, "Encapsulated message format"); a JSON event starts with ``{``
_ARROW_MARK = b"\xff\xff\xff\xff"
_ARROW_ZSTD = ipc.IpcWriteOptions(compression="zstd")
_ARROW_LZ4 = ipc.IpcWriteOptions(compression="lz4")
#: an Arrow events batch of this many bytes of buffers or more is compressed with zstd, a smaller one with LZ4
ZSTD_FROM_BYTES = 128 << 10
#: rows of one Arrow events message at most (then split further until under the byte bound)
MAX_BATCH_ROWS = 4096


#: events record header: JSON ``{source_id: floor}`` (see the module docstring)
FLOORS_HEADER = "ckptwatch-floors"
#: events record header: on each copy of a host key's message, the partition (decimal ASCII)
#: of the copy a sink stores
FANOUT_HEADER = "ckptwatch-fanout"

#: events record header: where the message's sources were read (see the module docstring)
SOURCES_HEADER = "ckptwatch-sources"

#: event times accepted, in ns since the Unix epoch (UTC): from the epoch up to, not
#: including, 2200-01-01. A time outside (negative, int64 max) is no training log's: an event
#: carrying one is rejected where it is decoded
TS_MIN_NS = 0
TS_END_NS = 7_258_118_400 * 1_000_000_000
#: the columns an event cannot do without: what names it (``source_id``, ``offset``), its
#: time and kind, and the rule and line a detector reads it by
REQUIRED = ("ts", "kind", "source_id", "offset", "rule_id", "line")

_HEX = "[0-9a-fA-F]"
#: a JSON string escape; a ``\\u`` surrogate only as a high-low pair (DuckDB refuses a lone one)
_ESCAPE = (r'\\(?:["\\/bfnrt]|u(?:[0-9a-cA-CefEF]' + _HEX + r'{3}|[dD][0-7]' + _HEX + r'{2}'
           r'|[dD][89abAB]' + _HEX + r'{2}\\u[dD][c-fC-F]' + _HEX + r'{2}))')
_JSON_STRING = r'"(?:[^"\\\x00-\x1f]|' + _ESCAPE + r')*"'
_JSON_SCALAR = (r'(?:' + _JSON_STRING + r'|-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?'
                r'|true|false|null|NaN|-?Infinity)')
_WS = r'[ \t\n\r]*'
_MEMBER = _WS + _JSON_STRING + _WS + ":" + _WS + _JSON_SCALAR + _WS
#: what an event's ``attrs`` must match (when not null): a JSON object whose values are
#: strings, numbers, booleans or nulls, numbers as Python's ``json`` writes them (``NaN``,
#: ``Infinity``, ``-Infinity`` included), as :func:`ckptwatch.rules.engine.attrs_json_of`
#: builds it. A regular language, so checked by polars' linear-time regex engine over the
#: whole column, with no work per event in Python
ATTRS_PATTERN = r'^' + _WS + r'\{(?:' + _MEMBER + r'(?:,' + _MEMBER + r')*|' + _WS + r')\}' + _WS + r'$'


class Sources(NamedTuple):
    """A decoded :data:`SOURCES_HEADER`: the collector's ``host`` (None if not given), its
    ``files`` (``source_id`` -> path on that host) and ``collector`` (the collector's id,
    ``host:offsets file``; None from a collector older than the field)."""
    host: str | None
    files: dict[str, str]
    collector: str | None = None


def encode_sources(host: str, files: dict[str, str], collector: str | None = None) -> bytes:
    """The value of :data:`SOURCES_HEADER`: ``files`` maps ``source_id`` -> path on ``host``;
    ``collector`` names the collector that read them (left out when None)."""
    doc: dict[str, Any] = {"host": host, "files": files}
    if collector is not None:
        doc["collector"] = collector
    return json.dumps(doc, separators=(",", ":")).encode()


def decode_sources(value: bytes | None) -> Sources:
    """Inverse of :func:`encode_sources`. Raises DecodeError for anything but that shape
    (a header without a value too)."""
    try:
        doc = json.loads(value) if value is not None else None
        _sane_json(doc, f"header {SOURCES_HEADER}")  # a lone surrogate in a path or a collector
    except (ValueError, RecursionError, DecodeError):  # RecursionError: nested deeper than Python's stack
        doc = None
    files = doc.get("files") if isinstance(doc, dict) else None
    host = doc.get("host") if isinstance(doc, dict) else None
    collector = doc.get("collector") if isinstance(doc, dict) else None
    if (not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items())
            or not (host is None or isinstance(host, str)) or not (collector is None or isinstance(collector, str))):
        raise DecodeError(f"header {SOURCES_HEADER} is not {{\"host\": ..., \"files\": {{id: path}}}}: "
                          f"{(value or b'')[:80]!r}")
    return Sources(host, files, collector)


def encode_floors(floors: dict[str, int]) -> bytes:
    """The value of :data:`FLOORS_HEADER`."""
    return json.dumps(floors, separators=(",", ":")).encode()


def decode_floors(value: bytes | None) -> dict[str, int]:
    """Inverse of :func:`encode_floors`. Raises DecodeError for anything but an object of
    integers."""
    try:
        floors = json.loads(value) if value is not None else None
        _sane_json(floors, f"header {FLOORS_HEADER}")
    except (ValueError, RecursionError, DecodeError):
        floors = None
    if not isinstance(floors, dict) or not all(_int(v) and v >= 0 for v in floors.values()):
        raise DecodeError(f"header {FLOORS_HEADER} is not a JSON object of offsets: {(value or b'')[:80]!r}")
    return floors


#: the longest reason a DecodeError gives (a field's value quoted in it is cut first, by
#: :func:`_cut`; an exception's own text, such as fromisoformat's, quotes it whole)
MESSAGE_CHARS = 1000


class DecodeError(Exception):
    """A message, or events of it, that are not what the topic carries. The text names the
    field; the consumer adds topic, partition and offset. ``kept``: how many events of the
    message were still taken (0: none, the message is left out whole)."""

    def __init__(self, message: str, *, kept: int = 0) -> None:
        if len(message) > MESSAGE_CHARS:  # the reason travels in a dead letter's header and a log line
            message = f"{message[:MESSAGE_CHARS]}… [cut: {len(message) - MESSAGE_CHARS} more characters]"
        super().__init__(message)
        self.kept = kept


def encode_events(events: pl.DataFrame) -> list[bytes]:
    """One JSON document per row of an EVENT_SCHEMA frame, in row order."""
    if events.is_empty():
        return []
    wire = events.select(list(EVENT_SCHEMA)).with_columns(pl.col("ts").dt.epoch("ns"))
    return [line.encode() for line in wire.write_ndjson().splitlines()]


#: bytes of one events message at most (a single larger event goes alone): well under the
#: broker's default ``message.max.bytes`` (1 MiB) and the producer's ``max_request_size``
MAX_BATCH_BYTES = 256 << 10


def encode_event_batches(events: pl.DataFrame, keys: list[bytes] | pl.Series,
                         max_bytes: int = MAX_BATCH_BYTES, *, fmt: str = "arrow") -> list[tuple[bytes, bytes]]:
    """``(key, value)`` messages for an EVENT_SCHEMA frame whose row ``i`` goes under
    ``keys[i]`` (bytes, or a Series of str / binary): each value holds consecutive rows of one
    key (row order kept within a key) in format ``fmt`` (:data:`EVENT_FORMATS`), at most
    ``max_bytes`` unless one row alone is larger. Keys appear in the order of their first row.

    Raises:
        ValueError: as many keys as rows are needed, and a known ``fmt``.
    """
    if fmt not in EVENT_FORMATS:
        raise ValueError(f"events format must be one of {', '.join(EVENT_FORMATS)}, not {fmt!r}")
    if events.is_empty():
        return []
    if len(keys) != events.height:
        raise ValueError(f"{len(keys)} keys for {events.height} events")
    if fmt == "ndjson":
        return _ndjson_batches(events, keys if isinstance(keys, list) else keys.cast(pl.Binary).to_list(), max_bytes)
    key_col = keys if isinstance(keys, pl.Series) else pl.Series(keys, dtype=pl.Binary)
    frame = events.select(list(EVENT_SCHEMA)).with_columns(key_col.cast(pl.Binary).alias("_key"))
    out: list[tuple[bytes, bytes]] = []
    for (key,), rows in frame.partition_by("_key", maintain_order=True, as_dict=True).items():
        table = rows.drop("_key").to_arrow()
        for start in range(0, table.num_rows, MAX_BATCH_ROWS):
            out += [(key, v) for v in _arrow_values(table.slice(start, MAX_BATCH_ROWS), max_bytes)]
    return out


def _arrow_values(table: pa.Table, max_bytes: int) -> list[bytes]:
    """``table`` as Arrow IPC stream values of at most ``max_bytes`` each (halved until so;
    one row alone may be larger)."""
    sink = pa.BufferOutputStream()
    options = _ARROW_ZSTD if table.nbytes >= ZSTD_FROM_BYTES else _ARROW_LZ4
    with ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    value = sink.getvalue().to_pybytes()
    if len(value) <= max_bytes or table.num_rows == 1:
        return [value]
    half = table.num_rows // 2
    return _arrow_values(table.slice(0, half), max_bytes) + _arrow_values(table.slice(half), max_bytes)


def _ndjson_batches(events: pl.DataFrame, keys: list[bytes], max_bytes: int) -> list[tuple[bytes, bytes]]:
    """:func:`encode_event_batches` in the ``ndjson`` format."""
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
    frame of every event of ``values`` in order (each value an Arrow IPC stream, one JSON
    event, or an NDJSON batch of them).

    Raises DecodeError when a value is not a batch of events or an event fails a check of
    the module docstring (the caller names the message)."""
    return decode_event_messages(values)[0]


def decode_event_messages(values: list[bytes | None]) -> tuple[pl.DataFrame, list[int]]:
    """:func:`decode_events`, and how many of the frame's rows each value gave, in order
    (what a consumer needs to tell each event's message offset).

    Raises DecodeError when a value is not a batch of events, or an event of one fails a
    check (see the module docstring)."""
    for v in values:
        why = _unusable(v)
        if why:
            raise DecodeError(why)
    frame, counts = _decode_values(values)  # type: ignore[arg-type]
    bad = _faulty_rows(frame)
    if bad.any():
        row = frame.filter(bad).head(1).with_columns(pl.col("ts").dt.epoch("ns").alias("_ns")).row(0, named=True)
        raise DecodeError(_fault(row))
    return frame, counts


def _unusable(value: bytes | None) -> str | None:
    """Why ``value`` cannot be a batch of events before it is parsed (None: it may be one)."""
    if value is None:
        return "a tombstone (no value), not a batch of events"
    if not isinstance(value, bytes):
        return f"a value of type {type(value).__name__}, not bytes"
    if not value.strip():
        return f"an empty value ({len(value)} bytes), not a batch of events"
    return None


def _decode_values(values: list[bytes]) -> tuple[pl.DataFrame, list[int]]:
    """The events of ``values`` (each usable: see :func:`_unusable`) as one EVENT_SCHEMA
    frame, unchecked row by row, and the rows each value gave. Raises DecodeError when a
    value is not a batch of events."""
    if not values:
        return pl.DataFrame(schema=EVENT_SCHEMA), []
    frames: list[pl.DataFrame] = []
    counts: list[int] = []
    run: list[bytes] = []  # consecutive JSON values: one parse
    arrow: list[bytes] = []  # consecutive Arrow values: one frame

    def flush_run() -> None:
        frame = _decode_ndjson(run)
        # one event a line; a blank line is none (JSON escapes a newline inside a string)
        sizes = [sum(1 for line in v.split(b"\n") if line.strip()) for v in run]
        if sum(sizes) != frame.height:  # a parser reading lines otherwise: no count to trust
            raise DecodeError(f"not a ckptwatch events batch: {frame.height} events in {sum(sizes)} JSON lines")
        frames.append(frame)
        counts.extend(sizes)
        run.clear()

    def flush_arrow() -> None:
        frame, sizes = _decode_arrow(arrow, len(values))
        frames.append(frame)
        counts.extend(sizes)
        arrow.clear()

    for v in values:
        if v.startswith(_ARROW_MARK):
            if run:
                flush_run()
            arrow.append(v)
        else:
            if arrow:
                flush_arrow()
            run.append(v)
    if run:
        flush_run()
    if arrow:
        flush_arrow()
    return (frames[0] if len(frames) == 1 else pl.concat(frames)), counts


def _faulty_rows(frame: pl.DataFrame) -> pl.Series:
    """Per row of an EVENT_SCHEMA ``frame``: True when the event fails a check of the module
    docstring. Vectorized: no work per event in Python."""
    if frame.is_empty():
        return pl.Series("bad", [], dtype=pl.Boolean)
    ns = pl.col("ts").dt.epoch("ns")
    attrs = pl.col("attrs")
    return frame.select(pl.any_horizontal(
        *(pl.col(c).is_null() for c in REQUIRED), ns < TS_MIN_NS, ns >= TS_END_NS, pl.col("offset") < 0,
        pl.col("kind") == "", pl.col("source_id") == "",
        attrs.is_not_null() & ~attrs.str.contains(ATTRS_PATTERN),
    ).fill_null(False).alias("bad")).to_series()


def _fault(row: dict[str, Any]) -> str:
    """What is wrong with one event (a row of a frame with ``_ns``, its ``ts`` in ns), naming
    the field."""
    for c in REQUIRED:
        if row[c] is None:
            return (f"field {c}: missing (a ckptwatch event needs kind, source_id and ts, and an offset, "
                    "rule_id and line)")
    if not TS_MIN_NS <= row["_ns"] < TS_END_NS:
        return f"field ts: {row['_ns']} ns since the epoch is not a time from 1970 to 2200 (UTC)"
    if row["offset"] < 0:
        return f"field offset: {row['offset']} is negative"
    for c in ("kind", "source_id"):
        if row[c] == "":
            return f"field {c}: empty"
    return (f"field attrs: not a JSON object of strings, numbers, booleans and nulls: "
            f"{_cut(row['attrs'])}")


def _cut(text: str, n: int = 80) -> str:
    return repr(text if len(text) <= n else text[:n] + "...")


def _decode_arrow(values: list[bytes], n: int) -> tuple[pl.DataFrame, list[int]]:
    """Consecutive Arrow IPC values as one frame, and the rows each gave. They are read into
    one Arrow table and converted, cast and checked once: per message, that work cost
    ~1 ms, most of a detector's time on a fleet of small messages (a job's events of
    one collector poll)."""
    what = "an Arrow IPC stream" + ("" if n == 1 else f" in a batch of {n} messages")
    try:
        tables = [ipc.open_stream(v).read_all() for v in values]
        for t in tables:  # string columns valid UTF-8, offsets in bounds: DuckDB and polars trust them
            t.validate(full=True)
        tables = [_typed(t, what) for t in tables]
    except (pa.ArrowException, OSError, ValueError, TypeError, OverflowError) as e:  # a cut stream is an OSError
        raise DecodeError(f"not a ckptwatch events batch ({what}): {e}") from None
    try:
        whole = [tables[0] if len(tables) == 1 else pa.concat_tables(tables)]
        frames = [_checked_events(t, what) for t in whole]
        return (frames[0] if len(frames) == 1 else pl.concat(frames)), [t.num_rows for t in tables]
    except DecodeError:
        raise
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # noqa: BLE001 -- the last guard: pyo3's PanicException is a BaseException
        raise DecodeError(f"not a ckptwatch events batch ({what}): {type(e).__name__}: {e}") from None


#: the Arrow type each event column is cast to before polars reads it
_ARROW_TYPES = {pl.Utf8: pa.large_string(), pl.Int32: pa.int32(), pl.Int64: pa.int64(), TS: pa.timestamp("ns", "UTC")}
_UTC_NAMES = (None, "UTC", "Etc/UTC", "+00:00", "Z")


def _stringy(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def _typed(table: pa.Table, what: str) -> pa.Table:
    """The event columns of an Arrow ``table``, each of a type that casts to its
    EVENT_SCHEMA type (strings or dictionary-encoded strings, integers or their text, UTC
    timestamps or integer nanoseconds; nulls) and cast to it, safely (an overflow raises): what polars
    then reads as it is. Other columns are left out. Raises DecodeError for a duplicate or
    missing column or a column of another type (a struct, a decimal, an interval, a union,
    a timestamp in another zone), which polars would reject or panic on."""
    names = table.column_names
    if len(set(names)) != len(names):
        raise DecodeError(f"not a ckptwatch events batch ({what}): a column appears twice")
    missing = [c for c in EVENT_SCHEMA if c not in names]
    if missing:
        raise DecodeError(f"not a ckptwatch events batch ({what}): no column {', '.join(missing)}")
    columns = []
    for name, dtype in EVENT_SCHEMA.items():
        col = table.column(name)
        t = col.type
        if pa.types.is_dictionary(t):
            t = t.value_type
            col = col.cast(t)
        if pa.types.is_null(t):
            ok = True
        elif dtype == pl.Utf8:  # a foreign producer's integers read as their text, as polars would
            ok = _stringy(t) or pa.types.is_integer(t)
        elif dtype == TS:
            ok = pa.types.is_integer(t) or (pa.types.is_timestamp(t) and t.tz in _UTC_NAMES)
            if ok and pa.types.is_timestamp(t) and t.tz != "UTC":
                col = col.cast(pa.timestamp(t.unit))  # a naive or other-spelled UTC time: UTC
                col = pa.chunked_array([c.view(pa.int64()) for c in col.chunks]).cast(pa.int64())
                col = col.cast(pa.timestamp(t.unit, "UTC"))
        else:  # integers, or their text (a cast that does not parse raises)
            ok = pa.types.is_integer(t) or _stringy(t)
        if not ok:
            raise DecodeError(f"not a ckptwatch events batch ({what}): column {name} is of type {t}")
        columns.append(col.cast(_ARROW_TYPES[dtype], safe=True))
    return pa.table(columns, names=list(EVENT_SCHEMA))


def _checked_events(table: pa.Table, what: str) -> pl.DataFrame:
    """An Arrow table of events as an EVENT_SCHEMA frame. Raises DecodeError (naming
    ``what``) when it lacks a column or a column does not cast (each event is checked
    after, by :func:`_faulty_rows`)."""
    try:
        frame = pl.from_arrow(table, rechunk=False)  # a run of messages is many chunks: no copy into one
    except (pa.ArrowException, ValueError) as e:
        raise DecodeError(f"not a ckptwatch events batch ({what}): {e}") from None
    assert isinstance(frame, pl.DataFrame)
    missing = [c for c in EVENT_SCHEMA if c not in frame.columns]
    if missing:
        raise DecodeError(f"not a ckptwatch events batch ({what}): no column {', '.join(missing)}")
    try:
        frame = frame.select([pl.col(c).cast(t) for c, t in EVENT_SCHEMA.items()])
    except pl.exceptions.PolarsError as e:
        raise DecodeError(f"not a ckptwatch events batch ({what}): {e}") from None
    return frame  # each event checked by _faulty_rows


def _decode_ndjson(values: list[bytes]) -> pl.DataFrame:
    what = f"{values[0][:80]!r}" if len(values) == 1 else f"a batch of {len(values)} messages"
    try:
        wire = pl.read_ndjson(io.BytesIO(b"\n".join(values)), schema=_WIRE_SCHEMA)
    except Exception:  # polars raises several types for bad JSON
        raise DecodeError(f"not a ckptwatch event (a JSON object with ts, kind, source_id, offset, ...): {what}") from None
    return wire.with_columns(pl.from_epoch(pl.col("ts"), time_unit="ns").cast(TS))


def encode_incident(inc: Incident) -> bytes:
    return json.dumps(inc.to_dict()).encode()


#: how deep an incident's or save fact's JSON may nest: the deepest ckptwatch writes is 5
#: (checkpoint_state: per-rank files' facts); deeper breaks the sink's alerts, ``incidents
#: show`` and the console's pages with RecursionError
JSON_DEPTH_MAX = 32


def _sane_json(doc: Any, what: str) -> None:
    """Raises DecodeError (``what``: e.g. ``ckptwatch incident``) when the decoded JSON
    ``doc`` nests deeper than :data:`JSON_DEPTH_MAX`, holds a string DuckDB cannot store
    (a lone surrogate: ``"\\ud800"``). Walks iteratively: the check itself cannot overflow
    the stack. (A number too large for its field is the field check's.)"""
    stack = [(doc, 0)]
    while stack:
        v, depth = stack.pop()
        if depth > JSON_DEPTH_MAX:
            raise DecodeError(f"not a {what}: nested deeper than {JSON_DEPTH_MAX} levels")
        if isinstance(v, dict):
            stack += [(k, depth + 1) for k in v]
            stack += [(x, depth + 1) for x in v.values()]
        elif isinstance(v, list):
            stack += [(x, depth + 1) for x in v]
        elif isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                raise DecodeError(f"not a {what}: a string with a lone surrogate: {_cut(repr(v))}") from None


def decode_incident(value: bytes | None) -> Incident:
    """One incidents-topic value as an Incident, every field checked (see
    :func:`check_incident`). Raises DecodeError naming what is wrong (a tombstone, not JSON,
    a field missing or of the wrong type)."""
    if value is None:
        raise DecodeError("a tombstone (no value), not an incident")
    try:
        d = json.loads(value)
    except (ValueError, TypeError):
        raise DecodeError(f"not JSON: {value[:80]!r}") from None
    except RecursionError:
        raise DecodeError(f"JSON nested too deep: {value[:80]!r}") from None
    _sane_json(d, "ckptwatch incident")
    try:
        inc = Incident.from_dict(d)
        check_incident(inc)
    except DecodeError:
        raise
    except KeyError as e:
        raise DecodeError(f"not a ckptwatch incident: no field {e}") from None
    except (ValueError, TypeError, AttributeError) as e:
        raise DecodeError(f"not a ckptwatch incident: {e}") from None
    except Exception as e:  # noqa: BLE001 -- the last guard: nothing a message holds stops a consumer
        raise DecodeError(f"not a ckptwatch incident: {type(e).__name__}: {e}") from None
    return inc


def _int(v: Any, bits: int = 64) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and -(1 << (bits - 1)) <= v < 1 << (bits - 1)


def _opt(ok: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or ok(v)


def _str(v: Any) -> bool:
    return isinstance(v, str)


def _time(v: Any) -> bool:
    """A UTC-aware time from 1970 to 2200, as an event's (see :data:`TS_END_NS`)."""
    return (isinstance(v, dt.datetime) and v.utcoffset() is not None
            and _EPOCH <= v < _EPOCH + dt.timedelta(microseconds=TS_END_NS // 1000))


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
#: field -> check, of an incident, its root cause and its evidence items: the types the
#: sink's tables and the detectors take
_INCIDENT_FIELDS: dict[str, Callable[[Any], bool]] = {
    "id": lambda v: _str(v) and _ID.fullmatch(v) is not None,
    "kind": lambda v: _str(v) and _KIND.fullmatch(v) is not None,
    "job": _opt(_str), "step": _opt(_int), "checkpoint_path": _opt(_str), "remediation": _str,
    "severity": lambda v: v in SEVERITIES, "status": lambda v: v in STATUSES,
    "first_ts": _time, "detected_ts": _opt(_time), "checkpoint_state": lambda v: isinstance(v, dict),
    "collateral": lambda v: isinstance(v, list) and all(_int(r, 32) for r in v),
    "last_good_checkpoint": _opt(lambda v: isinstance(v, dict) and _int(v.get("step"))  # always a step
                                 and _opt(_str)(v.get("path"))),
    "commands": lambda v: isinstance(v, list) and all(isinstance(c, dict) for c in v),
}
#: an incident id as a page names it (a URL path part, PagerDuty's dedup_key of at most 255
#: characters): ckptwatch's own are 16 hex digits
_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
#: an incident kind: a word of the detectors' (an unknown one is shown as it is)
_KIND = re.compile(r"[a-z][a-z0-9_]{0,63}")
_ROOT_FIELDS: dict[str, Callable[[Any], bool]] = {
    "cls": _str, "rank": _opt(lambda v: _int(v, 32)), "host": _opt(_str), "pid": _opt(_int), "ts": _opt(_time),
    "rule_id": _opt(_str), "line": _opt(_str), "signal": _opt(_str), "note": _str, "sender": _opt(_str),
}
_EVIDENCE_FIELDS: dict[str, Callable[[Any], bool]] = {
    "source_id": _str, "offset": _int, "ts": _time, "kind": _str, "rank": _opt(lambda v: _int(v, 32)),
    "host": _opt(_str), "rule_id": _str, "line": _str, "role": _str, "ts_source": _str,
}


def check_incident(inc: Incident) -> None:
    """Raises DecodeError naming the first field of ``inc`` (or of its root cause or an
    evidence item) whose value is not of its type: ids and kinds non-empty strings, steps
    64-bit integers, ranks 32-bit ones, times UTC from 1970 to 2200, ... (what the sink's
    tables and the detectors take)."""
    items = [("", inc, _INCIDENT_FIELDS)]
    if inc.root_cause is not None:
        items.append(("root_cause.", inc.root_cause, _ROOT_FIELDS))
    items += [(f"evidence[{i}].", e, _EVIDENCE_FIELDS) for i, e in enumerate(inc.evidence)]
    for prefix, obj, fields in items:
        for name, ok in fields.items():
            v = getattr(obj, name)
            if not ok(v):
                shown = name if prefix != "root_cause." or name != "cls" else "class"
                raise DecodeError(f"not a ckptwatch incident: field {prefix}{shown}: {_cut(repr(v))} is not of its type")
    for i, c in enumerate(inc.commands):  # what alerts and pages print: text, purpose and command always
        if (not isinstance(c, dict) or not all(isinstance(c.get(k), str) for k in ("purpose", "command"))
                or not all(isinstance(k, str) and (v is None or isinstance(v, str)) for k, v in c.items())):
            raise DecodeError(f"not a ckptwatch incident: field commands[{i}]: {_cut(repr(c))} is not an object of "
                              "strings with a purpose and a command")
    _check_state(inc.checkpoint_state)


#: checkpoint_state keys the reports read as lists of ranks (``finished``: ranks that wrote
#: their part, ...), and as counts
_STATE_RANKS = ("finished", "expected_ranks", "started_not_finished", "not_started")
_STATE_INTS = ("world_size",)


def _check_state(state: dict[str, Any]) -> None:
    """Raises DecodeError when a key of ``checkpoint_state`` that the reports read holds
    another type than the detectors write (a list of ranks, a count)."""
    for key in _STATE_RANKS:
        v = state.get(key)
        if v is not None and not (isinstance(v, list) and all(_int(r, 32) for r in v)):
            raise DecodeError(f"not a ckptwatch incident: field checkpoint_state.{key}: {_cut(repr(v))} is not a list "
                              "of ranks")
    for key in _STATE_INTS:
        v = state.get(key)
        if v is not None and not _int(v):
            raise DecodeError(f"not a ckptwatch incident: field checkpoint_state.{key}: {_cut(repr(v))} is not an "
                              "integer")


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


def decode_save_fact(value: bytes | None) -> SaveFact:
    """Inverse of :func:`encode_save_fact`. Raises DecodeError when the value is not a save
    fact (a tombstone, not JSON, a field missing or of the wrong type, a time not UTC)."""
    if value is None:
        raise DecodeError("a tombstone (no value), not a save fact")
    try:
        d = json.loads(value)
        _sane_json(d, "ckptwatch save fact")
        first = d["first_ts"]
        if not (d["path"] is None or isinstance(d["path"], str)):
            raise TypeError(f"path {_cut(repr(d['path']))} is not a string")
        fact = SaveFact(
            job=str(d["job"]), step=int(d["step"]), path=d["path"], complete=bool(d["complete"]),
            first_ts=dt.datetime.fromisoformat(first) if first else None,
            world_size=None if d["world_size"] is None else int(d["world_size"]),
            losses=tuple((dt.datetime.fromisoformat(ts), int(s), float(v)) for ts, s, v in d["losses"]),
            missing=tuple(int(r) for r in d.get("missing", ())),
        )
    except KeyError as e:
        raise DecodeError(f"not a ckptwatch save fact: no field {e}") from None
    except RecursionError:
        raise DecodeError("not a ckptwatch save fact: JSON nested too deep") from None
    except (ValueError, TypeError, AttributeError, OverflowError) as e:  # OverflowError: int(1e400)
        raise DecodeError(f"not a ckptwatch save fact: {e}") from None
    except DecodeError:
        raise
    except Exception as e:  # noqa: BLE001 -- the last guard: nothing a message holds stops a consumer
        raise DecodeError(f"not a ckptwatch save fact: {type(e).__name__}: {e}") from None
    times = [fact.first_ts] if fact.first_ts else []
    ints = [fact.step, *(s for _, s, _ in fact.losses), *fact.missing] + (
        [fact.world_size] if fact.world_size is not None else [])
    if not (all(_int(i) for i in ints) and all(_time(t) for t in times + [ts for ts, _, _ in fact.losses])):
        raise DecodeError(f"not a ckptwatch save fact: a step out of range or a time not UTC in 1970..2200: "
                          f"{_cut(repr(value))}")
    return fact


def decode_events_skipping(values: list[bytes | None]
                           ) -> tuple[pl.DataFrame, list[tuple[int, DecodeError]], list[int]]:
    """Like :func:`decode_event_messages`, but what is bad is left out instead of failing
    the batch: a value that is no batch of events whole, an event that fails a check (see
    the module docstring) alone, the other events of its value kept.

    Returns the frame of the events kept, ``(index in values, error)`` for each value with
    something left out (the error names the field and, in ``kept``, how many of its events
    were kept), and the events kept of each value (0 for one left out whole)."""
    bad: dict[int, DecodeError] = {}
    for i, v in enumerate(values):
        why = _unusable(v)
        if why:
            bad[i] = DecodeError(why)
    usable = [i for i in range(len(values)) if i not in bad]
    try:
        frame, sizes = _decode_values([values[i] for i in usable])  # type: ignore[misc]
        given = dict(zip(usable, sizes, strict=True))
    except DecodeError:  # one bad value: each on its own (only then, one parse each)
        frames, given = [], {}
        for i in usable:
            try:
                one, (given[i],) = _decode_values([values[i]])  # type: ignore[list-item]
            except DecodeError as e:
                bad[i] = e
                continue
            frames.append(one)
        frame = pl.concat(frames) if frames else pl.DataFrame(schema=EVENT_SCHEMA)
    counts = [given.get(i, 0) for i in range(len(values))]
    faulty = _faulty_rows(frame)
    if faulty.any():
        frame, counts = _reject_rows(frame, faulty, counts, bad)
    return frame, sorted(bad.items()), counts


def _reject_rows(frame: pl.DataFrame, faulty: pl.Series, counts: list[int],
                 bad: dict[int, DecodeError]) -> tuple[pl.DataFrame, list[int]]:
    """``frame`` without its ``faulty`` rows and the rows each value keeps; a DecodeError in
    ``bad`` for each value that lost some, naming how many and the first one's field."""
    starts = list(itertools.accumulate(counts, initial=0))
    message = pl.Series("_message", range(len(counts)), dtype=pl.Int64).repeat_by(
        pl.Series(counts, dtype=pl.UInt32)).explode()
    rows = (frame.with_columns(message, pl.col("ts").dt.epoch("ns").alias("_ns"), pl.int_range(pl.len()).alias("_row"))
            .filter(faulty))
    kept = list(counts)
    for (i,), group in rows.group_by("_message", maintain_order=True):
        row = group.row(0, named=True)
        kept[i] -= group.height
        bad[i] = DecodeError(f"{group.height} of {counts[i]} event(s) rejected; event {row['_row'] - starts[i]} "
                             f"(source_id {row['source_id']!r}, offset {row['offset']}): {_fault(row)}",
                             kept=kept[i])
    return frame.filter(~faulty), kept
