"""Benchmark of `bstar simulate`'s capacity line, of one `bstar search` candidate and of
`bstar plan`'s start-up (one command: python bench/sim_capacity_bench.py; issue 41, item 5).

The study of docs/simulate.md's speed section: 10,000 requests of 512 prompt + 512 output
tokens, Poisson 20 req/s, Llama-3-8B on an A100-80GB at vllm serve's defaults there
(max_num_seqs 256). Timed in this run, on this machine, medians of REPEAT, wall and CPU
(the CPU time leaves out waiting for a core, which is most of what a shared machine adds):

- the study without its capacity line (`StudyOptions(capacity=False)`: the level alone):
  the in-run baseline the capacity figures are divided by;
- the same study with it (capacity by bisection, then the load at 90% of it): its ratio to
  the first is what the capacity line costs;
- `bstar simulate` itself in a fresh interpreter (imports and printing included), against
  the 2 s budget;
- one `bstar search` candidate (`search.evaluate`: capacity, then the SLO bisection below
  it), against the 1 s budget;
- the study of examples/traces/mooncake-sample.jsonl (300 requests of ~14k prompt tokens
  through the prefix cache), without and with its capacity line (MOON_REPEAT each), the
  second against the 2 s budget (issue 29: "each bundled sample trace simulates offline in
  seconds");
- whole-process `bstar plan` against `python -c 'import numpy'` (bench/startup.py's
  interleaved runs), against 2x.

The budgets are for a quiet machine: on a loaded one read the ratios (each figure against
its baseline in this run) and the CPU medians, and the load average printed at the end.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bstar.deployment import Deployment
from bstar.sim.metrics import parse_slo
from bstar.sim.study import StudyOptions, run_study
from bstar.sim.traffic import parse_lengths
from bstar.specs.gpu import get_gpu
from bstar.specs.presets import get_model
from startup import PLAN_NUMPY_BUDGET
from startup import measure as startup_medians

MOONCAKE = Path(__file__).resolve().parent.parent / "examples/traces/mooncake-sample.jsonl"
STUDY_BUDGET_S = 2.0
CANDIDATE_BUDGET_S = 1.0
REPEAT = 5
MOON_REPEAT = 3
PLAN_RUNS = 9
MODEL, GPU = "llama-3-8b", "a100-80gb-sxm"
OPTS = StudyOptions(rate=20.0, input_len="512", output_len="512", num_requests=10_000)
CLI = ["simulate", "--model", MODEL, "--gpu", GPU, "--rate", "20", "--input-len", "512",
       "--output-len", "512", "--num-requests", "10000"]


def median_s(fn: Callable[[], Any], repeat: int = REPEAT) -> tuple[float, float, Any]:
    """Median wall and CPU seconds (this process's) of `repeat` calls, and the last result."""
    walls, cpus, out = [], [], None
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return statistics.median(walls), statistics.median(cpus), out


def child_median_s(cmd: list[str], env: dict[str, str], repeat: int) -> tuple[float, float]:
    """Median wall and CPU seconds (user + system of the child) of `repeat` runs of `cmd`."""
    import resource

    walls, cpus = [], []
    for _ in range(repeat):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(cmd, env=env, check=True, capture_output=True)
        walls.append(time.perf_counter() - t0)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
    return statistics.median(walls), statistics.median(cpus)


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
    base_s, base_c, _ = median_s(lambda: run_study(d, StudyOptions(**{
        **{f: getattr(OPTS, f) for f in OPTS.__slots__}, "capacity": False})))
    with_s, with_c, study = median_s(lambda: run_study(d, OPTS))
    cap = study.capacities[0]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    cli_s, cli_c = child_median_s([sys.executable, "-m", "bstar", *CLI], env, 3)
    cand_s, cand_c, row = median_s(candidate)
    print(f"simulate 10,000 requests x (512 + 512) tokens, Poisson 20/s, {MODEL} on {GPU}, "
          f"max_num_seqs 256; medians of {REPEAT} (the CLI: of 3), wall (CPU)")
    print(f"  study without capacity (the baseline): {base_s:.3f} s ({base_c:.3f} s)")
    print(f"  study with capacity:    {with_s:.3f} s ({with_c:.3f} s)  (ratio {with_s / base_s:.2f}"
          f"; capacity {cap['capacity_req_s']:.2f} req/s)")
    print(f"  bstar simulate (fresh process, with capacity): {cli_s:.3f} s ({cli_c:.3f} s)  "
          f"({cli_s / STUDY_BUDGET_S:.2f} of the {STUDY_BUDGET_S:g} s budget; "
          f"{cli_s / base_s:.2f} x the baseline)")
    print(f"  one search candidate (max_num_seqs 64): {cand_s:.3f} s ({cand_c:.3f} s)  "
          f"({cand_s / CANDIDATE_BUDGET_S:.2f} of the {CANDIDATE_BUDGET_S:g} s budget; "
          f"{cand_s / base_s:.2f} x the baseline; {row.get('simulations', '?')} simulations)")
    moon_base_s, moon_base_c, _ = median_s(
        lambda: run_study(d, StudyOptions(trace=str(MOONCAKE), capacity=False)), MOON_REPEAT)
    moon_s, moon_c, _ = median_s(lambda: run_study(d, StudyOptions(trace=str(MOONCAKE))),
                                 MOON_REPEAT)
    print(f"  {MOONCAKE.name} (300 requests), medians of {MOON_REPEAT}: without capacity "
          f"{moon_base_s:.3f} s ({moon_base_c:.3f} s), with capacity {moon_s:.3f} s "
          f"({moon_c:.3f} s)  (ratio {moon_s / moon_base_s:.2f}; "
          f"{moon_s / STUDY_BUDGET_S:.2f} of the {STUDY_BUDGET_S:g} s budget; "
          f"{moon_s / base_s:.2f} x the baseline)")
    med = startup_medians(PLAN_RUNS)
    plan_ratio = med["bstar plan"][0] / med["import numpy"][0]
    print(f"  bstar plan {med['bstar plan'][0] * 1e3:.0f} ms ({med['bstar plan'][1] * 1e3:.0f}"
          f" ms) against python -c 'import numpy' {med['import numpy'][0] * 1e3:.0f} ms "
          f"({med['import numpy'][1] * 1e3:.0f} ms), medians of {PLAN_RUNS} interleaved: "
          f"ratio {plan_ratio:.2f} (CPU {med['bstar plan'][1] / med['import numpy'][1]:.2f}; "
          f"budget {PLAN_NUMPY_BUDGET:g})")
    ok = (cli_s <= STUDY_BUDGET_S and cand_s <= CANDIDATE_BUDGET_S
          and moon_s <= STUDY_BUDGET_S and plan_ratio <= PLAN_NUMPY_BUDGET)
    print(f"  load average at the end: {os.getloadavg()[0]:.1f} ({os.cpu_count()} CPUs)")
    print("PASS" if ok else "OVER BUDGET")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
