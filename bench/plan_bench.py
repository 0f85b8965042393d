"""Benchmark of the cost model and the CLI start-up (one command: python bench/plan_bench.py).

Prints medians and ratios measured in this run, since these machines are shared and noisy:
1. the full curve (batches 1..4096 at three contexts) in-library, against the 20 ms budget
   and against a per-batch scalar loop over the same model (what vectorizing buys);
2. `bstar --help` wall time against `python -c pass` on the same interpreter (budget 3x),
   measured as bench/startup.py measures it (which also times `bstar plan`).
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np

import startup  # bench/startup.py, beside this script
from bstar import roofline as rl
from bstar.deployment import Deployment
from bstar.specs.gpu import get_gpu
from bstar.specs.presets import get_model

CONTEXTS = (512, 2048, 8192)
BATCHES = np.arange(1, 4097)


def full_curve(d: Deployment) -> None:
    for ctx in CONTEXTS:
        rl.curve(d, BATCHES, ctx)
        rl.b_star(d, ctx)
        rl.compute_crossover(d, ctx)


def scalar_loop(d: Deployment) -> None:
    # One call per batch size: the cost of not vectorizing.
    for ctx in CONTEXTS:
        for b in BATCHES[::8]:  # every 8th batch, scaled up by 8 below
            rl.decode_step(d, [int(b)], ctx)


def median_s(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> int:
    d = Deployment(model=get_model("llama-3-8b"), gpu=get_gpu("a100-80gb-sxm"))
    full_curve(d)  # warm caches (catalog parsing, numpy first use)
    t_vec = median_s(lambda: full_curve(d), 30)
    t_loop = median_s(lambda: scalar_loop(d), 3) * 8
    print(f"full curve, {BATCHES.size} batches x {len(CONTEXTS)} contexts: "
          f"median {t_vec * 1e3:.2f} ms (budget 20 ms, ratio {t_vec / 0.020:.2f}); "
          f"scalar per-batch loop {t_loop * 1e3:.0f} ms, {t_loop / t_vec:.0f}x slower")

    # The same measurement as bench/startup.py (this checkout's CLI, interleaved runs).
    med = startup.measure(15)
    base, cli = med["python -c pass"][0], med["bstar --help"][0]
    ratio = cli / base
    print(f"start-up: python -c pass median {base * 1e3:.1f} ms, bstar --help median "
          f"{cli * 1e3:.1f} ms, ratio {ratio:.2f} (budget {startup.HELP_BUDGET:g}); "
          f"bstar plan ratio {med['bstar plan'][0] / base:.2f} (budget "
          f"{startup.PLAN_BUDGET:g}; python bench/startup.py)")
    ok = t_vec < 0.020 and ratio < startup.HELP_BUDGET
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
