"""One-line integrity calls for training scripts; no torch or transformers needed to import.

::

    from ckptwatch.integrity.api import write_manifest, verify, guard_resume

    write_manifest("/ckpt/checkpoint-40")          # after a save: hashes every file, atomically
    guard_resume("/ckpt/checkpoint-40")            # before loading: raises ResumeRefused if not whole
    trainer.add_callback(ManifestCallback())       # Hugging Face Trainer: a manifest after each save
    dcp_save(state_dict, checkpoint_id="/ckpt/step_40", step=40)   # torch.distributed.checkpoint.save + manifest

Each call prints one structured line (:mod:`ckptwatch.integrity.logline`: ``save_start``,
``save_end``, ``integrity``, ``resume``) to stderr, or to ``emit`` when given (e.g. a
``logging`` logger's ``info``), which the rule pack ``05-ckptwatch.yaml`` reads exactly: the
pipeline then knows which saves finished, which checkpoints are corrupt
(``corrupt_checkpoint``) and which job resumed from what. Rank and world size default to
torchrun's ``RANK`` / ``WORLD_SIZE`` environment variables.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ckptwatch.integrity import manifest as manifest_mod
from ckptwatch.integrity import verify as verify_mod
from ckptwatch.integrity.findings import Verdict, worst
from ckptwatch.integrity.limits import Limits
from ckptwatch.integrity.logline import Emit, emit_to_stderr, format_line
from ckptwatch.integrity.manifest import Manifest, step_from_name
from ckptwatch.integrity.verify import Report

__all__ = ["ManifestCallback", "ResumeRefused", "dcp_save", "guard_resume", "verify", "write_manifest"]


class ResumeRefused(Exception):
    """:func:`guard_resume` found the checkpoint not whole. ``report`` is the full
    :class:`~ckptwatch.integrity.verify.Report`; the message names the verdict and the
    first bad files with their problems."""

    def __init__(self, report: Report) -> None:
        self.report = report
        bad = [f for f in report.files if f.verdict != "ok"]
        named = "; ".join(f"{f.path}: {', '.join(x.problem for x in f.findings) or f.verdict}" for f in bad[:5])
        named += f"; and {len(bad) - 5} more" if len(bad) > 5 else ""
        named += "".join(f"; {f.path} {f.problem}" for f in report.findings[:3])
        super().__init__(f"refusing to resume from {report.root}: {report.verdict}: {named or 'see ckptwatch verify'}")


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else None


def _who(rank: int | None, world_size: int | None) -> tuple[int | None, int | None]:
    return (_env_int("RANK") if rank is None else rank, _env_int("WORLD_SIZE") if world_size is None else world_size)


def _detail(report: Report) -> str | None:
    for f in report.files:
        if f.verdict != "ok" and f.findings:
            return f"{f.path}: {f.findings[0].problem}"
    return f"{report.findings[0].path}: {report.findings[0].problem}" if report.findings else None


def _integrity_line(path: Path, verdict: Verdict, *, step: int | None, rank: int | None, world_size: int | None,
                    files: int, nbytes: int, problems: int, manifest: bool, detail: str | None) -> str:
    return format_line("integrity", str(path), step=step, rank=rank, world_size=world_size, verdict=verdict,
                       files=files, bytes=nbytes, problems=problems, manifest="yes" if manifest else "no",
                       detail=detail)


def write_manifest(directory: str | os.PathLike[str], *, step: int | None = None, world_size: int | None = None,
                   rank: int | None = None, emit: Emit | None = None) -> Manifest:
    """Hash every file of the checkpoint ``directory`` and write ``ckptwatch-manifest.json``
    into it atomically (see :func:`ckptwatch.integrity.manifest.write_manifest`); print an
    ``integrity`` line with the structural verdict of what was written. ``step`` defaults
    to the number in the directory name (``checkpoint-40``, ``iter_0000040``).

    Returns the manifest. Raises :class:`~ckptwatch.integrity.errors.IntegrityError` when the
    directory cannot be listed or a file could not be hashed (a manifest only vouches for
    stable bytes)."""
    root = Path(directory).absolute()  # the pipeline matches checkpoints by path: relative ones would not meet
    rank, world_size = _who(rank, world_size)
    m, s = manifest_mod.create_manifest(root, world_size=world_size, step=step)
    verdicts: list[Verdict] = [sc.check.verdict for sc in s.files.values() if sc.check.checked]
    verdicts += [f.verdict for f in (*s.tree.findings, *s.tree_findings)]
    bad = [f"{rel}: {sc.check.findings[0].problem}" for rel, sc in s.files.items() if sc.check.findings]
    bad += [f"{f.path}: {f.problem}" for f in (*s.tree.findings, *s.tree_findings) if f.verdict != "ok"]
    (emit or emit_to_stderr)(_integrity_line(root, worst(verdicts), step=m.step, rank=rank, world_size=m.world_size,
                                             files=len(m.files), nbytes=m.total_bytes, problems=len(bad),
                                             manifest=True, detail=bad[0] if bad else None))
    return m


def verify(directory: str | os.PathLike[str], *, manifest: str | os.PathLike[str] | None = None,
           rank: int | None = None, emit: Emit | None = None, limits: Limits | None = None,
           stop: threading.Event | None = None) -> Report:
    """Verify the checkpoint ``directory`` (:func:`ckptwatch.integrity.verify.verify`: hashes
    against its manifest when there is one, and every structural check, bounded by
    ``limits``) and print an ``integrity`` line. Returns the
    :class:`~ckptwatch.integrity.verify.Report`.

    Raises :class:`~ckptwatch.integrity.errors.IntegrityError` when the directory cannot be
    listed, :class:`~ckptwatch.integrity.limits.Cancelled` (no line printed) once ``stop``
    is set; problems inside it are in the report."""
    report = verify_mod.verify(Path(directory).absolute(), manifest=manifest, limits=limits, stop=stop)
    rank, world_size = _who(rank, None)
    m = report.manifest
    step = m.step if m is not None and m.step is not None else step_from_name(Path(directory).name)
    problems = sum(1 for f in report.files if f.verdict != "ok") + sum(1 for f in report.findings if f.verdict != "ok")
    (emit or emit_to_stderr)(_integrity_line(
        report.root, report.verdict, step=step, rank=rank, world_size=m.world_size if m else world_size,
        files=report.total_files, nbytes=report.total_bytes, problems=problems, manifest=m is not None,
        detail=_detail(report)))
    return report


def guard_resume(directory: str | os.PathLike[str], *, allow_unverifiable: bool = False, rank: int | None = None,
                 world_size: int | None = None, emit: Emit | None = None) -> Report:
    """Verify the checkpoint before loading it; raise :class:`ResumeRefused` unless it is
    ``ok`` (or ``unverifiable`` with ``allow_unverifiable``: nothing could be checked, e.g.
    an unknown format and no manifest). On success prints a ``resume`` line naming the
    checkpoint, step, rank and world size of this (the resuming) job.

    Raises :class:`ResumeRefused` (the report attached) or
    :class:`~ckptwatch.integrity.errors.IntegrityError` (the directory cannot be listed)."""
    out = emit or emit_to_stderr
    report = verify(directory, rank=rank, emit=out)
    if report.verdict not in (("ok", "unverifiable") if allow_unverifiable else ("ok",)):
        raise ResumeRefused(report)
    rank, world_size = _who(rank, world_size)
    step = report.manifest.step if report.manifest is not None else step_from_name(Path(directory).name)
    out(format_line("resume", str(report.root), step=step, rank=rank, world_size=world_size, verdict=report.verdict))
    return report


class TrainerCallbackBase:
    """What a Hugging Face ``TrainerCallback``-compatible object needs without importing
    transformers: every ``on_*`` event it does not define is a no-op (the Trainer's
    ``CallbackHandler`` calls them all), and :meth:`_say` writes a one-line problem to
    ``self.emit`` (stderr by default) so that training goes on."""

    emit: Emit | None = None

    def _say(self, line: str) -> None:
        (self.emit or emit_to_stderr)(line)

    def __getattr__(self, name: str) -> Callable[..., None]:
        if name.startswith("on_"):
            return lambda *args, **kwargs: None
        raise AttributeError(name)


class ManifestCallback(TrainerCallbackBase):
    """A Hugging Face ``TrainerCallback``-compatible object (``trainer.add_callback(...)``):
    after each save, on the main process, writes the manifest of
    ``<output_dir>/checkpoint-<global_step>`` (the Trainer's layout) and prints its
    ``integrity`` line. Every other Trainer event is a no-op, so the Trainer's
    ``CallbackHandler`` can call any ``on_*`` method on it; transformers is not imported.
    A manifest that cannot be written is reported on stderr and training goes on."""

    def __init__(self, *, emit: Emit | None = None) -> None:
        self.emit = emit

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not getattr(state, "is_world_process_zero", True):
            return None
        directory = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        from ckptwatch.integrity.errors import IntegrityError

        try:
            write_manifest(directory, step=state.global_step, emit=self.emit)
        except IntegrityError as e:
            self._say(f"ckptwatch: no manifest for {directory}: {e}")
        return None


def dcp_save(state_dict: Mapping[str, Any], checkpoint_id: str | os.PathLike[str], *, step: int | None = None,
             rank: int | None = None, world_size: int | None = None, manifest: bool = True,
             save: Callable[..., Any] | None = None, emit: Emit | None = None, **save_kwargs: Any) -> Any:
    """``torch.distributed.checkpoint.save(state_dict, checkpoint_id=...)`` (or ``save``)
    between a ``save_start`` and a ``save_end`` line from every rank, so the pipeline knows
    which ranks finished the save; then, on rank 0, :func:`write_manifest` (DCP's ``save``
    returns on every rank once the coordinator wrote ``.metadata``). Returns what ``save``
    returns. An exception from ``save`` propagates, with no ``save_end``: that is what an
    interrupted save looks like in the logs."""
    out = emit or emit_to_stderr
    rank, world_size = _who(rank, world_size)
    path = str(Path(checkpoint_id).absolute())
    step = step if step is not None else step_from_name(Path(path).name)
    if save is None:
        from torch.distributed.checkpoint import save  # type: ignore[import-not-found, no-redef]
    out(format_line("save_start", path, step=step, rank=rank, world_size=world_size))
    result = save(state_dict, checkpoint_id=checkpoint_id, **save_kwargs)
    out(format_line("save_end", path, step=step, rank=rank, world_size=world_size))
    if manifest and (rank or 0) == 0:
        write_manifest(path, step=step, world_size=world_size, rank=rank, emit=out)
    return result
