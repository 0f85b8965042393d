"""The measured path: one streamed completion read on bstar's own asyncio `Protocol`.

Why not aiohttp here (docs/sweep.md "Stamped where the bytes arrive"): a chunk read through
aiohttp's `StreamReader` is stamped when the reading task resumes, one event-loop
iteration after its bytes arrived, so at 256+ streams every stamp carried the length of the
iteration (every other socket's callbacks and every other task's step) and the client added
10-20 ms to ITL p99 that the server never sent. Here `data_received` stamps the bytes
(`perf_counter`) the moment the loop hands them over, and parses them in place: HTTP
framing by httptools (llhttp, Node's C parser, the one uvicorn uses), the SSE lines by
`SseEvents`. No task wakes per token; the request's task wakes once, when the stream ends.

`SseEvents` is also what an injected session's stream (a test's in-process fake) is fed
through, so both paths share one state machine and one error taxonomy. The small JSON calls
(tokenize, /metrics, /health) stay on aiohttp (loadgen/client.py).
"""

from __future__ import annotations

import asyncio
import base64
import json
from time import perf_counter
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

if TYPE_CHECKING:
    from bstar.loadgen.record import RequestRecord

_scan_json = json.JSONDecoder().scan_once  # the C scanner behind json.loads, no wrapper
ERROR_BODY_BYTES = 64 * 1024  # the most of a non-200 body kept for its error text


def loads(data: bytes) -> Any:
    """One SSE event's JSON (`data` stripped): json.loads' own C scanner called directly,
    without the encoding sniffing and wrapper json.loads adds on bytes (about half its
    time on a 200-byte event). ValueError when `data` is not one JSON value."""
    text = data.decode()  # UnicodeDecodeError is a ValueError
    try:
        obj, end = _scan_json(text, 0)
    except StopIteration:
        raise ValueError("expecting a JSON value") from None
    if end != len(text):
        raise ValueError("extra data after the JSON value")
    return obj


def short(text: str, n: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


def has_content(choices: Any) -> bool:
    """Whether an event's `choices` carry generated text (completions' `text`, chat's
    `delta.content` or `delta.reasoning_content`)."""
    for choice in choices:
        if choice.get("text"):
            return True
        delta = choice.get("delta")
        if delta and (delta.get("content") or delta.get("reasoning_content")):
            return True
    return False


class SseEvents:
    """One response's SSE stream into its record. `feed(bytes, t)` with `t` the bytes'
    arrival (perf_counter); every token in one arrival carries that time. True once the
    stream is over: `[DONE]` seen, or an error recorded (then nothing more is read)."""

    __slots__ = ("done", "finished", "last", "rec", "t0", "tail", "usage_tokens")

    def __init__(self, rec: RequestRecord, t0: float) -> None:
        self.rec = rec
        self.t0 = t0
        self.last: float | None = None
        self.tail = b""
        self.usage_tokens: int | None = None
        self.done = False
        self.finished = False

    def feed(self, data: bytes, t: float) -> bool:
        if self.finished:
            return True
        if self.tail:
            data = self.tail + data
        lines = data.split(b"\n")
        self.tail = lines.pop()
        return self._lines(lines, t)

    def end(self, t: float) -> bool:
        """The stream ended: a last line without its newline still counts."""
        if self.finished or not self.tail:
            return self.finished
        lines, self.tail = [self.tail], b""
        return self._lines(lines, t)

    def _lines(self, lines: list[bytes], t: float) -> bool:
        rec = self.rec
        try:
            for raw in lines:
                if raw[:5] != b"data:":
                    continue  # blank separators, comments, `event:` lines
                data = raw[5:].strip()
                if data == b"[DONE]":
                    self.done = self.finished = True
                    return True
                try:
                    event = loads(data)
                except ValueError:
                    return self._fail("malformed_sse", "not JSON: " + short(
                        data.decode("utf-8", "replace"), 120))
                if type(event) is not dict:
                    return self._fail("malformed_sse", "SSE data is not a JSON object")
                if event.get("error"):
                    return self._fail("server_error", short(json.dumps(event["error"])))
                choices = event.get("choices")
                if choices and has_content(choices):
                    if self.last is None:
                        rec.ttft_s = t - self.t0
                    else:
                        rec.itl_s.append(t - self.last)
                    self.last = t
                    rec.chunks += 1
                usage = event.get("usage")
                if usage:
                    self.usage_tokens = usage.get("completion_tokens")
                    rec.prompt_tokens = usage.get("prompt_tokens")
                    details = usage.get("prompt_tokens_details")
                    if isinstance(details, dict) and isinstance(
                            details.get("cached_tokens"), int):
                        rec.cached_prompt_tokens = details["cached_tokens"]
        except (ValueError, TypeError, AttributeError, KeyError) as e:
            # An odd server (events of the wrong shape) must cost one record, not a stream.
            return self._fail("malformed_sse",
                              short(f"unexpected event shape: {type(e).__name__}: {e}"))
        return False

    def _fail(self, kind: str, error: str) -> bool:
        self.rec.error_kind, self.rec.error = kind, error
        self.finished = True
        return True

    def close(self, max_tokens: int) -> None:
        """The record's token count and verdict, once the stream is over."""
        rec = self.rec
        if self.usage_tokens is not None:
            rec.output_tokens = int(self.usage_tokens)
            rec.token_source = "usage"
        else:
            rec.output_tokens = rec.chunks
        if rec.error_kind is not None:
            return
        if self.done or self.usage_tokens is not None or rec.chunks >= max_tokens:
            rec.ok = rec.chunks > 0
            if not rec.ok:
                rec.error_kind, rec.error = "incomplete", "stream carried no tokens"
        else:
            rec.error_kind = "incomplete"
            rec.error = f"stream ended after {rec.chunks} chunks without [DONE]"


class Target:
    """Where requests go, parsed once: host, port, TLS, the path prefix, the Host header and
    the URL's credentials as a Basic auth header (never kept elsewhere, never shown)."""

    __slots__ = ("auth", "host", "host_header", "port", "prefix", "tls")

    def __init__(self, root: str) -> None:
        parts = urlsplit(root)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {parts.scheme}://{parts.hostname}")
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.tls else 80)
        self.host_header = parts.netloc.rpartition("@")[2]
        self.prefix = parts.path.rstrip("/")
        self.auth: str | None = None
        if parts.username is not None:
            pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            self.auth = "Basic " + base64.b64encode(pair.encode()).decode()

    def __repr__(self) -> str:  # never shows the credentials
        return f"Target({self.host!r}, {self.port})"


class Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection, one request at a time. Bytes are stamped and
    parsed where they arrive; the waiting task is woken once, when its stream is over."""

    def __init__(self, pool: ConnectionPool) -> None:
        self.pool = pool
        self.transport: Any = None
        self.parser: Any = None
        self.events: SseEvents | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.now = 0.0
        self.received = 0
        self.status = 0
        self.error_body: bytearray | None = None
        self.body: list[bytes] = []  # this arrival's chunk payloads, fed once it is parsed
        self.framed = False  # Content-Length or Transfer-Encoding: not ended by EOF
        self.complete = False
        self.lost = False
        self.lost_error: str | None = None
        self.bad_http: str | None = None
        self.pool_when_complete = False
        self.keep_alive = False

    # -- the request's side ---------------------------------------------------------------
    def begin(self, events: SseEvents, request: bytes) -> asyncio.Future[None]:
        from httptools import HttpResponseParser

        self.parser = HttpResponseParser(self)
        self.events = events
        self.waiter = asyncio.get_running_loop().create_future()
        self.received = self.status = 0
        self.error_body = None
        self.body.clear()
        self.framed = self.complete = self.pool_when_complete = self.keep_alive = False
        self.transport.write(request)
        return self.waiter

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    # -- asyncio.Protocol -----------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.now = perf_counter()  # before any other work: the bytes' arrival
        self.received += len(data)
        if self.parser is None:
            return  # bytes between requests: nobody asked; the next request resets
        events = self.events  # the message may end (and the connection go idle) in the feed
        try:
            self.parser.feed_data(data)
        except Exception as e:  # httptools.HttpParserError and its kin
            self.bad_http = short(f"{type(e).__name__}: {e}", 200)
            self.transport.abort()
            self._wake()
            return
        body = self.body
        if body:
            # Every HTTP chunk's payload of this arrival, fed as one piece: one split and
            # one pass per arrival, not per chunk (an SSE event is usually one chunk).
            piece = body[0] if len(body) == 1 else b"".join(body)
            body.clear()
            if events is not None and events.feed(piece, self.now):
                self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if exc is not None:
            self.lost_error = short(f"{type(exc).__name__}: {exc}", 200)
        self.pool.forget(self)
        self._wake()

    # -- httptools callbacks --------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() in (b"content-length", b"transfer-encoding"):
            self.framed = True

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()  # reset once the message ends
        if self.events is not None:
            self.events.rec.http_status = self.status
        if self.status != 200:
            self.error_body = bytearray()

    def on_body(self, body: bytes) -> None:
        if self.error_body is not None:
            if len(self.error_body) < ERROR_BODY_BYTES:
                self.error_body += body[: ERROR_BODY_BYTES - len(self.error_body)]
        else:
            self.body.append(body)

    def on_message_complete(self) -> None:
        self.complete = True
        self._wake()
        if self.pool_when_complete:
            self.pool.put(self)


class ConnectionPool:
    """Keep-alive connections to one target: reused, opened when none is idle (the level's
    concurrency is the only cap), all closed with the pool."""

    def __init__(self, target: Target, connect_timeout_s: float) -> None:
        self.target = target
        self.connect_timeout_s = connect_timeout_s
        self.idle: list[Connection] = []
        self.live: set[Connection] = set()
        self._tls: Any = None

    async def acquire(self) -> Connection:
        while self.idle:
            conn = self.idle.pop()
            if not conn.lost and not conn.transport.is_closing():
                return conn
        t = self.target
        if t.tls and self._tls is None:
            import ssl

            self._tls = ssl.create_default_context()
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self.connect_timeout_s):
            _, conn = await loop.create_connection(
                lambda: Connection(self), t.host, t.port, ssl=self._tls if t.tls else None)
        self.live.add(conn)
        return conn

    def release(self, conn: Connection, *, reusable: bool) -> None:
        """Back to the pool when its response was read whole (or will be: `[DONE]` came
        before the end of the HTTP message) and the server keeps it alive; else closed."""
        if not reusable or conn.lost or not conn.keep_alive:
            conn.transport.abort()
        elif conn.complete:
            self.put(conn)
        else:
            conn.pool_when_complete = True

    def put(self, conn: Connection) -> None:
        conn.parser = conn.events = conn.waiter = None
        if not conn.lost:
            self.idle.append(conn)

    def forget(self, conn: Connection) -> None:
        self.live.discard(conn)

    def close(self) -> None:
        for conn in list(self.live):
            conn.transport.abort()
        self.idle.clear()
        self.live.clear()
