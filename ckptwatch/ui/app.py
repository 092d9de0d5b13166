"""The local web console (Flask): the incident list with filters, updated live; an incident
page (timeline, report, evidence with files, alerts); and "diagnose a log", where pasted
text or dropped files are read by this process as ``ckptwatch diagnose`` reads them.

Every page is self-contained: styles and scripts inline, pictures inline SVG, nothing
fetched from the network. Reads go through :func:`ckptwatch.history.read.open_history`,
per request: the database at rest, or the read snapshot of the process writing it (the
console of ``run --ui`` / ``sink --ui`` reads its own process's snapshot only).

JSON API (for the pages' scripts, and scripts of yours):

* ``GET /api/incidents?job=&kind=&severity=&status=&since=`` -> ``{"source", "count",
  "incidents": [list columns], "rows_html"}``; 400 ``{"error"}`` for a bad filter, 503
  ``{"error"}`` when the history cannot be read.
* ``POST /api/diagnose`` (multipart: ``text`` and/or ``files``) -> ``{"incidents":
  [diagnose --json incidents], "report", "read", "refused", "html"}``; 400 ``{"error",
  "html"}`` when nothing can be read or a limit is passed
  (:class:`~ckptwatch.ui.diagnose.Limits`); 413 above
  :data:`~ckptwatch.ui.diagnose.MAX_UPLOAD`; 503 when the console is already diagnosing
  as many uploads as it takes at once.

Everything shown is redacted (:mod:`ckptwatch.sinks.redact`): list rows, incident pages
(report, evidence, alerts, timeline), diagnoses. Every request passes
:mod:`ckptwatch.ui.guard` (Host, Origin, optional token; security headers on answers).
"""

from __future__ import annotations

import datetime as dt
import select
import socket
import threading
from collections.abc import Iterable
from typing import Any

from flask import Flask, jsonify, render_template, request

from ckptwatch.detectors.incident import DEFAULT_SEVERITY, OWN_TIME, SEVERITIES, STATUSES
from ckptwatch.history import queries, timeline
from ckptwatch.history.cli import parse_since, report_text
from ckptwatch.history.plot import svg
from ckptwatch.history.read import HistoryError, open_history
from ckptwatch.sinks.redact import Redactor
from ckptwatch.ui import guard
from ckptwatch.ui.diagnose import MAX_UPLOAD, Cancelled, Diagnosis, Limits, Upload, UploadError, run_diagnosis

#: how often the list page asks for the list again (ms)
REFRESH_MS = 2000
#: fields and files of one upload at most (Werkzeug's default is 1,000)
MAX_PARTS = 10_000


def _when(value: Any) -> str:
    if isinstance(value, dt.datetime):
        return f"{value.astimezone(dt.timezone.utc):%Y-%m-%d %H:%M:%S}"
    return "-" if value is None else str(value)


def _client_gone() -> bool:
    """The client of the current request closed its connection (Werkzeug's server gives
    the socket as ``werkzeug.socket``; False under a server that does not)."""
    sock = request.environ.get("werkzeug.socket")
    if sock is None:
        return False
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def create_app(database: str, *, snapshot_only: bool = False, redactor: Redactor | None = None,
               limits: Limits | None = None, token: str | None = None, allow_hosts: Iterable[str] = ()) -> Flask:
    """The console over the history of ``database`` (the file ``run``/``sink`` write).
    ``snapshot_only``: read only its read snapshot (the console runs in the writer);
    ``redactor``: applied to everything shown (default: the packaged patterns);
    ``limits``: what one diagnosis may cost; ``token`` / ``allow_hosts``: see
    :mod:`ckptwatch.ui.guard`."""
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = MAX_UPLOAD + (1 << 20)  # the form's own bytes on top
    app.config["MAX_FORM_MEMORY_SIZE"] = MAX_UPLOAD  # a pasted text field (Flask's default: 500 kB)
    app.config["MAX_FORM_PARTS"] = MAX_PARTS
    redactor = redactor or Redactor.load()
    limits = limits or Limits()
    slots = threading.BoundedSemaphore(limits.concurrent)
    guard.install(app, token=token, allow_hosts=allow_hosts)

    def history():  # noqa: ANN202
        return open_history(database, snapshot_only=snapshot_only)

    def common(page: str) -> dict[str, Any]:
        return {"page": page, "database": database}

    def listing() -> tuple[list[dict[str, Any]], str]:
        args = request.args
        since = args.get("since") or None
        with history() as (con, opened):
            frame = queries.list_incidents(con, job=args.get("job") or None, kind=args.get("kind") or None,
                                           min_severity=args.get("severity") or None,
                                           status=args.get("status") or None,
                                           since=parse_since(since) if since else None)  # ValueError: said on the page
        frame = redactor.frame(frame)
        rows = []
        for r in frame.iter_rows(named=True):
            cause = "-"
            if r["root_cause_class"]:
                cause = r["root_cause_class"] + (f" rank {r['root_rank']}" if r["root_rank"] is not None else "") + \
                    (f" on {r['root_host']}" if r["root_host"] else "")
            rows.append({**r, "detected": _when(r["detected_ts"]), "cause": cause})
        return rows, opened.describe()

    @app.get("/")
    def incident_list():  # noqa: ANN202
        error, rows, source = None, [], ""
        try:
            rows, source = listing()
        except (HistoryError, ValueError) as e:
            error = str(e)
        return render_template("list.html", rows=rows, source=source, error=error, f=request.args,
                               kinds=list(DEFAULT_SEVERITY), severities=SEVERITIES, statuses=(*STATUSES, "all"),
                               refresh_ms=REFRESH_MS, **common("list"))

    @app.get("/api/incidents")
    def api_incidents():  # noqa: ANN202
        try:
            rows, source = listing()
        except ValueError as e:
            return jsonify(error=str(e)), 400
        except HistoryError as e:
            return jsonify(error=str(e)), 503
        html = "".join(render_template("row.html", r=r) for r in rows)
        plain = [{k: (v.isoformat() if isinstance(v, dt.datetime) else v) for k, v in r.items()} for r in rows]
        return jsonify(source=source, count=len(rows), incidents=plain, rows_html=html)

    @app.get("/incidents/<incident_id>")
    def incident_page(incident_id: str):  # noqa: ANN202
        try:
            with history() as (con, opened):
                try:
                    iid = queries.find_incident(con, incident_id)
                except HistoryError as e:
                    return render_template("list.html", rows=[], source=opened.describe(), error=str(e), f={},
                                           kinds=[], severities=[], statuses=[], refresh_ms=REFRESH_MS,
                                           **common("list")), 404
                inc, evidence = queries.load_incident(con, iid)
                alerts = redactor.frame(queries.alerts_of(con, iid))
                paging = queries.paging_of(con, iid)
                grouped = redactor.frame(queries.grouped_under(con, iid))
                tl = timeline.build_timeline(con, inc).redacted(redactor)
                inc, evidence = tl.incident, redactor.frame(evidence)
                picture = svg(tl)
        except HistoryError as e:
            return render_template("list.html", rows=[], source="", error=str(e), f={}, kinds=[], severities=[],
                                   statuses=[], refresh_ms=REFRESH_MS, **common("list")), 503
        # ≈: a time inherited from an earlier line (or the file's), not the line's own
        ev = [{**e, "ts": f"{e['ts']:%H:%M:%S.%f}"[:-3] + ("" if (e.get("ts_source") or "line") in OWN_TIME else "≈")}
              for e in evidence.iter_rows(named=True)]
        al = [{**a, "created": _when(a["created_ts"])} for a in alerts.iter_rows(named=True)]
        return render_template("incident.html", inc=inc, svg=picture, report=report_text(inc), evidence=ev,
                               alerts=al, paging=paging, grouped=grouped.to_dicts(), source=opened.describe(),
                               **common("list"))

    def uploads() -> list[Upload]:
        out = []
        text = request.form.get("text", "")
        if text.strip():
            out.append(Upload("pasted.log", text.encode()))
        for f in request.files.getlist("files"):
            if f.filename:
                out.append(Upload(f.filename, f.read()))
        return out

    def diagnosis_view() -> tuple[dict[str, Any], int, Diagnosis | None, str | None]:
        """What one POST gives: the API's JSON, its status, and the diagnosis or the error."""
        sent = uploads()  # the whole body is read before a slot is taken: a slow sender holds none
        if not slots.acquire(blocking=False):
            msg = f"the console is already reading {limits.concurrent} upload(s): try again when they are done"
            return {"error": msg, "html": render_template("diagnosis.html", error=msg, d=None)}, 503, None, msg
        try:
            d = run_diagnosis(sent, redactor=redactor, limits=limits, client_gone=_client_gone)
        except UploadError as e:
            return {"error": str(e), "html": render_template("diagnosis.html", error=str(e), d=None)}, 400, None, str(e)
        except Cancelled:
            return {"error": "cancelled: the client left"}, 499, None, "cancelled"
        finally:
            slots.release()
        html = render_template("diagnosis.html", error=None, d=d)
        return {"incidents": [i.to_dict() for i in d.incidents], "report": d.report, "read": d.read,
                "refused": d.refused, "html": html}, 200, d, None

    def diagnose_form(*, d: Diagnosis | None = None, error: str | None = None, text: str = "") -> str:
        return render_template("diagnose.html", d=d, error=error, text=text, max_mib=MAX_UPLOAD >> 20,
                               max_bytes=MAX_UPLOAD, **common("diagnose"))

    @app.route("/diagnose", methods=["GET", "POST"])
    def diagnose_page():  # noqa: ANN202  (the form without a script posts here)
        if request.method == "GET":
            return diagnose_form()
        _, code, d, error = diagnosis_view()
        return diagnose_form(d=d, error=error, text=request.form.get("text", "")), code

    @app.post("/api/diagnose")
    def api_diagnose():  # noqa: ANN202
        doc, code, _, _ = diagnosis_view()
        return jsonify(doc), code

    @app.errorhandler(413)
    def too_large(_e: Exception):  # noqa: ANN202
        msg = f"upload too large: at most {MAX_UPLOAD >> 20} MiB here; for bigger logs run ckptwatch diagnose on them"
        if (request.content_length or 0) <= app.config["MAX_CONTENT_LENGTH"]:  # within the size: too many parts
            msg = f"too many files or fields in one upload: at most {MAX_PARTS:,} here"
        if request.path.startswith("/api/"):
            return jsonify(error=msg, html=render_template("diagnosis.html", error=msg, d=None)), 413
        return diagnose_form(error=msg), 413

    return app
