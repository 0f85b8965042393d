"""vLLM's prompt time that tensor parallelism does not divide: how much each vLLM data set,
fitted alone, puts in the API server's front end.

    python bench/front_end_split.py      # ~10 minutes on one core

The `vllm` profile prices that time in two places, fitted to both data sets at once by
`python bench/fit_runs.py --engine vllm`: in the step (`prompt_token_s`: every running
request waits for it, so it adds to TPOT as well as TTFT) and in the API server, which
tokenizes each prompt on a single-thread executor before the engine sees the request
(`EngineBehaviour.front_token_s`: first come, first served, TTFT and E2E only). This prints
the bundled profile's medians on both sets, then each set's own fit from the profile
(`bstar.validate_stages.fit_stages`, like for like):

1. the InferenceMAX gpt-oss-120b vLLM runs (data/inferencemax/runs.csv): the MoE, all-reduce
   and both prompt-time terms, and the stages' medians at that fit;
2. the H100 load stages (data/vllm-h100/stages.csv): their own terms (kv_bandwidth,
   overhead_s, request_overhead_s) and the front end's time per prompt token, and the
   runs' medians at that fit.

Medians of |predicted / measured - 1| over the runs (TPOT, TTFT, E2E means) and over the
stages' steady ones (docs/cost-model.md, "2026 models").
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from bstar.deployment import Efficiency, EngineBehaviour  # noqa: E402
from bstar.engines import get_engine  # noqa: E402
from bstar.runs_table import load_runs  # noqa: E402
from bstar.stages_table import load_stages  # noqa: E402
from bstar.validate_stages import fit_stages  # noqa: E402
from fit_runs import FIT, _medians  # noqa: E402  (bench/, the script's own folder)

# The runs' own terms and the stages' own terms of the joint fit, without front_token_s.
RUN_FIT = tuple(k for k in FIT["vllm"][:5] if k != "front_token_s")
STAGE_FIT = FIT["vllm"][5:]


def medians(items: list, eff: Efficiency, beh: EngineBehaviour) -> str:
    return ", ".join(f"{k.split('_')[0].upper()} {v:.1%}"
                     for k, v in _medians(items, eff, beh).items())


def values(eff: Efficiency, beh: EngineBehaviour, keys: tuple[str, ...]) -> str:
    return ", ".join(f"{k} {getattr(eff if hasattr(eff, k) else beh, k):.4g}" for k in keys)


def main() -> int:
    vllm = get_engine("vllm")
    eff, beh = vllm.efficiency(), vllm.behaviour()
    runs = [r for r in load_runs(ROOT / "data" / "inferencemax" / "runs.csv")
            if r.engine == "vllm"]
    stages = load_stages(ROOT / "data" / "vllm-h100" / "stages.csv")
    print(f"profile: {values(eff, beh, (*RUN_FIT, 'front_token_s', *STAGE_FIT))}")
    print(f"  runs:   {medians(runs, eff, beh)}")
    print(f"  stages: {medians(stages, eff, beh)}")

    got = fit_stages(runs, eff, (*RUN_FIT, "front_token_s"), iterations=4, behaviour=beh)
    assert got is not None
    e1, b1 = got
    print(f"1. runs alone: {values(e1, b1, (*RUN_FIT, 'front_token_s'))}")
    print(f"  runs:   {medians(runs, e1, b1)}")
    print(f"  stages: {medians(stages, e1, b1)}")

    got = fit_stages(stages, eff, (*STAGE_FIT, "front_token_s"), behaviour=beh)
    assert got is not None
    e2, b2 = got
    print(f"2. stages alone: {values(e2, b2, (*STAGE_FIT, 'front_token_s'))}")
    print(f"  stages: {medians(stages, e2, b2)}")
    print(f"  runs:   {medians(runs, e2, b2)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
