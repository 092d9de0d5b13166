"""The per-rank timeline of one incident, as data: lanes (a rank each, grouped by host,
plus a lane per host for its kernel / storage / scheduler lines and one for the job's
launcher), save bars (each rank's save of a step from its start to its end, or to where
it was cut off) and marks (the events, the initiating one and the collateral ones told
apart). :mod:`ckptwatch.history.plot` draws it.

Built from the incident's evidence (always stored) and, when the database still holds
them, the job's other events around it (``events``, without ``metric`` lines: a read
snapshot has the same). Times are UTC.

An event whose time is not its line's own (``ts_source`` ``inherited`` from an earlier line,
or the file's ``mtime``: known from the ``events`` table) is drawn where the detectors date
it (:class:`~ckptwatch.detectors.saves.Dating`: at the earliest own time of a later event of
its file, never before the time it carries) and flagged ``approx`` (drawn faded), and so is
a save bar that starts at such an event: an untimed save line printed 40 minutes after the
last dated one neither stretches its save back to that line nor the picture with it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import Counter
from dataclasses import dataclass, field

import duckdb

from ckptwatch.detectors.incident import Incident
from ckptwatch.detectors.saves import OWN_TIME, Dating
from ckptwatch.history.read import has_table
from ckptwatch.sinks.redact import Redactor

#: event kinds that end a rank's part in a save when no save_end came
ENDING = frozenset({"process_exit", "oom_kill", "cuda_oom", "collective_timeout", "collective_error", "node_lost",
                    "storage_error", "save_error", "job_signal", "agent_signal", "gpu_xid", "host_memory",
                    "native_crash", "exception"})
#: kinds drawn on a timeline (the rest, e.g. world_size, only set lanes and the window)
DRAWN = ENDING | {"save_start", "save_end", "load_start", "load_end", "load_error", "job_failed", "job_end", "resume",
                  "integrity"}
#: seconds of events kept before the incident's first evidence and after its last
MARGIN_S = 30.0
#: a save bar of the last good checkpoint is drawn when it started at most this long before the incident
LAST_GOOD_WITHIN_S = 600.0


@dataclass(frozen=True)
class Lane:
    """One row of the picture. ``rank`` None: a host lane (``host`` set: its kernel,
    storage and scheduler lines) or the job's lane (launcher, scheduler, no rank)."""

    host: str | None
    rank: int | None

    @property
    def label(self) -> str:
        if self.rank is not None:
            return f"rank {self.rank}"
        return f"{self.host} (host)" if self.host else "job / launcher"


@dataclass(frozen=True)
class Bar:
    """A rank's save of ``step``: ``start`` to ``end``; ``outcome`` ``saved`` (its
    save_end came), ``cut`` (it ended at ``end`` without one: the rank's failure or the
    incident's root cause) or ``open`` (nothing ended it in the window)."""

    lane: Lane
    step: int | None
    start: dt.datetime
    end: dt.datetime
    outcome: str
    last_good: bool = False
    #: the start is an event whose time is not its line's own (:attr:`Mark.approx`): drawn faded
    approx: bool = False


@dataclass(frozen=True)
class Mark:
    """One event: ``role`` ``root_cause``, ``collateral`` (the incident's evidence) or
    ``context``; its line (first line of a multiline record) and where it was read."""

    lane: Lane
    ts: dt.datetime
    kind: str
    role: str
    line: str
    file: str | None = None
    #: the time is not the line's own (inherited from an earlier line, or the file's mtime):
    #: ``ts`` is the time the detectors date it by (the next own time of its file), drawn faded
    approx: bool = False


@dataclass
class Timeline:
    """Everything a picture of ``incident`` shows, lanes in drawing order (top first)."""

    incident: Incident
    lanes: list[Lane] = field(default_factory=list)
    bars: list[Bar] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    start: dt.datetime | None = None
    end: dt.datetime | None = None
    #: the last good checkpoint's step when its save is not in the picture (long before)
    last_good_outside: int | None = None

    @property
    def hosts(self) -> list[str | None]:
        """Hosts of the rank lanes, in order, each once."""
        return list(dict.fromkeys(lane.host for lane in self.lanes if lane.rank is not None))

    def redacted(self, redactor: Redactor) -> Timeline:
        """A copy fit to show: the incident redacted whole (:meth:`Redactor.incident`), and
        every mark's line and file and every lane's host through ``redactor``."""
        def text(v: str | None) -> str | None:
            return redactor.redact(v) if v else v
        lanes = {lane: Lane(text(lane.host), lane.rank) for lane in self.lanes}
        for m in self.marks:
            lanes.setdefault(m.lane, Lane(text(m.lane.host), m.lane.rank))
        for b in self.bars:
            lanes.setdefault(b.lane, Lane(text(b.lane.host), b.lane.rank))
        return dataclasses.replace(
            self, incident=redactor.incident(self.incident), lanes=[lanes[x] for x in self.lanes],
            bars=[dataclasses.replace(b, lane=lanes[b.lane]) for b in self.bars],
            marks=[dataclasses.replace(m, lane=lanes[m.lane], line=redactor.redact(m.line), file=text(m.file))
                   for m in self.marks])


def _rows(con: duckdb.DuckDBPyConnection, sql: str, params: list) -> list[dict]:
    cur = con.execute(sql, params)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def build_timeline(con: duckdb.DuckDBPyConnection | None, inc: Incident) -> Timeline:
    """The timeline of ``inc`` (loaded with its evidence, e.g. by
    :func:`~ckptwatch.history.queries.load_incident`) from the database ``con`` reads; with
    ``con`` None (an incident ``diagnose`` just found, stored nowhere), from its evidence alone."""
    tl = Timeline(inc)
    evidence = {(e.source_id, e.offset): e for e in inc.evidence}
    stored = _stored(con, list(evidence)) if con is not None and has_table(con, "events") else {}
    # the window: around the evidence, each line whose time is not its own dated by the others' own times
    dating = Dating((e.source_id, e.offset, e.ts, _source(stored.get(ref, {}))) for ref, e in evidence.items())
    times = [dating.at(e.source_id, e.offset, e.ts, _source(stored.get(ref, {}))) for ref, e in evidence.items()]
    times = times or [inc.first_ts]
    lo, hi = min(times) - dt.timedelta(seconds=MARGIN_S), max(times) + dt.timedelta(seconds=MARGIN_S)
    rows: list[dict] = []
    if con is not None and inc.job is not None and has_table(con, "events"):
        lg = (inc.last_good_checkpoint or {}).get("step")
        # the job's lines, and those of its files stored without a job (a job named after the
        # directory read: its lines name none)
        files_read = sorted({e.source_id for e in inc.evidence})
        rows = _rows(con, "SELECT ts, ts_source, host, rank, kind, step, line, source_id, \"offset\", dedup_key "
                          "FROM events WHERE (job = ? OR (job IS NULL AND list_contains(?, source_id))) "
                          "AND kind <> 'metric' AND ((ts BETWEEN ? AND ?) OR (kind IN "
                          "('save_start', 'save_end') AND step = ? AND ts BETWEEN ? AND ?)) ORDER BY ts",
                     [inc.job, files_read, lo, hi, lg, lo - dt.timedelta(seconds=LAST_GOOD_WITHIN_S), hi])
    files = {}
    if con is not None and has_table(con, "sources"):
        files = dict(con.execute("SELECT source_id, file FROM sources").fetchall())
    # one row per event: evidence rows win (they carry the detector's rank and role); the
    # same line read twice (a --tee console and a rank file) once
    seen_keys: set = {r["dedup_key"] for r in rows if r["dedup_key"] and (r["source_id"], r["offset"]) in evidence}
    events: list[dict] = []
    for r in rows:
        key = r["dedup_key"] or (r["source_id"], r["offset"])
        if key in seen_keys or (r["source_id"], r["offset"]) in evidence:
            continue
        seen_keys.add(key)
        events.append({**r, "role": "context"})
    by_key = {**stored, **{(r["source_id"], r["offset"]): r for r in rows}}
    for e in inc.evidence:
        row = by_key.get((e.source_id, e.offset), {})
        step = row.get("step")
        if step is None and e.kind in ("save_start", "save_end"):
            step = inc.step
        # the evidence says where its time came from (schema 4); the stored event when it does not
        ts_source = row.get("ts_source") or (e.ts_source if e.ts_source != "line" else None)
        events.append({"ts": e.ts, "ts_source": ts_source, "host": e.host, "rank": e.rank,
                       "kind": e.kind, "step": step, "line": e.line, "source_id": e.source_id, "offset": e.offset,
                       "role": e.role if e.role in ("root_cause", "collateral") else "context"})
    # host-level lines (kernel, storage) of the job's hosts in the window
    rank_hosts: dict[int, Counter] = {}
    for ev in events:
        if ev["rank"] is not None:
            rank_hosts.setdefault(ev["rank"], Counter())[ev["host"]] += ev["host"] is not None
    for r in (inc.checkpoint_state.get("expected_ranks") or []):
        rank_hosts.setdefault(r, Counter())
    host_of = {r: (c.most_common(1)[0][0] if c and c.most_common(1)[0][1] else None) for r, c in rank_hosts.items()}
    hosts = sorted({h for h in host_of.values() if h is not None})
    if con is not None and hosts and has_table(con, "events"):
        for r in _rows(con, "SELECT ts, ts_source, host, rank, kind, step, line, source_id, \"offset\", "
                            "dedup_key FROM events WHERE job IS NULL AND list_contains(?, host) AND ts BETWEEN ? AND ? ORDER BY ts",
                       [hosts, lo, hi]):
            if (r["source_id"], r["offset"]) not in evidence and (r["source_id"], r["offset"]) not in by_key:
                events.append({**r, "role": "context"})
    # each event whose time is not its line's own at the time the detectors date it by
    dating = Dating((ev["source_id"], ev["offset"], ev["ts"], _source(ev)) for ev in events)
    for ev in events:
        if _approx(ev):
            ev["ts"] = dating.at(ev["source_id"], ev["offset"], ev["ts"], ev["ts_source"])
    # lanes: the job's, then per host its own lane (when it has lines) and its ranks
    ranks_by_host: dict[str | None, list[int]] = {}
    for r, h in sorted(host_of.items(), key=lambda kv: (kv[1] is None, kv[1] or "", kv[0])):
        ranks_by_host.setdefault(h, []).append(r)
    host_lines = {ev["host"] for ev in events if ev["rank"] is None and ev["host"] is not None}
    if any(ev["rank"] is None and (ev["host"] is None or ev["host"] not in ranks_by_host) for ev in events
           if ev["kind"] in DRAWN):
        tl.lanes.append(Lane(None, None))
    for h, ranks in ranks_by_host.items():
        if h is not None and h in host_lines:
            tl.lanes.append(Lane(h, None))
        tl.lanes += [Lane(h, r) for r in ranks]
    lane_of_rank = {lane.rank: lane for lane in tl.lanes if lane.rank is not None}

    def lane_for(ev: dict) -> Lane:
        if ev["rank"] is not None and ev["rank"] in lane_of_rank:
            return lane_of_rank[ev["rank"]]
        if ev["host"] is not None and Lane(ev["host"], None) in tl.lanes:
            return Lane(ev["host"], None)
        if Lane(None, None) not in tl.lanes:
            tl.lanes.insert(0, Lane(None, None))
        return Lane(None, None)

    events.sort(key=lambda ev: ev["ts"])
    for ev in events:
        if ev["kind"] in DRAWN:
            tl.marks.append(Mark(lane_for(ev), ev["ts"], ev["kind"], ev["role"], _first_line(ev["line"]),
                                 files.get(ev["source_id"]), _approx(ev)))
    rc = inc.root_cause
    if rc is not None and rc.ts is not None and not any(m.role == "root_cause" for m in tl.marks):
        # the detector blamed a rank that printed nothing of its own (e.g. the one the others
        # timed out waiting for): the mark goes on that rank's lane, at the time it gave
        lane = lane_of_rank.get(rc.rank) if rc.rank is not None else Lane(None, None)
        if lane is not None and lane in tl.lanes:
            tl.marks.append(Mark(lane, rc.ts, rc.cls, "root_cause", _first_line(rc.line), None, True))
    tl.bars = _bars(events, lane_of_rank, inc)
    stamps = [m.ts for m in tl.marks] + [b.start for b in tl.bars] + [b.end for b in tl.bars]
    tl.start, tl.end = (min(stamps), max(stamps)) if stamps else (inc.first_ts, inc.first_ts)
    lg = inc.last_good_checkpoint
    if lg and lg.get("step") is not None and not any(b.last_good for b in tl.bars):
        tl.last_good_outside = lg["step"]
    return tl


def _first_line(text: str | None) -> str:
    return (text or "").split("\n")[0]


def _stored(con: duckdb.DuckDBPyConnection, refs: list[tuple[str, int]]) -> dict[tuple[str, int], dict]:
    """The stored ``events`` rows of the lines ``refs`` (``(source_id, offset)``) names, by ref:
    whatever job they were stored under (the evidence says where its times came from)."""
    if not refs:
        return {}
    rows = _rows(con, "SELECT e.ts_source, e.step, e.source_id, e.\"offset\" FROM events e JOIN (SELECT "
                      "unnest(?::VARCHAR[]) AS sid, unnest(?::BIGINT[]) AS off) r ON e.source_id = r.sid "
                      "AND e.\"offset\" = r.off", [[r[0] for r in refs], [r[1] for r in refs]])
    return {(r["source_id"], r["offset"]): r for r in rows}


def _source(ev: dict) -> str:
    """Where the event's time came from (``ts_source``); one not known (an incident stored
    nowhere, an event the database no longer holds) is taken as its line's own."""
    return ev.get("ts_source") or "line"


def _approx(ev: dict) -> bool:
    """The event's time is not its line's own (``inherited`` from an earlier line, or the file's ``mtime``)."""
    return _source(ev) not in OWN_TIME


def _bars(events: list[dict], lanes: dict[int, Lane], inc: Incident) -> list[Bar]:
    """Each rank's saves: save_start to its save_end, else to the rank's first ending event
    after it (or the root cause's time), else open to the last event."""
    out: list[Bar] = []
    last = max((ev["ts"] for ev in events), default=inc.first_ts)
    root_ts = inc.root_cause.ts if inc.root_cause and inc.root_cause.ts else None
    lg_step = (inc.last_good_checkpoint or {}).get("step")
    starts: dict[tuple[int, int | None], dict] = {}
    for ev in events:
        if ev["kind"] == "save_start" and ev["rank"] in lanes:
            starts.setdefault((ev["rank"], ev["step"]), ev)
    for (rank, step), first in sorted(starts.items(), key=lambda kv: (kv[1]["ts"], kv[0][0])):
        start = first["ts"]  # dated (build_timeline): a start whose time is inherited is never drawn from that time
        mine = [ev for ev in events if ev["rank"] == rank and ev["ts"] >= start]
        end = next((ev["ts"] for ev in mine if ev["kind"] == "save_end" and ev["step"] in (step, None)), None)
        outcome = "saved"
        if end is None:  # the first failure of the rank whose time is its own (an inherited one may be long before)
            end = next((ev["ts"] for ev in mine if ev["kind"] in ENDING and not _approx(ev)), None)
            outcome = "cut"
            if end is None and root_ts is not None and root_ts >= start:
                end = root_ts
            if end is None:
                end, outcome = last, "open"
        out.append(Bar(lanes[rank], step, start, end, outcome, last_good=step is not None and step == lg_step
                       and outcome == "saved", approx=_approx(first)))
    return out
