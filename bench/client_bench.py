"""How much load can bstar's client drive before it distorts what it measures?

One command:  python bench/client_bench.py [--aiperf PATH] [--levels 16,32,64,...]
                                          [--repeats R]

A local fixed-rate token server (bench/token_server.py) streams every request's tokens
exactly `--interval-ms` apart, so any ITL beyond the interval is added by the client (or
the shared host). For each client and each concurrency level the bench records output
tokens/s, pooled ITL p50/p99 (every gap between streamed chunks), the p99 added over the
interval ("added"), the same against the minimal client at that level ("vs min": what the
client adds beyond the host's and the token server's own jitter), and the client's CPU. A
client keeps up at a level when it streams >= 95% of the minimal client's tokens/s; it
sustains a level when it keeps up and adds under 1 ms to ITL p99 there and at every level
below (over the interval; and, second test, over the minimal client). Clients, all
against the same server in the same run:

  minimal a bare asyncio Protocol: arrivals stamped where they arrive, events counted,
          nothing parsed: the floor (host and server jitter)
  bstar   bstar.loadgen (OpenAIClient + drive): what `bstar sweep` runs
  aiohttp the same client reading its streams through aiohttp's StreamReader (each chunk
          stamped when its task resumes): the measured path before loadgen/stream.py
  workers the same over `--workers` local processes (bstar.loadgen.workers, `bstar sweep
          --workers N`): the level's streams split, one event loop each, one start instant
  ray     the same workers as Ray actors on a local cluster (`bstar sweep --ray`; needs
          bstar[ray], skipped without it)
  httpx   the same streaming loop on httpx (the alternative HTTP library; the choice)
  aiperf  NVIDIA AIPerf (`pip install aiperf`, in its own venv: --aiperf .../bin/aiperf),
          its ITL taken from its per-request export (inter_chunk_latency), pooled the same way

With `--repeats R` every level and client runs R times, interleaved, and the table shows
medians; each comparison with the minimal client is made within its run, then the median
is taken (on a shared host two runs of one client differ by more than the 1 ms under test).
It prints one table, per client the highest concurrency sustained within 1 ms of the
minimal client's ITL p99 and within 5% of its tokens/s, and the ratios bstar/aiperf of the
highest sustained concurrency and of tokens/s there. A client that collapses (under half
the floor's tokens/s) is not run at higher levels. Everything runs on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from bstar.loadgen.client import OpenAIClient, RequestSpec, aiohttp_session  # noqa: E402
from bstar.loadgen.worker import (  # noqa: E402
    drive,
    event_loop_name,
    run_loop,
    steady_gc,
)
from bstar.loadgen.workers import LoadPool, WorkerJob, split_level  # noqa: E402
from bstar.servers import ManagedServer, free_port  # noqa: E402
from bstar.stats import percentile  # noqa: E402

ADDED_LIMIT_MS = 1.0
TPUT_FRACTION = 0.95
COLLAPSED = 0.5  # a client under half the floor's tokens/s is not run at higher levels


Gaps = dict[int, list[float]]  # a request's index -> the gaps (s) its client saw


def stats(per: Gaps, tokens: int, wall_s: float, cpu_s: float,
          interval_ms: float) -> dict[str, Any]:
    g = sorted(x * 1e3 for v in per.values() for x in v)
    p99 = percentile(g, 99) if g else float("nan")
    return {"tok_s": tokens / wall_s, "itl_p50_ms": percentile(g, 50) if g else float("nan"),
            "itl_p99_ms": p99, "added_p99_ms": p99 - interval_ms,
            "cpu_pct": 100 * cpu_s / wall_s, "gaps": per}


def read_stamps(stamp_dir: Path) -> dict[int, list[float]]:
    """The token server's send times per request index (its prompts start with the index),
    then emptied for the next run (the server appends with O_APPEND, so truncating is safe)."""
    out: dict[int, list[float]] = {}
    for f in stamp_dir.glob("*.stamps"):
        for line in f.read_text().splitlines():
            word, *times = line.split()
            if word.isdigit():
                out[int(word)] = [float(t) for t in times]
        os.truncate(f, 0)
    return out


def paired(per: Gaps, sent: dict[int, list[float]]) -> dict[str, float]:
    """The same chunks seen by the server and by the client: the server's own gaps (its
    loop's jitter on a busy host) against the client's, so what the client adds to ITL p99
    is measured with the server's jitter cancelled. A request is paired when the client saw
    as many gaps as the server sent."""
    client: list[float] = []
    server: list[float] = []
    n = 0
    for i, gaps in per.items():
        s = sent.get(i)
        if s is None or len(s) - 1 != len(gaps):
            continue
        n += 1
        client += [g * 1e3 for g in gaps]
        server += [(b - a) * 1e3 for a, b in itertools.pairwise(s)]
    if not client:
        return {"paired_requests": 0, "server_p99_ms": float("nan"),
                "client_added_p99_ms": float("nan")}
    sp99 = percentile(sorted(server), 99)
    return {"paired_requests": n, "server_p99_ms": sp99,
            "client_added_p99_ms": percentile(sorted(client), 99) - sp99}


def medians(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per client and level: the median of each number over the runs (each
    comparison with the minimal client was made within its run first)."""
    import statistics

    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault((r["client"], r["concurrency"]), []).append(r)
    out = []
    for (client, n), rs in groups.items():
        row: dict[str, Any] = {"client": client, "concurrency": n, "runs": len(rs)}
        for k, v in rs[0].items():
            if isinstance(v, float) and k not in row:
                row[k] = statistics.median(r[k] for r in rs)
        out.append(row)
    return out


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) used so far by process `pid` and its children (the token
    server's processes), from /proc; 0 where /proc is not there."""
    tick = os.sysconf("SC_CLK_TCK")
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError, IndexError):
            continue
    return total


def prompt(i: int, n: int) -> str:
    return (f"{i} " + "x" * n)[:n]


async def run_bstar(url: str, n: int, requests: int, in_len: int, out_len: int,
                    interval_ms: float, *, via_aiohttp: bool = False) -> dict[str, float]:
    """bstar's client as the sweep runs it; `via_aiohttp`: the same client reading its
    streams through an aiohttp session (the measured path before loadgen/stream.py)."""
    specs = [RequestSpec(i, out_len, prompt=prompt(i, in_len)) for i in range(requests + n)]
    session = aiohttp_session(10.0) if via_aiohttp else None
    async with OpenAIClient(url, "tiny", session=session) as c:
        # Warm-up: one request per stream, so connections exist before timing.
        async for _ in drive(c, specs[:n], concurrency=n):
            pass
        gaps: Gaps = {}
        tokens = 0
        with steady_gc():  # as the sweep's runner does, before its clock starts
            t0, c0 = time.perf_counter(), time.process_time()
            async for r in drive(c, specs[n:], concurrency=n):
                gaps[r.index] = r.itl_s
                tokens += r.output_tokens if r.ok else 0
        wall_s, cpu_s = time.perf_counter() - t0, time.process_time() - c0
    if session is not None:
        await session.close()
    return stats(gaps, tokens, wall_s, cpu_s, interval_ms)


async def run_pool(pool: LoadPool, url: str, n: int, requests: int, in_len: int,
                   out_len: int, interval_ms: float) -> dict[str, float]:
    """bstar's client over the pool's workers, as `bstar sweep --workers/--ray` runs it:
    each worker warms its own connections, all start at one instant, the level lasts
    until the last worker's last token; CPU is the workers' plus this process's."""
    specs = [RequestSpec(i, out_len, prompt=prompt(i, in_len)) for i in range(requests + n)]
    base = WorkerJob(url=url, model="tiny", endpoint="completions", api_key=None,
                     request_timeout_s=600.0, extra_body={}, warm=[], specs=[],
                     concurrency=None, rate=None, seed=0, level_time_limit_s=3600.0)
    jobs = split_level(specs[n:], specs[:n], workers=pool.workers, concurrency=n, rate=None,
                       seed=0, base=base)
    await pool.warm(jobs)
    gaps: Gaps = {}
    tokens = 0
    c0 = time.process_time()
    async for batch in pool.measure():
        for r in batch:
            gaps[r.index] = r.itl_s
            tokens += r.output_tokens if r.ok else 0
    return stats(gaps, tokens, pool.outcome.duration_s,
                 pool.outcome.cpu_s + time.process_time() - c0, interval_ms)


async def run_httpx(url: str, n: int, requests: int, in_len: int, out_len: int,
                    interval_ms: float) -> dict[str, float]:
    import httpx

    body = {"model": "tiny", "max_tokens": out_len, "stream": True,
            "stream_options": {"include_usage": True}}
    gaps: Gaps = {}
    tokens = 0

    async def one(client: httpx.AsyncClient, i: int, record: bool) -> None:
        nonlocal tokens
        last = None
        mine = gaps.setdefault(i, []) if record else []
        async with client.stream("POST", url + "/v1/completions",
                                 json={**body, "prompt": prompt(i, in_len)}) as resp:
            async for line in resp.aiter_lines():
                if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                    continue
                ev = json.loads(line[5:])
                if any(ch.get("text") for ch in ev.get("choices") or ()):
                    t = time.perf_counter()
                    if last is not None:
                        mine.append(t - last)
                    last = t
                    tokens += record

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(limits=limits, timeout=None, trust_env=False) as client:
        await asyncio.gather(*(one(client, i, False) for i in range(n)))
        queue = list(range(n, n + requests))

        async def stream() -> None:
            while queue:
                await one(client, queue.pop(), True)

        t0, c0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(stream() for _ in range(n)))
        return stats(gaps, tokens, time.perf_counter() - t0, time.process_time() - c0,
                     interval_ms)


class _FloorStream(asyncio.Protocol):
    """The floor's connection: each arrival stamped where the loop hands it over, its
    events counted (`data: {`), nothing parsed; the request ends at the chunked body's end."""

    def __init__(self) -> None:
        self.transport: Any = None
        self.gaps: list[float] = []
        self.last: float | None = None
        self.tokens = 0
        self.done: asyncio.Future[None] | None = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        t = time.perf_counter()
        n = data.count(b"data: {")
        if n:
            if self.last is not None:
                self.gaps.append(t - self.last)
            self.gaps += [0.0] * (n - 1)  # events that arrived together: a gap of 0
            self.last = t
            self.tokens += n
        if data.endswith(b"0\r\n\r\n") and self.done is not None and not self.done.done():
            self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_result(None)


async def run_minimal(url: str, n: int, requests: int, in_len: int, out_len: int,
                      interval_ms: float) -> dict[str, float]:
    """The floor: one keep-alive connection per stream on a bare asyncio Protocol that
    stamps each arrival of bytes where it arrives and only counts the events in it (no
    HTTP or JSON parsing). What it sees beyond the interval is the host's and the server's
    jitter, and the least any Python client on this loop can add."""
    host, port = url.split("//", 1)[1].split(":")
    loop = asyncio.get_running_loop()
    gaps: Gaps = {}
    tokens = 0

    async def stream(proto: _FloorStream, ids: list[int], record: bool) -> None:
        nonlocal tokens
        for i in ids:
            body = json.dumps({"model": "tiny", "prompt": prompt(i, in_len),
                               "max_tokens": out_len, "stream": True}).encode()
            proto.gaps, proto.last, proto.tokens = [], None, 0
            proto.done = loop.create_future()
            proto.transport.write(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            await proto.done
            if record:
                gaps[i] = proto.gaps
                tokens += proto.tokens

    # Warm-up: one request per stream on its own connection, kept for the measured run.
    conns = [(await loop.create_connection(_FloorStream, host, int(port)))[1]
             for _ in range(n)]
    try:
        await asyncio.gather(*(stream(c, [i], False) for i, c in enumerate(conns)))
        per = [list(range(n + k, n + requests, n)) for k in range(n)]
        t0, c0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(stream(c, ids, True) for c, ids in zip(conns, per,
                                                                       strict=True)))
        wall_s, cpu_s = time.perf_counter() - t0, time.process_time() - c0
    finally:
        for c in conns:
            c.transport.close()
    return stats(gaps, tokens, wall_s, cpu_s, interval_ms)


def run_aiperf(aiperf: str, url: str, n: int, requests: int, in_len: int, out_len: int,
               interval_ms: float, tokenizer: str) -> dict[str, float]:
    out = Path(tempfile.mkdtemp(prefix="bstar-aiperf-"))
    cmd = [aiperf, "profile", "-m", "tiny", "--url", url, "--endpoint-type", "completions",
           "--streaming", "--concurrency", str(n), "--request-count", str(requests),
           "--warmup-request-count", str(n), "--prompt-input-tokens-mean", str(in_len),
           "--prompt-input-tokens-stddev", "0", "--prompt-output-tokens-mean", str(out_len),
           "--prompt-output-tokens-stddev", "0", "--tokenizer", tokenizer,
           "--output-artifact-dir", str(out), "--use-server-token-count",
           "--no-server-metrics", "--no-gpu-telemetry", "--ui-type", "none"]
    env = {**os.environ, "no_proxy": "*", "NO_PROXY": "*"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"aiperf failed ({proc.returncode}): {proc.stdout[-2000:]}")
    summary = json.loads((out / "profile_export_aiperf.json").read_text())
    gaps: list[float] = []
    for line in (out / "profile_export.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec["metadata"].get("benchmark_phase") != "profiling":
            continue
        icl = (rec.get("metrics") or {}).get("inter_chunk_latency")
        if icl:
            gaps += [x / 1e3 for x in icl["value"]]
    wall_s = float(summary["benchmark_duration"]["avg"])
    tok_s = float(summary["output_token_throughput"]["avg"])
    cpu_s = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    shutil.rmtree(out, ignore_errors=True)
    # AIPerf's records carry no request index: its gaps are pooled, not paired.
    s = stats({-1: gaps}, round(tok_s * wall_s), wall_s, 0.0, interval_ms)
    # AIPerf's CPU includes its start-up and dataset generation: report it over the run.
    s["cpu_pct"] = float("nan") if cpu_s <= 0 else 100 * cpu_s / wall_s
    return s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--levels", default="8,16,32,64,128,256")
    ap.add_argument("--interval-ms", type=float, default=20.0)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3, help="requests per stream per level")
    ap.add_argument("--repeats", type=int, default=1,
                    help="run every level and client this many times, interleaved; the "
                         "table shows medians, and each comparison with the minimal client "
                         "is the median of the per-run comparisons")
    ap.add_argument("--clients", default="minimal,bstar,aiohttp,workers,ray,httpx,aiperf")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 2,
                    help="processes (or Ray actors) of the workers and ray clients "
                         "(default: the CPUs)")
    ap.add_argument("--server-procs", type=int, default=1,
                    help="token server processes sharing the port (for 1,000+ streams)")
    ap.add_argument("--aiperf", default=shutil.which("aiperf") or
                    str(Path.home() / ".cache/bstar/aiperf-venv/bin/aiperf"))
    ap.add_argument("--tokenizer", help="HF tokenizer folder for AIPerf (default: the tiny "
                    "model's, built if needed)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    levels = [int(x) for x in args.levels.split(",")]
    clients = args.clients.split(",")
    if "aiperf" in clients and not Path(args.aiperf).exists():
        print(f"aiperf not found at {args.aiperf}; skipping it", file=sys.stderr)
        clients.remove("aiperf")
    if "httpx" in clients:
        try:
            import httpx  # noqa: F401
        except ImportError:
            print("httpx is not installed; skipping it", file=sys.stderr)
            clients.remove("httpx")
    if "ray" in clients:
        try:
            import ray  # noqa: F401
        except ImportError:
            print("ray is not installed (bstar[ray]); skipping it", file=sys.stderr)
            clients.remove("ray")
    tokenizer = args.tokenizer
    if "aiperf" in clients and not tokenizer:
        from bstar.tinymodel import default_tiny_dir

        tokenizer = str(default_tiny_dir().hf_dir)
    port = free_port()
    stamp_dir = Path(tempfile.mkdtemp(prefix="bstar-stamps-"))
    server = ManagedServer([sys.executable, str(HERE / "token_server.py"), "--port", str(port),
                            "--interval-ms", str(args.interval_ms),
                            "--procs", str(args.server_procs), "--stamp-dir", str(stamp_dir)],
                           health_url=f"http://127.0.0.1:{port}/health", timeout_s=30)
    rows: list[dict[str, Any]] = []
    pools: dict[str, LoadPool] = {}
    behind: set[str] = set()  # clients that collapsed (under half the floor's tokens/s)
    try:
        server.start()
        url = server.url
        server_pid = server.process.pid if server.process else 0
        for rep, n, client in ((r, n, c) for r in range(args.repeats) for n in levels
                               for c in clients):
            requests = n * args.rounds
            if client in behind:
                continue
            if client in ("workers", "ray") and client not in pools:
                pools[client] = LoadPool(args.workers,
                                         "local" if client == "ray" else None)
                pools[client].start()
            srv0, wall0 = tree_cpu_s(server_pid), time.perf_counter()
            if client in pools:
                s = run_loop(run_pool(pools[client], url, n, requests, args.input_len,
                                      args.output_len, args.interval_ms))
            elif client in ("bstar", "aiohttp"):
                s = run_loop(run_bstar(url, n, requests, args.input_len,
                                       args.output_len, args.interval_ms,
                                       via_aiohttp=client == "aiohttp"))
            elif client == "minimal":
                s = asyncio.run(run_minimal(url, n, requests, args.input_len,
                                            args.output_len, args.interval_ms))
            elif client == "httpx":
                s = asyncio.run(run_httpx(url, n, requests, args.input_len,
                                          args.output_len, args.interval_ms))
            else:
                s = run_aiperf(args.aiperf, url, n, requests, args.input_len,
                               args.output_len, args.interval_ms, tokenizer or "")
            # The server's CPU over the client's run (its warm-up included): what the
            # fixture had, next to the client, on the same cores.
            s["server_cpu_pct"] = 100 * (tree_cpu_s(server_pid) - srv0) / (
                time.perf_counter() - wall0)
            s.update(paired(s.pop("gaps"), read_stamps(stamp_dir)))
            rows.append({"client": client, "concurrency": n, "repeat": rep, **s})
            floor_s = next((r for r in rows if r["client"] == "minimal"
                            and r["concurrency"] == n and r["repeat"] == rep), None)
            if floor_s and client != "minimal" and s["tok_s"] < COLLAPSED * floor_s[
                    "tok_s"]:
                behind.add(client)
            print(f"{client:7s} c={n:4d}  {s['tok_s']:8.1f} tok/s  ITL p50 "
                  f"{s['itl_p50_ms']:6.2f}  p99 {s['itl_p99_ms']:6.2f} ms  (+"
                  f"{s['added_p99_ms']:5.2f}; server {s['server_p99_ms']:6.2f}, client "
                  f"+{s['client_added_p99_ms']:5.2f})  cpu {s['cpu_pct']:5.1f}% (server "
                  f"{s['server_cpu_pct']:5.1f}%)  load "
                  f"{os.getloadavg()[0]:.2f}", file=sys.stderr, flush=True)
    finally:
        for pool in pools.values():
            pool.close()
        server.stop()
        shutil.rmtree(stamp_dir, ignore_errors=True)
    # Against the floor at the same level in the same run: what the client adds beyond the
    # host's and the server's jitter; then per client and level the medians over the runs.
    floor = {(r["concurrency"], r["repeat"]): r for r in rows if r["client"] == "minimal"}
    for r in rows:
        f = floor.get((r["concurrency"], r["repeat"]))
        r["of_minimal_tok_s"] = r["tok_s"] / f["tok_s"] if f else float("nan")
        r["vs_minimal_p99_ms"] = r["itl_p99_ms"] - f["itl_p99_ms"] if f else float("nan")
        r["vs_minimal_paired_ms"] = (r["client_added_p99_ms"] - f["client_added_p99_ms"]
                                     if f else float("nan"))
    runs, rows = rows, medians(rows)
    for r in rows:
        # A client that cannot keep up streams fewer tokens than the server sends (and then
        # sees a quieter server): it must keep >= 95% of the floor's tokens/s to count.
        r["keeps_up"] = r["of_minimal_tok_s"] >= TPUT_FRACTION
    tests = {
        "added": ("adding < 1 ms to ITL p99 over the interval",
                  lambda r: r["keeps_up"] and r["added_p99_ms"] < ADDED_LIMIT_MS),
        "vs_minimal": ("within 1 ms of the minimal client's ITL p99 and within "
                       f"{100 - TPUT_FRACTION * 100:g}% of its tokens/s",
                       lambda r: r["keeps_up"] and r["vs_minimal_p99_ms"] < ADDED_LIMIT_MS),
        "paired": ("within 1 ms of the minimal client's ITL p99, each over the server's own "
                   f"gaps of the same chunks, and within {100 - TPUT_FRACTION * 100:g}% of "
                   "its tokens/s", lambda r: r["keeps_up"] and r["vs_minimal_paired_ms"]
                   < ADDED_LIMIT_MS),
        "tput": (f"keeping tokens/s within {100 - TPUT_FRACTION * 100:g}% of the minimal "
                 "client's", lambda r: r["keeps_up"]),
    }
    result: dict[str, Any] = {"interval_ms": args.interval_ms, "added_limit_ms": ADDED_LIMIT_MS,
                              "cpus": os.cpu_count(), "workers": args.workers,
                              "server_procs": args.server_procs,
                              "event_loop": event_loop_name(),
                              "repeats": args.repeats, "loadavg": os.getloadavg(),
                              "rows": rows, "runs": runs, "sustained": {}}
    for name, (_, passes) in tests.items():
        best: dict[str, dict[str, Any] | None] = {}
        for client in clients:
            # Sustained = every level up to it passes (not a lucky level after a failure).
            top = None
            for r in sorted((r for r in rows if r["client"] == client),
                            key=lambda r: r["concurrency"]):
                if not passes(r):
                    break
                top = r
            best[client] = top
        result["sustained"][name] = best
        b, a = best.get("bstar"), best.get("aiperf")
        if b and a:
            result[f"ratio_{name}"] = {"concurrency": b["concurrency"] / a["concurrency"],
                                       "tok_s": b["tok_s"] / a["tok_s"]}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"\nfixed-rate token server, {args.interval_ms:g} ms per token, "
          f"{args.input_len} in / {args.output_len} out, {os.cpu_count()} CPUs, "
          f"{args.workers} workers, {args.server_procs} server process(es), "
          f"{'medians of ' + str(args.repeats) + ' runs, ' if args.repeats > 1 else ''}bstar on "
          f"{event_loop_name()}, load average "
          f"at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'client':7s} {'conc':>5s} {'tok/s':>9s} {'of min':>7s} {'ITL p50':>8s} "
          f"{'ITL p99':>8s} "
          f"{'added':>7s} {'vs min':>7s} {'srv p99':>8s} {'client':>7s} {'vs min':>7s} "
          f"{'CPU%':>6s} {'srv CPU%':>8s}")
    for r in rows:
        print(f"{r['client']:7s} {r['concurrency']:5d} {r['tok_s']:9.1f} "
              f"{100 * r['of_minimal_tok_s']:6.1f}% {r['itl_p50_ms']:8.2f} "
              f"{r['itl_p99_ms']:8.2f} {r['added_p99_ms']:+7.2f} "
              f"{r['vs_minimal_p99_ms']:+7.2f} {r['server_p99_ms']:8.2f} "
              f"{r['client_added_p99_ms']:+7.2f} {r['vs_minimal_paired_ms']:+7.2f} "
              f"{r['cpu_pct']:6.1f} {r['server_cpu_pct']:8.1f}")
    print("(srv p99: the server's own gaps between sends of the same chunks; client: ITL p99 "
          "over srv p99, the server's jitter cancelled; its vs min: over the minimal "
          "client's; srv CPU%: the token server's processes over the client's run)")
    for name, (title, _) in tests.items():
        print(f"\nhighest concurrency sustained {title}:")
        for client, r in result["sustained"][name].items():
            print(f"  {client:7s} " + (f"{r['concurrency']} streams, {r['tok_s']:.0f} tok/s"
                                       if r else "none of the levels"))
        ratio = result.get(f"ratio_{name}")
        if ratio:
            print(f"  bstar / aiperf: concurrency {ratio['concurrency']:.2f}x, "
                  f"tokens/s {ratio['tok_s']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
