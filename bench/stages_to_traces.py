"""The shared vLLM H100 load stages replayed as Mooncake-format traces (issue 29).

    python bench/stages_to_traces.py [STAGES.csv] [--out DIR] [--only NAME ...]

For each stage of the table (default data/vllm-h100/stages.csv) this writes a Mooncake JSON
lines trace, DIR/<stage>.jsonl (`timestamp` in ms, `input_length`, `output_length`,
`hash_ids` with one id per 512-token block), then reads it back through `bstar simulate
--trace`'s path (`bstar.sim.traffic.parse_trace`, `make_workload`: the Mooncake reader, no
caching flag) and simulates it with the stage's deployment, engine profile and scheduler,
scored against the measured means exactly as `bstar validate STAGES.csv` scores its
"profile" column (`simulate_stage`, `score_stage`, `summarize_scores`). It prints both side
by side: validate's own stage workload (the generator: system prompt and distinct prompts as
segment ids, hits found at vLLM's 16-token blocks) and the trace.

The trace is the stage's workload as its generator describes it (`stage_workload`, with the
same seed, so the same prompt and output lengths and arrival times): every prompt starts
with the stage's `shared_prefix_len`-token system prompt, then the tokens of prompt i mod k
of its `distinct_prompts` k, sent in turn. A hash id names the whole prefix that ends with
its block, as Mooncake's chained ids do: a block wholly inside the system prompt gets the
system prompt's id for that block, any other block the id of (its distinct prompt, block
end). Ids are numbered in order of first use.

512-token blocks are coarser than vLLM's 16: a block partly system prompt and partly a
distinct prompt's own tokens hashes differently for each distinct prompt, so the trace
cannot say that its leading system-prompt tokens are shared. On these stages the system
prompt (100 or 150 tokens) lies inside block 0, so the trace keeps only the repeats of each
distinct prompt (all of its blocks, the partial last one too, since a repeat has the same
length) and loses the system prompt's hits on each distinct prompt's first send. The hit
rates printed show what that costs.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from bstar.stages_table import Stage, load_stages  # noqa: E402

BLOCK_TOKENS = 512  # Mooncake's hash_ids block (bstar.sim.trace_formats.HASH_BLOCK_TOKENS)


def stage_trace(stage: Stage, num_requests: int, seed: int = 0) -> list[dict[str, Any]]:
    """The stage's requests as Mooncake records (module docstring), in arrival order."""
    from bstar.validate_stages import stage_workload

    if stage.arrival == "concurrency":
        raise ValueError(f"{stage.stage}: a closed loop has no arrival times for a trace")
    w = stage_workload(stage, num_requests, seed, prefix_cache=False)
    assert w.arrival_s is not None
    k = stage.distinct_prompts
    ids: dict[tuple[Any, ...], int] = {}
    records = []
    for i, (p, o, t) in enumerate(zip(w.prompt_tokens.tolist(), w.output_tokens.tolist(),
                                      w.arrival_s.tolist(), strict=True)):
        prompt = i % k if k else i
        hashes = []
        for start in range(0, p, BLOCK_TOKENS):
            end = min(start + BLOCK_TOKENS, p)
            key = ("system", end) if end <= stage.shared_prefix_len else ("prompt", prompt, end)
            hashes.append(ids.setdefault(key, len(ids)))
        records.append({"timestamp": round(t * 1e3), "input_length": p, "output_length": o,
                        "hash_ids": hashes})
    return records


def write_trace(records: Sequence[dict[str, Any]], path: Path) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def trace_workload(path: Path) -> Any:
    """The trace read back as `bstar simulate --trace FILE` reads it."""
    import numpy as np

    from bstar.sim.traffic import make_workload, parse_lengths, parse_trace

    trace = parse_trace(path.read_bytes())
    assert trace.format == "mooncake", trace.format
    one = parse_lengths("1")  # unused for a trace: it gives its own lengths
    return make_workload(trace, one, one, len(trace.arrival_s), np.random.default_rng(0))


def hit_rate(run: Any) -> float:
    h, q = run.prefix_hit_tokens, run.prefix_query_tokens
    return h / q if q else math.nan


def score_both(stage: Stage, out_dir: Path, seed: int = 0) -> tuple[Any, Any, float, float]:
    """(validate's StageScore, the trace's StageScore, their simulated hit rates)."""
    from bstar.sim import SchedulerConfig, SimConfig, simulate
    from bstar.validate_stages import (
        score_stage,
        simulate_stage,
        stage_deployment,
        stage_requests,
        stage_workload,
    )

    n = stage_requests(stage)
    path = out_dir / f"{stage.stage}.jsonl"
    write_trace(stage_trace(stage, n, seed), path)
    tw = trace_workload(path)
    gw = stage_workload(stage, n, seed)
    d = stage_deployment(stage)
    cfg = SimConfig(SchedulerConfig(stage.max_num_seqs, stage.max_num_batched_tokens))
    rates = [hit_rate(simulate(d, cfg, w)) for w in (gw, tw)]
    gen = score_stage(stage, simulate_stage(stage, deployment=d, workload=gw))
    tr = score_stage(stage, simulate_stage(stage, deployment=d, workload=tw))
    return gen, tr, rates[0], rates[1]


def _short(state: str) -> str:
    return "growing" if state == "queue growing" else state


def _pct(x: float | None) -> str:
    return "   -  " if x is None or not math.isfinite(x) else f"{100 * x:+5.1f}%"


def _summary_line(name: str, s: Any) -> str:
    def mm(k: str) -> str:
        a, b = s.mean_abs[k], s.median_abs[k]
        return "-" if a is None else f"{100 * a:.1f}% / {100 * b:.1f}%"

    return (f"    {name:<10} E2E {mm('e2e_mean_ms')}  TTFT {mm('ttft_mean_ms')}  "
            f"per-token {mm('tpot_mean_ms')}   states {s.states_right}/{s.stages}")


def main(argv: Sequence[str] | None = None) -> int:
    from bstar.validate_stages import summarize_scores

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("stages", nargs="?", default=str(ROOT / "data/vllm-h100/stages.csv"))
    ap.add_argument("--out", default="stage-traces", help="folder for the traces")
    ap.add_argument("--only", nargs="*", default=None, help="stage names")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stages = [s for s in load_stages(args.stages)
              if not args.only or s.stage in args.only]
    print("profile efficiencies; error = predicted / measured - 1; "
          "gen = validate's stage workload, trace = its Mooncake trace")
    print(f"  {'stage':<34}{'meas':>9}{'gen':>9}{'trace':>9}   "
          f"{'E2E gen':>8}{'trace':>8}  {'TTFT gen':>8}{'trace':>8}  "
          f"{'tok gen':>8}{'trace':>8}   hit rate gen / trace")
    gens, trs = [], []
    for st in stages:
        g, t, hg, ht = score_both(st, out)
        gens.append(g)
        trs.append(t)
        cols = "  ".join(f"{_pct(g.errors.get(k))}  {_pct(t.errors.get(k))}"
                         for k in ("e2e_mean_ms", "ttft_mean_ms", "tpot_mean_ms"))
        states = (_short(x) for x in (g.measured_state, g.prediction.state,
                                      t.prediction.state))
        print(f"  {st.stage:<34}" + "".join(f"{x:>9}" for x in states)
              + f"   {cols}   {hg:.3f} / {ht:.3f}")
    sg, stt = summarize_scores(gens), summarize_scores(trs)
    print(f"  mean / median |error| over the {sg.latency_stages} stages measured steady; "
          f"states right of {sg.stages}")
    print(_summary_line("generator", sg))
    print(_summary_line("trace", stt))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
