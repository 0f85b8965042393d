"""TTFT and TPOT under Poisson load: `bstar simulate` against a measured rate sweep.

    python bench/ttft_vs_vllm.py RATE_SWEEP.json --model CONFIG --gpu GPU_FILE \
        --profile PROFILE.toml --dtype fp32 --kv-dtype fp32 \
        --max-num-seqs 16 --max-num-batched-tokens 512 [--sim-requests 2000]

RATE_SWEEP.json is `bstar sweep --rate R1,R2,... --json` against the engine; the profile
is `bstar calibrate` on decode levels of the same server (and optionally its mixed steps,
bench/mixed_steps.py). Per level it simulates the same Poisson rate, lengths and scheduler
settings (chunked prefill with the given token budget) and prints TTFT p50/p99 and TPOT
p50/p99, measured vs simulated, with the relative error, and the median |error| per metric.

The simulator's TTFT starts when the engine sees the request; the measured one also
carries the HTTP and API-process time of one request. `--ttft-offset-ms` adds a measured
figure for it (bench/mixed_steps.py prints one: "network + API per request"). The sweep's
levels run few requests, so their p99 is close to their maximum; the simulation runs
`--sim-requests` requests per level (default: the level's own count, same seed) and its
percentiles are the model's. docs/simulate.md has a run on this repository's CPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from bstar.commands.common import add_deployment_arguments, build_deployment
from bstar.sim import Lengths, Poisson, SchedulerConfig, SimConfig, simulate_levels

METRICS = (("ttft_ms", "p50"), ("ttft_ms", "p99"), ("tpot_ms", "p50"), ("tpot_ms", "p99"))


def compare(sweep: dict, d: object, max_num_seqs: int, max_num_batched_tokens: int,
            sim_requests: int | None = None, ttft_offset_ms: float = 0.0,
            seed: int | None = None) -> list[dict]:
    """Per rate level: {"rate", "measured": {metric: v}, "simulated": {...}, "error": {...}}
    with metric keys like "ttft_ms_p50"."""
    opt = sweep["options"]
    cfg = SimConfig(SchedulerConfig(max_num_seqs, max_num_batched_tokens))
    inp, out = Lengths.fixed(int(opt["input_len"])), Lengths.fixed(int(opt["output_len"]))
    rows = []
    for lv in sweep["levels"]:
        if lv.get("rate") is None:
            continue
        n = sim_requests or int(lv["requests"])
        s = seed if seed is not None else int(opt.get("seed") or 0)
        sim = simulate_levels(d, [max_num_seqs], Poisson(float(lv["rate"])), inp, out, n,
                              seed=s, config=cfg)[0].to_dict()  # type: ignore[arg-type]
        row: dict = {"rate": float(lv["rate"]), "requests": int(lv["requests"]),
                     "measured": {}, "simulated": {}, "error": {}}
        for k, q in METRICS:
            key = f"{k}_{q}"
            m = lv[k][q]
            v = sim[k][q] + (ttft_offset_ms if k == "ttft_ms" else 0.0)
            row["measured"][key], row["simulated"][key] = m, v
            row["error"][key] = v / m - 1 if m else float("nan")
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sweep", help="bstar sweep --rate ... --json output")
    p.add_argument("--max-num-seqs", type=int, required=True, help="the server's cap")
    p.add_argument("--max-num-batched-tokens", type=int, required=True,
                   help="the server's token budget per step")
    p.add_argument("--sim-requests", type=int, default=None,
                   help="requests per simulated level (default: the level's own count)")
    p.add_argument("--ttft-offset-ms", type=float, default=0.0,
                   help="network + API time per request, added to the simulated TTFT")
    p.add_argument("--seed", type=int, default=None, help="simulation seed (default: sweep's)")
    p.add_argument("--json", action="store_true")
    add_deployment_arguments(p)
    args = p.parse_args(argv)
    sweep = json.loads(Path(args.sweep).read_text())
    d = build_deployment(args)
    rows = compare(sweep, d, args.max_num_seqs, args.max_num_batched_tokens,
                   args.sim_requests, args.ttft_offset_ms, args.seed)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    head = "".join(f"{k + ' ' + q:>24}" for k, q in METRICS)
    print(f"{'level':>10}{head}\n{'':>10}" + "   measured    sim   err" * len(METRICS))
    for r in rows:
        cells = "".join(f"{r['measured'][f'{k}_{q}']:>11.1f}{r['simulated'][f'{k}_{q}']:>7.0f}"
                        f"{r['error'][f'{k}_{q}']:>+6.0%}" for k, q in METRICS)
        print(f"{'r=' + format(r['rate'], 'g'):>10}{cells}")
    for k, q in METRICS:
        errs = [abs(r["error"][f"{k}_{q}"]) for r in rows]
        print(f"median |error| {k} {q}: {statistics.median(errs):.0%} "
              f"(max {max(errs):.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
