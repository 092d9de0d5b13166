"""Pictures of an incident: its per-rank timeline (:mod:`ckptwatch.history.timeline`) drawn
with matplotlib, as PNG, SVG, or a self-contained HTML page (the SVG inline, then the
report and the evidence; nothing fetched from the network).

The picture: a lane per rank, grouped by host (a band per host, its name at the left; a
lane of its own for the host's kernel, storage and scheduler lines), and one for the job's
launcher; each save of a step as a bar from its start to its end (green: saved; red,
hatched: cut off by a failure; grey: still open), the last good checkpoint's bars marked;
the initiating event as a large red star, labelled with the root cause; collateral events
(other ranks' reports of the same failure) as orange crosses; the rest by kind. An event
whose time is not its line's own (inherited from an earlier line), and a save bar that
starts at one, are drawn faded (:data:`FADED`), where the timeline dates them. Time is UTC.
Lane height is fixed, so a 64-rank job is a taller picture, not a squeezed one.

Text from logs is drawn as text: matplotlib's mathtext (``$...$``) is off for every
picture (``text.parse_math``), and pictures are drawn one at a time per process
(matplotlib's global state, mathtext included, is not thread-safe; the console draws from
request threads).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import html
import io
import threading
from collections.abc import Iterator, Sequence
from typing import BinaryIO

import matplotlib
import matplotlib.dates as mdates
import matplotlib.transforms as mtransforms
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from ckptwatch.history.timeline import Lane, Timeline

#: seconds a picture spans at least (events within a second drawn in a readable window)
MIN_SPAN_S = 10.0
#: inches per lane, and around the lanes (title, axis, legend)
LANE_IN, FRAME_IN, WIDTH_IN = 0.26, 2.4, 12.0
#: marker per event kind of a context mark: (marker, colour, legend label)
KIND_STYLE = {
    "save_start": ("|", "#1b5e20", "save started"),
    "save_end": ("|", "#1b5e20", "save finished"),
    "process_exit": ("v", "#424242", "process exit"),
    "agent_signal": (">", "#6a1b9a", "launcher signal"),
    "job_signal": (">", "#ad1457", "job signal (scheduler)"),
    "collective_timeout": ("D", "#8d6e63", "collective timeout"),
    "collective_error": ("D", "#8d6e63", "collective error"),
    "oom_kill": ("s", "#000000", "kernel OOM kill"),
    "cuda_oom": ("s", "#5d4037", "CUDA OOM"),
    "node_lost": ("s", "#b71c1c", "node lost"),
    "storage_error": ("s", "#0d47a1", "storage error"),
    "gpu_xid": ("s", "#4a148c", "GPU Xid"),
    "host_memory": ("s", "#3e2723", "host memory exhausted"),
    "native_crash": ("s", "#880e4f", "native crash"),
    "exception": ("x", "#b71c1c", "exception in save / load code"),
    "save_error": ("x", "#c62828", "save error"),
    "load_start": ("|", "#01579b", "load started"),
    "load_end": ("|", "#01579b", "load finished"),
    "load_error": ("x", "#e65100", "load error"),
    "job_failed": ("P", "#212121", "job failed"),
    "job_end": ("P", "#616161", "job ended"),
    "resume": ("o", "#01579b", "resume"),
    "integrity": ("s", "#37474f", "integrity check"),
}
BAR_STYLE = {"saved": ("#66bb6a", None), "cut": ("#ef5350", "///"), "open": ("#bdbdbd", None)}
#: the opacity of what has no time of its own (:attr:`Mark.approx <ckptwatch.history.timeline.Mark.approx>`,
#: :attr:`Bar.approx <ckptwatch.history.timeline.Bar.approx>`)
FADED = 0.4
#: the legend's word for it
FADED_LABEL = "faded: no time of its own (dated by a later line)"
#: One picture at a time per process. matplotlib's drawing state is process-wide and not
#: thread-safe: ``rcParams`` (``rc_context`` below swaps them for the whole process, not
#: for one thread), pyplot's current figure (for any caller that uses pyplot), the font
#: cache and the mathtext parser (a pyparsing grammar with a process-wide packrat cache:
#: two threads parsing at once corrupt it).
#: The console draws from its request threads, so every drawing entry point holds this.
#: Re-entrant: an entry point may call another (:func:`html_page` draws through
#: :func:`svg`) or be called under :func:`_drawing` without deadlocking its own thread.
_DRAWING = threading.RLock()


@contextlib.contextmanager
def _drawing(**rc: object) -> Iterator[None]:
    """Hold the drawing lock with log text as plain text (and ``rc``'s settings)."""
    with _DRAWING, matplotlib.rc_context({"text.parse_math": False, **rc}):
        yield


def _num(t: dt.datetime) -> float:
    return float(mdates.date2num(t))


def draw(tl: Timeline) -> Figure:
    """The timeline as a matplotlib figure. Made without pyplot (no backend chosen, nothing
    to close): saved by :func:`write_png` / :func:`svg`, shown in a notebook with
    ``display(fig)``. Its text is made with mathtext off (``$`` drawn as ``$``)."""
    with matplotlib.rc_context({"text.parse_math": False}):
        return _draw(tl)


def _draw(tl: Timeline) -> Figure:
    inc = tl.incident
    lanes = tl.lanes or [Lane(None, None)]
    row = {lane: i for i, lane in enumerate(lanes)}
    fig = Figure(figsize=(WIDTH_IN, FRAME_IN + LANE_IN * len(lanes)))
    ax = fig.subplots()
    start, end = tl.start or inc.first_ts, tl.end or inc.first_ts
    if (end - start).total_seconds() < MIN_SPAN_S:  # a few events within a second: centred in a readable window
        middle = start + (end - start) / 2
        start, end = middle - dt.timedelta(seconds=MIN_SPAN_S / 2), middle + dt.timedelta(seconds=MIN_SPAN_S / 2)
    span = (end - start).total_seconds()
    pad = dt.timedelta(seconds=span * 0.04)
    ax.set_xlim(_num(start - pad), _num(end + pad * 6))  # room at the right for the root cause's label
    ax.set_ylim(len(lanes) - 0.5, -0.5)
    # host bands
    shade = False
    for host in tl.hosts:
        rows_of = [row[lane] for lane in lanes if lane.host == host]
        if shade:
            ax.axhspan(min(rows_of) - 0.5, max(rows_of) + 0.5, color="#f5f5f5", zorder=0)
        shade = not shade
        ax.annotate(host or "host unknown", xy=(0, (min(rows_of) + max(rows_of)) / 2),
                    xycoords=("axes fraction", "data"), xytext=(-62, 0), textcoords="offset points", ha="right",
                    va="center", fontsize=9, fontweight="bold", color="#37474f", annotation_clip=False)
        if len(rows_of) > 1:  # a bracket over the host's lanes, between its name and the rank labels
            at = ax.get_yaxis_transform() + mtransforms.ScaledTranslation(-56 / 72, 0, fig.dpi_scale_trans)
            ax.plot([0, 0], [min(rows_of) - 0.35, max(rows_of) + 0.35], transform=at, clip_on=False,
                    color="#90a4ae", linewidth=1.2)
    small = len(lanes) > 24
    ax.set_yticks(range(len(lanes)), [lane.label for lane in lanes], fontsize=6.5 if small else 8.5)
    ax.tick_params(axis="y", length=0, pad=4)
    # saves
    for bar in tl.bars:
        colour, hatch = BAR_STYLE[bar.outcome]
        width = max(_num(bar.end) - _num(bar.start), span / 86400 / 400)
        ax.broken_barh([(_num(bar.start), width)], (row[bar.lane] - 0.32, 0.64), facecolors=colour, hatch=hatch,
                       edgecolor="#2e7d32" if bar.last_good else "none", linewidth=1.6 if bar.last_good else 0,
                       zorder=2, alpha=FADED if bar.approx else 1.0)
    placed: list[float] = []
    stacked = 0
    for step, bars in _by_step(tl):
        first = min(bars, key=lambda b: row[b.lane])
        label = f"step {step}" + (" (last good)" if any(b.last_good for b in bars) else "")
        x = _num(min(b.start for b in bars))
        # a label starting within 12 % of the span of the one before goes a line higher
        near = sum(1 for p in placed if abs(x - p) < span / 86400 * 0.12)
        placed.append(x)
        stacked = max(stacked, near)
        ax.annotate(label, (x, row[first.lane] - 0.5), xytext=(0, 2 + 9 * near), textcoords="offset points",
                    fontsize=7.5, color="#1b5e20" if "good" in label else "#424242", va="bottom",
                    annotation_clip=False)
    # events
    seen: dict[str, tuple[str, str]] = {}
    for m in tl.marks:
        y = row[m.lane]
        faded = FADED if m.approx else 1.0  # a time inherited from an earlier line
        if m.role == "root_cause":
            ax.scatter(_num(m.ts), y, marker="*", s=260, color="#d50000", edgecolor="black", linewidth=0.8, zorder=6,
                       alpha=faded)
        elif m.role == "collateral":
            ax.scatter(_num(m.ts), y, marker="X", s=60, color="#ff9800", edgecolor="black", linewidth=0.4, zorder=5,
                       alpha=faded)
        else:
            marker, colour, name = KIND_STYLE.get(m.kind, (".", "#757575", m.kind))
            ax.scatter(_num(m.ts), y, marker=marker, s=40 if marker != "|" else 90, color=colour, zorder=4,
                       linewidth=1.2, alpha=faded)
            seen.setdefault(name, (marker, colour))
    root = next((m for m in tl.marks if m.role == "root_cause"), None)
    rc = inc.root_cause
    if root is not None and rc is not None:
        text = f"root cause: {rc.cls}" + (f" ({rc.signal})" if rc.signal else "") + \
               (f"\nrank {rc.rank}" if rc.rank is not None else "") + (f" on {rc.host}" if rc.host else "")
        ax.annotate(text, (_num(root.ts), row[root.lane]), xytext=(18, -16 if row[root.lane] < len(lanes) - 1 else 14),
                    textcoords="offset points", fontsize=9, fontweight="bold", color="#b71c1c",
                    arrowprops={"arrowstyle": "-", "color": "#b71c1c", "lw": 1},
                    bbox={"boxstyle": "round,pad=0.25", "fc": "white", "ec": "#b71c1c", "lw": 0.8}, zorder=7)
    # axes, title, legend
    locator = mdates.AutoDateLocator(minticks=4, maxticks=9)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S" if span < 6 * 3600 else "%m-%d %H:%M",
                                                      tz=dt.timezone.utc))
    ax.set_xlabel(f"event time (UTC), {start:%Y-%m-%d}", fontsize=8.5)
    ax.tick_params(axis="x", labelsize=8)
    ax.grid(axis="x", color="#e0e0e0", linewidth=0.6, zorder=1)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    step = "unknown" if inc.step is None else inc.step
    title = f"{inc.kind} · job {inc.job} · step {step}"
    lg = inc.last_good_checkpoint
    ranks = sum(1 for lane in lanes if lane.rank is not None)
    named = [h for h in tl.hosts if h is not None]
    where = f"{len(named)} host{'s' if len(named) != 1 else ''}" + (" and ranks of unknown host" if None in tl.hosts
                                                                    and named else "")
    sub = [f"{ranks} rank{'s' if ranks != 1 else ''} on {where}" if named else
           f"{ranks} rank{'s' if ranks != 1 else ''}, host not in the logs",
           f"collateral ranks: {rank_ranges(inc.collateral) or 'none'}",
           f"last good checkpoint: step {lg['step']}" if lg else "no good checkpoint seen"]
    if tl.last_good_outside is not None:
        sub[-1] += " (saved before this window)"
    above = 14 + 9 * stacked  # points above the axes the step labels take
    ax.set_title(title, fontsize=11.5, fontweight="bold", loc="left", pad=above + 16)
    ax.annotate("   ·   ".join(sub) + f"   ·   id {inc.id}", xy=(0, 1), xycoords="axes fraction",
                xytext=(0, above), textcoords="offset points", fontsize=8.5, color="#455a64", va="bottom")
    outcomes = {b.outcome for b in tl.bars}
    roles = {m.role for m in tl.marks}
    handles = []  # what the picture shows, nothing else
    if "saved" in outcomes:
        handles.append(Patch(facecolor=BAR_STYLE["saved"][0], label="save finished"))
    if any(b.last_good for b in tl.bars):
        handles.append(Patch(facecolor=BAR_STYLE["saved"][0], edgecolor="#2e7d32", linewidth=1.6,
                             label="last good checkpoint"))
    if "cut" in outcomes:
        handles.append(Patch(facecolor=BAR_STYLE["cut"][0], hatch="///", label="save cut off"))
    if "open" in outcomes:
        handles.append(Patch(facecolor=BAR_STYLE["open"][0], label="save not ended in the logs"))
    if "root_cause" in roles:
        handles.append(Line2D([], [], marker="*", color="#d50000", markeredgecolor="black", markersize=13,
                              linestyle="", label="initiating failure"))
    if "collateral" in roles:
        handles.append(Line2D([], [], marker="X", color="#ff9800", markeredgecolor="black", markersize=8,
                              linestyle="", label="collateral report"))
    handles += [Line2D([], [], marker=mk, color=c, linestyle="", markersize=7, label=name)
                for name, (mk, c) in seen.items() if not name.startswith("save ")]
    if any(m.approx for m in tl.marks) or any(b.approx for b in tl.bars):
        handles.append(Line2D([], [], marker="o", color="#757575", alpha=FADED, linestyle="", markersize=7,
                              label=FADED_LABEL))
    if handles:
        ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -1.05 / (FRAME_IN + LANE_IN * len(lanes))),
                  ncol=min(len(handles), 5), fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def rank_ranges(ranks: Sequence[int]) -> str:
    """``[0, 1, 2, 3, 5, 7, 8]`` -> ``0-3, 5, 7, 8`` (a run of three or more as a range)."""
    runs: list[list[int]] = []
    for r in sorted(set(ranks)):
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    return ", ".join(f"{run[0]}-{run[-1]}" if len(run) > 2 else ", ".join(map(str, run)) for run in runs)


def _by_step(tl: Timeline) -> list[tuple[int | None, list]]:
    out: dict[int | None, list] = {}
    for b in tl.bars:
        out.setdefault(b.step, []).append(b)
    return sorted(out.items(), key=lambda kv: min(b.start for b in kv[1]))


def write_png(tl: Timeline, out: str | BinaryIO, *, dpi: int = 130) -> None:
    """The picture as PNG, to a path or a binary file. Raises OSError when it cannot be written."""
    with _drawing():
        draw(tl).savefig(out, format="png", dpi=dpi, bbox_inches="tight")


def svg(tl: Timeline) -> str:
    """The picture as an SVG document (text; fonts drawn as paths: no font is fetched)."""
    buf = io.StringIO()
    with _drawing(**{"svg.fonttype": "path"}):
        draw(tl).savefig(buf, format="svg", bbox_inches="tight")
    text = buf.getvalue()
    return text[text.index("<svg"):]  # inline: without the XML prolog and doctype


def html_page(tl: Timeline, report_text: str, *, title: str | None = None, extra: Sequence[str] = ()) -> str:
    """A self-contained HTML page: the SVG timeline, the report (preformatted) and a table
    of the drawn events (time, lane, role, kind, file, line). No script, no stylesheet or
    font from the network."""
    inc = tl.incident
    rows = "\n".join(
        f"<tr class=\"{m.role}\"><td>{m.ts:%H:%M:%S.%f}{' ≈ (no time of its own)' if m.approx else ''}</td>"
        f"<td>{html.escape(m.lane.label)}</td>"
        f"<td>{m.role}</td><td>{m.kind}</td><td>{html.escape(m.file or '')}</td>"
        f"<td><code>{html.escape(m.line[:300])}</code></td></tr>" for m in tl.marks)
    name = html.escape(title or f"{inc.kind} · {inc.job} · step {inc.step}")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{name}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.5rem; color: #212121; }}
pre {{ background: #fafafa; border: 1px solid #e0e0e0; padding: .75rem; overflow-x: auto; font-size: .8rem; }}
table {{ border-collapse: collapse; font-size: .78rem; }} td, th {{ padding: .15rem .5rem; text-align: left; }}
tr.root_cause {{ background: #ffebee; font-weight: 600; }} tr.collateral {{ background: #fff3e0; }}
svg {{ max-width: 100%; height: auto; }}
</style></head><body>
<h1 style="font-size:1.2rem">{name}</h1>
{svg(tl)}
{''.join(extra)}
<h2 style="font-size:1rem">Report</h2>
<pre>{html.escape(report_text)}</pre>
<h2 style="font-size:1rem">Events drawn</h2>
<table><tr><th>time (UTC)</th><th>lane</th><th>role</th><th>kind</th><th>file</th><th>line</th></tr>
{rows}
</table>
</body></html>
"""

