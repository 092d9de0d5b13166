"""Command line of the incident history: ``ckptwatch incidents list | show | export | plot``.

    ckptwatch incidents list [--db incidents.duckdb] [--job GLOB] [--kind GLOB] [--severity S]
                             [--status open|resolved|superseded|all] [--since 2h|2026-12-01] [--json]
    ckptwatch incidents show ID [--db ...] [--json]      # ID or a prefix of it (4+ characters)
    ckptwatch incidents export OUT --format parquet|csv [--table incidents|evidence|alerts] [filters]
    ckptwatch incidents plot ID --out FILE.png|FILE.svg|FILE.html   # the per-rank timeline

They read a database at rest, or the read snapshot of one a running ``run`` / ``sink``
writes (:mod:`ckptwatch.history.read`), and say on standard error which, and how old it is.
What they print or write is redacted (:mod:`ckptwatch.sinks.redact`, with the config's
``[alerts] redaction_files``): the database keeps the raw lines, the outputs do not.
Files they write are ``0600``.
Exit codes: 0, 1 (``show``: no such incident), 2 (usage or input error: one line).
"""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import re
import sys
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import duckdb
import polars as pl
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ckptwatch import config as config_mod
from ckptwatch.detectors.incident import Incident
from ckptwatch.history import queries
from ckptwatch.history.read import HistoryError, open_history
from ckptwatch.private_files import open_private
from ckptwatch.sinks import report
from ckptwatch.sinks.redact import RedactionError, Redactor

#: a table piped to a file or a pager keeps its width (rich would cut it to 80 columns)
T = TypeVar("T")

_out = Console(emoji=False, highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 240)
_err = Console(stderr=True, emoji=False, highlight=False, soft_wrap=True)

incidents_app = typer.Typer(no_args_is_help=True, help="Incident history: list, show and export past incidents "
                                                       "(also while run or sink writes the database).")

DbOpt = Annotated[str | None, typer.Option("--db", help="The DuckDB file run/sink write (default: the config's "
                                                       "sink.db, incidents.duckdb).")]
ConfigOpt = Annotated[str | None, typer.Option("--config", help="TOML config file (default $CKPTWATCH_CONFIG).")]
JobOpt = Annotated[str | None, typer.Option("--job", help="Job name or glob, e.g. 'llama-*'.")]
KindOpt = Annotated[str | None, typer.Option("--kind", help="Incident kind or glob, e.g. interrupted_save.")]
SeverityOpt = Annotated[str | None, typer.Option("--severity", help="This severity and above: info, warning, "
                                                                   "error, critical.")]
StatusOpt = Annotated[str | None, typer.Option("--status", help="open, resolved, superseded or all (default: "
                                                               "all but superseded, i.e. withdrawn).")]
SinceOpt = Annotated[str | None, typer.Option("--since", help="Detected within this long (30m, 2h, 7d) or since "
                                                             "this UTC date or time (2026-12-01, 2026-12-01T08:00).")]

#: characters of an id the table shows (``show`` takes any unique prefix; ``--json`` gives them whole)
ID_SHOWN = 10
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def _fail(msg: str, code: int = 2) -> typer.Exit:
    _err.print(f"[red]error:[/red] {escape(msg)}")
    return typer.Exit(code)


def parse_since(text: str, now: dt.datetime | None = None) -> dt.datetime:
    """``--since``: a duration back from ``now`` (``30m``, ``2h``, ``7d``, ``1h30m``) or an ISO
    date or time (UTC when it names no zone). Raises ValueError naming the text."""
    now = now or dt.datetime.now(dt.timezone.utc)
    parts = re.findall(r"(\d+(?:\.\d+)?)([smhdw])", text.strip())
    if parts and "".join(n + u for n, u in parts) == text.strip():
        try:
            return now - dt.timedelta(seconds=sum(float(n) * _UNITS[u] for n, u in parts))
        except OverflowError:  # 99999999d: before year 1
            raise ValueError(f"since {text}: reaches back before the year 1") from None
    try:
        t = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"since {text}: not a duration (30m, 2h, 7d) or a date (2026-12-01, 2026-12-01T08:00)") from None
    return t.replace(tzinfo=dt.timezone.utc) if t.tzinfo is None else t.astimezone(dt.timezone.utc)


def _since(text: str | None) -> dt.datetime | None:
    if not text:
        return None
    try:
        return parse_since(text)
    except ValueError as e:
        raise _fail(f"--{e}") from None


def _db(db: str | None, config: str | None) -> str:
    if db:
        return db
    try:
        return config_mod.load(config).sink.db
    except config_mod.ConfigError as e:
        raise _fail(str(e)) from None


def _redactor(config: str | None) -> Redactor:
    """The packaged secret patterns plus the config's ``[alerts] redaction_files``."""
    try:
        return Redactor.load(config_mod.load(config).alerts.redaction_files)
    except (config_mod.ConfigError, RedactionError) as e:
        raise _fail(str(e)) from None


def _filters(con: duckdb.DuckDBPyConnection, job: str | None, kind: str | None, severity: str | None,
             status: str | None, since: str | None) -> pl.DataFrame:
    try:
        return queries.list_incidents(con, job=job, kind=kind, min_severity=severity, status=status,
                                      since=_since(since))
    except ValueError as e:
        raise _fail(f"--{str(e).split()[0]} {str(e).split(' ', 1)[1]}") from None


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, dt.datetime):
        return f"{value.astimezone(dt.timezone.utc):%Y-%m-%d %H:%M:%S}"
    return str(value)


def list_cmd(db: DbOpt = None, job: JobOpt = None, kind: KindOpt = None, severity: SeverityOpt = None,
             status: StatusOpt = None, since: SinceOpt = None,
             as_json: Annotated[bool, typer.Option("--json", help="A JSON array of incidents instead of a table.")] = False,
             config: ConfigOpt = None) -> None:
    """List past incidents, newest first (filters combine)."""
    path, redactor = _db(db, config), _redactor(config)
    try:
        with open_history(path) as (con, opened):
            frame = redactor.frame(_filters(con, job, kind, severity, status, since))
    except HistoryError as e:
        raise _fail(str(e)) from None
    _err.print(f"[dim]{escape(opened.describe())}[/dim]")
    if as_json:
        _out.print_json(json.dumps(frame.to_dicts(), default=lambda v: v.isoformat()), indent=2)
        return
    if frame.is_empty():
        _out.print("no incident matches" if any((job, kind, severity, status, since)) else "no incident recorded")
        return
    table = Table(box=None, pad_edge=False, header_style="bold")
    for name in ("id", "detected (UTC)", "severity", "status", "paging", "kind", "job", "step", "root cause",
                 "last good"):
        table.add_column(name, no_wrap=name in ("id", "detected (UTC)", "severity", "status", "paging"))
    for r in frame.iter_rows(named=True):
        style = report.SEV_STYLE.get(r["severity"], "")
        cause = "-"
        if r["root_cause_class"]:
            where = " ".join(f"{k} {v}" for k, v in (("rank", r["root_rank"]), ("on", r["root_host"])) if v is not None)
            cause = f"{r['root_cause_class']} {where}".strip()
        table.add_row(r["id"][:ID_SHOWN], _cell(r["detected_ts"]),
                      f"[{style}]{r['severity']}[/{style}]" if style else r["severity"], r["status"], r["paging"],
                      r["kind"],
                      escape(_cell(r["job"])), _cell(r["step"]), escape(cause), _cell(r["last_good_step"]))
    _out.print(table)
    _err.print(f"[dim]{frame.height} incident(s)[/dim]")


def _read_incident(path: str, ref: str, more: Callable[[duckdb.DuckDBPyConnection, str, Incident], T]
                   ) -> tuple[Incident, pl.DataFrame, T]:
    """The incident ``ref`` (id or prefix) names in the history of ``path``, its evidence
    rows, and ``more(con, id, incident)`` read in the same opening; says on stderr what
    was read. Exits 1 for no such incident, 2 when the history cannot be read."""
    try:
        with open_history(path) as (con, opened):
            try:
                iid = queries.find_incident(con, ref)
            except HistoryError as e:
                raise _fail(str(e), 1) from None
            inc, evidence = queries.load_incident(con, iid)
            extra = more(con, iid, inc)
    except HistoryError as e:
        raise _fail(str(e)) from None
    _err.print(f"[dim]{escape(opened.describe())}[/dim]")
    return inc, evidence, extra


def show_cmd(incident: Annotated[str, typer.Argument(metavar="ID", help="Incident id, or its first 4+ characters.")],
             db: DbOpt = None,
             as_json: Annotated[bool, typer.Option("--json", help="The incident as diagnose --json gives it, each "
                                                                 "evidence row with its file.")] = False,
             config: ConfigOpt = None) -> None:
    """One incident whole: the report diagnose prints, its evidence lines with their file
    and host, the alerts sent about it, and the incidents grouped under its page."""
    redactor = _redactor(config)
    inc, evidence, (alerts, paging, grouped) = _read_incident(
        _db(db, config), incident, lambda con, iid, _inc: (queries.alerts_of(con, iid), queries.paging_of(con, iid),
                                                           queries.grouped_under(con, iid)))
    inc, evidence = redactor.incident(inc), redactor.frame(evidence)
    alerts, grouped = redactor.frame(alerts), redactor.frame(grouped)
    if as_json:
        doc = inc.to_dict()
        doc["paging"] = paging
        doc["grouped_here"] = grouped.to_dicts()
        for item, row in zip(doc["evidence"], evidence.iter_rows(named=True), strict=True):
            item["file"], item["read_on"] = row["file"], row["read_on"]
        doc["alerts"] = alerts.to_dicts()
        _out.print_json(json.dumps(doc, default=lambda v: v.isoformat() if hasattr(v, "isoformat") else str(v)),
                        indent=2)
        return
    report.render_text([inc], _out)
    _out.print("  evidence")
    for r in evidence.iter_rows(named=True):
        who = f"rank {r['rank']}" if r["rank"] is not None else (r["host"] or "agent")
        where = f"{r['file'] or 'source ' + r['source_id']}:{r['offset']}" + (f" on {r['read_on']}" if r["read_on"] else "")
        _out.print(f"    {r['ts']:%H:%M:%S.%f}"[:-3] + escape(f"  {who:<8} {r['role']:<10} {r['kind']:<18} ")
                   + f"[dim]{escape(where)}[/dim]")
        _out.print(f"      {escape(r['line'] or '')}")
    _out.print(f"  paging       {escape(str(paging))}")
    if not grouped.is_empty():  # a channel's group_by: this page stands for them too
        _out.print(f"  grouped here {grouped.height} incident(s), not paged on their own")
        for g in grouped.iter_rows(named=True):
            _out.print(f"    {g['incident_id']}  {escape(g['kind'])} job {escape(str(g['job']))} step {g['step']}  "
                       f"[dim]({escape(g['channel'])})[/dim]")
    if not alerts.is_empty():
        _out.print("  alerts")
        for a in alerts.iter_rows(named=True):
            _out.print(f"    {_cell(a['created_ts'])}  {escape(a['channel'])}: {a['action']} {a['status']}"
                       + (f" ({a['attempts']} attempts)" if (a["attempts"] or 0) > 1 else "")
                       + (f"  {escape(a['last_error'])}" if a["last_error"] else ""))


def export_cmd(out: Annotated[str, typer.Argument(help="File to write (.parquet or .csv).")],
               fmt: Annotated[str | None, typer.Option("--format", help="parquet or csv (default: from OUT's "
                                                                       "suffix).")] = None,
               table: Annotated[str, typer.Option("--table", help="incidents, evidence (each row with its file) "
                                                                  "or alerts.")] = "incidents",
               db: DbOpt = None, job: JobOpt = None, kind: KindOpt = None, severity: SeverityOpt = None,
               status: StatusOpt = None, since: SinceOpt = None, config: ConfigOpt = None) -> None:
    """Write incidents (or their evidence, or their alerts) to Parquet or CSV, for pandas,
    polars, Spark or a spreadsheet. The filters are list's."""
    fmt = fmt or ("csv" if out.endswith(".csv") else "parquet" if out.endswith(".parquet") else None)
    if fmt not in ("parquet", "csv"):
        raise _fail("--format: parquet or csv (OUT's suffix gives none)")
    if table not in queries.EXPORT_TABLES:
        raise _fail(f"--table {table}: one of {', '.join(queries.EXPORT_TABLES)}")
    path, redactor = _db(db, config), _redactor(config)
    try:
        with open_history(path) as (con, opened):
            ids = None
            if any((job, kind, severity, status, since)):
                ids = _filters(con, job, kind, severity, status, since)["id"].to_list()
            n = queries.export(con, out, fmt=fmt, table=table, ids=ids, redact=redactor.frame)
    except HistoryError as e:
        raise _fail(str(e)) from None
    except duckdb.Error as e:
        raise _fail(f"{out}: {str(e).splitlines()[0]}") from None
    _err.print(f"[dim]{escape(opened.describe())}[/dim]")
    _out.print(f"{n} {table} rows -> {escape(out)} ({fmt})")


def report_text(inc: Incident) -> str:
    """The text report of ``inc`` as ``diagnose`` prints it, without colour."""
    buf = io.StringIO()
    report.render_text([inc], Console(file=buf, width=160, emoji=False, highlight=False, color_system=None, soft_wrap=True))
    return buf.getvalue()


def plot_cmd(incident: Annotated[str, typer.Argument(metavar="ID", help="Incident id, or its first 4+ characters.")],
             out: Annotated[str, typer.Option("--out", help="FILE.png, FILE.svg or FILE.html (self-contained: "
                                                           "the picture, the report and the events).")],
             db: DbOpt = None, config: ConfigOpt = None) -> None:
    """Draw an incident's per-rank timeline: a lane per rank grouped by host, each save from
    start to end or to where it was cut off, the initiating failure marked and labelled,
    the collateral reports, host lines and the last good checkpoint."""
    from ckptwatch.history import plot, timeline

    kind = os.path.splitext(out)[1].lower().lstrip(".")
    if kind not in ("png", "svg", "html"):
        raise _fail(f"--out {out}: name a .png, .svg or .html file")
    redactor = _redactor(config)
    _, _, tl = _read_incident(_db(db, config), incident, lambda con, _id, inc: timeline.build_timeline(con, inc))
    tl = tl.redacted(redactor)
    inc = tl.incident
    try:
        with open(open_private(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb") as f:
            if kind == "png":
                plot.write_png(tl, f)
            else:
                f.write((plot.svg(tl) if kind == "svg" else plot.html_page(tl, report_text(inc))).encode())
    except OSError as e:
        raise _fail(f"{out}: {e.strerror or e}") from None
    ranks = sum(1 for lane in tl.lanes if lane.rank is not None)
    hosts = len([h for h in tl.hosts if h is not None])
    _out.print(f"{escape(out)}: {inc.kind} of job {escape(str(inc.job))}, {ranks} rank{'s' if ranks != 1 else ''} on "
               f"{hosts} host{'s' if hosts != 1 else ''}, {len(tl.bars)} save bars, {len(tl.marks)} events")


def register(app: typer.Typer) -> None:
    """Add ``incidents list | show | export`` to ``app``."""
    incidents_app.command("list")(list_cmd)
    incidents_app.command("show")(show_cmd)
    incidents_app.command("export")(export_cmd)
    incidents_app.command("plot")(plot_cmd)
    app.add_typer(incidents_app, name="incidents")
