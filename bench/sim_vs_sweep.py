"""Simulate what a measured sweep measured, level by level, and print the error per level.

    python bench/sim_vs_sweep.py SWEEP.json --model CONFIG_DIR --gpu GPU_FILE \
        [--profile PROFILE.toml] [--dtype fp32] [--max-num-seqs 8] [--max-num-batched-tokens N]

SWEEP.json is `bstar sweep ... --json`; its options give the lengths, the load (concurrency:
closed loop; rate: Poisson) and the requests per level. The server's own --max-num-seqs and
token budget are not in the sweep's output, so they are flags here. See docs/simulate.md,
"Checked against reality", for a run on this repository's CPU with vLLM and the tiny model.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bstar.commands.common import add_deployment_arguments, build_deployment
from bstar.engine_defaults import vllm_defaults
from bstar.sim import (
    ClosedLoop,
    Lengths,
    Poisson,
    SchedulerConfig,
    SimConfig,
    simulate_levels,
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sweep", help="bstar sweep --json output")
    p.add_argument("--max-num-seqs", type=int, required=True, help="the server's cap")
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    add_deployment_arguments(p)
    args = p.parse_args(argv)
    sweep = json.loads(Path(args.sweep).read_text())
    opt = sweep["options"]
    d = build_deployment(args)
    tokens = args.max_num_batched_tokens or vllm_defaults(d.gpu).max_num_batched_tokens
    cfg = SimConfig(SchedulerConfig(args.max_num_seqs, tokens))
    inp, out = Lengths.fixed(opt["input_len"]), Lengths.fixed(opt["output_len"])
    metrics = (("throughput_tok_s", None), ("tpot_ms", "mean"), ("ttft_ms", "p50"),
               ("ttft_ms", "p99"), ("e2e_ms", "p50"))
    head = "".join(f"{(k + ' ' + (q or '')).strip():>26}" for k, q in metrics)
    print(f"{'level':>8}{head}\n{'':>8}" + "      measured   sim   err" * len(metrics))
    errors: list[float] = []
    for lv in sweep["levels"]:
        if "concurrency" in lv and lv["concurrency"] is not None:
            load, name = ClosedLoop(int(lv["concurrency"])), f"c={lv['concurrency']}"
        else:
            load, name = Poisson(float(lv["rate"])), f"r={lv['rate']}"
        sim = simulate_levels(d, [args.max_num_seqs], load, inp, out, int(lv["requests"]),
                              seed=int(opt.get("seed") or 0), config=cfg)[0].to_dict()
        cells = []
        for k, q in metrics:
            m = lv[k] if q is None else lv[k][q]
            s = sim[k] if q is None else sim[k][q]
            err = (s / m - 1) * 100 if m else float("nan")
            errors.append(abs(err))
            cells.append(f"{m:>14.1f}{s:>6.0f}{err:>+5.0f}%")
        print(f"{name:>8}" + "".join(cells))
    errors.sort()
    print(f"median |error| over all cells: {errors[len(errors) // 2]:.0f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
