"""Command line: ``ckptwatch diagnose | run | rules check``.

Exit codes: ``diagnose`` 0 with no incident, 1 with at least one, 2 on a usage or input
error; ``rules check`` 0 when every rule is sound, 1 otherwise, 2 on usage error.
Errors are one line naming the file (and line or rule) and the reason, never a traceback.
"""

from __future__ import annotations

import datetime as dt
import os
import sys
from typing import Annotated

import typer
from rich.console import Console

from ckptwatch.ingest import timestamps
from ckptwatch.ingest.layout import TemplateError, compile_template
from ckptwatch.pipeline import PipelineOptions, diagnose
from ckptwatch.rules import RuleError, check_rule_files
from ckptwatch.sinks import report

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Find interrupted, partial and poisoned checkpoints in ML training logs.")
rules_app = typer.Typer(no_args_is_help=True, help="Rule packs: list and validate log fingerprints.")
app.add_typer(rules_app, name="rules")

_err = Console(stderr=True, highlight=False)

TemplateOpt = Annotated[str | None, typer.Option("--path-template", help="Labels from paths, e.g. "
                                                  "'{job}/{host}/rank{rank}.log' (fields: job, host, rank, "
                                                  "local_rank, attempt; * matches within a path part).")]
BootOpt = Annotated[str | None, typer.Option("--boot-time", help="Boot time (ISO 8601, UTC if no zone) "
                                              "for kernel '[ seconds]' timestamps.")]
RulesOpt = Annotated[list[str] | None, typer.Option("--rules", help="Extra rule pack file or directory "
                                                     "(repeatable), loaded after the packaged packs.")]


def _fail(msg: str, code: int = 2) -> typer.Exit:
    _err.print(f"[red]error:[/red] {msg}", soft_wrap=True)
    return typer.Exit(code)


def _options(path_template: str | None, boot_time: str | None, rules: list[str] | None) -> PipelineOptions:
    try:
        template = compile_template(path_template) if path_template else None
    except TemplateError as e:
        raise _fail(str(e)) from None
    boot = None
    if boot_time:
        boot = timestamps.parse_one(boot_time.replace("T", " ") if "T" in boot_time else boot_time)
        if boot is None:
            raise _fail(f"--boot-time {boot_time!r}: not an ISO 8601 time such as 2026-11-30T08:00:00Z")
    for r in rules or []:
        if not os.path.exists(r):
            raise _fail(f"--rules {r}: does not exist")
    return PipelineOptions(template=template, boot_time=boot, rule_files=tuple(rules or ()))


@app.command("diagnose")
def diagnose_cmd(
    paths: Annotated[list[str], typer.Argument(help="Log files and/or directories (any mix of per-rank "
                                                    "logs, torchrun console output, kernel logs).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of the report.")] = False,
    path_template: TemplateOpt = None,
    boot_time: BootOpt = None,
    rules: RulesOpt = None,
) -> None:
    """Read logs once and report every checkpoint incident found.

    Exit code 0: no incident; 1: at least one; 2: usage or input error.
    """
    options = _options(path_template, boot_time, rules)
    try:
        incidents, stats = diagnose(paths, options)
    except RuleError as e:
        raise _fail(str(e)) from None
    if stats.files == 0 or stats.files == stats.skipped.get("unreadable_file", 0):
        for msg in stats.errors:
            _err.print(f"[red]error:[/red] {msg}", soft_wrap=True)
        raise _fail("no readable log file in " + ", ".join(paths))
    if as_json:
        sys.stdout.write(report.render_json(incidents, stats.to_dict()) + "\n")
        for msg in stats.errors:
            _err.print(f"[yellow]warning:[/yellow] {msg}", soft_wrap=True)
    else:
        report.render_text(incidents, Console(highlight=False, soft_wrap=True), stats.to_dict())
    raise typer.Exit(1 if incidents else 0)


@app.command("run")
def run_cmd(
    logs: Annotated[str, typer.Option("--logs", help="Directory to tail (every file under it, new ones too).")],
    db: Annotated[str, typer.Option("--db", help="DuckDB file for events and incidents.")] = "incidents.duckdb",
    once: Annotated[bool, typer.Option("--once", help="Process what exists now, then exit.")] = False,
    interval: Annotated[float, typer.Option("--interval", help="Seconds between polls.")] = 1.0,
    path_template: TemplateOpt = None,
    boot_time: BootOpt = None,
    rules: RulesOpt = None,
) -> None:
    """The embedded pipeline: tail a directory of logs and write events and incidents to DuckDB."""
    import duckdb

    from ckptwatch.embedded import EmbeddedRunner

    if not os.path.isdir(logs):
        raise _fail(f"--logs {logs}: not a directory")
    options = _options(path_template, boot_time, rules)
    console = Console(highlight=False, soft_wrap=True)
    try:
        runner = EmbeddedRunner(logs, db, options, on_incident=lambda inc: report.render_text([inc], console))
    except RuleError as e:
        raise _fail(str(e)) from None
    except duckdb.Error as e:
        raise _fail(f"--db {db}: {str(e).splitlines()[0]}") from None
    try:
        runner.run(once=once, interval=interval)
    except KeyboardInterrupt:
        pass
    finally:
        stats = runner.stats.to_dict()
        runner.close()
    for msg in stats["errors"]:
        _err.print(f"[yellow]warning:[/yellow] {msg}", soft_wrap=True)
    console.print(f"[dim]{stats['files']} files, {stats['lines']} lines, {stats['events']} events; "
                  f"database {db}[/dim]")


@rules_app.command("check")
def rules_check(
    files: Annotated[list[str] | None, typer.Argument(help="Rule files to check (default: the packaged packs).")] = None,
) -> None:
    """Validate rule files: YAML, fields, regex, unique ids and every example.

    Reports file, rule id and reason for each broken rule; exit code 1 if any.
    """
    for f in files or []:
        if not os.path.exists(f):
            raise _fail(f"{f}: does not exist")
    n, errors = check_rule_files(files or [])
    for e in errors:
        _err.print(f"[red]broken:[/red] {e}", soft_wrap=True)
    if errors:
        raise typer.Exit(1)
    Console(highlight=False).print(f"{n} rules OK")


@rules_app.command("list")
def rules_list() -> None:
    """List the loaded rules: id, event kind, file."""
    from ckptwatch.rules import RuleSet

    console = Console(highlight=False)
    for r in RuleSet.load().rules:
        console.print(f"{r.id:<42} {r.event:<20} {os.path.basename(r.file)}")


def main() -> None:
    """Console entry point."""
    app()


if __name__ == "__main__":
    main()
