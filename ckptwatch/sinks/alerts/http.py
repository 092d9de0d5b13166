"""One HTTP POST of a notification, and what the answer means for the outbox.

* 2xx: ``sent``;
* 429 (rate limited) and 408, 5xx, timeouts, refused or reset connections: ``retry``, after
  the ``Retry-After`` header when the server gave one (seconds, or an HTTP date: RFC 9110
  section 10.2.3), else after the dispatcher's backoff;
* any other status (400 bad payload, 403 revoked token, 404 deleted webhook ...):
  ``rejected``: sending the same bytes again would fail the same way.

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


@dataclass(frozen=True)
class Request:
    """A POST to make: ``body`` bytes (JSON), extra ``headers``."""

    url: str = field(repr=False)
    body: bytes
    headers: dict[str, str] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class Outcome:
    """``status``: ``sent`` | ``retry`` | ``rejected``; ``retry_after`` in seconds when the
    server said how long to wait; ``error`` for the log."""

    status: str
    error: str = ""
    retry_after: float | None = None


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


def post(req: Request, timeout: float) -> Outcome:
    """POST ``req`` with a ``timeout`` in seconds; never raises for network or HTTP errors."""
    headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT, **req.headers}
    try:
        r = urllib.request.Request(req.url, data=req.body, headers=headers, method="POST")
        with urllib.request.urlopen(r, timeout=timeout) as resp:
            resp.read()
            return Outcome("sent")
    except urllib.error.HTTPError as e:
        detail = e.read(300).decode("utf-8", "replace").strip().replace("\n", " ")
        error = f"HTTP {e.code}" + (f": {detail}" if detail else "")
        if e.code == 429 or e.code == 408 or e.code >= 500:
            return Outcome("retry", error, retry_after(e.headers.get("Retry-After")))
        return Outcome("rejected", error)
    except urllib.error.URLError as e:
        return Outcome("retry", f"cannot connect: {e.reason}")
    except (TimeoutError, ConnectionError, http.client.HTTPException) as e:
        return Outcome("retry", f"{type(e).__name__}: {e}".rstrip(": "))
    except ValueError:  # a URL urllib cannot use (checked at start: should not happen); never echoed
        return Outcome("rejected", "the channel's URL cannot be used")
