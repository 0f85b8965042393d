"""Async streaming client for OpenAI-compatible `/v1/completions` and `/v1/chat/completions`.

The measured path, the streamed completion, runs on bstar's own asyncio Protocol
(loadgen/stream.py): each arrival of bytes is stamped where the event loop hands it over
and parsed there (httptools for HTTP, json's C scanner for events), and the request's task
wakes once per stream instead of once per token. aiohttp, which stamped a chunk only when
the reading task resumed, added 10-20 ms to ITL p99 at 256 streams (docs/sweep.md). The
small JSON calls (tokenize, /metrics, /health) and injected test sessions use aiohttp,
chosen over httpx by measurement (bench/client_bench.py: a third of httpx's CPU per token).

One call, one `RequestRecord`: every failure (refused connection, HTTP status, reset
mid-stream, malformed SSE, timeout, the level's time limit) comes back as a record with
its reason rather than an exception, so a sweep never loses what it measured. The API
key lives only in the request header; it is not in any record, repr or error text.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from time import perf_counter
from typing import TYPE_CHECKING, Any, Literal

from bstar.errors import BstarError
from bstar.loadgen.record import RequestRecord as RequestRecord  # its home; importable here
from bstar.loadgen.stream import ConnectionPool, SseEvents, Target
from bstar.loadgen.stream import short as _short

if TYPE_CHECKING:
    from bstar.loadgen.stream import Connection

Endpoint = Literal["completions", "chat"]

# Error kinds a record can carry (the `error_kind` column); documented in docs/sweep.md.
ERROR_KINDS = (
    "connect",  # could not connect (unreachable URL, server down)
    "http_401", "http_403", "http_404", "http_429", "http_4xx", "http_5xx",
    "reset",  # connection dropped mid-response
    "malformed_sse",  # a data line that is not JSON
    "server_error",  # an SSE event carrying {"error": ...}
    "incomplete",  # the stream ended without [DONE] and without the tokens asked for
    "timeout",  # the per-request timeout passed
    "time_limit",  # the level's time limit passed while the request was in flight
    "client",  # anything else raised inside the client (a bug or an odd server)
)


@dataclass(slots=True)
class RequestSpec:
    """One request to send. `prompt` for completions, `messages` for chat."""

    index: int
    max_tokens: int
    prompt: str | None = None
    messages: list[dict[str, str]] | None = None
    expected_prompt_tokens: int | None = None
    warmup: bool = False


def _status_kind(status: int) -> str:
    if status in (401, 403, 404, 429):
        return f"http_{status}"
    return "http_5xx" if status >= 500 else "http_4xx"


def server_root(url: str) -> str:
    """The server's root URL: `http://host:8000/v1` (the base URL OpenAI clients take) and
    `http://host:8000` both give `http://host:8000`; bstar appends `/v1/...` itself, and
    `/metrics`, `/health` and `/tokenize` live at the root."""
    root = url.strip().rstrip("/")
    while root.endswith("/v1"):
        root = root[: -len("/v1")].rstrip("/")
    return root


class OpenAIClient:
    """A client of `base_url`: `send()` streams one request into a record over bstar's
    own keep-alive connections (or through the `session` given: a test's fake); the small
    JSON calls go through one aiohttp session.

    `extra_body` is merged into every request body (e.g. {"ignore_eos": True,
    "min_tokens": 64} to force output lengths). Use as `async with OpenAIClient(...)`.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        endpoint: Endpoint = "completions",
        api_key: str | None = None,
        request_timeout_s: float = 600.0,
        extra_body: dict[str, Any] | None = None,
        connect_timeout_s: float = 10.0,
        session: Any = None,
    ) -> None:
        self.base_url = server_root(base_url)
        self.model = model
        self.endpoint: Endpoint = endpoint
        self.request_timeout_s = request_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.extra_body = dict(extra_body or {})
        self._headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if api_key:
            from urllib.parse import urlsplit

            if urlsplit(self.base_url).username is not None:
                # aiohttp refuses an Authorization header beside URL credentials.
                raise BstarError("give the server's credentials once: in --url "
                                 "(user:password@host) or as --api-key, not both")
            self._headers["Authorization"] = f"Bearer {api_key}"
        # An injected session (aiohttp.ClientSession or anything with its request/post
        # interface, e.g. a test's in-process fake) is the caller's: used, never closed.
        self._own_session = session is None
        self._session: Any = session
        self._pool: ConnectionPool | None = None
        try:
            self._target: Target | None = Target(self.base_url)
        except ValueError:
            # Not http(s): no pool; the request goes through aiohttp, which refuses the URL,
            # and the record says so (error_kind "client").
            self._target = None
        self._head = b"" if self._target is None else self._request_head(self._target,
                                                                          api_key)

    def _request_head(self, target: Target, api_key: str | None) -> bytes:
        """The streamed request's head up to its Content-Length (`% len(body)`), built once.
        It holds the credentials (the key, or the URL's as Basic auth) and is never shown."""
        lines = [f"POST {target.prefix}{self.path} HTTP/1.1", f"Host: {target.host_header}",
                 "Content-Type: application/json", "Accept: text/event-stream",
                 "User-Agent: bstar"]
        auth = f"Bearer {api_key}" if api_key else target.auth
        if auth:
            lines.append(f"Authorization: {auth}")
        return ("\r\n".join(lines) + "\r\nContent-Length: %d\r\n\r\n").encode()

    def __repr__(self) -> str:  # never shows the key
        return f"OpenAIClient({self.base_url!r}, model={self.model!r}, endpoint={self.endpoint!r})"

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.endpoint == "chat" else "/v1/completions"

    async def __aenter__(self) -> OpenAIClient:
        if not self._own_session:
            return self
        self._session = aiohttp_session(self.connect_timeout_s)
        if self._target is not None:
            self._pool = ConnectionPool(self._target, self.connect_timeout_s)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

    # -- small JSON helpers used by the workload (tokenize, calibration) and the sweep -----
    async def _call(self, method: str, path: str, *, body: dict[str, Any] | None,
                    timeout_s: float, as_json: bool) -> tuple[int, Any]:
        """(status, parsed JSON or text); (0, reason) when the server cannot be reached."""
        import aiohttp

        try:
            async with self._session.request(
                method, self.base_url + path, json=body, headers=self._headers,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as resp:
                text = await resp.text()
                if not as_json:
                    return resp.status, text
                try:
                    return resp.status, json.loads(text)
                except ValueError:
                    return resp.status, text
        except TimeoutError:
            return 0, (f"no answer to {method} {path} within {timeout_s:g} s (the "
                       f"connection was accepted or is still pending)")
        except (aiohttp.ClientError, OSError) as e:
            return 0, str(e) or type(e).__name__

    async def get_json(self, path: str, timeout_s: float = 10.0) -> tuple[int, Any]:
        return await self._call("GET", path, body=None, timeout_s=timeout_s, as_json=True)

    async def get_text(self, path: str, timeout_s: float = 10.0) -> tuple[int, str]:
        status, text = await self._call("GET", path, body=None, timeout_s=timeout_s,
                                        as_json=False)
        return status, str(text)

    async def post_json(self, path: str, body: dict[str, Any],
                        timeout_s: float = 60.0) -> tuple[int, Any]:
        return await self._call("POST", path, body=body, timeout_s=timeout_s, as_json=True)

    def body_for(self, spec: RequestSpec) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": spec.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.endpoint == "chat":
            body["messages"] = spec.messages or [{"role": "user", "content": spec.prompt or ""}]
        else:
            body["prompt"] = spec.prompt or ""
        body.update(self.extra_body)
        return body

    # -- the measured path --------------------------------------------------------------
    async def send(self, spec: RequestSpec, *, deadline: float | None = None) -> RequestRecord:
        """Stream one request. `deadline` (time.monotonic) is the level's time limit.

        llama.cpp's HTTP server (cpp-httplib) closes a keep-alive connection after 5
        requests; the pool may hand out such a connection before it notices, and writing the
        request then fails before the server saw anything. That case is sent again (up to
        three times): it is not a server error and must not count as one.
        """
        rec = await self._send_once(spec, deadline=deadline)
        # Also "Server disconnected" before any status line: the server closed the pooled
        # connection as the request went out (seen against llama.cpp at 2 streams). The
        # pool may hold more than one such connection, so up to three resends. A server
        # that died fails them with "connect" and is recorded as such.
        for _ in range(3):
            if not (rec.error_kind == "reset" and rec.http_status is None and rec.chunks == 0
                    and any(m in (rec.error or "") for m in ("write request body",
                                                             "Server disconnected"))):
                break
            rec = await self._send_once(spec, deadline=deadline)
        return rec

    async def _send_once(self, spec: RequestSpec, *,
                         deadline: float | None = None) -> RequestRecord:
        rec = RequestRecord(
            index=spec.index, ok=False, start_s=time.time(), warmup=spec.warmup,
            expected_prompt_tokens=spec.expected_prompt_tokens,
            expected_output_tokens=spec.max_tokens,
        )
        now = time.monotonic()
        own_deadline = now + self.request_timeout_s
        limit = own_deadline if deadline is None else min(deadline, own_deadline)
        by_level = deadline is not None and deadline < own_deadline
        body = json.dumps(self.body_for(spec)).encode()
        t0 = perf_counter()
        events = SseEvents(rec, t0)
        end: float | None = None
        try:
            async with asyncio.timeout_at(
                asyncio.get_running_loop().time() + (limit - now)
            ):
                if self._pool is not None:
                    end = await self._stream(events, body)
                else:
                    await self._stream_session(events, body)
        except TimeoutError:
            rec.error_kind = "time_limit" if by_level else "timeout"
            rec.error = ("level time limit reached mid-request" if by_level
                         else f"no complete response within {self.request_timeout_s:g} s")
        except Exception as e:  # one record per failure (an unknown one is raised again)
            rec.error_kind, rec.error = _failure(e, self.base_url)
        rec.e2e_s = (perf_counter() if end is None else end) - t0
        events.close(spec.max_tokens)
        return rec

    async def _stream(self, events: SseEvents, body: bytes) -> float | None:
        """The measured path on bstar's own connection (loadgen/stream.py): the bytes are
        stamped and parsed where they arrive; this task wakes once, when the stream is
        over. Returns the arrival of the stream's last bytes when it ended cleanly."""
        rec = events.rec
        pool = self._pool
        assert pool is not None
        try:
            conn = await pool.acquire()
        except TimeoutError:
            rec.error_kind = "connect"
            rec.error = (f"cannot connect to {self.base_url}: no connection within "
                         f"{self.connect_timeout_s:g} s")
            return None
        except OSError as e:
            rec.error_kind = "connect"
            rec.error = _short(f"cannot connect to {self.base_url}: {e}")
            return None
        reusable = False
        try:
            await conn.begin(events, self._head % len(body) + body)
            reusable, end = _outcome(conn, events)
            return end
        finally:
            pool.release(conn, reusable=reusable)

    async def _stream_session(self, events: SseEvents, body: bytes) -> None:
        """An injected session's response (a test's fake): the same SSE state machine,
        each arrival stamped when this task resumes."""
        rec = events.rec
        async with self._session.post(self.base_url + self.path, data=body,
                                      headers=self._headers) as resp:
            rec.http_status = resp.status
            if resp.status != 200:
                text = await resp.text()
                rec.error_kind = _status_kind(resp.status)
                rec.error = f"HTTP {resp.status}: {_short(text)}"
                return
            read = _reader(resp.content)
            while True:
                data = await read()
                t = perf_counter()
                if not data:
                    events.end(t)
                    return
                if events.feed(data, t):
                    return


def aiohttp_session(connect_timeout_s: float) -> Any:
    """The aiohttp session a client keeps for its JSON calls (and what bench/client_bench.py
    streams through for its before/after). trust_env=False: proxies in the environment must
    never see local traffic; limit=0: the caller's concurrency is the only cap on
    connections; DummyCookieJar: no cookie filtering per request or parsing per response
    (an inference API sets none that matter)."""
    import aiohttp

    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, force_close=False),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s),
        trust_env=False, cookie_jar=aiohttp.DummyCookieJar(),
    )


def _outcome(conn: Connection, events: SseEvents) -> tuple[bool, float | None]:
    """What the connection's end says about the request: into the record, and whether the
    connection can serve another (`reusable`) and when the stream's last bytes arrived."""
    rec = events.rec
    if conn.bad_http is not None:
        rec.error_kind, rec.error = "client", f"invalid HTTP from the server: {conn.bad_http}"
        return False, None
    if conn.status and conn.status != 200:
        text = bytes(conn.error_body or b"").decode("utf-8", "replace")
        rec.error_kind = _status_kind(conn.status)
        rec.error = f"HTTP {conn.status}: {_short(text)}"
        return conn.complete, None
    if events.finished:
        return events.done, conn.now if events.done else None
    if conn.complete:
        events.end(conn.now)  # the message ended; close() says whether [DONE] came
        return True, conn.now
    if conn.status == 200 and not conn.framed and conn.lost_error is None:
        events.end(conn.now)  # a body that ends with the connection (no length, no chunks)
        return False, conn.now
    rec.error_kind = "reset"
    if conn.status == 0 and conn.received == 0:
        # The server closed the pooled connection as the request went out: send() resends.
        rec.error = "ServerDisconnectedError: Server disconnected before answering"
    else:
        rec.error = _short(f"connection lost mid-response after {rec.chunks} chunks"
                           + (f": {conn.lost_error}" if conn.lost_error else ""))
    return False, None


def _failure(e: Exception, base_url: str) -> tuple[str, str]:
    """(error_kind, error) for what a stream raised: aiohttp's errors (an injected session),
    the socket's, or an odd server's."""
    import aiohttp

    if isinstance(e, aiohttp.ClientConnectorError):
        return "connect", _short(f"cannot connect to {base_url}: {e.os_error}")
    if isinstance(e, (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError,
                      aiohttp.ClientOSError, ConnectionError, OSError)):
        return "reset", _short(f"{type(e).__name__}: {e}")
    if isinstance(e, aiohttp.ClientError):
        return "client", _short(f"{type(e).__name__}: {e}")
    if isinstance(e, (ValueError, TypeError, AttributeError, KeyError, UnicodeError)):
        return "malformed_sse", _short(f"unexpected event shape: {type(e).__name__}: {e}")
    raise e


def _reader(content: Any) -> Callable[[], Awaitable[bytes]]:
    """An awaitable that gives the bytes that arrived (b"" at the end): aiohttp's
    `readany`, else (an injected session's response) the next item of its iterator."""
    read = getattr(content, "readany", None)
    if read is not None:
        return read  # type: ignore[no-any-return]
    it = content.__aiter__()

    async def read_next() -> bytes:
        try:
            return bytes(await it.__anext__())
        except StopAsyncIteration:
            return b""

    return read_next
