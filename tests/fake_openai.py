"""An in-process fake of bench/token_server.py for the sweep's fault tests: the same
endpoints, pacing and faults, served through an object with aiohttp.ClientSession's
`request`/`post` interface (`OpenAIClient(session=...)`, `run_sweep(session_factory=...)`),
so a test needs no subprocess and no port. Faults that only a real process can show (a
server dying, a reset on a pooled keep-alive connection, Ctrl-C) stay with the real token
server.

    fake = FakeServer(fault="429", fault_every=3)
    run_sweep(cfg(fake.url), db=db, session_factory=fake.session)
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

MODEL = "tiny"
ROUND_TRIP_S = 0.5e-3
_TEXT = "abcdefghijklmnopqrstuvwxyz"


class _Response:
    def __init__(self, status: int, body: bytes = b"",
                 lines: AsyncIterator[bytes] | None = None) -> None:
        self.status = status
        self._body = body
        self.content = lines if lines is not None else _no_lines()

    async def text(self) -> str:
        return self._body.decode("utf-8", "replace")

    async def __aenter__(self) -> _Response:
        # A response takes a round trip: other tasks (the sweep's error-rate rule) run.
        await asyncio.sleep(ROUND_TRIP_S)
        return self

    async def __aexit__(self, *exc: object) -> None:
        aclose = getattr(self.content, "aclose", None)
        if aclose is not None:
            await aclose()


async def _no_lines() -> AsyncIterator[bytes]:
    return
    yield b""  # pragma: no cover - makes this an async generator


def _json(status: int, obj: Any) -> _Response:
    return _Response(status, json.dumps(obj).encode())


def _error(status: int, message: str) -> _Response:
    return _json(status, {"error": {"message": message, "code": status}})


class FakeServer:
    """token_server.py's behaviour: one character per token, token k due at
    start + k * interval; `fault` one of 401, 429, 500, reset, malformed, hang (every
    `fault_every`-th request); `no_tokenize` drops /tokenize."""

    url = "http://fake.invalid"

    def __init__(self, *, interval_ms: float = 2.0, fault: str | None = None,
                 fault_every: int = 0, api_key: str | None = None,
                 no_tokenize: bool = False) -> None:
        self.interval_s = interval_ms / 1e3
        self.fault = fault
        self.fault_every = fault_every
        self.api_key = api_key
        self.no_tokenize = no_tokenize
        self.requests = 0  # completion requests seen (the faults count these)
        self.paths: list[str] = []

    def session(self) -> _Session:
        return _Session(self)

    def respond(self, method: str, url: str, body: dict[str, Any],
                headers: dict[str, str]) -> _Response:
        path = urllib.parse.urlsplit(url).path
        self.paths.append(path)
        if path == "/v1/models":
            return _json(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        if path == "/tokenize" and method == "POST" and not self.no_tokenize:
            text = str(body.get("prompt", body.get("content", "")))
            return _json(200, {"count": len(text), "tokens": [ord(c) for c in text]})
        if path in ("/v1/completions", "/v1/chat/completions") and method == "POST":
            return self._completion(body, headers, chat=path.endswith("chat/completions"))
        return _error(404, "Not Found")

    def _completion(self, body: dict[str, Any], headers: dict[str, str],
                    chat: bool) -> _Response:
        if self.fault == "401" and headers.get("Authorization") != f"Bearer {self.api_key}":
            return _error(401, "Unauthorized")
        if body.get("model") != MODEL:
            return _error(404, f"The model `{body.get('model')}` does not exist.")
        self.requests += 1
        nth = self.requests
        faulty = self.fault_every > 0 and nth % self.fault_every == 0
        if self.fault in ("429", "500") and faulty:
            return _error(int(self.fault), f"injected {self.fault}")
        prompt = _prompt_tokens(body, chat)
        if not body.get("stream"):
            text = "a" * int(body.get("max_tokens") or 16)
            return _json(200, {"choices": [{"text": text, "index": 0}],
                               "usage": {"prompt_tokens": prompt,
                                         "completion_tokens": len(text)}})
        return _Response(200, lines=self._stream(body, chat, prompt, faulty))

    async def _stream(self, body: dict[str, Any], chat: bool, prompt_tokens: int,
                      faulty: bool) -> AsyncIterator[bytes]:
        out = int(body.get("max_tokens") or 16)
        obj = "chat.completion.chunk" if chat else "text_completion"
        t0 = time.monotonic()
        for k in range(out):
            delay = t0 + k * self.interval_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            if faulty and k == 3:
                if self.fault == "reset":
                    raise aiohttp.ClientPayloadError("Response payload is not completed")
                if self.fault == "malformed":
                    yield b"data: {not json\n"
                    continue
                if self.fault == "hang":
                    await asyncio.sleep(3600)
            ch = _TEXT[k % len(_TEXT)]
            choice = {"index": 0, "delta": {"content": ch}} if chat else {"index": 0,
                                                                            "text": ch}
            yield b"data: " + json.dumps({"id": "x", "object": obj, "model": MODEL,
                                          "choices": [choice]}).encode() + b"\n"
            yield b"\n"
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": out,
                     "total_tokens": prompt_tokens + out}
            yield b"data: " + json.dumps({"id": "x", "object": obj, "model": MODEL,
                                          "choices": [], "usage": usage}).encode() + b"\n"
        yield b"data: [DONE]\n"


def _prompt_tokens(body: dict[str, Any], chat: bool) -> int:
    """One token per character; a chat template of 11 tokens per message."""
    if chat:
        msgs = body.get("messages") or []
        return sum(len(str(m.get("content", ""))) for m in msgs) + 11 * len(msgs)
    return len(str(body.get("prompt", "")))


class _Session:
    """The part of aiohttp.ClientSession that OpenAIClient uses."""

    def __init__(self, server: FakeServer) -> None:
        self.server = server

    def request(self, method: str, url: str, *, json: Any = None,
                headers: dict[str, str] | None = None, timeout: Any = None) -> _Response:
        return self.server.respond(method, url, json or {}, headers or {})

    def post(self, url: str, *, data: str | bytes = b"",
             headers: dict[str, str] | None = None) -> _Response:
        import json as json_mod

        return self.server.respond("POST", url, json_mod.loads(data or b"{}"), headers or {})

    async def close(self) -> None:
        return None
