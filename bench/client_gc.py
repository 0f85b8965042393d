"""Does freezing the collector before a level (bstar.loadgen.worker.steady_gc) keep its
pauses out of the measured gaps?

One command:  python bench/client_gc.py [--streams 256] [--repeats 3]

Against the fixed-rate token server (bench/token_server.py, send times recorded), bstar's
client runs the same level with the collector as Python leaves it ("on") and frozen before
the level ("frozen", what the sweep's runner and load workers do), interleaved with the
minimal client, `--repeats` times. Per run it prints what the client adds to ITL p99 over
the server's own gaps of the same chunks (bench/client_bench.py's paired measure) and the
longest collector pause (gc.callbacks) inside the level; then the medians per mode.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))

import client_bench as cb  # noqa: E402
from bstar.loadgen.worker import steady_gc  # noqa: E402
from bstar.servers import ManagedServer, free_port  # noqa: E402

WINDOW = [0.0, float("inf")]  # the measured level: pauses before it (the freeze's own
                              # collection) and after it (the thaw's) are not the level's


@contextlib.contextmanager
def as_python_leaves_it() -> Iterator[None]:
    WINDOW[:] = [time.perf_counter(), float("inf")]
    yield
    WINDOW[1] = time.perf_counter()


@contextlib.contextmanager
def frozen() -> Iterator[None]:
    with steady_gc():
        WINDOW[:] = [time.perf_counter(), float("inf")]
        yield
        WINDOW[1] = time.perf_counter()


MODES = {"on": as_python_leaves_it, "frozen": frozen}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3, help="requests per stream")
    args = ap.parse_args(argv)
    n = args.streams
    pauses: list[float] = []
    started: list[float] = []

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[:] = [time.perf_counter()]
        elif started and WINDOW[0] <= started[0] <= WINDOW[1]:
            pauses.append((time.perf_counter() - started[0]) * 1e3)

    stamps = Path(tempfile.mkdtemp(prefix="bstar-stamps-"))
    port = free_port()
    server = ManagedServer([sys.executable, str(HERE / "token_server.py"), "--port", str(port),
                            "--stamp-dir", str(stamps)],
                           health_url=f"http://127.0.0.1:{port}/health", timeout_s=30)
    added: dict[str, list[float]] = {m: [] for m in (*MODES, "minimal")}
    worst: dict[str, list[float]] = {m: [] for m in MODES}
    server.start()
    gc.callbacks.append(on_gc)
    try:
        for rep in range(args.repeats):
            for mode, guard in MODES.items():
                cb.steady_gc = guard  # what run_bstar wraps its measured level in
                pauses.clear()
                s = cb.run_loop(cb.run_bstar(server.url, n, n * args.rounds, 64, 64, 20.0))
                p = cb.paired(s.pop("gaps"), cb.read_stamps(stamps))
                added[mode].append(p["client_added_p99_ms"])
                worst[mode].append(max(pauses, default=0.0))
                print(f"{rep} {mode:7s} client adds {p['client_added_p99_ms']:+6.2f} ms to ITL "
                      f"p99, longest collector pause {worst[mode][-1]:5.1f} ms "
                      f"({len(pauses)} collections), {s['tok_s']:.0f} tok/s", flush=True)
            m = asyncio.run(cb.run_minimal(server.url, n, n * args.rounds, 64, 64, 20.0))
            pm = cb.paired(m.pop("gaps"), cb.read_stamps(stamps))
            added["minimal"].append(pm["client_added_p99_ms"])
            print(f"{rep} minimal client adds {pm['client_added_p99_ms']:+6.2f} ms", flush=True)
    finally:
        gc.callbacks.remove(on_gc)
        server.stop()
    print(f"\n{n} streams, medians of {args.repeats} interleaved runs:")
    for mode in MODES:
        print(f"  bstar, collector {mode:7s} adds {statistics.median(added[mode]):+6.2f} ms "
              f"to ITL p99; longest pause {statistics.median(worst[mode]):5.1f} ms")
    print(f"  minimal client          adds {statistics.median(added['minimal']):+6.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
