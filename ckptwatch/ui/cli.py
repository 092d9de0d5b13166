"""``ckptwatch ui``: the web console alone, over a database at rest or the read snapshot of
the process writing it (``run --ui`` / ``sink --ui`` serve it beside ingestion instead).

    ckptwatch ui [--db incidents.duckdb] [--port 8470] [--address 127.0.0.1]

Exit codes: 0 stopped (Ctrl-C, SIGTERM), 2 a usage error or a port that cannot be bound.
"""

from __future__ import annotations

import errno
import signal
import threading
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from ckptwatch import config as config_mod
from ckptwatch.ui.server import DEFAULT_PORT

_err = Console(stderr=True, highlight=False, soft_wrap=True)


def _fail(msg: str) -> typer.Exit:
    _err.print(f"[red]error:[/red] {escape(msg)}")
    return typer.Exit(2)


def ui_cmd(db: Annotated[str | None, typer.Option("--db", help="The DuckDB file run/sink write (default: the "
                                                               "config's sink.db, incidents.duckdb).")] = None,
           port: Annotated[int, typer.Option("--port", help="TCP port (0: any free one).")] = DEFAULT_PORT,
           address: Annotated[str, typer.Option("--address", help="Address to listen on (default 127.0.0.1: this "
                                                                  "machine only).")] = "127.0.0.1",
           config: Annotated[str | None, typer.Option("--config", help="TOML config file.")] = None) -> None:
    """Serve the web console: incidents (updated live), incident pages with their timeline,
    and "diagnose a log" (paste or drop files; read here, sent nowhere)."""
    from ckptwatch.ui.app import create_app
    from ckptwatch.ui.server import ConsoleServer

    if not db:
        try:
            db = config_mod.load(config).sink.db
        except config_mod.ConfigError as e:
            raise _fail(str(e)) from None
    try:
        server = ConsoleServer(create_app(db), address, port).start()
    except OSError as e:
        hint = " (choose another --port)" if e.errno == errno.EADDRINUSE else ""
        raise _fail(f"cannot listen on {address}:{port}: {e.strerror or e}{hint}") from None
    if address not in ("127.0.0.1", "::1", "localhost"):
        _err.print(f"[yellow]warning:[/yellow] listening on {escape(address)}: the console shows raw log lines; "
                   "anyone who can reach this address can read them")
    print(f"console: {server.url}  (history of {db}; Ctrl-C stops it)", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        server.close()


def register(app: typer.Typer) -> None:
    """Add ``ui`` to ``app``."""
    app.command("ui")(ui_cmd)
