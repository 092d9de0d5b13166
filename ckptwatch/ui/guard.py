"""What the console checks on every request and adds to every answer, so that a web page
the operator happens to open cannot use it (DNS rebinding, cross-site posts, framing) and
an address other than loopback can require a token.

* **Host** (DNS rebinding: ``attacker.example`` resolving to 127.0.0.1): the ``Host``
  header's name must be an IP address, ``localhost``, this machine's host name (long or
  short), or one given with ``--allow-host``; otherwise 421 (Misdirected Request). An IP
  literal is safe: a rebinding page is served under a domain name.
* **Origin** (CSRF): a request that is not ``GET`` / ``HEAD`` / ``OPTIONS`` and carries
  an ``Origin`` (browsers send it on every cross-origin POST, form posts included) must
  come from the console's own origin, and none may say ``Sec-Fetch-Site: cross-site``;
  otherwise 403. Scripts (curl, Python) send neither and pass.
* **Token** (optional; for an address other than loopback): when one is set, every request
  carries it as ``Authorization: Bearer TOKEN``, or the ``ckptwatch_token`` cookie, or once
  as ``?token=TOKEN`` (which sets that cookie, ``HttpOnly; SameSite=Strict``, and redirects
  to the same page without it); otherwise 401. Compared in constant time.
* **Headers** on every answer: a Content-Security-Policy allowing only the page's own
  inline script (a fresh nonce per page: ``csp_nonce`` in templates), inline styles and
  ``data:`` images, fetches to the console itself, no framing (also ``X-Frame-Options:
  DENY``), ``X-Content-Type-Options: nosniff``, ``Referrer-Policy: no-referrer``,
  ``Cache-Control: no-store``.

Header semantics: RFC 9110 (Host, 421), the Fetch standard (``Origin``,
``Sec-Fetch-Site``), CSP Level 3 (nonces, ``frame-ancestors``).
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
import socket
from collections.abc import Iterable
from urllib.parse import urlencode

from flask import Flask, Response, g, jsonify, redirect, request

#: the cookie a ``?token=`` visit sets
TOKEN_COOKIE = "ckptwatch_token"
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    return True


def _same(given: str, token: str) -> bool:
    """``given`` is ``token``, compared in constant time (as UTF-8 bytes: any text)."""
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), token.encode("utf-8", "surrogateescape"))


def host_name(host_header: str) -> str:
    """The name part of a ``Host`` header (``name``, ``name:port``, ``[v6]:port``),
    lower-cased, without a trailing dot."""
    h = host_header.strip().lower()
    if h.startswith("["):
        return h[: h.find("]") + 1] if "]" in h else h
    return h.rsplit(":", 1)[0].rstrip(".") if h.count(":") == 1 else h.rstrip(".")


def allowed_hosts(extra: Iterable[str] = ()) -> frozenset[str]:
    """Host names the console answers to besides IP literals: ``localhost``, this
    machine's host name and its first label, and ``extra`` (``--allow-host``)."""
    me = socket.gethostname().lower().rstrip(".")
    return frozenset({"localhost", me, me.split(".", 1)[0], *(h.lower().rstrip(".") for h in extra if h)})


def install(app: Flask, *, token: str | None = None, allow_hosts: Iterable[str] = ()) -> None:
    """Add the checks and headers of the module docstring to ``app``. ``token``: required
    on every request when given (empty means none)."""
    names = allowed_hosts(allow_hosts)

    def refuse(code: int, msg: str) -> Response:
        resp = jsonify(error=msg)
        resp.status_code = code
        return resp

    @app.before_request
    def _check():  # noqa: ANN202
        g.csp_nonce = secrets.token_urlsafe(16)
        name = host_name(request.host or "")
        if not (_is_ip(name) or name in names):
            return refuse(421, f"host {name!r} is not this console's (start it with --allow-host {name} to allow it)")
        if request.method not in _SAFE_METHODS:
            origin = request.headers.get("Origin")
            own = f"{request.scheme}://{request.host}".lower()
            if (origin is not None and origin.lower() != own) or \
                    request.headers.get("Sec-Fetch-Site", "").lower() == "cross-site":
                return refuse(403, "cross-origin request refused: post from the console's own pages")
        if token:
            given = request.args.get("token")
            if given is not None and request.method in _SAFE_METHODS and _same(given, token):
                rest = [(k, v) for k, v in request.args.items(multi=True) if k != "token"]
                resp = redirect(request.path + ("?" + urlencode(rest) if rest else ""), code=303)
                resp.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="Strict", path="/")
                return resp
            auth = request.headers.get("Authorization", "")
            bearer = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
            cookie = request.cookies.get(TOKEN_COOKIE, "")
            if not (_same(bearer, token) or _same(cookie, token)):
                return refuse(401, "this console needs its token: open it once as /?token=TOKEN, "
                                   "or send Authorization: Bearer TOKEN")
        return None

    @app.after_request
    def _headers(resp: Response) -> Response:
        nonce = g.get("csp_nonce", "")
        resp.headers["Content-Security-Policy"] = (
            f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'unsafe-inline'; img-src 'self' data:; "
            "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
        resp.headers["X-Frame-Options"] = "DENY"
        resp.headers["X-Content-Type-Options"] = "nosniff"
        resp.headers["Referrer-Policy"] = "no-referrer"
        resp.headers["Cache-Control"] = "no-store"
        return resp

    @app.context_processor
    def _nonce() -> dict[str, str]:
        return {"csp_nonce": g.get("csp_nonce", "")}

