"""Command line: ``ckptwatch diagnose | run | collect | detect | sink | rules | silence |
manifest | verify | simulate | incidents`` (``manifest`` and ``verify`` in
:mod:`ckptwatch.integrity.cli`, ``simulate`` in :mod:`ckptwatch.simulate_cli`, ``incidents``
in :mod:`ckptwatch.history.cli`); ``ckptwatch --version``.

Exit codes: ``diagnose`` 0 with no incident, 1 with at least one, 2 on a usage or input
error; ``rules check`` 0 when every rule is sound, 1 otherwise, 2 on usage error;
``verify`` 0 ok, 1 a problem, 2 usage error; ``manifest`` 0 written, 1 written but a
structural check already fails, 2 not written; ``manifest diff`` 0 same, 1 differ, 2 usage.
``run``, ``collect``, ``detect`` and ``sink`` exit 0 when stopped (Ctrl-C, SIGTERM; also
while still waiting for the broker) or idle (``--until-idle``), 2 on a usage, config or
input error, and 2 when no Kafka broker answers at start: they say they are waiting, print
a ``hint:`` on checking the address after ``[kafka] connect_hint_after`` seconds (15) and
give up after ``connect_timeout`` (60); with ``--once`` they give up at the hint. ``run
--once`` exits 3 when an alert was not delivered (rejected, given up, or still queued for
the next run), and 2 when it found no readable log file under ``--logs``.
Errors are one line naming the file (and line or rule) and the reason, never a traceback.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import fnmatch
import errno
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import duckdb
import typer
from rich.console import Console
from rich.markup import escape

from ckptwatch import config as config_mod
from ckptwatch.config import Config
from ckptwatch.detectors.incident import DEFAULT_SEVERITY
from ckptwatch.ingest import timestamps
from ckptwatch.ingest.handles import OpenFileLimitError, raise_open_file_limit
from ckptwatch.ingest.layout import TemplateError, compile_template
from ckptwatch.ingest.prefix import LinePrefixError, compile_line_prefix
from ckptwatch.history.cli import register as register_history
from ckptwatch.ui.cli import register as register_ui
from ckptwatch.integrity.cli import register as register_integrity
from ckptwatch.simulate_cli import register as register_simulate
from ckptwatch.pipeline import PipelineOptions, detector_config, diagnose
from ckptwatch.rules import RuleError, check_rule_files
from ckptwatch.sinks import report
from ckptwatch.sinks.alerts.dispatcher import Alerter
from ckptwatch.sinks.redact import RedactionError
from ckptwatch.sinks.alerts.settings import AlertConfigError
from ckptwatch.sinks.duckdb_store import Store

if TYPE_CHECKING:
    from ckptwatch.sinks.metrics import Metrics

T = TypeVar("T")

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Find interrupted, partial and poisoned checkpoints in ML training logs.")
rules_app = typer.Typer(no_args_is_help=True, help="Rule packs: list and validate log fingerprints.")
app.add_typer(rules_app, name="rules")
silence_app = typer.Typer(no_args_is_help=True, help="Silences: mute alerts by job, kind or label until they "
                                                    "expire (the running pipeline picks them up at once).")
app.add_typer(silence_app, name="silence")
register_integrity(app)  # manifest, verify
register_simulate(app)  # simulate
register_history(app)  # incidents list | show | export | plot
register_ui(app)  # ui


def _version(value: bool) -> None:
    if value:
        from ckptwatch import __version__

        Console(emoji=False, highlight=False).print(f"ckptwatch {__version__}")
        raise typer.Exit()


@app.callback()
def _main(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                help="Print the version and exit.")] = False) -> None:
    """Find interrupted, partial and poisoned checkpoints in ML training logs."""

_err = Console(stderr=True, emoji=False, highlight=False)

CheckpointRootOpt = Annotated[list[str] | None, typer.Option(
    "--checkpoint-root", help="Verify each new checkpoint directory under this one once it stops changing "
    "(collect.verify_settle s); results reach the pipeline as integrity events (repeatable).")]
TemplateOpt = Annotated[str | None, typer.Option("--path-template", help="Labels from paths, e.g. "
                                                  "'{job}/{host}/rank{rank}.log' (fields: job, host, rank, "
                                                  "local_rank, attempt; * matches within a path part).")]
BootOpt = Annotated[str | None, typer.Option("--boot-time", help="Boot time (ISO 8601, UTC if no zone) "
                                              "for kernel '[ seconds]' timestamps.")]
LinePrefixOpt = Annotated[str | None, typer.Option(
    "--line-prefix", help="The torchrun --log-line-prefix-template the consoles were written with, e.g. "
    "'${hostname}:${rank}: ' (macros: role_name, local_rank, rank, hostname): read exactly.")]
RulesOpt = Annotated[list[str] | None, typer.Option("--rules", help="Extra rule pack file or directory "
                                                     "(repeatable), loaded after the packaged packs.")]
JobOpt = Annotated[str | None, typer.Option("--job", help="The job of every line whose path --path-template "
                                             "names no job (one job's logs or paste); its lines' own run ids "
                                             "then name no other.")]


KafkaOpt = Annotated[str | None, typer.Option("--kafka", help="Kafka bootstrap servers HOST:PORT[,...] "
                                               "(fleet mode; also CKPTWATCH_KAFKA_BOOTSTRAP_SERVERS or the "
                                               "config file's kafka.bootstrap_servers).")]
ConfigOpt = Annotated[str | None, typer.Option("--config", help="TOML config file (default $CKPTWATCH_CONFIG); "
                                                "flags and CKPTWATCH_* variables override it.")]
PartitionsOpt = Annotated[int | None, typer.Option("--partitions", help="Partitions of a topic created "
                                                    "because it is missing (default 6).")]
RetentionOpt = Annotated[float | None, typer.Option("--retention-days", min=0, help="Delete raw events older "
                                                    "than this many days (incidents and evidence are kept; "
                                                    "default sink.retention_days, 0: keep all).")]
UntilIdleOpt = Annotated[float | None, typer.Option("--until-idle", min=0, help="Exit after this many seconds "
                                                     "without new input (default: run until stopped).")]
MetricsPortOpt = Annotated[int | None, typer.Option("--metrics-port", help="Serve Prometheus metrics at "
                                                     "http://ADDRESS:PORT/metrics (e.g. 9464; default 0: off; "
                                                     "also the config's metrics.port).")]
UiOpt = Annotated[int | None, typer.Option("--ui", metavar="PORT", help="Serve the web console on this port "
                                           "(e.g. 8470; 0: any free one) while running; it reads the read "
                                           "snapshots.")]
UiAddressOpt = Annotated[str, typer.Option("--ui-address", help="Address the console listens on (default "
                                           "127.0.0.1: this machine only).")]
MetricsAddressOpt = Annotated[str | None, typer.Option("--metrics-address", help="Address the metrics endpoint "
                                                        "listens on (default 127.0.0.1; 0.0.0.0: every interface).")]


def _fail(msg: str, code: int = 2) -> typer.Exit:
    _err.print(f"[red]error:[/red] {escape(msg)}", soft_wrap=True)
    return typer.Exit(code)


def _options(path_template: str | None, boot_time: str | None, rules: list[str] | None,
             line_prefix: str | None = None, job: str | None = None) -> PipelineOptions:
    if line_prefix:
        try:
            compile_line_prefix(line_prefix)
        except LinePrefixError as e:
            raise _fail(f"--line-prefix: {e}") from None
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
    if job is not None and not job.strip():
        raise _fail("--job: empty; give the job's name")
    return PipelineOptions(template=template, boot_time=boot, rule_files=tuple(rules or ()), line_prefix=line_prefix,
                           job=job.strip() if job else None)


@app.command("diagnose")
def diagnose_cmd(
    paths: Annotated[list[str], typer.Argument(help="Log files and/or directories (any mix of per-rank "
                                                    "logs, torchrun console output, kernel logs); - reads a "
                                                    "pasted log from standard input.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of the report.")] = False,
    path_template: TemplateOpt = None,
    line_prefix: LinePrefixOpt = None,
    boot_time: BootOpt = None,
    rules: RulesOpt = None,
    job: JobOpt = None,
) -> None:
    """Read logs once and report every checkpoint incident found.

    Exit code 0: no incident; 1: at least one; 2: usage or input error.
    """
    options = _options(path_template, boot_time, rules, line_prefix, job)
    shown = ", ".join("<stdin>" if p == "-" else p for p in paths)  # the paths as the user gave them
    with tempfile.TemporaryDirectory(prefix="ckptwatch-stdin-") as spool:
        spooled = os.path.join(spool, "stdin.log")

        def named(text: str) -> str:  # name the spool file as the user knows it
            return text.replace(spooled + ".gz", "<stdin>").replace(spooled, "<stdin>")

        if "-" in paths:  # a pasted log: spooled to a file, read like any other, named <stdin>
            pasted = os.path.join(spool, "stdin.log")
            with open(pasted, "wb") as f:
                shutil.copyfileobj(sys.stdin.buffer, f)
            with open(pasted, "rb") as f:
                magic = f.read(2)
            if not magic:
                raise _fail("standard input (-) was empty: paste a log, or pipe one in (ckptwatch diagnose - < log)")
            if magic == b"\x1f\x8b":  # gzip -c log | ckptwatch diagnose -
                os.rename(pasted, pasted + ".gz")
                pasted += ".gz"
            paths = [pasted if p == "-" else p for p in paths]
            options = dataclasses.replace(options, name_unlabelled=False)  # a paste's job-less lines: 'unknown'
        try:
            incidents, stats = diagnose(paths, options, progress=_Progress(_err) if _err.is_terminal else None)
        except (RuleError, OpenFileLimitError) as e:
            raise _fail(named(str(e))) from None
        stats.errors = [named(m) for m in stats.errors]
        stats.unlabelled_files = {k: [named(f) for f in v] for k, v in stats.unlabelled_files.items()}
    nothing = None
    if stats.files == 0 or stats.files == stats.skipped.get("unreadable_file", 0):
        nothing = "no readable log file in " + shown
    elif stats.lines == 0:  # "No incident found" would read as a clean bill of health
        nothing = f"no line to read: the {stats.files} file(s) in {shown} are empty"
    if nothing:
        for msg in stats.errors:
            _err.print(f"[red]error:[/red] {escape(msg)}", soft_wrap=True)
        raise _fail(nothing)
    summary = stats.to_dict()
    if as_json:
        sys.stdout.write(report.render_json(incidents, summary) + "\n")
        warnings = [*summary["errors"], *summary["warnings"]]
    else:  # the report (its advice on labels included) on standard output, input problems on standard error
        report.render_text(incidents, Console(emoji=False, highlight=False, soft_wrap=True), {**summary, "errors": []})
        warnings = summary["errors"]
    for msg in warnings:
        _err.print(f"[yellow]warning:[/yellow] {escape(msg)}", soft_wrap=True)
    raise typer.Exit(1 if incidents else 0)


class _Progress:
    """Progress of a long read on a terminal: one line on stderr, redrawn at most twice a
    second (files, MB read, lines, events); cleared when the read ends."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.last = 0.0

    def __call__(self, stats: Any, bytes_read: int) -> None:
        import time

        now = time.monotonic()
        if now - self.last < 0.5:
            return
        self.last = now
        self.console.file.write(f"\rreading: {stats.files} files, {bytes_read / 1e6:,.1f} MB, {stats.lines:,} lines, "
                                f"{stats.events:,} events\x1b[K")
        self.console.file.flush()

    def __del__(self) -> None:
        if self.last:
            self.console.file.write("\r\x1b[K")


@app.command("run")
def run_cmd(
    ctx: typer.Context,
    logs: Annotated[str, typer.Option("--logs", help="Directory to tail (every file under it, new ones too).")],
    db: Annotated[str, typer.Option("--db", help="DuckDB file for events and incidents.")] = "incidents.duckdb",
    once: Annotated[bool, typer.Option("--once", help="Process what exists now, then exit.")] = False,
    interval: Annotated[float, typer.Option("--interval", help="Seconds between polls.")] = 1.0,
    kafka: KafkaOpt = None,
    config: ConfigOpt = None,
    partitions: PartitionsOpt = None,
    until_idle: UntilIdleOpt = None,
    path_template: TemplateOpt = None,
    line_prefix: LinePrefixOpt = None,
    boot_time: BootOpt = None,
    rules: RulesOpt = None,
    job: JobOpt = None,
    metrics_port: MetricsPortOpt = None,
    metrics_address: MetricsAddressOpt = None,
    checkpoint_root: CheckpointRootOpt = None,
    retention_days: RetentionOpt = None,
    ui: UiOpt = None,
    ui_address: UiAddressOpt = "127.0.0.1",
) -> None:
    """Tail a directory of logs and write events and incidents to DuckDB.

    Embedded (default): every stage in this process, no broker. With a Kafka broker
    configured (--kafka or the config file), the same stages run as collector, detector
    and sink linked through Kafka, still in this one process.

    Exit code with --once: 0 everything read; 2 usage, config, input or database error,
    or nothing to read (no readable log file under --logs); 3 an alert not delivered;
    130 stopped before the end. Without --once: 0 when stopped, 2 on an error.
    """
    if not os.path.isdir(logs):
        raise _fail(f"--logs {logs}: not a directory")
    cfg = _config(config, {"kafka": {"bootstrap_servers": kafka, "partitions": partitions},
                           "collect": {"interval": interval, "checkpoint_roots": checkpoint_root or None},
                           "sink": {"retention_days": retention_days},
                           "metrics": {"port": metrics_port, "address": metrics_address}}, need_kafka=False)
    options = _options(path_template, boot_time, rules, line_prefix, job)
    # a live run judges like the fleet's detectors: files written out of step (a rank behind
    # another by a poll, a restart reading a backlog) are not judged late by the newest one
    options.detector = detector_config(cfg.detect, options.detector)
    # a relative verification log lives next to the database, like the run's other state
    verify_log = os.path.join(os.path.dirname(os.path.abspath(db)), cfg.collect.verify_log)
    cfg = dataclasses.replace(cfg, collect=dataclasses.replace(cfg.collect, verify_log=verify_log))
    metrics = _start_metrics(ctx, cfg)
    alerter = _alerter(cfg, db)
    if cfg.kafka.enabled:
        from ckptwatch.services import launch

        collect = dataclasses.replace(cfg.collect, paths=[logs], checkpoint=cfg.collect.checkpoint or f"{db}.collect.json")
        cfg = dataclasses.replace(cfg, collect=collect, sink=dataclasses.replace(cfg.sink, db=db))
        _sigterm_as_interrupt()
        with _stopped_quietly():
            store = _open_store(db, cfg)
            store.wait_for_space = not once  # as in the embedded run
            _start_console(ctx, cfg, db, ui, ui_address)
            try:
                built = _build(lambda: alerter(store, metrics))
                res = _serve(lambda: launch.run_all(cfg, options, store, once=once, until_idle=until_idle, say=_say,
                                                    metrics=metrics, alerter=built))
                with _shielded():  # the summary reads the alert outbox in the store: before it closes
                    if res is not None:
                        _report_stats(res[0].stats.to_dict(), f"{res[0].published} events through Kafka; database {db}")
                    _alerts_done(built, once)
                    if once and res is not None:
                        _nothing_read(res[0].stats.to_dict(), logs)
            finally:
                with _shielded():
                    store.close()
        return
    from ckptwatch.embedded import EmbeddedRunner
    from ckptwatch.integrity.errors import IntegrityError
    from ckptwatch.integrity.watch import CheckpointWatcher

    _sigterm_as_interrupt()
    try:
        runner = EmbeddedRunner(logs, db, options, metrics=metrics, alerter=alerter,
                                checkpoints=CheckpointWatcher.from_settings(cfg.collect),
                                retention=_retention(cfg),
                                on_warning=lambda m: _err.print(f"[yellow]warning:[/yellow] {escape(m)}",
                                                                soft_wrap=True))
    except KeyboardInterrupt:
        return
    except (RuleError, AlertConfigError, RedactionError, IntegrityError) as e:
        raise _fail(str(e)) from None
    except duckdb.Error as e:
        raise _fail(f"--db {db}: {str(e).splitlines()[0]}") from None
    # a one-shot run gives up on a full disk (one line, exit 2; a re-run resumes from what was
    # stored) where a service waits for space
    runner.store.wait_for_space = not once
    if cfg.sink.snapshot_every > 0:  # readers read it while this run writes (ckptwatch.sinks.snapshot)
        runner.store.publish_snapshots(cfg.sink.snapshot_every)
    try:
        _start_console(ctx, cfg, db, ui, ui_address)
    except typer.Exit:
        runner.close()
        raise
    stopped = False
    try:
        runner.run(once=once, interval=interval, until_idle=until_idle, stop=_STOPPING)
    except OpenFileLimitError as e:
        raise _fail(str(e)) from None
    except (KeyboardInterrupt, RuntimeError, duckdb.Error) as e:
        if not _interrupted(e):
            if isinstance(e, duckdb.Error):  # EIO, EFBIG, a full disk: nothing stored is lost
                raise _fail(f"--db {db}: {str(e).splitlines()[0]}") from None
            raise
        stopped = True
    finally:
        with _shielded():
            stats = runner.stats.to_dict()
            runner.close()
    with _shielded():
        _report_stats(stats, f"{stats['events']} events; database {db}")
        if runner.alerter:
            _alerts_done(runner.alerter, once)
    if stopped and once:  # the input was not read to its end: not a success for a script
        raise typer.Exit(130)
    if once:
        _nothing_read(stats, logs)


def _nothing_read(stats: dict[str, Any], logs: str) -> None:
    """``run --once`` that found no file it could read under ``logs``: exit 2, saying so (a
    wrong --logs is not a clean run). Raises typer.Exit."""
    unreadable = stats["skipped"].get("unreadable_file", 0)
    if stats["files"] == 0:
        raise _fail(f"nothing to read: no log file under {logs}")
    if stats["files"] == unreadable:
        raise _fail(f"nothing to read: no readable log file under {logs}")


def _alerts_done(alerter: Alerter, once: bool) -> None:
    """The alert summary line; ``--once`` exits 3 when a notification was not delivered."""
    line = alerter.summary()
    if alerter.undelivered:
        _say(line)
        if once:
            raise typer.Exit(3)
    else:
        _info(line)


def _alerter(cfg: Config, db: str) -> Callable[[Store, Metrics], Alerter]:
    """The alerter factory of ``run`` / ``sink``: channels of ``[alerts]`` (plus the console)."""
    from ckptwatch.sinks.alerts.setup import alerter_from_config

    console = Console(emoji=False, highlight=False, soft_wrap=True)
    return lambda store, metrics: alerter_from_config(cfg.alerts, store, db_path=db, metrics=metrics, say=_say,
                                                      console=console)


def _build(fn: Callable[[], T]) -> T:
    """``fn()``, with an alert channel or redaction file that cannot be used as a one-line error."""
    try:
        return fn()
    except (AlertConfigError, RedactionError) as e:
        raise _fail(str(e)) from None


def _config(path: str | None, flags: dict[str, dict[str, object]], *, need_kafka: bool) -> Config:
    try:
        cfg = config_mod.load(path, flags=flags)
        if cfg.kafka.enabled:
            from ckptwatch.kafka.configuration import check_client_keys

            check_client_keys(cfg.kafka)
    except config_mod.ConfigError as e:
        raise _fail(str(e)) from None
    if need_kafka and not cfg.kafka.enabled:
        raise _fail("no Kafka broker configured: pass --kafka HOST:PORT, set CKPTWATCH_KAFKA_BOOTSTRAP_SERVERS, "
                    "or bootstrap_servers in the config file's [kafka] section")
    return cfg


def _start_metrics(ctx: typer.Context, cfg: Config) -> Metrics:
    """The process's metrics; served over HTTP when ``[metrics] port`` is not 0, until the
    command of ``ctx`` ends. A port that cannot be bound is a one-line error."""
    from ckptwatch.sinks.metrics import Metrics, MetricsServer

    metrics = Metrics(job_label=cfg.metrics.job_label)
    if cfg.metrics.port:
        where = f"{cfg.metrics.address}:{cfg.metrics.port}"
        try:
            server = MetricsServer(metrics, cfg.metrics.port, cfg.metrics.address)
        except OSError as e:
            hint = " (choose another --metrics-port)" if e.errno == errno.EADDRINUSE else ""
            raise _fail(f"metrics: cannot listen on {where}: {e.strerror or e}{hint}") from None
        ctx.call_on_close(server.close)
        _info(f"metrics: {server.url}")
    return metrics


def _start_console(ctx: typer.Context, cfg: Config, db: str, port: int | None, address: str) -> None:
    """With ``--ui PORT``: the web console over this process's read snapshots, served until
    the command of ``ctx`` ends. Needs snapshots (``[sink] snapshot_every`` > 0); a port that
    cannot be bound is a one-line error."""
    if port is None:
        return
    if cfg.sink.snapshot_every <= 0:
        raise _fail("--ui reads the read snapshots this process publishes: set [sink] snapshot_every > 0")
    from ckptwatch.sinks.redact import Redactor
    from ckptwatch.ui.app import create_app
    from ckptwatch.ui.cli import console_token, exposure_warning
    from ckptwatch.ui.server import ConsoleServer

    token = console_token()
    try:
        app = create_app(db, snapshot_only=True, redactor=Redactor.load(cfg.alerts.redaction_files), token=token)
        server = ConsoleServer(app, address, port).start()
    except OSError as e:
        hint = " (choose another --ui port)" if e.errno == errno.EADDRINUSE else ""
        raise _fail(f"--ui: cannot listen on {address}:{port}: {e.strerror or e}{hint}") from None
    ctx.call_on_close(server.close)
    _info(f"console: {server.url}")
    if exposure_warning(address, token):
        _say(f"warning: {exposure_warning(address, token)}")


def _info(msg: str) -> None:
    _err.print(f"[dim]{escape(msg)}[/dim]", soft_wrap=True)


def _say(msg: str) -> None:
    _err.print(f"[yellow]{escape(msg)}[/yellow]", soft_wrap=True)


#: set by the SIGTERM / SIGINT handler: a stop was asked for
_STOPPING = threading.Event()


def _sigterm_as_interrupt() -> None:
    """Every long-running command (run, collect, detect, sink) starts here: a stop signal
    becomes a KeyboardInterrupt, and the files it creates (databases, WALs DuckDB recreates
    after a checkpoint, offsets, alert outboxes: they hold raw log lines) are private to its user."""
    os.umask(0o077)

    def handler(signum: int, frame: object) -> None:
        _STOPPING.set()
        raise KeyboardInterrupt
    _STOPPING.clear()
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)  # also when started in the background, where SIGINT is ignored


def _interrupted(e: BaseException) -> bool:
    """``e`` is how a stop (Ctrl-C, SIGTERM) surfaced: a KeyboardInterrupt, or what a library
    made of it while it ran (DuckDB turns one that lands inside a query into
    ``RuntimeError: Query interrupted``)."""
    return isinstance(e, KeyboardInterrupt) or (_STOPPING.is_set() and isinstance(e, (RuntimeError, duckdb.Error)))


@contextlib.contextmanager
def _shielded() -> Iterator[None]:
    """SIGTERM and Ctrl-C ignored for the block: the short, bounded cleanup after a service
    stopped (a summary, closing the database) is not cut off by a second signal."""
    old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def _stopped_quietly() -> Iterator[None]:
    """An interrupt (Ctrl-C, SIGTERM) before the service started (opening the database,
    building the alerter) ends the command with exit 0 and no traceback, as a stop does."""
    try:
        yield
    except KeyboardInterrupt:
        pass


def _serve(fn: Callable[[], T]) -> T | None:
    """Run a service until it returns or is interrupted; known failures become one-line errors."""
    from kafka.errors import KafkaError

    from ckptwatch.ingest.checkpoint import CheckpointError
    from ckptwatch.integrity.errors import IntegrityError
    from ckptwatch.kafka.admin import BrokerUnavailable

    _sigterm_as_interrupt()
    logging.getLogger("kafka").setLevel(logging.CRITICAL)  # outages are reported by the services
    try:
        return fn()
    except KeyboardInterrupt:
        return None
    except (RuntimeError, duckdb.Error) as e:
        if _interrupted(e):
            return None
        if isinstance(e, duckdb.Error):
            raise _fail(f"database: {str(e).splitlines()[0]}") from None
        raise
    except (RuleError, CheckpointError, BrokerUnavailable, config_mod.ConfigError, IntegrityError,
            OpenFileLimitError) as e:
        raise _fail(str(e)) from None
    except KafkaError as e:  # refused by the broker: authorization, bad topic config, ...
        raise _fail(f"Kafka: {e}") from None


@app.command("collect")
def collect_cmd(
    ctx: typer.Context,
    paths: Annotated[list[str] | None, typer.Argument(help="Log files, directories or glob patterns "
                                                           "('/var/log/train/**/*.log'); default: collect.paths of the config.")] = None,
    kafka: KafkaOpt = None,
    config: ConfigOpt = None,
    checkpoint: Annotated[str | None, typer.Option("--checkpoint", help="File holding each source's offset "
                                                    "(default ckptwatch-collect.json).")] = None,
    once: Annotated[bool, typer.Option("--once", help="Publish what the files hold now, then exit.")] = False,
    until_idle: UntilIdleOpt = None,
    partitions: PartitionsOpt = None,
    path_template: TemplateOpt = None,
    line_prefix: LinePrefixOpt = None,
    boot_time: BootOpt = None,
    rules: RulesOpt = None,
    metrics_port: MetricsPortOpt = None,
    metrics_address: MetricsAddressOpt = None,
    checkpoint_root: CheckpointRootOpt = None,
) -> None:
    """Fleet collector: tail this host's logs, parse them, publish events to Kafka."""
    from ckptwatch.services import launch

    cfg = _config(config, {"kafka": {"bootstrap_servers": kafka, "partitions": partitions},
                           "collect": {"paths": paths or None, "checkpoint": checkpoint,
                                       "path_template": path_template, "line_prefix": line_prefix,
                                       "boot_time": boot_time,
                                       "checkpoint_roots": checkpoint_root or None},
                           "metrics": {"port": metrics_port, "address": metrics_address}}, need_kafka=True)
    if not cfg.collect.paths:
        raise _fail("nothing to collect: give paths, or paths in the config file's collect section")
    if not cfg.collect.checkpoint:
        cfg = dataclasses.replace(cfg, collect=dataclasses.replace(cfg.collect, checkpoint="ckptwatch-collect.json"))
    options = _options(cfg.collect.path_template or None, cfg.collect.boot_time or None, rules,
                       cfg.collect.line_prefix or None)
    _info(f"collect: {', '.join(cfg.collect.paths)} -> {cfg.kafka.events_topic} at {cfg.kafka.bootstrap_servers}; "
          f"offsets in {cfg.collect.checkpoint}")
    metrics = _start_metrics(ctx, cfg)
    c = _serve(lambda: launch.collect(cfg, options, once=once, until_idle=until_idle, say=_say, metrics=metrics))
    if c is not None:
        _report_stats(c.stats.to_dict(), f"{c.published} events published to {cfg.kafka.events_topic}")
        if once and c.stats.files == 0:
            raise _fail("nothing was read: no file matches " + ", ".join(cfg.collect.paths))


@app.command("detect")
def detect_cmd(
    ctx: typer.Context,
    kafka: KafkaOpt = None,
    config: ConfigOpt = None,
    group: Annotated[str | None, typer.Option("--group", help="Consumer group (default ckptwatch-detect).")] = None,
    until_idle: UntilIdleOpt = None,
    partitions: PartitionsOpt = None,
    metrics_port: MetricsPortOpt = None,
    metrics_address: MetricsAddressOpt = None,
) -> None:
    """Fleet detector: one member of the detector consumer group (run several to scale out)."""
    from ckptwatch.services import launch

    cfg = _config(config, {"kafka": {"bootstrap_servers": kafka, "partitions": partitions},
                           "detect": {"group": group},
                           "metrics": {"port": metrics_port, "address": metrics_address}}, need_kafka=True)
    _info(f"detect: group {cfg.detect.group}, {cfg.kafka.events_topic} -> {cfg.kafka.incidents_topic} "
          f"at {cfg.kafka.bootstrap_servers}")
    metrics = _start_metrics(ctx, cfg)
    m = _serve(lambda: launch.detect(cfg, PipelineOptions(), until_idle=until_idle, say=_say, metrics=metrics))
    if m is not None:
        s = m.stats
        _err.print(f"[dim]{s.events} events ({s.replayed} replayed) in {s.rebalances} assignment(s), "
                   f"{s.incidents_published} incident versions published, {s.bad_messages} bad messages "
                   f"skipped[/dim]", soft_wrap=True)


@app.command("sink")
def sink_cmd(
    ctx: typer.Context,
    kafka: KafkaOpt = None,
    config: ConfigOpt = None,
    db: Annotated[str | None, typer.Option("--db", help="DuckDB file (default incidents.duckdb).")] = None,
    group: Annotated[str | None, typer.Option("--group", help="Consumer group (default ckptwatch-sink).")] = None,
    until_idle: UntilIdleOpt = None,
    partitions: PartitionsOpt = None,
    metrics_port: MetricsPortOpt = None,
    metrics_address: MetricsAddressOpt = None,
    retention_days: RetentionOpt = None,
    ui: UiOpt = None,
    ui_address: UiAddressOpt = "127.0.0.1",
) -> None:
    """Fleet sink: events and incidents from Kafka into DuckDB."""
    from ckptwatch.services import launch

    cfg = _config(config, {"kafka": {"bootstrap_servers": kafka, "partitions": partitions},
                           "sink": {"db": db, "group": group, "retention_days": retention_days},
                           "metrics": {"port": metrics_port, "address": metrics_address}}, need_kafka=True)
    metrics = _start_metrics(ctx, cfg)  # before the store: a port in use leaves no database open
    _sigterm_as_interrupt()
    with _stopped_quietly():
        store = _open_store(cfg.sink.db, cfg)
        try:
            _start_console(ctx, cfg, cfg.sink.db, ui, ui_address)
            _info(f"sink: group {cfg.sink.group}, {cfg.kafka.events_topic} + {cfg.kafka.incidents_topic} at "
                  f"{cfg.kafka.bootstrap_servers} -> {cfg.sink.db}")
            alerter = _build(lambda: _alerter(cfg, cfg.sink.db)(store, metrics))
            members: list = []  # the member, also when SIGTERM or Ctrl-C ends it: its counts are said
            m = _serve(lambda: launch.sink(cfg, store, until_idle=until_idle, say=_say, metrics=metrics,
                                           alerter=alerter, started=members.append))
            with _shielded():  # the summary reads the alert outbox in the store: before it closes
                m = m or (members[0] if members else None)
                if m is not None:
                    s = m.stats
                    _err.print(f"[dim]{s.events_inserted} new events, {s.incidents_upserted} incident writes, "
                               f"{s.bad_messages} bad messages skipped"
                               + (f", {s.offsets_lost} offsets lost to retention" if s.offsets_lost else "")
                               + (f", {s.sources_shared} file(s) followed by two collectors" if s.sources_shared else "")
                               + f"; database {escape(cfg.sink.db)}[/dim]",
                               soft_wrap=True)
                _alerts_done(alerter, once=False)
        finally:
            with _shielded():
                store.close()


def _retention(cfg: Config) -> dt.timedelta | None:
    """How long raw events stay in the database (None: for ever), from ``[sink] retention_days``."""
    return dt.timedelta(days=cfg.sink.retention_days) if cfg.sink.retention_days > 0 else None


def _open_store(path: str, cfg: Config) -> Store:
    """The store at ``path``, publishing read snapshots as ``[sink] snapshot_every`` says."""
    import duckdb

    try:
        store = Store(path, say=_say)
    except duckdb.Error as e:
        raise _fail(f"--db {path}: {str(e).splitlines()[0]}") from None
    if cfg.sink.snapshot_every > 0:
        store.publish_snapshots(cfg.sink.snapshot_every)
    return store


def _report_stats(stats: dict[str, Any], summary: str) -> None:
    for msg in stats["errors"]:
        _err.print(f"[yellow]warning:[/yellow] {escape(msg)}", soft_wrap=True)
    _err.print(f"[dim]{stats['files']} files, {stats['lines']} lines, {escape(summary)}[/dim]", soft_wrap=True)


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
        _err.print(f"[red]broken:[/red] {escape(str(e))}", soft_wrap=True)
    if errors:
        raise typer.Exit(1)
    Console(emoji=False, highlight=False).print(f"{n} rules OK")


@rules_app.command("list")
def rules_list() -> None:
    """List the loaded rules: id, event kind, file."""
    from ckptwatch.rules import RuleSet

    console = Console(emoji=False, highlight=False)
    for r in RuleSet.load().rules:
        console.print(f"{r.id:<42} {r.event:<20} {os.path.basename(r.file)}")


_DURATION = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def _duration(text: str) -> float:
    """``90s``, ``30m``, ``2h``, ``1d``, ``1h30m`` -> seconds. Raises ValueError."""
    import re

    parts = re.findall(r"(\d+(?:\.\d+)?)([smhdw])", text.strip())
    if not parts or "".join(n + u for n, u in parts) != text.strip():
        raise ValueError(text)
    return sum(float(n) * _DURATION[u] for n, u in parts)


def _silence_file(config: str | None, db: str | None, file: str | None) -> tuple[Any, list[Any]]:
    """The silence file of the database (``--file``, ``[alerts] silences_file`` or
    ``<db>.silences.json``) and the config's silences."""
    from ckptwatch.sinks.alerts.settings import parse_silences
    from ckptwatch.sinks.alerts.setup import silences_path
    from ckptwatch.sinks.alerts.silences import SilenceFile

    cfg = _config(config, {"sink": {"db": db}}, need_kafka=False)
    return SilenceFile(file or silences_path(cfg.alerts, cfg.sink.db)), _build(lambda: parse_silences(cfg.alerts.silences))


SilenceDbOpt = Annotated[str | None, typer.Option("--db", help="The pipeline's DuckDB file (default: the config's sink.db, "
                                                   "incidents.duckdb); silences live in DB.silences.json.")]
SilenceFileOpt = Annotated[str | None, typer.Option("--file", help="The silence file itself (overrides --db).")]


@silence_app.command("add")
def silence_add(
    job: Annotated[str | None, typer.Option("--job", help="Job glob, e.g. 'debug-*'.")] = None,
    kind: Annotated[str | None, typer.Option("--kind", help="Incident kind glob, e.g. stalled_save.")] = None,
    label: Annotated[list[str] | None, typer.Option("--label", help="LABEL=GLOB on host, cause or severity "
                                                    "(repeatable), e.g. host=node-07.")] = None,
    duration: Annotated[str, typer.Option("--for", help="How long: 30m, 2h, 1d, 1h30m.")] = "2h",
    comment: Annotated[str, typer.Option("--comment", help="Why (shown by list).")] = "",
    db: SilenceDbOpt = None,
    file: SilenceFileOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Mute alerts of matching incidents until the silence expires; prints its id."""
    from ckptwatch.sinks.alerts.settings import LABELS

    matchers = {k: v for k, v in (("job", job), ("kind", kind)) if v}
    for item in label or []:
        key, sep, glob = item.partition("=")
        if not sep or key not in LABELS or not glob:
            raise _fail(f"--label {item}: expected LABEL=GLOB with LABEL one of {', '.join(LABELS)}")
        matchers[key] = glob
    if not matchers:
        raise _fail("nothing to match: give --job, --kind and/or --label")
    try:
        seconds = _duration(duration)
    except ValueError:
        raise _fail(f"--for {duration}: not a duration such as 30m, 2h, 1d or 1h30m") from None
    if not 0 < seconds <= 366 * 86400:
        raise _fail(f"--for {duration}: a silence lasts more than 0 s and at most 366 days")
    if kind and not any(fnmatch.fnmatchcase(k, kind) for k in DEFAULT_SEVERITY):
        raise _fail(f"--kind {kind}: matches no incident kind ({', '.join(DEFAULT_SEVERITY)})")
    sf, _ = _silence_file(config, db, file)
    now = dt.datetime.now(dt.timezone.utc)
    try:
        s = sf.add(matchers, now + dt.timedelta(seconds=seconds), comment, now=now)
    except AlertConfigError as e:
        raise _fail(str(e)) from None
    except OSError as e:
        raise _fail(f"{sf.path}: {e.strerror or e}") from None
    Console(emoji=False, highlight=False).print(f"{s.id}  until {s.expires:%Y-%m-%d %H:%M:%S} UTC  "
                                   + escape(" ".join(f"{k}={v}" for k, v in s.matchers.items())))


@silence_app.command("list")
def silence_list(
    show_all: Annotated[bool, typer.Option("--all", help="Include expired silences.")] = False,
    db: SilenceDbOpt = None,
    file: SilenceFileOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Silences in force (from the silence file and the config), soonest to expire first."""
    sf, configured = _silence_file(config, db, file)
    try:
        items = configured + sf.read()
    except AlertConfigError as e:
        raise _fail(str(e)) from None
    now = dt.datetime.now(dt.timezone.utc)
    console = Console(emoji=False, highlight=False, soft_wrap=True)
    shown = sorted((s for s in items if show_all or s.active(now)), key=lambda s: s.expires)
    if not shown:
        where = f"{sf.path}" if os.path.exists(sf.path) else f"{sf.path}, which does not exist: wrong --db?"
        console.print(escape(f"no silence in force in {where}" + ("" if show_all else " (--all shows expired ones)")))
    for s in shown:
        state = "active " if s.active(now) else "expired"
        match = " ".join(f"{k}={v}" for k, v in s.matchers.items())
        console.print(escape(f"{s.id:<10} {state} until {s.expires:%Y-%m-%d %H:%M:%S} UTC  {match}"
                             + (f"  # {s.comment}" if s.comment else "")))


@silence_app.command("expire")
def silence_expire(
    silence_id: Annotated[str, typer.Argument(metavar="ID", help="Id printed by add / list.")],
    db: SilenceDbOpt = None,
    file: SilenceFileOpt = None,
    config: ConfigOpt = None,
) -> None:
    """End a silence now (config silences end by editing the config)."""
    sf, configured = _silence_file(config, db, file)
    if any(s.id == silence_id for s in configured):
        raise _fail(f"{silence_id} comes from the config file: remove it there")
    try:
        s = sf.expire(silence_id)
    except AlertConfigError as e:
        raise _fail(str(e)) from None
    Console(emoji=False, highlight=False).print(f"{s.id} expired at {s.expires:%Y-%m-%d %H:%M:%S} UTC")


def main() -> None:
    """Console entry point: lifts the open-file soft limit to the hard one (a watcher holds
    its log files open, :mod:`ckptwatch.ingest.handles`), then runs the command."""
    raise_open_file_limit()
    app()


if __name__ == "__main__":
    main()
