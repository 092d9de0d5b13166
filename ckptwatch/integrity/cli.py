"""Command line of the integrity checks: ``ckptwatch manifest`` and ``ckptwatch verify``.

    ckptwatch manifest DIR [--world-size N] [--step N] [--limit NAME=VALUE ...]   # write DIR/ckptwatch-manifest.json
    ckptwatch manifest diff A B [--json] [--rehash]       # A, B: checkpoint dirs or manifest files
    ckptwatch verify DIR [--manifest PATH] [--json] [--all] [--workers N] [--limit NAME=VALUE ...]

Exit codes: ``manifest`` 0 written, 1 written but the checkpoint already fails a check
(printed), 2 not written (usage or input error, a file unreadable or changing while
hashed). ``manifest diff`` 0 same, 1 differ, 2 usage or input error. ``verify`` 0 ok, 1 a
problem (incomplete, corrupt, unverifiable), 2 usage or input error (directory missing,
not a directory, unreadable; a ``--manifest`` that cannot be read). Errors are one line
naming the path and the reason, never a traceback; 130 when interrupted.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

if TYPE_CHECKING:
    from ckptwatch.integrity.findings import Finding
    from ckptwatch.integrity.manifest import Manifest
    from ckptwatch.integrity.tree import Tree
    from ckptwatch.integrity.verify import Report

#: Below this many bytes no progress bar is drawn (it would only flicker).
PROGRESS_MIN_BYTES = 64 << 20

_err = Console(stderr=True, emoji=False, highlight=False)
_HASHED_NOW = "hashed now"  # the tool of a diff operand's in-memory manifest
_STYLE = {"ok": "green", "unverifiable": "yellow", "incomplete": "red", "corrupt": "bold red"}


class _DirOrCommand(TyperGroup):
    """A group whose first argument is either a subcommand name or, for the default
    subcommand ``create``, the checkpoint directory itself (``manifest DIR``)."""

    default = "create"

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = [self.default, *args]
        return super().parse_args(ctx, args)


manifest_app = typer.Typer(
    cls=_DirOrCommand, no_args_is_help=True, add_completion=False,
    help="SHA-256 manifests of checkpoint directories.\n\n"
         "ckptwatch manifest DIR [--world-size N] [--step N]: hash every file of the checkpoint DIR and write "
         "DIR/ckptwatch-manifest.json atomically (run it after each save; verify compares against it). "
         "Exit 0 written, 1 written but a structural check already fails, 2 not written.\n\n"
         "ckptwatch manifest diff A B: the files that differ between two checkpoints (directories, using "
         "their manifest or hashing them now, or manifest files). Exit 0 same, 1 differ, 2 usage error.\n\n"
         "(A directory named like a subcommand: ckptwatch manifest create ./diff.)")


_LIMIT_HELP = ("Raise or lower a bound on the work (repeatable; k/M/G suffixes): max_zip_entries, inflate_ratio, "
               "inflate_floor, max_member_inflated, max_total_inflated, max_tensors, max_json_bytes, "
               "max_json_containers, max_json_items, max_pickle_bytes. Past one: limit_exceeded (unverifiable).")


def _limits(assignments: list[str] | None) -> Any:
    """:class:`~ckptwatch.integrity.limits.Limits` with ``--limit`` applied (a usage error otherwise)."""
    from ckptwatch.integrity.limits import Limits

    try:
        return Limits().replace(assignments or [])
    except ValueError as e:
        raise _fail(f"--limit {e}") from None


def _fail(msg: str, code: int = 2) -> typer.Exit:
    """Print ``msg`` as the one-line error of every ckptwatch command; the exit to raise."""
    _err.print(f"[red]error:[/red] {escape(msg)}", soft_wrap=True)
    return typer.Exit(code)


def _info(msg: str) -> None:
    _err.print(f"[dim]{escape(msg)}[/dim]", soft_wrap=True)


@contextmanager
def _progress(label: str) -> Iterator[tuple[Callable[[int], None], Callable[[Tree], None]]]:
    """``(progress, on_listed)`` callbacks drawing a rich progress bar on stderr, only when stderr
    is a terminal and the checkpoint holds at least :data:`PROGRESS_MIN_BYTES`."""
    from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                               TransferSpeedColumn)

    state: dict[str, Any] = {}

    def on_listed(tree: Tree) -> None:
        if _err.is_terminal and tree.total_bytes >= PROGRESS_MIN_BYTES:
            bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                           TimeRemainingColumn(), console=_err, transient=True)
            state["task"] = bar.add_task(f"{label} {len(tree.files)} files", total=tree.total_bytes)
            bar.start()
            state["bar"] = bar

    def progress(n: int) -> None:
        bar = state.get("bar")
        if bar is not None:
            bar.advance(state["task"], n)

    try:
        yield progress, on_listed
    finally:
        if "bar" in state:
            state["bar"].stop()


def _size(n: int) -> str:
    return f"{n:,} bytes"


def _manifest_summary(m: Manifest) -> str:
    bits = [f"{len(m.files)} files", _size(m.total_bytes)]
    bits.append(f"step {m.step}" if m.step is not None else "step unknown")
    if m.world_size is not None:
        bits.append(f"world size {m.world_size} ({m.world_size_source})")
    else:
        bits.append("world size unknown (pass --world-size)")
    return ", ".join(bits)


@manifest_app.command("create")
def manifest_create(
    directory: Annotated[str, typer.Argument(metavar="DIR", help="The checkpoint directory (after its save "
                                                                   "has finished).")],
    world_size: Annotated[int | None, typer.Option("--world-size", min=1, help="World size of the job that "
                                                   "wrote it (default: from DCP .metadata or shard/rank files).")] = None,
    step: Annotated[int | None, typer.Option("--step", min=0, help="Training step (default: from the directory "
                                             "name: checkpoint-40, iter_0000040, global_step40, step_0000040).")] = None,
    workers: Annotated[int | None, typer.Option("--workers", min=1, help="Hashing threads (default: one per core).")] = None,
    limit: Annotated[list[str] | None, typer.Option("--limit", metavar="NAME=VALUE", help=_LIMIT_HELP)] = None,
) -> None:
    """Hash every file of DIR and write DIR/ckptwatch-manifest.json (atomically)."""
    from ckptwatch.integrity.errors import IntegrityError
    from ckptwatch.integrity.manifest import create_manifest, manifest_path

    limits = _limits(limit)
    try:
        with _progress("hashing") as (progress, on_listed):
            m, s = create_manifest(directory, world_size=world_size, step=step, workers=workers, progress=progress,
                                   on_listed=on_listed, limits=limits)
    except IntegrityError as e:
        raise _fail(str(e)) from None
    except KeyboardInterrupt:
        raise _fail("interrupted: no manifest written", 130) from None
    problems = [f for f in s.tree.findings + [f for sc in s.files.values() for f in sc.check.findings]
                + s.tree_findings if f.verdict != "ok"]
    for f in problems:
        _err.print(f"[yellow]warning:[/yellow] [{_STYLE[f.verdict]}]{f.verdict}[/] {escape(f.path)}: "
                   f"{escape(f.problem)}: {escape(f.detail)}", soft_wrap=True)
    Console(emoji=False, highlight=False, soft_wrap=True).print(
        escape(f"wrote {manifest_path(s.root)}: {_manifest_summary(m)}; {s.seconds:.2f} s"))
    if problems:
        _err.print(f"[yellow]the checkpoint already fails {len(problems)} check(s): the manifest records it as it "
                   "is; do not rely on it to resume[/yellow]", soft_wrap=True)
        raise typer.Exit(1)


def _load_side(arg: Path, label: str, workers: int | None, rehash: bool = False) -> Manifest:
    """A diff operand: a manifest file, a directory's manifest, or a directory hashed now
    (``rehash``: always, its manifest ignored; a manifest file stands for its directory)."""
    from ckptwatch.integrity.errors import IntegrityError
    from ckptwatch.integrity.manifest import create_manifest, is_manifest_file, manifest_path, read_manifest

    try:
        if rehash and arg.is_file() and is_manifest_file(arg.name):
            arg = arg.parent
        if rehash and not arg.is_dir():
            raise _fail(f"{arg}: --rehash compares the bytes on disk: give a checkpoint directory")
        if arg.is_dir() and (rehash or not manifest_path(arg).exists()):
            why = "--rehash" if rehash else f"no {manifest_path(arg).name}"
            _info(f"{label} {arg}: {why}: hashing its files now")
            with _progress(f"hashing {label}") as (progress, on_listed):
                m = create_manifest(arg, workers=workers, progress=progress, on_listed=on_listed, write=False)[0]
                return dataclasses.replace(m, tool=_HASHED_NOW)
        if not arg.exists():
            raise _fail(f"{arg}: does not exist")
        return read_manifest(arg)
    except IntegrityError as e:
        raise _fail(str(e)) from None
    except OSError as e:  # e.g. a directory that cannot be listed
        raise _fail(f"{arg}: cannot read: {e.strerror or e}") from None


@manifest_app.command("diff")
def manifest_diff(
    a: Annotated[str, typer.Argument(metavar="A", help="Checkpoint directory or manifest file.")],
    b: Annotated[str, typer.Argument(metavar="B", help="Checkpoint directory or manifest file.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON: same, added, removed, size_changed, "
                                          "hash_changed.")] = False,
    workers: Annotated[int | None, typer.Option("--workers", min=1, help="Hashing threads for a directory "
                                                "without a manifest.")] = None,
    rehash: Annotated[bool, typer.Option("--rehash", help="Hash the bytes on disk now, whatever manifests the "
                                         "directories hold (a damaged copy carrying a copied manifest then differs).")]
    = False,
) -> None:
    """Files that differ between checkpoints A and B: added, removed, size or SHA-256 changed.

    A directory stands for its ckptwatch-manifest.json, or, without one, for its files
    hashed now; with --rehash, always for its files hashed now. Exit 0: same; 1: they
    differ; 2: usage or input error.
    """
    from ckptwatch.integrity.manifest import diff

    try:
        ma, mb = _load_side(Path(a), "A", workers, rehash), _load_side(Path(b), "B", workers, rehash)
    except KeyboardInterrupt:
        raise _fail("interrupted", 130) from None
    d = diff(ma, mb)
    if as_json:
        sys.stdout.write(json.dumps(d.to_json(), indent=1) + "\n")
        raise typer.Exit(0 if d.same else 1)
    out = Console(emoji=False, highlight=False, soft_wrap=True)
    for p in d.hash_changed:
        out.print(f"[red]hash changed[/red]  {escape(p)}  ({_size(ma.files[p].size)}, sha256 "
                  f"{ma.files[p].sha256[:12]}... -> {mb.files[p].sha256[:12]}...)")
    for p, x, y in d.size_changed:
        out.print(f"[red]size changed[/red]  {escape(p)}  {x:,} -> {y:,} bytes")
    for p in d.removed:
        out.print(f"[yellow]only in A[/yellow]     {escape(p)}")
    for p in d.added:
        out.print(f"[yellow]only in B[/yellow]     {escape(p)}")
    sides = "; ".join(f"{label}: {m.checkpoint} (step {'unknown' if m.step is None else m.step}, "
                      + ("hashed now)" if m.tool == _HASHED_NOW else f"manifest written {m.created})")
                      for label, m in (("A", ma), ("B", mb)))
    if d.same:
        out.print(escape(f"same: {len(ma.files)} files, {_size(ma.total_bytes)}, identical sizes and SHA-256. {sides}"))
        return
    n = len(d.hash_changed) + len(d.size_changed) + len(d.removed) + len(d.added)
    out.print(escape(f"differ: {n} of {len(set(ma.files) | set(mb.files))} files. {sides}"))
    raise typer.Exit(1)


def _finding_line(f: Finding) -> str:
    label = "note" if f.verdict == "ok" else f.verdict
    style = "dim" if f.verdict == "ok" else _STYLE[f.verdict]
    return f"[{style}]{label:<12}[/] {escape(f.path)}  {escape(f.problem)}: {escape(f.detail)}"


def render_text(report: Report, console: Console, *, show_all: bool = False) -> None:
    """The verify report for people: one line per finding, worst first (every file first with
    ``show_all``), then the overall verdict with counts, totals and the manifest compared with."""
    from ckptwatch.integrity.findings import VERDICTS

    if show_all:
        for r in report.files:
            if not r.findings:
                size = "" if r.size is None else f", {_size(r.size)}"
                console.print(f"[{_STYLE[r.verdict]}]{r.verdict:<12}[/] {escape(r.path)}  ({escape(r.format)}{size})")
    findings = [f for r in report.files for f in r.findings] + report.findings
    for f in sorted(findings, key=lambda f: (-VERDICTS.index(f.verdict), f.path)):  # worst first
        console.print(_finding_line(f))
    counts = ", ".join(f"{n} {v}" for v, n in reversed(report.counts().items()) if n)
    m = report.manifest
    if m is not None:
        against = (f"manifest {report.manifest_path or '(given)'} written {m.created}"
                   f"{'' if m.step is None else f', step {m.step}'}"
                   f"{'' if m.world_size is None else f', world size {m.world_size}'}")
    else:
        against = "no manifest: structure checked only (write one after each save: ckptwatch manifest DIR)"
    notes = sum(1 for r in report.files for f in r.findings if f.verdict == "ok")
    console.print(f"[{_STYLE[report.verdict]}]{report.verdict.upper()}[/]  {escape(str(report.root))}: "
                  + escape(f"{counts or '0 files'}{f', {notes} note(s)' if notes else ''}; "
                           f"{report.total_files} files, {_size(report.total_bytes)} read in {report.seconds:.2f} s; "
                           f"{against}"))


def verify_cmd(
    directory: Annotated[str, typer.Argument(metavar="DIR", help="The checkpoint directory.")],
    manifest: Annotated[str | None, typer.Option("--manifest", help="Manifest file (or checkpoint directory "
                                                  "holding one) to compare with (default: "
                                                  "DIR/ckptwatch-manifest.json when it exists).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    show_all: Annotated[bool, typer.Option("--all", help="List every file, not only the problems.")] = False,
    workers: Annotated[int | None, typer.Option("--workers", min=1, help="Hashing threads (default: one per core).")] = None,
    limit: Annotated[list[str] | None, typer.Option("--limit", metavar="NAME=VALUE", help=_LIMIT_HELP)] = None,
) -> None:
    """Verify a checkpoint before resuming from it: hashes against its manifest, every file's
    structure, and the directory as a whole (DCP .metadata vs shards, HF index, DeepSpeed latest).

    Prints the problems and one verdict: ok, unverifiable, incomplete or corrupt.
    Exit code 0: ok; 1: a problem; 2: usage or input error.
    """
    from ckptwatch.integrity.errors import IntegrityError
    from ckptwatch.integrity.verify import verify

    limits = _limits(limit)
    try:
        with _progress("verifying") as (progress, on_listed):
            report = verify(directory, manifest=manifest, workers=workers, progress=progress, on_listed=on_listed,
                            limits=limits)
    except IntegrityError as e:
        raise _fail(str(e)) from None
    except KeyboardInterrupt:
        raise _fail("interrupted", 130) from None
    if as_json:
        sys.stdout.write(json.dumps(report.to_json(), indent=1) + "\n")
    else:
        render_text(report, Console(emoji=False, highlight=False, soft_wrap=True), show_all=show_all)
    raise typer.Exit(0 if report.verdict == "ok" else 1)


def register(app: typer.Typer) -> None:
    """Add ``manifest`` and ``verify`` to the ``ckptwatch`` application."""
    app.add_typer(manifest_app, name="manifest")
    app.command("verify")(verify_cmd)
