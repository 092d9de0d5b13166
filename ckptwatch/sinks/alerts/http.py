"""One HTTP POST of a notification, and what the answer means for the outbox.

* 2xx: ``sent`` (as soon as the status line says so: a response body that comes late or
  not at all does not make it a retry, which would be a duplicate);
* 429 (rate limited) and 408, 5xx, timeouts, refused or reset connections: ``retry``, after
  the ``Retry-After`` header when the server gave one (seconds, or an HTTP date: RFC 9110
  section 10.2.3), else after the dispatcher's backoff;
* any other status (400 bad payload, 403 revoked token, 404 deleted webhook ...):
  ``rejected``: sending the same bytes again would fail the same way.

Two timeouts (:class:`Timeouts`): ``connect`` (TCP connect, proxy tunnel and TLS handshake;
short: nothing was sent yet, so giving up early costs nothing) and ``read`` (each wait for
the answer once the request is written; long, so a slow receiver that will say 200 is
waited for rather than sent the notification again). A retry whose outcome is unknown
(:attr:`Outcome.maybe_delivered`: the request was written in full and no status came) may
reach the receiver twice; :meth:`Timeouts.for_attempt` lengthens the read timeout on each
retry so a slow receiver gets at most a few copies.

Error texts name the status or the socket error, never the URL (a Slack webhook URL is
itself a secret).
"""

from __future__ import annotations

import datetime as dt
import email.utils
import http.client
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

USER_AGENT = "ckptwatch-alerts/0.1"
#: Defaults, seconds (``[alerts.channels.NAME] connect_timeout`` / ``read_timeout`` override).
CONNECT_TIMEOUT = 5.0
READ_TIMEOUT = 30.0
#: A retry's read timeout grows at most to this multiple of the configured one.
READ_GROWTH_MAX = 4


@dataclass(frozen=True)
class Timeouts:
    """Seconds: ``connect`` (connect + TLS handshake), ``read`` (each wait for the answer)."""

    connect: float = CONNECT_TIMEOUT
    read: float = READ_TIMEOUT

    def for_attempt(self, attempts: int) -> Timeouts:
        """The timeouts of a send after ``attempts`` earlier attempts: the read timeout
        doubles per attempt, up to :data:`READ_GROWTH_MAX` times the configured one."""
        return Timeouts(self.connect, self.read * min(2 ** max(attempts, 0), READ_GROWTH_MAX))


@dataclass(frozen=True)
class Request:
    """A POST to make: ``body`` bytes (JSON), extra ``headers``."""

    url: str = field(repr=False)
    body: bytes
    headers: dict[str, str] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class Outcome:
    """``status``: ``sent`` | ``retry`` | ``rejected``; ``retry_after`` in seconds when the
    server said how long to wait; ``error`` for the log; ``maybe_delivered``: a retry whose
    request was written in full before the answer failed to come (timeout, reset): the
    receiver may have acted on it."""

    status: str
    error: str = ""
    retry_after: float | None = None
    maybe_delivered: bool = False


def check_url(url: str) -> str | None:
    """Why ``url`` cannot be a channel endpoint (None when it can): it must be http(s) with a
    host and no ``user:password@`` part (urllib would look the password up as a host name).
    The reason never contains the URL."""
    try:
        u = urllib.parse.urlsplit(url.strip())
    except ValueError:
        return "is not a URL"
    if u.scheme not in ("http", "https") or not u.hostname:
        return "is not an http:// or https:// URL with a host"
    if "@" in u.netloc:
        return "has a user:password@ part, which is not supported"
    return None


def retry_after(value: str | None, now: dt.datetime | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` value (delta-seconds or HTTP date); None if absent
    or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    now = now or dt.datetime.now(dt.timezone.utc)
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return max(0.0, (when - now).total_seconds())


class _ReadTimeout:
    """Mixin for http.client connections: ``timeout`` (from urlopen) bounds connect, proxy
    tunnel and TLS handshake; once connected, the socket waits ``read_timeout``."""

    read_timeout: float
    sock: object

    def connect(self) -> None:
        super().connect()  # type: ignore[misc]
        self.sock.settimeout(self.read_timeout)  # type: ignore[attr-defined]


class _HTTP(_ReadTimeout, http.client.HTTPConnection):
    pass


class _HTTPS(_ReadTimeout, http.client.HTTPSConnection):
    pass


def _opener(read: float) -> urllib.request.OpenerDirector:
    """A urllib opener (environment proxies included) whose connections switch to ``read``
    seconds once connected."""

    class H(urllib.request.HTTPHandler):
        def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
            return self.do_open(_factory(_HTTP), req)

    class S(urllib.request.HTTPSHandler):
        def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
            return self.do_open(_factory(_HTTPS), req, context=self._context)  # type: ignore[attr-defined]

    def _factory(cls: type) -> object:
        def make(*args: object, **kwargs: object) -> http.client.HTTPConnection:
            conn = cls(*args, **kwargs)
            conn.read_timeout = read
            return conn
        return make

    return urllib.request.build_opener(H(), S())


def post(req: Request, timeouts: Timeouts | float) -> Outcome:
    """POST ``req``; never raises for network or HTTP errors. ``timeouts``: a
    :class:`Timeouts`, or one number of seconds for both."""
    if not isinstance(timeouts, Timeouts):
        timeouts = Timeouts(float(timeouts), float(timeouts))
    headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT, **req.headers}
    try:
        r = urllib.request.Request(req.url, data=req.body, headers=headers, method="POST")
        resp = _opener(timeouts.read).open(r, timeout=timeouts.connect)
    except urllib.error.HTTPError as e:
        try:
            detail = e.read(300).decode("utf-8", "replace").strip().replace("\n", " ")
        except (OSError, http.client.HTTPException):
            detail = ""
        error = f"HTTP {e.code}" + (f": {detail}" if detail else "")
        if e.code == 429 or e.code == 408 or e.code >= 500:
            return Outcome("retry", error, retry_after(e.headers.get("Retry-After")))
        return Outcome("rejected", error)
    except urllib.error.URLError as e:  # connect, TLS or writing the request failed: not delivered
        return Outcome("retry", f"cannot connect: {e.reason}")
    except (TimeoutError, ConnectionError, http.client.HTTPException) as e:
        # the request was written in full; the status line did not come: maybe delivered
        what = "no answer within the read timeout (timed out)" if isinstance(e, TimeoutError) \
            else f"{type(e).__name__}: {e}".rstrip(": ")
        return Outcome("retry", what, maybe_delivered=True)
    except ValueError:  # a URL urllib cannot use (checked at start: should not happen); never echoed
        return Outcome("rejected", "the channel's URL cannot be used")
    try:
        resp.read()  # the status said 2xx (urllib raised HTTPError otherwise): delivered
    except (OSError, http.client.HTTPException):
        pass
    finally:
        resp.close()
    return Outcome("sent")
