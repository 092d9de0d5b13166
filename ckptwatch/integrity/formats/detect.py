"""Which format a checkpoint file is, from its name and first bytes (never the whole file).

Names first (they are unambiguous): ``.metadata`` (DCP), ``__R_I.distcp`` (DCP shard),
``*.index.json`` (Hugging Face index), ``latest`` (DeepSpeed), ``latest_checkpointed_iteration.txt``
(Megatron-LM). Then magic bytes:

* ``PK\\x03\\x04`` (a zip local header, PKWARE APPNOTE 4.3.7): ``torch_zip`` when a member
  is ``<folder>/data.pkl`` (torch writes it first; otherwise the central directory is
  consulted), else ``zip``;
* ``\\x80\\x02\\x8a\\x0a`` + torch's magic number: ``torch_legacy``;
* a pickle ``PROTO`` opcode (``\\x80`` and protocol 2-5), or the name ``*.pkl`` /
  ``*.pickle``: ``pickle`` (read inertly: whoever resumes may ``pickle.load`` it);
* 8-byte little-endian length N then ``{``, with N inside the file: ``safetensors``;

Otherwise the extension decides: ``*.json`` is ``json``; ``.safetensors`` is
``safetensors``; ``.pt`` / ``.pth`` / ``.ckpt`` (and ``.bin`` when too short to tell, e.g.
empty) are ``torch_zip``, the format ``torch.save`` writes by default, so that a file whose
first bytes are damaged is checked (and found corrupt) rather than called unknown.
"""

from __future__ import annotations

import os
import stat
import struct
from pathlib import Path
from typing import BinaryIO

from ckptwatch.integrity.formats import zipcheck
from ckptwatch.integrity.formats.dcp import METADATA_NAME, SHARD_RE
from ckptwatch.integrity.formats.deepspeed import LATEST_NAME
from ckptwatch.integrity.formats.megatron import TRACKER_NAME
from ckptwatch.integrity.formats.pickle_file import EXTENSIONS as PICKLE_EXT
from ckptwatch.integrity.formats.pickle_file import looks_like_pickle
from ckptwatch.integrity.formats.safetensors import MAX_HEADER
from ckptwatch.integrity.formats.torch_legacy import MAGIC_PREFIX

#: Every value :func:`detect_format` returns.
FORMATS = ("torch_zip", "zip", "torch_legacy", "pickle", "safetensors", "dcp_metadata", "dcp_shard", "hf_index",
           "deepspeed_latest", "megatron_tracker", "json", "unknown")
_TORCH_EXT = (".pt", ".pth", ".bin", ".ckpt")
#: Extensions that are torch.save files whatever their first bytes say (damaged magic bytes
#: must not make a checkpoint "unknown"); ``.bin`` is too generic for that.
_TORCH_ONLY_EXT = (".pt", ".pth", ".ckpt")


def by_name(name: str) -> str | None:
    """The format a file name alone implies, or None."""
    if name == METADATA_NAME:
        return "dcp_metadata"
    if SHARD_RE.match(name) or name.endswith(".distcp"):
        return "dcp_shard"
    if name.endswith(".index.json"):
        return "hf_index"
    if name == LATEST_NAME:
        return "deepspeed_latest"
    if name == TRACKER_NAME:
        return "megatron_tracker"
    return None


def guess_by_name(name: str) -> str:
    """The format a file name suggests when its bytes cannot be read."""
    return by_name(name) or _by_extension(name)


def _by_extension(name: str) -> str:
    if name.endswith(PICKLE_EXT):
        return "pickle"
    if name.endswith(".safetensors"):
        return "safetensors"
    if name.endswith(_TORCH_EXT):
        return "torch_zip"
    if name.endswith(".json"):
        return "json"
    return "unknown"


def detect_format(path: Path) -> str:
    """The format of the file at ``path`` (one of :data:`FORMATS`).

    Reads at most the first 64 bytes, the first zip local header's name and, for a zip
    whose first member is not ``data.pkl``, its central directory. Never raises and never
    opens anything but a regular file: a file that cannot be read, or is not regular (a
    FIFO would block), is judged by its name.
    """
    path = Path(path)
    name = path.name
    named = by_name(name)
    if named is not None:
        return named
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return _by_extension(name)  # never open a FIFO or device: it may block or have no end
        with open(path, "rb") as f:
            return detect_file(name, f, os.fstat(f.fileno()).st_size)
    except OSError:
        return _by_extension(name)


def detect_file(name: str, f: BinaryIO, size: int) -> str:
    """The format of the open regular file ``f`` of ``size`` bytes named ``name`` (one of
    :data:`FORMATS`), from its name and first bytes (see the module docstring). ``OSError``
    propagates."""
    named = by_name(name)
    if named is not None:
        return named
    f.seek(0)
    head = f.read(64)
    if head[:4] == zipcheck.LOCAL_SIG:
        return "torch_zip" if _has_data_pkl(f, head, size) else "zip"
    if head.startswith(MAGIC_PREFIX):
        return "torch_legacy"
    if name.endswith(PICKLE_EXT) or looks_like_pickle(head):
        return "pickle"
    if len(head) >= 9 and head[8:9] == b"{":
        n = struct.unpack("<Q", head[:8])[0]
        if n <= MAX_HEADER and (8 + n <= size or name.endswith(".safetensors")):
            return "safetensors"
    if len(head) < 9:
        return _by_extension(name)
    if name.endswith(_TORCH_ONLY_EXT):
        return "torch_zip"
    return _by_extension(name) if name.endswith((".safetensors", ".json")) else "unknown"


def _has_data_pkl(f, head: bytes, size: int) -> bool:
    nlen = struct.unpack_from("<H", head, 26)[0] if len(head) >= 30 else 0
    f.seek(30)
    first = f.read(nlen)
    if first.endswith(b"/data.pkl"):
        return True
    try:
        eocd = zipcheck.find_tail_eocd(f, 0, size)
        return eocd is not None and any(n.endswith("/data.pkl") for n in zipcheck.member_names(f, eocd))
    except zipcheck.CentralDirectoryError:
        return False
