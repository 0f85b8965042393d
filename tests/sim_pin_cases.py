"""Small fixed simulations whose every output `tests/test_sim_pin.py` holds to the values the
simulator gave before its speed work (issue 41, item 5): a speed-up must not move a number.

`python tests/sim_pin_cases.py --write` records them in tests/data/sim_pin.json with the
commit they came from; the test runs the same cases with the code in the tree and compares
(exact for counts, a relative 1e-12 for times: float noise, not a change of rule). Rewrite
the file only for a change meant to move results, and say so in its commit.

The cases cover the engine's paths: open and closed loops with the multi-step jump, chunked
prefill, preemption by recompute and by swap, the prefix cache (the first requests of the
bundled Mooncake sample, with a pool small enough to evict), a windowed model, MoE under
tensor parallelism, speculative decoding, and the capacity bisection `bstar simulate` and
`bstar search` run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
PIN = ROOT / "tests" / "data" / "sim_pin.json"
MOONCAKE = ROOT / "examples" / "traces" / "mooncake-sample.jsonl"


def _run_digest(run: Any) -> dict[str, Any]:
    """Everything a run reports, per request and in its summary (NaN as None)."""
    from bstar.sim import summarize

    r = run.requests

    def floats(a: Any) -> list[float | None]:
        return [None if np.isnan(x) else float(x) for x in np.asarray(a, dtype=np.float64)]

    w = np.asarray(run.itl_weights, dtype=np.int64)
    v = np.asarray(run.itl_values_s, dtype=np.float64)
    return {"duration_s": float(run.duration_s), "num_steps": int(run.num_steps),
            "num_preemptions": int(run.num_preemptions), "stop_reason": run.stop_reason,
            "truncated": bool(run.truncated), "num_blocks": int(run.num_blocks),
            "prefix": [run.prefix_hit_tokens, run.prefix_query_tokens],
            "first_token_s": floats(r.first_token_s), "finish_s": floats(r.finish_s),
            "num_generated": r.num_generated.tolist(),
            "request_preemptions": r.num_preemptions.tolist(),
            "itl_tokens": int(w.sum()), "itl_weighted_sum_s": float((v * w).sum()),
            "summary": json.loads(json.dumps(summarize(run).to_dict(), default=str))}


def _dep(model: str = "llama-3-8b", gpu: str = "a100-80gb-sxm", **kw: Any) -> Any:
    from bstar.deployment import Deployment
    from bstar.specs.gpu import get_gpu
    from bstar.specs.presets import get_model

    return Deployment(model=get_model(model), gpu=get_gpu(gpu), **kw)


def _workload(arrivals: Any, n: int, inp: str, out: str, seed: int = 1) -> Any:
    from bstar.sim import make_workload, parse_lengths

    return make_workload(arrivals, parse_lengths(inp), parse_lengths(out), n,
                         np.random.default_rng(seed))


def _sim(d: Any, w: Any, max_num_seqs: int, budget: int = 2048, **kw: Any) -> dict[str, Any]:
    from bstar.sim import SchedulerConfig, SimConfig, simulate

    pre = kw.pop("preemption", "recompute")
    return _run_digest(simulate(d, SimConfig(SchedulerConfig(max_num_seqs, budget, pre), **kw),
                                w))


def _mooncake(n: int) -> Any:
    from bstar.sim import parse_trace

    lines = MOONCAKE.read_text().splitlines()[:n]
    return parse_trace("\n".join(lines) + "\n")


def case_poisson() -> dict[str, Any]:
    from bstar.sim import Poisson

    return _sim(_dep(), _workload(Poisson(12.0), 250, "uniform:16:1500", "uniform:1:300"), 48,
                512)


def case_closed_loop() -> dict[str, Any]:
    from bstar.sim import ClosedLoop

    return _sim(_dep(), _workload(ClosedLoop(24, 0.5, random_think=True), 150, "512", "128"),
                16)


def case_recompute() -> dict[str, Any]:
    from bstar.sim import Poisson

    return _sim(_dep(gpu_util=0.235), _workload(Poisson(40.0), 150, "uniform:16:700",
                                                "uniform:1:300"), 64, 1024)


def case_swap() -> dict[str, Any]:
    from bstar.sim import Poisson

    return _sim(_dep(gpu_util=0.235), _workload(Poisson(40.0), 150, "uniform:16:700",
                                                "uniform:1:300"), 64, 1024, preemption="swap")


def case_prefix_cache() -> dict[str, Any]:
    trace = _mooncake(60)
    w = _workload(trace, 60, "512", "256")
    return _sim(_dep(gpu_util=0.36), w, 32)


def case_windowed() -> dict[str, Any]:
    from bstar.sim import Poisson

    return _sim(_dep("gemma-2-9b"), _workload(Poisson(8.0), 120, "uniform:16:6000", "64"), 32)


def case_moe_tp() -> dict[str, Any]:
    from bstar.sim import Poisson

    return _sim(_dep("mixtral-8x7b", "h100-sxm", num_gpus=2),
                _workload(Poisson(6.0), 120, "uniform:64:2000", "uniform:8:200"), 32)


def case_speculative() -> dict[str, Any]:
    from bstar import specdec as sd
    from bstar.sim import Poisson
    from bstar.sim.speculative import SpecSim

    d = _dep(gpu="h100-sxm")
    spec = SpecSim(sd.SpecConfig(3, 0.7, "eagle"), sd.make_drafter(d, "eagle"))
    return _sim(d, _workload(Poisson(10.0), 80, "uniform:16:600", "uniform:8:128"), 16,
                speculative=spec)


def case_capacity() -> dict[str, Any]:
    from bstar.sim import Poisson, SchedulerConfig, SimConfig
    from bstar.sim.capacity import capacity

    d = _dep()
    unit = _workload(Poisson(1.0), 400, "uniform:64:1024", "uniform:16:256", seed=0)
    cap, run = capacity(d, SimConfig(SchedulerConfig(16, 2048)), unit)
    return {"capacity": cap.to_dict(), "run": _run_digest(run)}


def case_capacity_prefix() -> dict[str, Any]:
    from bstar.sim import Poisson, SchedulerConfig, SimConfig
    from bstar.sim.capacity import capacity
    from bstar.sim.prefix import PromptShape, shape_workload

    unit = shape_workload(_workload(Poisson(1.0), 400, "uniform:64:1500", "uniform:8:96",
                                    seed=2), PromptShape(512, 3, multi_turn=3))
    cap, run = capacity(_dep(gpu_util=0.235), SimConfig(SchedulerConfig(16, 2048)), unit)
    return {"capacity": cap.to_dict(), "run": _run_digest(run)}


CASES: dict[str, Callable[[], dict[str, Any]]] = {
    name.removeprefix("case_"): fn for name, fn in list(globals().items())
    if name.startswith("case_") and callable(fn)}


def main() -> int:
    if sys.argv[1:] != ["--write"]:
        print("usage: python tests/sim_pin_cases.py --write", file=sys.stderr)
        return 2
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "src"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.strip()
    out = {"commit": commit + ("+dirty src" if dirty else ""),
           "cases": {name: fn() for name, fn in CASES.items()}}
    PIN.write_text(json.dumps(out, indent=0, sort_keys=True) + "\n")
    print(f"wrote {PIN} ({len(out['cases'])} cases, from {out['commit']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
