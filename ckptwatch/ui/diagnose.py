"""The console's "diagnose a log" page, without the web: uploaded or pasted text checked,
spooled to a private temporary directory, read by :func:`ckptwatch.pipeline.diagnose`
exactly as ``ckptwatch diagnose`` reads files, and turned into what the page shows (the
report text, each incident with its timeline as SVG), redacted like every other output
(:mod:`ckptwatch.sinks.redact`). Nothing leaves the machine.

What one request may cost is bounded (:class:`Limits`): the bytes sent (Flask's
``MAX_CONTENT_LENGTH``), the bytes and lines after ``.gz`` files are unpacked (unpacked
here, with a cap, before anything reads them), and the CPU seconds of the reading, which
runs in a child process (``multiprocessing``'s forkserver, with the pipeline preloaded)
under ``RLIMIT_CPU`` and is killed when the client leaves or the wall-clock deadline
passes. The console takes a bounded number of diagnoses at once (its caller holds a
semaphore of :attr:`Limits.concurrent`).
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import signal
import tempfile
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ckptwatch.detectors.incident import Incident
from ckptwatch.history import plot, timeline
from ckptwatch.history.cli import report_text
from ckptwatch.pipeline import PipelineOptions, diagnose
from ckptwatch.private_files import open_private
from ckptwatch.sinks.redact import Redactor

#: bytes of one request at most (pasted text and files together)
MAX_UPLOAD = 64 << 20
#: bytes at the start of a file looked at to tell text from binary
SNIFF = 8192


@dataclass(frozen=True)
class Limits:
    """What one diagnosis may cost. ``text_bytes``: bytes of all inputs after unpacking;
    ``lines``: newline-ended lines of all inputs; ``cpu_s``: CPU seconds of the reading
    (the child's ``RLIMIT_CPU``); ``wall_s``: seconds before the child is killed whatever
    it did; ``concurrent``: diagnoses at once per console (more get 503)."""

    text_bytes: int = 4 * MAX_UPLOAD
    lines: int = 4_000_000
    cpu_s: int = 60
    wall_s: float = 120.0
    concurrent: int = 2


class Cancelled(Exception):  # noqa: N818  (a state, not a failure)
    """The client left before the diagnosis ended: its child was killed."""


class UploadError(ValueError):
    """Nothing to read in what was sent; the message says why, for the user (the page and
    the API show it). Raises ValueError when made without a message."""

    def __init__(self, message: str) -> None:
        if not message.strip():
            raise ValueError("an UploadError says why, for the user: its message is empty")
        super().__init__(message)


@dataclass
class Upload:
    """One piece of input: a file's name (as the browser gave it) and its bytes."""

    name: str
    data: bytes


@dataclass
class Diagnosis:
    """What a diagnosis found: ``incidents`` (``diagnose`` order), their ``report`` (the
    text ``diagnose`` prints), one SVG timeline per incident, the files read and the
    files refused (``name``: why), and the read's stats (``diagnose --json``'s)."""

    incidents: list[Incident]
    report: str
    svgs: list[str]
    read: list[str]
    refused: dict[str, str] = field(default_factory=dict)
    stats: dict = field(default_factory=dict)


def refusal(upload: Upload) -> str | None:
    """Why ``upload`` cannot be a log (empty, or binary and not gzip), or None."""
    if not upload.data.strip():
        return "empty"
    head = upload.data[:SNIFF]
    if head[:2] == b"\x1f\x8b":
        return None  # a gzipped log: read as such
    if b"\x00" in head:
        return "binary, not a text log (a checkpoint or an archive? ckptwatch verify checks checkpoints)"
    return None


def _spool_name(name: str, taken: set[str]) -> str:
    """Where ``name``'s text goes in the spool, relative to it: safe (no directory part, so
    no ``..``; letters, digits and ``._-`` only, at most 120 of them; never hidden), unique
    (a name already ``taken`` goes in a numbered subdirectory, ``2/console.log``), and the
    upload's own file name otherwise, so the labels a name gives (``rank3.log``,
    ``console.log``, ``slurm-123.out``) hold. Less ``.gz``: the text is unpacked already,
    and the pipeline reads a ``.gz`` name through gzip. Any other suffix stays: the
    pipeline is given each file by path, which it reads whatever its suffix."""
    base = os.path.basename(name.replace("\\", "/"))
    base = "".join(c if c.isalnum() or c in "._-" else "_" for c in base)[:120]
    while base.lower().endswith(".gz"):
        base = base[:-3]
    if not base.strip("."):
        base = "pasted.log"
    if base.startswith("."):
        base = "_" + base
    out, n = base, 1  # ``taken`` holds the paths given and their subdirectories (``2/``)
    while out in taken or (f"{out}/" in taken if n == 1 else str(n) in taken):
        n += 1
        out = f"{n}/{base}"
    taken.update((out, f"{n}/") if n > 1 else (out,))
    return out


def _unpack(u: Upload, room: int) -> bytes | None:
    """The text of ``u``: its bytes, or a gzip's unpacked bytes; None when that is more
    than ``room`` bytes (unpacking stops there: a bomb costs ``room`` bytes, not its size).
    Raises :class:`UploadError` for a gzip that cannot be read."""
    if u.data[:2] != b"\x1f\x8b":
        return u.data if len(u.data) <= room else None
    d = zlib.decompressobj(wbits=31)
    out = bytearray()
    data = u.data
    try:
        while data and len(out) <= room:
            out += d.decompress(data, room + 1 - len(out))
            data = d.unconsumed_tail or (d.unused_data if d.eof and d.unused_data[:2] == b"\x1f\x8b" else b"")
            if d.eof and data:  # a concatenated gzip member
                d = zlib.decompressobj(wbits=31)
    except zlib.error as e:
        raise UploadError(f"{u.name}: not a readable gzip file ({e})") from None
    return bytes(out) if len(out) <= room else None


def prepare(uploads: Sequence[Upload], spool: str, limits: Limits,
            redact: Callable[[str], str] = str) -> tuple[list[str], dict[str, str]]:
    """Write what can be read of ``uploads`` into the private directory ``spool`` (gzips
    unpacked, files ``0600``); returns the names written (paths relative to ``spool``, see
    :func:`_spool_name`) and the uploads refused (``name``: why), every name as ``redact``
    leaves it (a file name can hold a secret too). Raises
    :class:`UploadError` when nothing was sent, more than :data:`MAX_UPLOAD` bytes, more
    than ``limits`` allow once unpacked, or nothing readable."""
    if not uploads:
        raise UploadError("nothing to diagnose: paste a log or drop log files")
    total = sum(len(u.data) for u in uploads)
    if total > MAX_UPLOAD:
        raise UploadError(f"{total / 2**20:.1f} MiB sent: at most {MAX_UPLOAD >> 20} MiB here; for bigger logs "
                          "run ckptwatch diagnose on them")
    refused: dict[str, str] = {}
    taken: set[str] = set()
    names: list[str] = []
    room, lines = limits.text_bytes, 0
    for u in uploads:
        u = Upload(redact(u.name), u.data)
        why = refusal(u)
        if why:
            refused[u.name] = why
            continue
        text = _unpack(u, room)
        if text is None:
            raise UploadError(f"more than {limits.text_bytes >> 20} MiB of text once unpacked: at most that here; "
                              "for bigger logs run ckptwatch diagnose on them")
        if text[:2] == b"\x1f\x8b":  # unpacked by the pipeline, it would escape these caps
            raise UploadError(f"{u.name}: a gzip inside a gzip: unpack it once and send that")
        room -= len(text)
        lines += text.count(b"\n")
        if lines > limits.lines:
            raise UploadError(f"more than {limits.lines:,} lines: at most that here; for bigger logs run "
                              "ckptwatch diagnose on them")
        name = _spool_name(u.name, taken)
        if os.path.dirname(name):
            os.makedirs(os.path.join(spool, os.path.dirname(name)), mode=0o700, exist_ok=True)
        with open(open_private(os.path.join(spool, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL), "wb") as f:
            f.write(text)
        names.append(name)
    if not names:
        raise UploadError("nothing readable: " + "; ".join(f"{n}: {w}" for n, w in refused.items()))
    return names, refused


def diagnose_spool(spool: str, names: list[str], refused: dict[str, str], redactor: Redactor) -> Diagnosis:
    """Read the files ``names`` of ``spool`` (paths relative to it) as ``ckptwatch diagnose``
    reads files named one by one (each read whatever its suffix), and build the page's
    :class:`Diagnosis` from what it found, redacted. Raises :class:`UploadError` when no
    line was read."""
    incidents, stats = diagnose([os.path.join(spool, n) for n in sorted(names)], PipelineOptions())
    if stats.lines == 0:
        raise UploadError("no line to read in what was sent")
    incidents = [redactor.incident(inc) for inc in incidents]
    svgs = [plot.svg(timeline.build_timeline(None, inc).redacted(redactor)) for inc in incidents]
    doc = stats.to_dict()
    doc["errors"] = [redactor.redact(m.replace(spool + os.sep, "")) for m in stats.errors]
    text = "".join(report_text(inc) for inc in incidents) if incidents else "No incident found.\n"
    return Diagnosis(incidents, text, svgs, names, refused, doc)


def _child(conn, spool: str, names: list[str], refused: dict[str, str],  # noqa: ANN001  (a Connection)
           redactor: Redactor, cpu_s: int) -> None:
    """In the child: cap its CPU, diagnose, send back ``("ok", Diagnosis)`` or ``("error", message)``."""
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 5))
    try:
        conn.send(("ok", diagnose_spool(spool, names, refused, redactor)))
    except UploadError as e:
        conn.send(("error", str(e)))
    except Exception as e:  # noqa: BLE001  (said on the page, in one line)
        conn.send(("error", f"the diagnosis failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"))
    finally:
        conn.close()


def _context() -> multiprocessing.context.BaseContext:
    """The forkserver context, the pipeline preloaded in its server (a fork of it is ready
    in milliseconds, and forking the console's threaded process is avoided)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["ckptwatch.ui.diagnose"])
    return ctx


def run_diagnosis(uploads: Sequence[Upload], *, redactor: Redactor | None = None, limits: Limits | None = None,
                  client_gone: Callable[[], bool] | None = None, isolate: bool = True) -> Diagnosis:
    """Diagnose ``uploads`` as ``ckptwatch diagnose`` would the same files named one by one,
    side by side in one directory (each file's labels from its name and lines), within
    ``limits``, redacted with ``redactor`` (default: the packaged patterns).

    ``isolate``: read in a child process (see the module docstring); ``client_gone`` is
    asked every 0.2 s meanwhile and a True kills the child (raises :class:`Cancelled`).
    Raises :class:`UploadError` when nothing sent can be read (none, all empty or binary,
    over a limit, no line read) or the reading took more than ``limits.cpu_s`` CPU seconds
    or ``limits.wall_s`` seconds."""
    limits = limits or Limits()
    redactor = redactor or Redactor.load()
    with tempfile.TemporaryDirectory(prefix="ckptwatch-ui-") as spool:
        os.chmod(spool, 0o700)
        names, refused = prepare(uploads, spool, limits, redactor.redact)
        if not isolate:
            return diagnose_spool(spool, names, refused, redactor)
        ctx = _context()
        recv, send = ctx.Pipe(duplex=False)
        child = ctx.Process(target=_child, args=(send, spool, names, refused, redactor, limits.cpu_s),
                            name="ckptwatch-diagnose", daemon=True)
        child.start()
        send.close()
        deadline = time.monotonic() + limits.wall_s
        try:
            while not recv.poll(0.2):  # an answer, or the child's end (EOF)
                if client_gone is not None and client_gone():
                    raise Cancelled()
                if time.monotonic() > deadline:
                    raise UploadError(f"reading it took more than {limits.wall_s:.0f} s: at most that here; "
                                      "run ckptwatch diagnose on these logs")
            try:
                status, value = recv.recv()
            except EOFError:  # it died without answering: killed by its CPU limit, or it crashed
                child.join(5)
                if -(child.exitcode or 0) in (signal.SIGXCPU, signal.SIGKILL):
                    raise UploadError(f"reading it took more than {limits.cpu_s} s of CPU: at most that here; "
                                      "run ckptwatch diagnose on these logs") from None
                raise UploadError(f"the diagnosis ended without an answer (exit {child.exitcode})") from None
        finally:
            recv.close()
            if child.is_alive():
                child.kill()
            child.join(5)
    if status == "error":
        raise UploadError(value)
    return value
