"""The measured path on bstar's own connection (loadgen/stream.py), against scripted servers
on 127.0.0.1: every framing a server may use gives the same record, every way a server
can fail gives one record with its kind, and connections are reused, resent on and closed
as they should be."""

from __future__ import annotations

import asyncio
import base64
import json
import random
from collections.abc import Awaitable, Callable
from typing import Any

from bstar.loadgen.client import OpenAIClient, RequestRecord, RequestSpec
from test_client_hotpath import _cut

Reply = Callable[[asyncio.StreamReader, asyncio.StreamWriter, dict[str, Any]], Awaitable[bool]]


def _events(n: int, *, usage: bool = True) -> list[bytes]:
    out = [b"data: " + json.dumps({"id": "x", "choices": [{"index": 0, "text": "ab"[k % 2]}]})
           .encode() + b"\n\n" for k in range(n)]
    if usage:
        out.append(b"data: " + json.dumps({"choices": [], "usage": {
            "prompt_tokens": 5, "completion_tokens": n}}).encode() + b"\n\n")
    return [*out, b"data: [DONE]\n\n"]


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class Scripted:
    """A server that reads each request whole, then lets `reply` answer it (True: keep the
    connection for another request). It counts connections and keeps each request's head."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.connections = 0
        self.heads: list[dict[str, Any]] = []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                first, *lines = head.decode().split("\r\n")
                headers = {k.lower(): v.strip() for k, _, v in
                           (x.partition(":") for x in lines if x)}
                body = await reader.readexactly(int(headers["content-length"]))
                req = {"line": first, "headers": headers, "body": json.loads(body)}
                self.heads.append(req)
                if not await self.reply(reader, writer, req):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def chunked(pieces_of: Callable[[bytes], list[bytes]], *, n: int = 9,
            pause_s: float = 0.002) -> Reply:
    """A 200 chunked SSE answer, its bytes written in the pieces `pieces_of` cuts."""
    async def reply(_r: asyncio.StreamReader, w: asyncio.StreamWriter, _q: dict[str, Any]
                    ) -> bool:
        data = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
                + b"".join(_chunk(e) for e in _events(n)) + b"0\r\n\r\n")
        for piece in pieces_of(data):
            w.write(piece)
            await w.drain()
            await asyncio.sleep(pause_s)
        return True
    return reply


async def _send(url: str, n: int = 9, **kw: Any) -> RequestRecord:
    async with OpenAIClient(url, "tiny", **kw) as c:
        return await c.send(RequestSpec(0, n, prompt="hi"))


def _run(reply: Reply, n: int = 9, **kw: Any) -> tuple[RequestRecord, Scripted]:
    async def go() -> tuple[RequestRecord, Scripted]:
        s = Scripted(reply)
        async with s as url:
            return await _send(url, n, **kw), s
    return asyncio.run(go())


def _ok(rec: RequestRecord, n: int = 9) -> None:
    assert rec.ok and rec.error_kind is None, rec.error
    assert rec.http_status == 200 and rec.chunks == n and len(rec.itl_s) == n - 1
    assert (rec.output_tokens, rec.token_source, rec.prompt_tokens) == (n, "usage", 5)
    assert rec.ttft_s is not None and rec.e2e_s is not None and rec.e2e_s >= rec.ttft_s


def test_any_cut_of_the_bytes_gives_the_same_record() -> None:
    rng = random.Random(3)

    def cuts(m: int) -> Callable[[bytes], list[bytes]]:
        return lambda data: _cut(data, rng, m)

    for cut in (lambda d: [d], cuts(7), cuts(40), cuts(400)):
        rec, _ = _run(chunked(cut, pause_s=0.0005))
        _ok(rec)


def test_tokens_in_one_arrival_share_its_stamp_and_spaced_ones_do_not() -> None:
    rec, _ = _run(chunked(lambda d: [d]))
    assert rec.itl_s == [0.0] * 8  # one write, one arrival, one stamp
    def halves(data: bytes) -> list[bytes]:  # events 1-4 in one write, 5-9 in the next
        cut = data.index(b"\r\n\r\n") + 4 + sum(len(_chunk(e)) for e in _events(9)[:4])
        return [data[:cut], data[cut:]]

    rec, _ = _run(chunked(halves, pause_s=0.3))
    _ok(rec)
    # Three gaps of 0 inside each write, one gap between the two arrivals (a client stalled
    # for the whole 0.3 s pause would read both at once; nothing else makes this fail).
    assert rec.itl_s.count(0.0) == 7 and max(rec.itl_s) > 0


def test_content_length_and_end_of_connection_bodies() -> None:
    body = b"".join(_events(4))

    async def by_length(_r: Any, w: asyncio.StreamWriter, _q: Any) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        return True

    async def by_close(_r: Any, w: asyncio.StreamWriter, _q: Any) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + body)
        await w.drain()
        return False  # the server closes: that is the body's end

    for reply in (by_length, by_close):
        rec, _ = _run(reply, 4)
        _ok(rec, 4)


def test_an_http_error_keeps_its_status_and_body_and_the_connection() -> None:
    calls = 0

    async def reply(r: Any, w: asyncio.StreamWriter, q: Any) -> bool:
        nonlocal calls
        calls += 1
        if calls == 1:
            msg = json.dumps({"error": {"message": "slow down", "code": 429}}).encode()
            w.write(b"HTTP/1.1 429 Too Many Requests\r\nContent-Length: %d\r\n\r\n%s"
                    % (len(msg), msg))
            return True
        return await chunked(lambda d: [d])(r, w, q)

    async def go() -> tuple[list[RequestRecord], Scripted]:
        s = Scripted(reply)
        async with s as url, OpenAIClient(url, "tiny") as c:
            return [await c.send(RequestSpec(i, 9, prompt="hi")) for i in range(2)], s

    (first, second), s = asyncio.run(go())
    assert (first.ok, first.error_kind, first.http_status) == (False, "http_429", 429)
    assert "slow down" in (first.error or "")
    _ok(second)
    assert s.connections == 1  # the 429's connection served the next request


def test_requests_reuse_one_keep_alive_connection() -> None:
    async def go() -> Scripted:
        s = Scripted(chunked(lambda d: [d]))
        async with s as url, OpenAIClient(url, "tiny") as c:
            for i in range(5):
                _ok(await c.send(RequestSpec(i, 9, prompt="hi")))
        return s

    assert asyncio.run(go()).connections == 1


def test_a_pooled_connection_the_server_closed_is_sent_again_not_failed() -> None:
    # llama.cpp's server closes a keep-alive connection after some requests without saying
    # so: a request written to it gets no answer and must be resent, not recorded as failed.
    async def reply(r: Any, w: asyncio.StreamWriter, q: Any) -> bool:
        await chunked(lambda d: [d])(r, w, q)
        return False  # close right after answering, no `Connection: close`

    async def go() -> tuple[list[RequestRecord], Scripted]:
        s = Scripted(reply)
        async with s as url, OpenAIClient(url, "tiny") as c:
            recs = []
            for i in range(4):
                recs.append(await c.send(RequestSpec(i, 9, prompt="hi")))
            return recs, s

    recs, s = asyncio.run(go())
    for rec in recs:
        _ok(rec)
    assert s.connections == 4


def test_a_reset_mid_stream_is_one_reset_record() -> None:
    async def reply(_r: Any, w: asyncio.StreamWriter, _q: Any) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                + b"".join(_chunk(e) for e in _events(9)[:3]))
        await w.drain()
        await asyncio.sleep(0.01)
        w.transport.abort()
        return False

    rec, _ = _run(reply)
    assert (rec.ok, rec.error_kind, rec.chunks, rec.http_status) == (False, "reset", 3, 200)
    assert "after 3 chunks" in (rec.error or "")


def test_not_http_is_a_client_record() -> None:
    async def reply(_r: Any, w: asyncio.StreamWriter, _q: Any) -> bool:
        w.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
        await w.drain()
        await asyncio.sleep(0.05)
        return False

    rec, _ = _run(reply)
    assert (rec.ok, rec.error_kind) == (False, "client")
    assert "invalid HTTP" in (rec.error or "")


def test_a_silent_server_times_out_and_its_connection_is_closed() -> None:
    async def reply(r: Any, w: asyncio.StreamWriter, _q: Any) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        await r.read()  # wait for the client to hang up
        return False

    async def go() -> tuple[RequestRecord, int]:
        s = Scripted(reply)
        async with s as url, OpenAIClient(url, "tiny", request_timeout_s=0.3) as c:
            rec = await c.send(RequestSpec(0, 9, prompt="hi"))
            assert c._pool is not None
            await asyncio.sleep(0.05)
            return rec, len(c._pool.live)

    rec, live = asyncio.run(go())
    assert (rec.ok, rec.error_kind, rec.http_status) == (False, "timeout", 200)
    assert live == 0


def test_refused_connection_is_a_connect_record() -> None:
    async def go() -> RequestRecord:
        s = Scripted(chunked(lambda d: [d]))
        async with s as url:
            pass  # closed: nothing listens on its port now
        return await _send(url)

    rec = asyncio.run(go())
    assert (rec.ok, rec.error_kind) == (False, "connect")
    assert "cannot connect to http://127.0.0.1:" in (rec.error or "")


def test_credentials_path_prefix_and_host_header() -> None:
    seen: list[dict[str, Any]] = []

    async def go(url_of: Callable[[str], str], **kw: Any) -> None:
        s = Scripted(chunked(lambda d: [d]))
        async with s as url:
            _ok(await _send(url_of(url), **kw))
        seen.extend(s.heads)

    asyncio.run(go(lambda u: u.replace("http://", "http://al%40ice:p%3Ass@") + "/proxy/v1"))
    asyncio.run(go(lambda u: u, api_key="sk-test"))
    by_url, by_key = seen
    assert by_url["line"] == "POST /proxy/v1/completions HTTP/1.1"
    assert by_url["headers"]["authorization"] == "Basic " + base64.b64encode(
        b"al@ice:p:ss").decode()
    assert by_url["headers"]["host"].startswith("127.0.0.1:")
    assert by_key["headers"]["authorization"] == "Bearer sk-test"
    assert by_key["body"]["stream"] is True and by_key["body"]["prompt"] == "hi"
