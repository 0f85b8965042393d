"""Async streaming client for OpenAI-compatible `/v1/completions` and `/v1/chat/completions`.

Built on aiohttp, chosen by measurement (bench/client_bench.py): against the same local
fixed-rate token server on 2 cores, aiohttp streamed the same tokens for about a third
of httpx's CPU and kept ITL p99 flat to higher concurrency. The client shares hosts with
the engine's CPU-side work, so CPU per token is what matters.

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
from dataclasses import asdict, dataclass, field
from time import perf_counter
from typing import Any, Literal

from bstar.errors import BstarError

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


@dataclass(slots=True)
class RequestRecord:
    """What happened to one request. Times in seconds; `start_s` is wall-clock epoch."""

    index: int
    ok: bool
    start_s: float
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    output_tokens: int = 0
    token_source: str = "counted"  # "usage" when the server's usage block gave the count
    chunks: int = 0
    http_status: int | None = None
    error_kind: str | None = None
    error: str | None = None
    warmup: bool = False
    expected_prompt_tokens: int | None = None
    expected_output_tokens: int | None = None
    # Prompt tokens the server served from its prefix cache (usage.prompt_tokens_details.
    # cached_tokens: vLLM with --enable-prompt-tokens-details, llama.cpp); None: not said.
    cached_prompt_tokens: int | None = None

    @property
    def tpot_s(self) -> float | None:
        """vLLM's per-request TPOT: (E2E - TTFT) / (output_tokens - 1)."""
        if not self.ok or self.ttft_s is None or self.e2e_s is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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


def _short(text: str, n: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


class OpenAIClient:
    """One aiohttp session to `base_url` (or the `session` given); `send()` streams one
    request into a record.

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
        self._url_cache: tuple[str, Any] | None = None

    def __repr__(self) -> str:  # never shows the key
        return f"OpenAIClient({self.base_url!r}, model={self.model!r}, endpoint={self.endpoint!r})"

    def _post_url(self) -> Any:
        """The completions URL, parsed once (a yarl.URL) for a real aiohttp session; a
        string for an injected one."""
        url = self.base_url + self.path
        if not self._own_session:
            return url
        if self._url_cache is None or self._url_cache[0] != url:
            from yarl import URL

            self._url_cache = (url, URL(url))
        return self._url_cache[1]

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.endpoint == "chat" else "/v1/completions"

    async def __aenter__(self) -> OpenAIClient:
        if not self._own_session:
            return self
        import aiohttp

        # trust_env=False: proxies in the environment must never see local traffic.
        # limit=0: the level's concurrency is the only cap on connections.
        # DummyCookieJar: no cookie filtering per request or parsing per response (an
        # inference API sets none that matter); the completions URL is parsed once.
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=False),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout_s),
            trust_env=False, cookie_jar=aiohttp.DummyCookieJar(),
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
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
        """Long on purpose: one streaming state machine (timeouts, status, SSE events, usage,
        the error taxonomy) whose timing variables must stay in one frame; split, the
        per-token timestamps would cross function calls on the measured path."""
        import aiohttp

        rec = RequestRecord(
            index=spec.index, ok=False, start_s=time.time(), warmup=spec.warmup,
            expected_prompt_tokens=spec.expected_prompt_tokens,
            expected_output_tokens=spec.max_tokens,
        )
        now = time.monotonic()
        own_deadline = now + self.request_timeout_s
        limit = own_deadline if deadline is None else min(deadline, own_deadline)
        by_level = deadline is not None and deadline < own_deadline
        body = json.dumps(self.body_for(spec))
        t0 = time.perf_counter()
        last: float | None = None
        usage_tokens: int | None = None
        done = False
        try:
            async with asyncio.timeout_at(
                asyncio.get_running_loop().time() + (limit - now)
            ):
                async with self._session.post(
                    self._post_url(), data=body, headers=self._headers
                ) as resp:
                    rec.http_status = resp.status
                    if resp.status != 200:
                        text = await resp.text()
                        rec.error_kind = _status_kind(resp.status)
                        rec.error = f"HTTP {resp.status}: {_short(text)}"
                        rec.e2e_s = time.perf_counter() - t0
                        return rec
                    # The hot path (bench/client_bench.py; docs/sweep.md "Client overhead"):
                    # one await per arrival of bytes, whatever they hold (aiohttp's readline
                    # costs an await, a buffer scan and a flow-control resume per line, two
                    # lines per SSE event); the arrival is timestamped before any other work,
                    # so every token in it carries the time it reached this process.
                    read = _reader(resp.content)
                    tail = b""
                    itl = rec.itl_s
                    while not done:
                        data_in = await read()
                        t = perf_counter()
                        if not data_in:
                            if not tail:
                                break
                            lines, tail = [tail], b""  # a last line without its newline
                        else:
                            if tail:
                                data_in = tail + data_in
                            lines = data_in.split(b"\n")
                            tail = lines.pop()
                        for raw in lines:
                            if raw[:5] != b"data:":
                                continue  # blank separators, comments, `event:` lines
                            data = raw[5:].strip()
                            if data == b"[DONE]":
                                done = True
                                break
                            try:
                                event = _loads(data)
                            except ValueError:
                                rec.error_kind = "malformed_sse"
                                rec.error = ("not JSON: "
                                             + _short(data.decode("utf-8", "replace"), 120))
                                break
                            if type(event) is not dict:
                                rec.error_kind = "malformed_sse"
                                rec.error = "SSE data is not a JSON object"
                                break
                            if event.get("error"):
                                rec.error_kind = "server_error"
                                rec.error = _short(json.dumps(event["error"]))
                                break
                            choices = event.get("choices")
                            if choices and _has_content(choices):
                                if last is None:
                                    rec.ttft_s = t - t0
                                else:
                                    itl.append(t - last)
                                last = t
                                rec.chunks += 1
                            usage = event.get("usage")
                            if usage:
                                usage_tokens = usage.get("completion_tokens")
                                rec.prompt_tokens = usage.get("prompt_tokens")
                                details = usage.get("prompt_tokens_details")
                                if isinstance(details, dict) and isinstance(
                                        details.get("cached_tokens"), int):
                                    rec.cached_prompt_tokens = details["cached_tokens"]
                        if rec.error_kind is not None:
                            break
        except TimeoutError:
            rec.error_kind = "time_limit" if by_level else "timeout"
            rec.error = ("level time limit reached mid-request" if by_level
                         else f"no complete response within {self.request_timeout_s:g} s")
        except aiohttp.ClientConnectorError as e:
            rec.error_kind = "connect"
            rec.error = _short(f"cannot connect to {self.base_url}: {e.os_error}")
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError,
                aiohttp.ClientOSError, ConnectionError) as e:
            rec.error_kind = "reset"
            rec.error = _short(f"{type(e).__name__}: {e}")
        except aiohttp.ClientError as e:
            rec.error_kind = "client"
            rec.error = _short(f"{type(e).__name__}: {e}")
        except (ValueError, TypeError, AttributeError, KeyError, UnicodeError) as e:
            # An odd server (events of the wrong shape) must cost one record, not a stream.
            rec.error_kind = "malformed_sse"
            rec.error = _short(f"unexpected event shape: {type(e).__name__}: {e}")
        rec.e2e_s = time.perf_counter() - t0
        if usage_tokens is not None:
            rec.output_tokens = int(usage_tokens)
            rec.token_source = "usage"
        else:
            rec.output_tokens = rec.chunks
        if rec.error_kind is None:
            if done or usage_tokens is not None or rec.chunks >= spec.max_tokens:
                rec.ok = rec.chunks > 0
                if not rec.ok:
                    rec.error_kind, rec.error = "incomplete", "stream carried no tokens"
            else:
                rec.error_kind = "incomplete"
                rec.error = f"stream ended after {rec.chunks} chunks without [DONE]"
        return rec


_scan_json = json.JSONDecoder().scan_once  # the C scanner behind json.loads, no wrapper


def _loads(data: bytes) -> Any:
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


def _has_content(choices: Any) -> bool:
    """Whether an event's `choices` carry generated text (completions' `text`, chat's
    `delta.content` or `delta.reasoning_content`)."""
    for choice in choices:
        if choice.get("text"):
            return True
        delta = choice.get("delta")
        if delta and (delta.get("content") or delta.get("reasoning_content")):
            return True
    return False
