"""Benchmark of `bstar simulate`'s capacity line and of one `bstar search` candidate (one
command: python bench/sim_capacity_bench.py).

The study of docs/simulate.md's speed section: 10,000 requests of 512 prompt + 512 output
tokens, Poisson 20 req/s, Llama-3-8B on an A100-80GB at vllm serve's defaults there
(max_num_seqs 256). Timed in this run, on this machine, medians of REPEAT:

- the study without its capacity line (`StudyOptions(capacity=False)`: the level alone);
- the same study with it (capacity by bisection, then the load at 90% of it): its ratio to
  the first is what the capacity line costs;
- `bstar simulate` itself in a fresh interpreter (imports and printing included), against
  the 2 s budget;
- one `bstar search` candidate (`search.evaluate`: capacity, then the SLO bisection below
  it), against the 1 s budget;
- the study of examples/traces/mooncake-sample.jsonl (300 requests of ~14k prompt tokens
  through the prefix cache), without and with its capacity line, once each (issue 29:
  "each bundled sample trace simulates offline in seconds").
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bstar.deployment import Deployment
from bstar.sim.metrics import parse_slo
from bstar.sim.study import StudyOptions, run_study
from bstar.sim.traffic import parse_lengths
from bstar.specs.gpu import get_gpu
from bstar.specs.presets import get_model
from sim_bench import timed

MOONCAKE = Path(__file__).resolve().parent.parent / "examples/traces/mooncake-sample.jsonl"
STUDY_BUDGET_S = 2.0
CANDIDATE_BUDGET_S = 1.0
REPEAT = 5
MODEL, GPU = "llama-3-8b", "a100-80gb-sxm"
OPTS = StudyOptions(rate=20.0, input_len="512", output_len="512", num_requests=10_000)
CLI = ["simulate", "--model", MODEL, "--gpu", GPU, "--rate", "20", "--input-len", "512",
       "--output-len", "512", "--num-requests", "10000"]


def median_s(fn: Callable[[], Any], repeat: int = REPEAT) -> tuple[float, Any]:
    """The median wall time of `repeat` calls and the last result (sim_bench's timer)."""
    return timed(fn, repeat)


def candidate() -> dict[str, Any]:
    """One search candidate as `bstar search` evaluates it: the default search traffic at
    4 req/s, the first unpruned replica of the grid."""
    from bstar.search.evaluate import Task, evaluate
    from bstar.search.run import plan_candidates
    from bstar.search.spec import SearchSpec, Traffic

    traffic = Traffic(4.0, parse_lengths("512"), parse_lengths("256"))
    spec = SearchSpec((MODEL,), (GPU,), traffic, parse_slo("ttft:2000,tpot:50"),
                      num_gpus=(1,), max_num_seqs=(64,))
    cands, pruned, _w, _unit = plan_candidates(spec)
    r = next(c.replica for c in cands if c.replica.key not in pruned)
    return evaluate(Task(r, spec.traffic, spec.slo, spec.rel_tol, spec.max_utilization))


def main() -> int:
    d = Deployment(model=get_model(MODEL), gpu=get_gpu(GPU))
    base_s, _ = median_s(lambda: run_study(d, StudyOptions(**{
        **{f: getattr(OPTS, f) for f in OPTS.__slots__}, "capacity": False})))
    with_s, study = median_s(lambda: run_study(d, OPTS))
    cap = study.capacities[0]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    cli_s, _ = median_s(lambda: subprocess.run([sys.executable, "-m", "bstar", *CLI],
                                               env=env, check=True, capture_output=True), 3)
    cand_s, row = median_s(candidate)
    print(f"simulate 10,000 requests x (512 + 512) tokens, Poisson 20/s, {MODEL} on {GPU}, "
          f"max_num_seqs 256; medians of {REPEAT} (the CLI: of 3)")
    print(f"  study without capacity: {base_s:.3f} s")
    print(f"  study with capacity:    {with_s:.3f} s  (ratio {with_s / base_s:.2f}; capacity "
          f"{cap['capacity_req_s']:.2f} req/s)")
    print(f"  bstar simulate (fresh process, with capacity): {cli_s:.3f} s  "
          f"({cli_s / STUDY_BUDGET_S:.2f} of the {STUDY_BUDGET_S:g} s budget)")
    print(f"  one search candidate (max_num_seqs 64): {cand_s:.3f} s  "
          f"({cand_s / CANDIDATE_BUDGET_S:.2f} of the {CANDIDATE_BUDGET_S:g} s budget; "
          f"{row.get('simulations', '?')} simulations)")
    trace = StudyOptions(trace=str(MOONCAKE))
    moon_base_s, _ = median_s(lambda: run_study(d, StudyOptions(trace=str(MOONCAKE),
                                                                capacity=False)), 1)
    moon_s, _ = median_s(lambda: run_study(d, trace), 1)
    print(f"  {MOONCAKE.name} (300 requests), one run each: without capacity "
          f"{moon_base_s:.3f} s, with capacity {moon_s:.3f} s (ratio "
          f"{moon_s / moon_base_s:.2f})")
    ok = cli_s <= STUDY_BUDGET_S and cand_s <= CANDIDATE_BUDGET_S
    print(f"  load average at the end: {os.getloadavg()[0]:.1f} ({os.cpu_count()} CPUs)")
    print("PASS" if ok else "OVER BUDGET")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
