"""Human-readable and JSON reports of incidents (``ckptwatch diagnose``, console channel).

The text report is meant to be read in ten seconds: what, where, who first, who else,
what is on disk, what to resume from, what to do, and a short per-rank timeline.
"""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.markup import escape

from ckptwatch.detectors.headline import why
from ckptwatch.detectors.incident import Incident

SEV_STYLE = {"critical": "bold red", "error": "red", "warning": "yellow", "info": "cyan"}
TIMELINE_MAX = 14


def _ranks(rs: list[int]) -> str:
    return ", ".join(str(r) for r in rs) if rs else "none"


def _ts(t: Any) -> str:
    return t.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC" if t is not None else "?"


def timeline(inc: Incident, limit: int = TIMELINE_MAX) -> list[str]:
    """A compact per-rank timeline of the evidence: root cause and collateral first, then
    save lines, in time order; at most ``limit`` lines."""
    ev = inc.evidence
    keep = [e for e in ev if e.role in ("root_cause", "collateral")]
    rest = [e for e in ev if e.role not in ("root_cause", "collateral")]
    chosen = sorted((keep + rest)[:limit], key=lambda e: (e.ts, e.source_id, e.offset))
    out = []
    for e in chosen:
        who = f"rank {e.rank}" if e.rank is not None else (e.host or "agent")
        mark = "*" if e.role == "root_cause" else " "
        when = e.ts.strftime('%H:%M:%S.%f')[:-3] + (" " if e.own_time else "≈")
        out.append(f"{mark}{when} {who:<8} {e.kind:<18} {e.line[:110]}")
    if len(ev) > limit:
        out.append(f"  … {len(ev) - limit} more evidence lines (see --json or the incident_evidence table)")
    if any(not e.own_time for e in chosen):
        out.append("  ≈ no time of its own: an earlier line's (the line came no earlier) or its file's mtime (no later)")
    return out


def _open_saves(console: Console, saves: list[dict[str, Any]]) -> None:
    """The saves the logs end inside of (no end, no failure after their start): what real
    pasted logs mostly mean by it is a process that died without a word (SIGKILL, the OOM
    killer: nothing is printed) or a paste cut there; a job still running shows it too."""
    if not saves:
        return
    console.print("[yellow]The logs end inside a save[/yellow] (started, not seen to finish, no failure after it):")
    for s in saves[:5]:
        step = f"step {s['step']}" if s.get("step") is not None else "a save whose step is not in the logs"
        console.print(f"  {escape(step)} of job {escape(str(s.get('job')))}"
                      + (f"  {escape(str(s['path']))}" if s.get("path") else ""))
    if len(saves) > 5:
        console.print(f"  … and {len(saves) - 5} more")
    console.print("  If the process is gone (it died without a word, as one killed by SIGKILL or the OOM killer does, "
                  "or the paste stops there), that checkpoint is not whole: verify it (ckptwatch verify PATH) before "
                  "resuming from it. If the job is still running, this is expected.")


def render_text(incidents: list[Incident], console: Console, stats: dict[str, Any] | None = None) -> None:
    """Print incidents (and a stats footer) to ``console``."""
    if not incidents:
        console.print("[green]No incident found.[/green]")
    _open_saves(console, (stats or {}).get("open_saves") or [])
    for inc in incidents:
        rc = inc.root_cause
        style = SEV_STYLE.get(inc.severity, "bold")
        console.print(f"[{style}]{escape(inc.severity.upper())}[/{style}] [bold]{escape(inc.kind)}[/bold]  "
                      f"job {escape(str(inc.job))}  step {'not in the logs' if inc.step is None else inc.step}  "
                      f"[dim]id {escape(inc.id)} · {escape(inc.status)}[/dim]")
        console.print(f"  checkpoint   {escape(inc.checkpoint_path or 'path not in the logs')}")
        if rc:
            sig = escape(f" ({rc.signal})") if rc.signal else ""
            where = ", ".join(f"{k} {v}" for k, v in (("rank", rc.rank), ("host", rc.host), ("pid", rc.pid))
                              if v is not None) or "rank unknown"
            # the root cause's line has no time of its own: dated by the next line of its file that has
            undated = [e for e in inc.evidence if e.role == "root_cause" and not e.own_time]
            if not undated:
                when = f"at {_ts(rc.ts)}"
            elif any(e.ts == rc.ts for e in undated):  # nothing dated after it in its file: a lower bound
                when = f"at ≈{_ts(rc.ts)} (no time of its own: an earlier line's; it came no earlier)"
            else:
                when = f"at ≈{_ts(rc.ts)} (no time of its own: the next dated line of its file)"
            console.print(f"  root cause   [bold]{escape(rc.cls)}{sig}[/bold] on {escape(where)}, {when}")
            if rc.line:
                console.print(f"               [dim]{escape(_telling_line(rc.line)[:160])}[/dim]")
            if rc.note:
                console.print(f"               {escape(rc.note)}")
        if not rc or rc.cls == "load_error":
            console.print(f"  what broke   {escape(why(inc))}")
        console.print(f"  collateral   ranks {_ranks(inc.collateral)}")
        cs = inc.checkpoint_state
        if cs.get("verdict"):  # corrupt_checkpoint: what verification found
            console.print(escape(f"  files        {cs['verdict']}: {cs.get('problems')} problem(s) in {cs.get('files')} "
                                 f"files ({cs.get('bytes')} bytes), manifest {'used' if cs.get('manifest') else 'none'}; "
                                 f"first: {cs.get('detail') or '-'}"))
        elif "expected_ranks" in cs:
            ws = f"world size {cs['world_size']}; " if cs.get("world_size") else ""
            console.print(f"  shards       {ws}ranks seen saving {_ranks(cs.get('expected_ranks', []))}; finished: "
                          f"{_ranks(cs.get('finished', []))}; started, not finished: "
                          f"{_ranks(cs.get('started_not_finished', []))}; not started: {_ranks(cs.get('not_started', []))}")
        if cs.get("presumed"):
            console.print("  save line    none in the logs: the save is presumed from where the job died, with its "
                          "progress bar standing at a save point (a completed bar, or a round step such as "
                          "save_steps' multiples) and no other line after it; trainers that log saves at INFO "
                          "(HF Trainer's default verbosity hides them) show nothing more")
        lg = inc.last_good_checkpoint
        lg_text = (f"step {lg['step']}" + (f"  {lg['path']}" if lg.get("path") else "")) if lg else "none seen"
        console.print(f"  last good    {escape(lg_text)}")
        console.print(f"  do this      {escape(inc.remediation)}")
        if inc.commands:
            console.print("  commands")
            for c in inc.commands:
                console.print(f"    [bold]{escape(c['command'])}[/bold]  [dim]# {escape(c['purpose'])}: "
                              f"{escape(str(c.get('source') or ''))}[/dim]", soft_wrap=True)
        console.print("  timeline")
        for line in timeline(inc):
            console.print(f"    {escape(line)}", soft_wrap=True)
        console.print()
    if stats:
        skipped = ", ".join(f"{k} {v}" for k, v in stats.get("skipped", {}).items()) or "none"
        notes = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in stats.get("notes", {}).items())
        notes = f"; dated with care: {notes}" if notes else ""
        console.print(f"[dim]{stats.get('files', 0)} files, {stats.get('lines', 0)} lines, {stats.get('events', 0)} events "
                      f"({stats.get('duplicate_events', 0)} seen twice), {len(incidents)} incident(s), "
                      f"skipped: {skipped}{notes}[/dim]")
        for err in [*stats.get("errors", []), *stats.get("warnings", [])]:
            console.print(f"[yellow]warning:[/yellow] {escape(err)}")


def render_json(incidents: list[Incident], stats: dict[str, Any]) -> str:
    """``{"incidents": [...], "stats": {...}}`` as documented in the README."""
    return json.dumps({"incidents": [i.to_dict() for i in incidents], "stats": stats}, indent=2, default=str)


def _telling_line(record: str) -> str:
    """The line of a multi-line record that says what happened: a traceback's exception
    line (its last line), else the record's first line."""
    lines = [ln.strip() for ln in record.splitlines() if ln.strip()]
    if not lines:
        return ""
    return lines[-1] if lines[0].startswith("Traceback") or lines[0].startswith("File ") else lines[0]
