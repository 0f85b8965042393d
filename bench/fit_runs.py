"""Fit the engine profiles' MoE and request terms to closed-loop runs (data/inferencemax/).

    python bench/fit_runs.py [data/inferencemax/runs.csv] [--engine NAME]

Per engine of the table (vllm, sglang, trt-llm), `bstar.validate_stages.fit_stages` fits, from
the bundled profile, the terms of FIT[engine] to the runs' measured TPOT, TTFT and E2E means
(every run simulated like for like, as `bstar validate` does: bstar.validate_runs), and prints
the fitted values with the medians of |predicted / measured - 1| before and after. The values
go into src/bstar/presets/engines.toml with this command as their source. One set per engine,
fitted over all its models and TP sizes: no per-model constant.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from bstar.deployment import Efficiency, EngineBehaviour  # noqa: E402
from bstar.engines import get_engine  # noqa: E402
from bstar.runs_table import load_runs  # noqa: E402
from bstar.validate_stages import evaluate, fit_stages  # noqa: E402

# The MoE terms (docs/cost-model.md, "2026 models") everywhere. vLLM: also the eager floor
# (its piecewise graphs stop at 512 tokens) and the all-reduce latency (TP 1, 2, 4 and 8 of
# one model pin it; the H100 stages could not). The engines never fitted on real load before
# (sglang, trt-llm) also fit their CPU time per step and per request; their prompt steps run
# outside graphs too, but under kernels longer than any launch floor: the runs cannot pin it.
FIT = {"vllm": ("moe_compute", "moe_layer_s", "eager_layer_s", "allreduce_latency_s"),
       "sglang": ("moe_compute", "moe_layer_s", "overhead_s", "request_overhead_s"),
       "trt-llm": ("moe_compute", "moe_layer_s", "overhead_s", "request_overhead_s")}

# The eager floor is a max against the kernels: fitted from 0 it has no slope. It starts at
# a launch-bound layer's time instead: ~25 kernels (norms, GEMMs, rope, the KV write,
# attention, the fused-MoE kernels, all-reduces) at ~4 us of CPU each.
EAGER_PRIOR_S = 100e-6


def _medians(runs: list, eff: Efficiency, beh: EngineBehaviour) -> dict[str, float]:
    scores, _ = evaluate(runs, eff, behaviour=beh)
    return {k: float(np.median([abs(s.errors[k]) for s in scores if k in s.errors]))
            for k in ("tpot_mean_ms", "ttft_mean_ms", "e2e_mean_ms")}


def main(argv: list[str]) -> int:
    only = None
    if "--engine" in argv:
        i = argv.index("--engine")
        only = argv[i + 1]
        argv = argv[:i] + argv[i + 2:]
    path = argv[0] if argv else str(ROOT / "data" / "inferencemax" / "runs.csv")
    by_engine: dict[str, list] = defaultdict(list)
    for r in load_runs(path):
        if not r.dp_attention and only in (None, r.engine):
            by_engine[r.engine].append(r)
    for eng, runs in sorted(by_engine.items()):
        prof, beh = get_engine(eng).efficiency(), get_engine(eng).behaviour()
        fit = FIT.get(eng, FIT["vllm"])
        start = replace(prof, moe_compute=1.0, moe_layer_s=0.0,
                        eager_layer_s=EAGER_PRIOR_S if "eager_layer_s" in fit else 0.0)
        before = _medians(runs, start, beh)
        got = fit_stages(runs, start, fit, iterations=4, behaviour=beh)
        if got is None:
            print(f"{eng}: the runs cannot determine {', '.join(fit)}")
            continue
        e, b = got
        after = _medians(runs, e, b)
        print(f"{eng} ({len(runs)} runs): " + ", ".join(
            f"{k} = {getattr(e, k) if hasattr(e, k) else getattr(b, k):.4g}" for k in fit))
        for name, m in (("before", before), ("after", after)):
            print(f"  {name}: median |error| " + ", ".join(
                f"{k.split('_')[0].upper()} {v:.1%}" for k, v in m.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
