"""A fixed-rate OpenAI-compatible token server: a fixture for the client benchmark and tests.

Not a product feature. It streams one printable character per token on an absolute
schedule (token k of a request is due at start + ttft + k * interval), so any delay a
client sees beyond `interval` between tokens is the client's (or the host's) own.
Standard library only (raw asyncio, HTTP/1.1 keep-alive, chunked SSE) so that it costs
as little CPU as possible next to the client under test.

It can also misbehave on purpose (`--fault`), for the sweep's fault-injection tests:
  401            every request without `Authorization: Bearer <--api-key>` gets 401
  429 / 500      every `--fault-every`-th request gets that status
  reset          every `--fault-every`-th stream is cut (RST) after a few tokens
  malformed      every `--fault-every`-th stream sends a non-JSON data line
  hang           every `--fault-every`-th stream stops sending and never ends
  die            the process exits hard after `--fault-every` requests have started
`--max-seqs N` caps concurrently decoding requests (the rest wait), like an engine's
max_num_seqs, so throughput rises with concurrency up to N and then flattens; /metrics
then shows running/waiting and a vLLM-style cache_config_info.

    python bench/token_server.py --port 8099 --interval-ms 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import struct
import sys
import time

MODEL = "tiny"
_TEXT = "abcdefghijklmnopqrstuvwxyz"


class State:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.requests = 0
        self.running = 0
        self.waiting = 0
        self.generated = 0
        self.preemptions = 0
        # A whole-prompt cache, like llama.cpp's reuse of an identical prompt: a prompt seen
        # before counts all its tokens as cached (usage and vLLM-style /metrics counters).
        self.seen_prompts: set[str] = set()
        self.cache_queries = 0
        self.cache_hits = 0
        self.sem = asyncio.Semaphore(args.max_seqs) if args.max_seqs else None
        # --stamp-dir: one line per finished stream, "<prompt's first word> <send times>",
        # appended in one write so a reader sees whole lines (the client bench pairs them
        # with the gaps its clients saw, so the server's own jitter cancels).
        self.stamp_fd = os.open(os.path.join(args.stamp_dir, f"{os.getpid()}.stamps"),
                                os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) \
            if args.stamp_dir else None


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _response(status: int, body: bytes, ctype: str = "application/json") -> bytes:
    reason = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
              429: "Too Many Requests", 500: "Internal Server Error"}.get(status, "X")
    head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")
    return head.encode() + body


def _error(status: int, message: str) -> bytes:
    return _response(status, json.dumps({"error": {"message": message, "code": status}}).encode())


def _metrics(st: State) -> bytes:
    a = st.args
    lines = [
        "# TYPE vllm:num_requests_running gauge",
        f'vllm:num_requests_running{{model_name="{MODEL}"}} {st.running}',
        f'vllm:num_requests_waiting{{model_name="{MODEL}"}} {st.waiting}',
        f'vllm:num_preemptions_total{{model_name="{MODEL}"}} {st.preemptions}',
        f'vllm:generation_tokens_total{{model_name="{MODEL}"}} {st.generated}',
        "# TYPE vllm:prefix_cache_queries_total counter",
        f'vllm:prefix_cache_queries_total{{model_name="{MODEL}"}} {st.cache_queries}',
        "# TYPE vllm:prefix_cache_hits_total counter",
        f'vllm:prefix_cache_hits_total{{model_name="{MODEL}"}} {st.cache_hits}',
    ]
    if a.max_seqs:
        usage = st.running / a.max_seqs
        lines += [
            f'vllm:kv_cache_usage_perc{{model_name="{MODEL}"}} {usage}',
            "# TYPE vllm:cache_config_info gauge",
            f'vllm:cache_config_info{{block_size="16",num_gpu_blocks="{a.max_seqs * 8}",'
            f'cache_dtype="auto"}} 1.0',
        ]
    return _response(200, ("\n".join(lines) + "\n").encode(), "text/plain; version=0.0.4")


def _token_events(chat: bool) -> list[bytes]:
    """The chunked SSE event of each token, encoded once: the server's CPU per token
    stays far below the client's under test (the bench drives it to 50k tokens/s)."""
    obj = "chat.completion.chunk" if chat else "text_completion"
    out = []
    for ch in _TEXT:
        choice = {"index": 0, "delta": {"content": ch}} if chat else {"index": 0, "text": ch}
        event = {"id": "x", "object": obj, "model": MODEL, "choices": [choice]}
        out.append(_chunk(b"data: " + json.dumps(event).encode() + b"\n\n"))
    return out


_EVENTS = {False: _token_events(False), True: _token_events(True)}


def _reset(writer: asyncio.StreamWriter) -> None:
    # SO_LINGER 0 makes close() send RST: the client sees a connection reset mid-stream.
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def _prompt_tokens(body: dict, chat: bool) -> int:
    """One token per character; a chat template of 11 tokens per message."""
    if chat:
        msgs = body.get("messages") or []
        return sum(len(str(m.get("content", ""))) for m in msgs) + 11 * len(msgs)
    return len(str(body.get("prompt", "")))


async def _stream(st: State, body: dict, chat: bool, writer: asyncio.StreamWriter,
                  nth: int) -> bool:
    """Stream one completion; returns False when the connection must be dropped."""
    a = st.args
    prompt_tokens = _prompt_tokens(body, chat)
    key = json.dumps(body.get("messages") if chat else body.get("prompt"))
    cached = prompt_tokens if key in st.seen_prompts else 0
    st.seen_prompts.add(key)
    st.cache_queries += prompt_tokens
    st.cache_hits += cached
    out = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
    usage_wanted = bool((body.get("stream_options") or {}).get("include_usage"))
    faulty = a.fault_every > 0 and nth % a.fault_every == 0
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\n")
    if st.sem is not None:
        st.waiting += 1
        await st.sem.acquire()
        st.waiting -= 1
    st.running += 1
    try:
        t0 = time.monotonic()
        interval = a.interval_ms / 1e3
        obj = "chat.completion.chunk" if chat else "text_completion"
        events = _EVENTS[chat]
        sent: list[float] | None = [] if st.stamp_fd is not None else None
        for k in range(out):
            due = t0 + a.ttft_ms / 1e3 + k * interval
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            if faulty and k == 3:
                if a.fault == "reset":
                    _reset(writer)
                    return False
                if a.fault == "malformed":
                    writer.write(_chunk(b"data: {not json\n\n"))
                    await writer.drain()
                    continue
                if a.fault == "hang":
                    await asyncio.sleep(3600)
            writer.write(events[k % len(events)])
            if sent is not None:
                sent.append(time.monotonic())
            st.generated += 1
            await writer.drain()
        if sent is not None and st.stamp_fd is not None:
            word = str(body.get("prompt") or "").split(" ", 1)[0] or "-"
            os.write(st.stamp_fd, (word + " " + " ".join(f"{t:.7f}" for t in sent)
                                   + "\n").encode())
        if usage_wanted:
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": out,
                     "total_tokens": prompt_tokens + out,
                     "prompt_tokens_details": {"cached_tokens": cached}}
            event = {"id": "x", "object": obj, "model": MODEL, "choices": [], "usage": usage}
            writer.write(_chunk(b"data: " + json.dumps(event).encode() + b"\n\n"))
        writer.write(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await writer.drain()
        return True
    finally:
        st.running -= 1
        if st.sem is not None:
            st.sem.release()


async def handle(st: State, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    a = st.args
    try:
        while True:
            line = await reader.readline()
            if not line:
                return
            method, path, _ = line.decode("latin-1").split(" ", 2)
            headers: dict[str, str] = {}
            while True:
                h = await reader.readline()
                if h in (b"\r\n", b"\n", b""):
                    break
                k, _, v = h.decode("latin-1").partition(":")
                headers[k.strip().lower()] = v.strip()
            n = int(headers.get("content-length", "0"))
            raw = await reader.readexactly(n) if n else b""
            if path == "/health":
                writer.write(_response(200, b"{}"))
            elif path == "/metrics":
                writer.write(_metrics(st))
            elif path == "/v1/models":
                writer.write(_response(200, json.dumps(
                    {"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode()))
            elif path == "/tokenize" and method == "POST" and not a.no_tokenize:
                body = json.loads(raw or b"{}")
                text = str(body.get("prompt", body.get("content", "")))
                writer.write(_response(200, json.dumps(
                    {"count": len(text), "tokens": [ord(c) for c in text]}).encode()))
            elif path in ("/v1/completions", "/v1/chat/completions") and method == "POST":
                if a.fault == "401" and headers.get("authorization") != f"Bearer {a.api_key}":
                    writer.write(_error(401, "Unauthorized"))
                    await writer.drain()
                    continue
                body = json.loads(raw or b"{}")
                if body.get("model") != MODEL:
                    writer.write(_error(404, f"The model `{body.get('model')}` does not exist."))
                    await writer.drain()
                    continue
                st.requests += 1
                nth = st.requests
                if a.fault == "die" and nth > a.fault_every:
                    os._exit(1)
                if a.fault in ("429", "500") and a.fault_every and nth % a.fault_every == 0:
                    writer.write(_error(int(a.fault), f"injected {a.fault}"))
                    await writer.drain()
                    continue
                if not body.get("stream"):
                    text = "a" * int(body.get("max_tokens") or 16)
                    pt = _prompt_tokens(body, path.endswith("chat/completions"))
                    writer.write(_response(200, json.dumps({
                        "choices": [{"text": text, "index": 0}],
                        "usage": {"prompt_tokens": pt, "completion_tokens": len(text)},
                    }).encode()))
                elif not await _stream(st, body, path.endswith("chat/completions"), writer,
                                       nth):
                    return
            else:
                writer.write(_error(404, "Not Found"))
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError, ValueError):
        return
    finally:
        if not writer.is_closing():
            writer.close()


async def serve(args: argparse.Namespace) -> None:
    st = State(args)
    server = await asyncio.start_server(lambda r, w: handle(st, r, w), "127.0.0.1", args.port,
                                        backlog=4096, reuse_port=args.procs > 1)
    print(f"token server on http://127.0.0.1:{args.port}", flush=True)
    async with server:
        await server.serve_forever()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--interval-ms", type=float, default=20.0, help="time between tokens")
    ap.add_argument("--ttft-ms", type=float, default=0.0, help="time to the first token")
    ap.add_argument("--max-seqs", type=int, default=0, help="cap on concurrent streams")
    ap.add_argument("--fault", default="none",
                    choices=["none", "401", "429", "500", "reset", "malformed", "hang", "die"])
    ap.add_argument("--fault-every", type=int, default=0)
    ap.add_argument("--api-key", default="")
    ap.add_argument("--no-tokenize", action="store_true",
                    help="no /tokenize endpoint (clients must calibrate from usage)")
    ap.add_argument("--stamp-dir", default="",
                    help="record each stream's send times there (bench/client_bench.py "
                         "pairs them with what its clients saw)")
    ap.add_argument("--procs", type=int, default=1,
                    help="serve from N processes sharing the port (SO_REUSEPORT; the kernel "
                         "spreads connections), so 1,000+ streams are not capped by one "
                         "server loop; counters and /metrics are then per process")
    return ap.parse_args(argv)


def _main(args: argparse.Namespace) -> None:
    try:
        asyncio.run(serve(args))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    ARGS = parse_args()
    if ARGS.procs > 1:
        import multiprocessing as mp

        children = [mp.Process(target=_main, args=(ARGS,), daemon=True)
                    for _ in range(ARGS.procs - 1)]
        for c in children:
            c.start()
    _main(ARGS)
