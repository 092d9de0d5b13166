"""JSON from a checkpoint, parsed only when its structure fits the limits (counted before parsing).

CPython's ``json`` builds the whole document at once, and the document decides how much it
builds: 30 MB of ``[],`` is ten million lists (about 600 MB), 60 MB of safetensors header a
million tensor objects (about 1 GB). So before parsing, :func:`check_shape` counts on the raw
bytes (``bytes.count``, C speed, no objects built) the opening brackets ``{`` / ``[``
(at least the number of objects and arrays) and the commas (at least the number of values
minus one per container); over :attr:`Limits.max_json_containers` or
:attr:`Limits.max_json_items` the document is not parsed and the caller reports
``limit_exceeded``. Brackets and commas inside strings are counted too (an over-count:
only a document with millions of them inside strings is refused needlessly).

Worst case after the check, per document: 1,000,000 containers (about 64-230 bytes each) and
8,000,000 values (8-32 bytes each): a few hundred MB, against gigabytes before.
JSON: RFC 8259.
"""

from __future__ import annotations

import json
from typing import Any

from ckptwatch.integrity.limits import Limits


class JsonLimitError(ValueError):
    """The document is over a limit (the message names it, as ``name=value``); not parsed."""


def check_shape(raw: bytes, limits: Limits, what: str = "the JSON") -> None:
    """Raise :class:`JsonLimitError` when ``raw`` (UTF-8 JSON bytes) is larger than
    ``max_json_bytes`` or holds more brackets / commas than the container / item limits."""
    if len(raw) > limits.max_json_bytes:
        raise JsonLimitError(f"{what} is {len(raw):,} bytes, more than the limit max_json_bytes="
                             f"{limits.max_json_bytes}: not parsed")
    containers = raw.count(b"{") + raw.count(b"[")
    if containers > limits.max_json_containers:
        raise JsonLimitError(f"{what} opens {containers:,} JSON objects/arrays, more than the limit "
                             f"max_json_containers={limits.max_json_containers}: not parsed")
    items = raw.count(b",")
    if items > limits.max_json_items:
        raise JsonLimitError(f"{what} holds {items:,} JSON values, more than the limit "
                             f"max_json_items={limits.max_json_items}: not parsed")


def loads(raw: bytes, limits: Limits, what: str = "the JSON", **kwargs: Any) -> Any:
    """``json.loads(raw.decode("utf-8"), **kwargs)`` after :func:`check_shape`. Raises
    :class:`JsonLimitError`, ``UnicodeDecodeError``, ``json.JSONDecodeError`` / ``ValueError``
    (e.g. an integer of over 4,300 digits) or ``RecursionError`` (absurd nesting)."""
    check_shape(raw, limits, what)
    return json.loads(raw.decode("utf-8"), **kwargs)
