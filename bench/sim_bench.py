"""Benchmark of the simulator (one command: python bench/sim_bench.py).

10,000 requests of 512 prompt + 512 output tokens (5.12 M generated tokens), Llama-3-8B on an
A100-80GB with vllm serve's defaults there (max_num_seqs 256, max_num_batched_tokens 2048):

- loaded: Poisson 20 req/s, past the server's capacity: the batch stays full, a request
  finishes every couple of steps, so few steps can be jumped;
- light: Poisson 2 req/s, a batch of ~20: most steps are pure decode between arrivals, which
  the engine jumps over many at a time.

Prints the median of several runs, its ratio to the 5 s budget, and its ratio to a baseline
measured in this run on this machine: calling `roofline.decode_step` once per simulated step
(the bare cost model, no scheduling at all) for as many steps as the simulation took.
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np

from bstar import roofline as rl
from bstar.deployment import Deployment
from bstar.sim import Lengths, Poisson, SchedulerConfig, SimConfig, make_workload, simulate
from bstar.specs.gpu import get_gpu
from bstar.specs.presets import get_model

BUDGET_S = 5.0
NUM_REQUESTS = 10_000
REPEAT = 3


def timed(fn, repeat: int) -> tuple[float, object]:  # type: ignore[no-untyped-def]
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> int:
    d = Deployment(model=get_model("llama-3-8b"), gpu=get_gpu("a100-80gb-sxm"))
    cfg = SimConfig(SchedulerConfig(256, 2048))
    ok = True
    print(f"simulate {NUM_REQUESTS:,} requests x 512 output tokens; median of {REPEAT} runs; "
          f"budget {BUDGET_S:g} s")
    for name, rate in (("loaded", 20.0), ("light", 2.0)):
        w = make_workload(Poisson(rate), Lengths.fixed(512), Lengths.fixed(512), NUM_REQUESTS,
                          np.random.default_rng(0))
        sim_s, run = timed(lambda w=w: simulate(d, cfg, w), REPEAT)
        steps = run.num_steps  # type: ignore[attr-defined]
        tokens = int(run.requests.num_generated.sum())  # type: ignore[attr-defined]
        assert tokens == NUM_REQUESTS * 512
        # Baseline: the bare roofline call per step, at this run's mean batch and context.
        batch = max(1, round(tokens / steps))
        sample = min(steps, 5000)
        base_sample_s, _ = timed(
            lambda b=batch, n=sample: [rl.decode_step(d, [b], 768) for _ in range(n)], 1)
        base_s = base_sample_s * steps / sample
        ok &= sim_s < BUDGET_S
        print(f"  {name:<6} Poisson {rate:g}/s: {sim_s:.3f} s  ({sim_s / BUDGET_S:.2f} of "
              f"budget)  {steps:,} steps, mean batch {batch}; baseline decode_step x {steps:,}"
              f" = {base_s:.3f} s  (simulation / baseline = {sim_s / base_s:.2f})")
    print("PASS" if ok else "FAIL: over budget")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
