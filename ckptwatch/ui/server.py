"""Serving the console: a threaded WSGI server (Werkzeug's, which Flask uses) in a daemon
thread of the calling process, so ``run --ui`` and ``sink --ui`` serve it beside ingestion
and ``ckptwatch ui`` serves it alone.

A connection that sends nothing for :data:`IDLE_S` seconds is closed, and the access log
never shows a ``token=`` value (:mod:`ckptwatch.ui.guard`)."""

from __future__ import annotations

import re
import threading
from typing import Any

from flask import Flask
from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server

#: the console's default port
DEFAULT_PORT = 8470
#: seconds a connection may stay silent (mid-request or between requests)
IDLE_S = 30
_TOKEN = re.compile(r"([?&]token=)[^&\s\"]*")


class _Handler(WSGIRequestHandler):
    """Werkzeug's handler with a socket timeout and a token-free access log."""

    timeout = IDLE_S

    def log(self, type: str, message: str, *args: Any) -> None:  # noqa: A002  (Werkzeug's signature)
        super().log(type, message, *(_TOKEN.sub(r"\1[REDACTED]", a) if isinstance(a, str) else a for a in args))


class ConsoleServer:
    """``app`` served at ``http://address:port/`` (port 0: a free one, see :attr:`port`).
    Raises OSError when the address cannot be bound (e.g. the port is taken)."""

    def __init__(self, app: Flask, address: str = "127.0.0.1", port: int = DEFAULT_PORT) -> None:
        self._server: BaseWSGIServer = make_server(address, port, app, threaded=True, request_handler=_Handler)
        self.address = address
        self.port = self._server.server_port
        self._thread = threading.Thread(target=self._server.serve_forever, name="ckptwatch-console", daemon=True)

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}/"

    def start(self) -> ConsoleServer:
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving (requests in flight finish) and release the port."""
        self._server.shutdown()
        self._server.server_close()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
