"""The client's streaming hot path (`OpenAIClient._send_once`): it reads whatever bytes
arrived (one await per arrival), splits them into SSE lines itself and parses each event
with json's C scanner. Whatever way the bytes are cut into arrivals, the record must be the
same; a malformed event must still be caught."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from typing import Any

import pytest

from bstar.loadgen.client import OpenAIClient, RequestSpec
from bstar.loadgen.stream import loads as _loads

pytest.importorskip("aiohttp", reason="needs aiohttp (a base dependency)")


def _sse(n: int, *, chat: bool = False, crlf: bool = False, usage: bool = True,
         done_newline: bool = True) -> bytes:
    nl = "\r\n" if crlf else "\n"
    out = []
    if chat:  # vLLM's first chat event: a role, no content
        out.append({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
    for k in range(n):
        choice = ({"index": 0, "delta": {"content": chr(97 + k % 26)}} if chat
                  else {"index": 0, "text": chr(97 + k % 26)})
        out.append({"id": "x", "choices": [choice]})
    if usage:
        out.append({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": n,
                                             "prompt_tokens_details": {"cached_tokens": 3}}})
    text = "".join(f"data: {json.dumps(e)}{nl}{nl}" for e in out)
    text += ": a comment" + nl + "data: [DONE]" + (nl + nl if done_newline else "")
    return text.encode()


class _Resp:
    def __init__(self, pieces: list[bytes]) -> None:
        self.status = 200
        self.content = self._gen(pieces)

    @staticmethod
    async def _gen(pieces: list[bytes]) -> AsyncIterator[bytes]:
        for p in pieces:
            await asyncio.sleep(0)
            yield p

    async def __aenter__(self) -> _Resp:
        return self

    async def __aexit__(self, *exc: object) -> None:
        pass


class _Session:
    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces

    def post(self, url: str, **kw: Any) -> _Resp:
        return _Resp(self.pieces)


def _cut(data: bytes, rng: random.Random, max_piece: int) -> list[bytes]:
    out, i = [], 0
    while i < len(data):
        j = min(len(data), i + rng.randint(1, max_piece))
        out.append(data[i:j])
        i = j
    return out


async def _send(pieces: list[bytes], *, chat: bool = False, max_tokens: int = 9) -> Any:
    client = OpenAIClient("http://127.0.0.1:1", "tiny", endpoint="chat" if chat else
                          "completions", session=_Session(pieces))
    return await client.send(RequestSpec(0, max_tokens, prompt="hi"))


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("crlf", [False, True])
def test_any_cut_of_the_stream_gives_the_same_record(chat: bool, crlf: bool) -> None:
    data = _sse(9, chat=chat, crlf=crlf)
    rng = random.Random(7)
    cuts = [[data], [bytes([b]) for b in data]]  # one arrival; one byte per arrival
    cuts += [_cut(data, rng, m) for m in (3, 17, 64, 300) for _ in range(3)]
    for pieces in cuts:
        rec = asyncio.run(_send(pieces, chat=chat))
        assert rec.ok and rec.error_kind is None, rec.error
        assert rec.chunks == 9 and len(rec.itl_s) == 8 and rec.ttft_s is not None
        assert (rec.output_tokens, rec.token_source) == (9, "usage")
        assert (rec.prompt_tokens, rec.cached_prompt_tokens) == (7, 3)


def test_last_line_without_newline_and_counted_tokens() -> None:
    rec = asyncio.run(_send([_sse(5, usage=False, done_newline=False)], max_tokens=5))
    assert rec.ok and rec.chunks == 5 and rec.token_source == "counted"
    assert rec.output_tokens == 5


def test_tokens_arriving_together_share_their_arrival_time() -> None:
    # Everything in one arrival: one timestamp, taken before any parsing.
    rec = asyncio.run(_send([_sse(4)], max_tokens=4))
    assert rec.itl_s == [0.0, 0.0, 0.0]


@pytest.mark.parametrize(("line", "kind"), [
    (b"data: {not json\n\n", "malformed_sse"),
    (b"data: [1, 2]\n\n", "malformed_sse"),
    (b'data: {"a": 1} trailing\n\n', "malformed_sse"),
    (b"data: \xff\xfe\n\n", "malformed_sse"),
    (b'data: {"error": {"message": "boom"}}\n\n', "server_error"),
])
def test_a_bad_event_mid_stream_is_caught(line: bytes, kind: str) -> None:
    good = _sse(6)
    cut = good.index(b"data:", 200)
    rec = asyncio.run(_send([good[:cut], line, good[cut:]]))
    assert not rec.ok and rec.error_kind == kind, rec.error


def test_loads_is_json() -> None:
    for text in (b'{"a": [1, 2.5, null, true, "x\\u00e9"]}', b"3", b'"s"', b"[]"):
        assert _loads(text) == json.loads(text)
    for bad in (b"", b"{", b'{"a": 1}x', b"nope", b"\xff"):
        with pytest.raises(ValueError):
            _loads(bad)
