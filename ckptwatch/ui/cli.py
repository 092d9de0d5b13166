"""``ckptwatch ui``: the web console alone, over a database at rest or the read snapshot of
the process writing it (``run --ui`` / ``sink --ui`` serve it beside ingestion instead).

    ckptwatch ui [--db incidents.duckdb] [--port 8470] [--address 127.0.0.1]
                 [--token-file FILE] [--allow-host NAME ...]

A token (``--token-file``, or ``$CKPTWATCH_UI_TOKEN``; ``run --ui`` and ``sink --ui`` read
the variable) is then required on every request (:mod:`ckptwatch.ui.guard`): set one
whenever the console listens on an address other than loopback.

Exit codes: 0 stopped (Ctrl-C, SIGTERM), 2 a usage error or a port that cannot be bound.
"""

from __future__ import annotations

import errno
import os
import signal
import threading
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from ckptwatch import config as config_mod
from ckptwatch.ui.server import DEFAULT_PORT

_err = Console(stderr=True, emoji=False, highlight=False, soft_wrap=True)


#: the environment variable holding the console's token
TOKEN_ENV = "CKPTWATCH_UI_TOKEN"
LOOPBACK = ("127.0.0.1", "::1", "localhost")


def _fail(msg: str) -> typer.Exit:
    _err.print(f"[red]error:[/red] {escape(msg)}")
    return typer.Exit(2)


def console_token(token_file: str | None = None) -> str | None:
    """The console's token: the first line of ``token_file``, else ``$CKPTWATCH_UI_TOKEN``,
    else None. Raises ValueError naming the file when it cannot be read or is empty."""
    if token_file:
        try:
            with open(token_file, encoding="utf-8") as f:
                token = f.readline().strip()
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"--token-file {token_file}: cannot read: {getattr(e, 'strerror', None) or e}") from None
        if not token:
            raise ValueError(f"--token-file {token_file}: empty")
        return token
    return os.environ.get(TOKEN_ENV, "").strip() or None


def exposure_warning(address: str, token: str | None) -> str | None:
    """What to warn about when the console listens on ``address`` without a token."""
    if address in LOOPBACK or token:
        return None
    return (f"listening on {address} without a token: the console shows log lines and takes uploads; anyone "
            f"who can reach this address can use it (set --token-file or ${TOKEN_ENV})")


def ui_cmd(db: Annotated[str | None, typer.Option("--db", help="The DuckDB file run/sink write (default: the "
                                                               "config's sink.db, incidents.duckdb).")] = None,
           port: Annotated[int, typer.Option("--port", help="TCP port (0: any free one).")] = DEFAULT_PORT,
           address: Annotated[str, typer.Option("--address", help="Address to listen on (default 127.0.0.1: this "
                                                                  "machine only).")] = "127.0.0.1",
           token_file: Annotated[str | None, typer.Option("--token-file", help="File whose first line is a token "
                                                                            "every request must carry (default "
                                                                            f"${TOKEN_ENV}).")] = None,
           allow_host: Annotated[list[str] | None, typer.Option("--allow-host", help="A host name the console may be "
                                                                                "reached by (besides IP addresses, "
                                                                                "localhost and this machine's "
                                                                                "name); repeatable.")] = None,
           config: Annotated[str | None, typer.Option("--config", help="TOML config file.")] = None) -> None:
    """Serve the web console: incidents (updated live), incident pages with their timeline,
    and "diagnose a log" (paste or drop files; read here, sent nowhere)."""
    from ckptwatch.sinks.redact import RedactionError, Redactor
    from ckptwatch.ui.app import create_app
    from ckptwatch.ui.server import ConsoleServer

    try:
        cfg = config_mod.load(config)
        redactor = Redactor.load(cfg.alerts.redaction_files)
        token = console_token(token_file)
    except (config_mod.ConfigError, RedactionError, ValueError) as e:
        raise _fail(str(e)) from None
    db = db or cfg.sink.db
    try:
        app = create_app(db, redactor=redactor, token=token, allow_hosts=allow_host or ())
        server = ConsoleServer(app, address, port).start()
    except OSError as e:
        hint = " (choose another --port)" if e.errno == errno.EADDRINUSE else ""
        raise _fail(f"cannot listen on {address}:{port}: {e.strerror or e}{hint}") from None
    warning = exposure_warning(address, token)
    if warning:
        _err.print(f"[yellow]warning:[/yellow] {escape(warning)}")
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
