"""Time per request of the simulator's prefix-cache and speculative paths beside the plain
path, measured in one run (one command: python bench/sim_paths_bench.py; issue 40, "Scale").

`bstar simulate` as the library runs it (`run_study`, the capacity line included),
Llama-3-8B on an A100-80GB at vllm serve's defaults there, medians of REPEAT:

- prefix cache: a trace (bstar's JSON lines) of NUM_TRACE requests (Poisson 2/s, prompts of
  200-2,000 tokens, outputs of 16-256, seeded), every request its own chain of hash ids
  (no two share a block: the cache finds nothing, so its whole cost is bookkeeping), against
  the same trace without hash ids (the plain path: no prompt identity, no cache). Goal:
  at most 2x the plain path;
- speculative: `--rate 1 --num-requests 20` with `--num-speculative-tokens 4` (EAGLE head,
  acceptance 0.7, the CLI's defaults), against the same study without speculation. Goal:
  at most 3x the plain path.

Both traces are written to a temporary directory. Timings on a shared machine move with its
load: the ratios (both sides measured in this run, interleaved) are the figures to quote;
the load average is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bstar.deployment import Deployment
from bstar.sim.speculative import SpecSim
from bstar.sim.study import StudyOptions, run_study
from bstar.specdec import SpecConfig, make_drafter
from bstar.specs.gpu import get_gpu
from bstar.specs.presets import get_model

MODEL, GPU = "llama-3-8b", "a100-80gb-sxm"
NUM_TRACE = 100_000
NUM_SPEC = 20
PREFIX_GOAL, SPEC_GOAL = 2.0, 3.0
HASH_BLOCK_TOKENS = 512  # Mooncake's (bstar.sim.trace_formats)
RATE_REQ_S = 2.0  # a light load (capacity ~9 req/s): 100,000 requests in 14 simulated hours


def write_traces(folder: Path, n: int, seed: int = 0) -> tuple[Path, Path]:
    """(trace with a distinct hash chain per request, the same trace without hash ids)."""
    rng = random.Random(seed)
    hashed, plain = folder / "hashed.jsonl", folder / "plain.jsonl"
    with hashed.open("w") as fh, plain.open("w") as fp:
        t, next_id = 0.0, 0
        for _ in range(n):
            t += rng.expovariate(RATE_REQ_S)
            p, o = rng.randint(200, 2000), rng.randint(16, 256)
            blocks = -(-p // HASH_BLOCK_TOKENS)
            row = {"arrival_s": round(t, 3), "prompt_tokens": p, "output_tokens": o}
            fh.write(json.dumps({**row, "hash_ids": list(range(next_id, next_id + blocks))})
                     + "\n")
            fp.write(json.dumps(row) + "\n")
            next_id += blocks
    return hashed, plain


def medians(fns: dict[str, Callable[[], Any]], repeat: int) -> dict[str, float]:
    """Median wall time of each function, the functions interleaved in each round (so a
    change in the machine's load falls on both sides of a ratio alike)."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeat):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--num-requests", type=int, default=NUM_TRACE,
                    help="requests in the prefix-cache traces (default %(default)s)")
    ap.add_argument("--repeat", type=int, default=3, help="rounds (default %(default)s)")
    ap.add_argument("--spec-repeat", type=int, default=5,
                    help="rounds of the speculative pair (default %(default)s)")
    args = ap.parse_args(argv)
    d = Deployment(model=get_model(MODEL), gpu=get_gpu(GPU))
    print(f"{MODEL} on {GPU}, vllm serve's defaults; run_study with the capacity line; "
          f"medians of {args.repeat} (speculative: {args.spec_repeat}), interleaved")
    with tempfile.TemporaryDirectory() as tmp:
        hashed, plain = write_traces(Path(tmp), args.num_requests)
        t = medians({"plain": lambda: run_study(d, StudyOptions(trace=str(plain))),
                     "prefix": lambda: run_study(d, StudyOptions(trace=str(hashed)))},
                    args.repeat)
    n = args.num_requests
    r_prefix = t["prefix"] / t["plain"]
    print(f"  prefix cache, {n:,} requests, {n:,} distinct hash chains: "
          f"{t['prefix']:.2f} s ({t['prefix'] / n * 1e6:.0f} us/request); plain path "
          f"(no hash ids) {t['plain']:.2f} s ({t['plain'] / n * 1e6:.0f} us/request); "
          f"ratio {r_prefix:.2f} (goal <= {PREFIX_GOAL:g})")
    spec = SpecSim(SpecConfig(4, 0.7, "auto"), make_drafter(d, "auto"))
    base = StudyOptions(rate=1.0, num_requests=NUM_SPEC)
    s = medians({"plain": lambda: run_study(d, base),
                 "spec": lambda: run_study(d, StudyOptions(rate=1.0, num_requests=NUM_SPEC,
                                                           speculative=spec))},
                args.spec_repeat)
    r_spec = s["spec"] / s["plain"]
    print(f"  speculative (K 4, EAGLE, a 0.7), --rate 1 --num-requests {NUM_SPEC} with its "
          f"capacity line: {s['spec']:.3f} s ({s['spec'] / NUM_SPEC * 1e3:.1f} ms/request); "
          f"plain {s['plain']:.3f} s ({s['plain'] / NUM_SPEC * 1e3:.1f} ms/request); ratio "
          f"{r_spec:.2f} (goal <= {SPEC_GOAL:g})")
    print(f"  load average at the end: {os.getloadavg()[0]:.1f} ({os.cpu_count()} CPUs)")
    ok = r_prefix <= PREFIX_GOAL and r_spec <= SPEC_GOAL
    print("PASS" if ok else "OVER GOAL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
