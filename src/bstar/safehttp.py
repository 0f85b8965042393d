"""One bounded GET for what bstar reads outside the measured stream: a server's `/metrics`
(`bstar kv --url`, the sweep's scraper) and a Hub `config.json` (`plan --model org/repo`).

What a server sends is untrusted (docs/sweep.md, "What a server may send"), so every read
here has a size cap and a deadline that holds whatever the server does: a trickle of one
byte a second, an endless body, headers that never end. The deadline is a timer that shuts
the socket down, so a blocked read returns at once (a per-read socket timeout would let a
trickle run forever). Redirects are followed (up to `MAX_REDIRECTS`), and credentials
never cross an origin: the Authorization header is dropped when a redirect changes scheme,
host or port (httpx's `_redirect_headers` does the same; urllib's redirect handler keeps
it). No proxy from the environment is used: bstar's servers are local or named.

Standard library only; blocking (the sweep calls it from a thread, off its event loop).
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import socket
import threading
import time
from dataclasses import dataclass
from urllib.parse import unquote, urljoin, urlsplit

from bstar.errors import BstarError

MAX_REDIRECTS = 5
_READ_BYTES = 64 * 1024


class FetchError(BstarError):
    """The GET failed: unreachable, too slow, too large, or not HTTP."""


class TooLarge(FetchError):
    """The answer passed the size cap (it was not read further)."""


@dataclass(frozen=True)
class Fetched:
    status: int
    body: bytes
    url: str  # the URL that answered (after redirects)


def origin(url: str) -> tuple[str, str, int]:
    """(scheme, host, port): what a credential is bound to."""
    p = urlsplit(url)
    scheme = p.scheme.lower()
    return scheme, (p.hostname or "").lower(), p.port or (443 if scheme == "https" else 80)


def _basic(url: str) -> str | None:
    p = urlsplit(url)
    if p.username is None:
        return None
    pair = f"{unquote(p.username)}:{unquote(p.password or '')}"
    return "Basic " + base64.b64encode(pair.encode()).decode()


class _Deadline:
    """Shuts the connection's socket down when the time is up; `expired` says it did."""

    def __init__(self, conn: http.client.HTTPConnection, remaining_s: float) -> None:
        self.conn = conn
        self.expired = False
        self.timer = threading.Timer(max(0.0, remaining_s), self._expire)
        self.timer.daemon = True
        self.timer.start()

    def _expire(self) -> None:
        self.expired = True
        sock = self.conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def cancel(self) -> None:
        self.timer.cancel()


def _one(url: str, headers: dict[str, str], max_bytes: int, deadline: float
         ) -> tuple[int, bytes, str | None]:
    """One GET: (status, body, Location of a redirect or None)."""
    try:
        p = urlsplit(url)
    except ValueError as e:
        raise FetchError(f"not a URL: {url} ({e})") from None
    if p.scheme not in ("http", "https") or not p.hostname:
        raise FetchError(f"not an http(s) URL: {url}")
    try:
        port = p.port
    except ValueError as e:
        raise FetchError(f"bad port in {url}: {e}") from None
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError
    cls = http.client.HTTPSConnection if p.scheme == "https" else http.client.HTTPConnection
    conn = cls(p.hostname, port, timeout=remaining)
    watch = _Deadline(conn, remaining)
    try:
        path = (p.path or "/") + (f"?{p.query}" if p.query else "")
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        location = resp.getheader("Location")
        if resp.status in (301, 302, 303, 307, 308) and location:
            return resp.status, b"", location
        length = resp.getheader("Content-Length")
        if length is not None and length.strip().isdigit() and int(length) > max_bytes:
            raise TooLarge(f"{_where(url)}: the answer is {int(length)} bytes, over the "
                             f"{max_bytes}-byte cap: not read")
        parts: list[bytes] = []
        size = 0
        while chunk := resp.read1(_READ_BYTES):
            size += len(chunk)
            if size > max_bytes:
                raise TooLarge(f"{_where(url)}: the answer passed the {max_bytes}-byte "
                                 f"cap: not read")
            parts.append(chunk)
        if watch.expired:
            raise TimeoutError
        return resp.status, b"".join(parts), None
    except (OSError, http.client.HTTPException) as e:
        if watch.expired or isinstance(e, TimeoutError):
            raise TimeoutError from None
        raise FetchError(f"could not read {_where(url)}: {type(e).__name__}: {e}") from None
    finally:
        watch.cancel()
        conn.close()


def _where(url: str) -> str:
    p = urlsplit(url)
    return f"{p.scheme}://{p.hostname}{':' + str(p.port) if p.port else ''}{p.path}"


def fetch(url: str, *, headers: dict[str, str] | None = None, max_bytes: int,
          timeout_s: float) -> Fetched:
    """GET `url`: at most `max_bytes` of body, all of it (redirects included) within
    `timeout_s`. Credentials in the URL (`user:pw@`) become Basic auth unless `headers`
    hold an Authorization; either is sent only to the URL's origin. FetchError otherwise."""
    deadline = time.monotonic() + timeout_s
    hdrs = {"User-Agent": "bstar", "Accept-Encoding": "identity", **(headers or {})}
    try:
        auth = _basic(url)
        start = origin(url)
    except ValueError as e:  # 'http://[::1': urlsplit refuses it
        raise FetchError(f"not a URL: {url} ({e})") from None
    if auth and not any(k.lower() == "authorization" for k in hdrs):
        hdrs["Authorization"] = auth
    for _ in range(MAX_REDIRECTS + 1):
        try:
            status, body, location = _one(url, hdrs, max_bytes, deadline)
        except TimeoutError:
            raise FetchError(f"no complete answer from {_where(url)} within {timeout_s:g} s"
                             ) from None
        if location is None:
            return Fetched(status, body, url)
        try:
            url = urljoin(url, location)
            moved = origin(url) != start
        except ValueError as e:
            raise FetchError(f"a redirect to a bad URL: {location[:200]!r} ({e})") from None
        if moved:
            # Another origin: it gets no credentials (neither ours nor the URL's userinfo).
            hdrs = {k: v for k, v in hdrs.items() if k.lower() != "authorization"}
    raise FetchError(f"more than {MAX_REDIRECTS} redirects from {_where(url)}")
