"""A scriptable OpenAI-compatible server on 127.0.0.1 in a thread, for the hostile-server
reproducers (tests/test_hostile_server.py) and their fuzz (tests/test_fuzz_server.py):
bstar's CLI runs in the test's own thread against it, over real sockets.

Each path is a `Route`, a function of the handler and the request's JSON body; the defaults
answer like a well-behaved server (one character per token, usage at the end, a 404 for
/metrics). A test overrides what it needs:

    with HostileServer({"/metrics": lambda h, body, n: h.send_raw(b"x" * 20_000_000)}) as s:
        main(["sweep", "--url", s.url, ...])

`seen` keeps every request's (path, headers).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = "tiny"

Route = Callable[["Handler", dict[str, Any], int], None]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # no 40 ms delayed-ACK stall per small write
    server: _Server

    def log_message(self, *args: Any) -> None:  # quiet
        return

    def _body(self) -> dict[str, Any]:
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        try:
            obj = json.loads(raw or b"{}")
        except ValueError:
            return {}
        return obj if isinstance(obj, dict) else {}

    def _route(self) -> None:
        srv = self.server.owner
        path = self.path.split("?")[0]
        body = self._body()
        with srv.lock:
            srv.seen.append((path, dict(self.headers.items())))
            srv.counts[path] = n = srv.counts.get(path, 0) + 1
        route = srv.routes.get(path) or DEFAULTS.get(path)
        try:
            if route is None:
                self.send_json(404, {"error": {"message": "Not Found"}})
            else:
                route(self, body, n)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    do_GET = do_POST = _route

    # -- helpers for routes ---------------------------------------------------------------
    def send_raw(self, body: bytes, status: int = 200, ctype: str = "text/plain",
                 headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def send_json(self, status: int, obj: Any) -> None:
        self.send_raw(json.dumps(obj).encode(), status, "application/json")

    def redirect(self, location: str) -> None:
        self.send_raw(b"", 302, headers={"Location": location})

    def send_chunks(self, pieces: Iterable[bytes], ctype: str = "text/event-stream") -> None:
        """A chunked 200 body, each piece one chunk, written as it comes (a generator may
        sleep between them, or never end)."""
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for p in pieces:
            if p:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(p), p))
                self.wfile.flush()
            if self.server.owner.closing:
                break
        self.wfile.write(b"0\r\n\r\n")

    def send_events(self, events: Iterable[Any]) -> None:
        """SSE: each event a JSON value (or bytes as they are), then [DONE]."""
        def lines() -> Iterable[bytes]:
            for e in events:
                yield e if isinstance(e, bytes) else b"data: " + json.dumps(e).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"
        self.send_chunks(lines())


def token_events(n: int, usage: dict[str, Any] | None = None) -> list[Any]:
    """`n` one-character tokens, then the usage block (default: the true counts)."""
    out: list[Any] = [{"choices": [{"index": 0, "text": "abcdefgh"[k % 8]}]} for k in range(n)]
    out.append({"choices": [], "usage": usage if usage is not None else
                {"prompt_tokens": 8, "completion_tokens": n}})
    return out


def _models(h: Handler, body: dict[str, Any], n: int) -> None:
    h.send_json(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})


def _tokenize(h: Handler, body: dict[str, Any], n: int) -> None:
    text = str(body.get("prompt", body.get("content", "")))
    h.send_json(200, {"count": len(text), "tokens": [ord(c) for c in text]})


def _completions(h: Handler, body: dict[str, Any], n: int) -> None:
    h.send_events(token_events(int(body.get("max_tokens") or 4)))


def _health(h: Handler, body: dict[str, Any], n: int) -> None:
    h.send_raw(b"ok")


DEFAULTS: dict[str, Route] = {"/v1/models": _models, "/tokenize": _tokenize,
                              "/v1/completions": _completions, "/health": _health}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: HostileServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that drops its connection (a pooled keep-alive socket closed at the end
        of a run, reset while this thread waits for its next request line) is not an error
        of the fake: socketserver would print its traceback to stderr, where a test that
        asserts "no Traceback" in the CLI's stderr reads it (it did, once, beside a
        CPU-bound process). Anything else still prints."""
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError):
            return
        super().handle_error(request, client_address)


class HostileServer:
    def __init__(self, routes: dict[str, Route] | None = None) -> None:
        self.routes = dict(routes or {})
        self.seen: list[tuple[str, dict[str, str]]] = []
        self.counts: dict[str, int] = {}
        self.lock = threading.Lock()
        self.closing = False
        self._srv = _Server(("127.0.0.1", 0), Handler)
        self._srv.owner = self
        self.port = int(self._srv.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._srv.serve_forever, args=(0.02,),
                                        daemon=True)

    def __enter__(self) -> HostileServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.closing = True
        self._srv.shutdown()
        self._srv.server_close()


def trickle(data: bytes, every_s: float) -> Iterable[bytes]:
    """`data` one byte at a time, `every_s` apart (a server too slow to finish)."""
    for i in range(len(data)):
        time.sleep(every_s)
        yield data[i:i + 1]


def endless(piece: bytes) -> Iterable[bytes]:
    """`piece` forever (until the client goes away or the server closes)."""
    while True:
        yield piece
