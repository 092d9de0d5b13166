"""Console channel: the incident report on the terminal (the embedded default).

A trigger prints the full text report (:func:`ckptwatch.sinks.report.render_text`), an
escalation or re-alert prints it again under a one-line heading, a resolve prints one
line, and an incident a silence mutes prints one line saying so (:meth:`ConsoleChannel.silenced`).
The incident is redacted as a whole like on every other channel (checkpoint paths,
last good checkpoint, root cause, evidence, remediation), before anything is printed.
"""

from __future__ import annotations

import threading

from rich.console import Console
from rich.markup import escape

from ckptwatch.detectors.headline import headline, where
from ckptwatch.detectors.incident import Incident
from ckptwatch.sinks import report
from ckptwatch.sinks.alerts.http import Outcome
from ckptwatch.sinks.alerts.notification_log import Notification
from ckptwatch.sinks.redact import Redactor
from ckptwatch.sinks.alerts.silences import Silence

_HEADING = {"escalate": "severity rose", "realert": "still open", "update": "root cause revised"}


class ConsoleChannel:
    """Writes to ``console`` (stdout by default); never fails. A re-print is harmless."""

    idempotent = True

    def __init__(self, name: str, *, redactor: Redactor, console: Console | None = None) -> None:
        self.name, self.redactor = name, redactor
        self.console = console or Console(emoji=False, highlight=False, soft_wrap=True)
        self._lock = threading.Lock()  # deliveries run on worker threads: one report at a time

    def silenced(self, inc: Incident, silence: Silence) -> None:
        """Say that ``inc`` (redacted) was muted by ``silence``, in one line: a silenced
        incident is not paged, but it does not vanish from the console either."""
        why = f" ({silence.comment})" if silence.comment else ""
        with self._lock:
            self.console.print(f"[dim]silenced until {silence.expires:%Y-%m-%d %H:%M} UTC by silence {silence.id}{escape(why)}:"
                               f"[/dim] {escape(headline(inc))} [dim](incident {inc.id})[/dim]")

    def deliver(self, n: Notification) -> Outcome:
        """Print the report (or the resolve line) of ``n``'s redacted incident."""
        inc = self.redactor.incident(n.incident)
        with self._lock:
            if n.action == "resolve":
                self.console.print(f"[green]{inc.status}[/green] {escape(inc.kind)}: job {escape(str(inc.job))} "
                                   f"{escape(where(inc))} (incident {inc.id})")
                return Outcome("sent")
            if n.action in _HEADING:
                self.console.print(f"[bold]{_HEADING[n.action]}:[/bold] incident {inc.id}")
            elif inc.status == "resolved":  # first alerted when already over: told once all the same
                self.console.print(f"[bold]resolved before it was alerted:[/bold] incident {inc.id}")
            report.render_text([inc], self.console)
        return Outcome("sent")
