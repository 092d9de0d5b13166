"""Errors of the integrity commands: one message each, naming the path and the reason."""

from __future__ import annotations


class IntegrityError(Exception):
    """A checkpoint directory or manifest that cannot be checked at all (it does not exist,
    is not a directory, cannot be listed, cannot be written). The message names the path and
    the reason in one line; the CLI prints it and exits 2. Problems *inside* a checkpoint
    are never raised: they are findings."""


class ManifestError(IntegrityError):
    """A manifest that cannot be read (damaged JSON, a missing or ill-typed field, a newer
    format version) or written. The message names the file, and the field where one is at fault."""


class ManifestPathEscape(ManifestError):
    """A manifest listing a path that is absolute or climbs out of the checkpoint with ``..``
    (``verify`` reports it as the finding ``path_escape`` and compares nothing)."""
