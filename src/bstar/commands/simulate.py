"""`bstar simulate`: continuous batching with paged KV and preemption, stepped by the cost
model; several --max-num-seqs run the sweep in simulation and apply the knee rules."""

from __future__ import annotations

import argparse
import json
from typing import Any

from bstar.commands.common import add_deployment_arguments, build_deployment, int_list


def add_simulate_arguments(p: argparse.ArgumentParser) -> None:
    add_deployment_arguments(p)
    s = p.add_argument_group("scheduler (vLLM V1)")
    s.add_argument("--max-num-seqs", type=int_list, default=None,
                   help="levels to simulate, comma-separated (default: what `vllm serve` "
                        "picks on this GPU: 256, or 1024 on >= 70 GiB non-A100 GPUs)")
    s.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="token budget per step; chunked prefill splits prompts to fit "
                        "(default: vllm serve's, 2048, or 8192 on >= 70 GiB non-A100 GPUs)")
    s.add_argument("--preemption", choices=("recompute", "swap"), default="recompute",
                   help="what a preempted request loses: recompute (V1) drops its KV; swap "
                        "(V0) parks it in host memory (default recompute)")
    s.add_argument("--swap-space-gib", type=float, default=4.0,
                   help="host swap space per GPU for --preemption swap, GiB (default 4)")
    t = p.add_argument_group("traffic")
    load = t.add_mutually_exclusive_group()
    load.add_argument("--rate", type=float, default=None,
                      help="open loop: Poisson arrivals, requests/s")
    load.add_argument("--concurrency", type=int, default=None,
                      help="closed loop: this many users, each with one request in flight")
    load.add_argument("--trace", default=None, metavar="FILE",
                      help="replay arrivals and lengths: CSV (arrival_s,input_tokens,"
                           "output_tokens) or JSON lines")
    t.add_argument("--think-time-s", type=float, default=0.0,
                   help="closed loop: mean pause between a response and the user's next "
                        "request (exponential; default 0)")
    t.add_argument("--input-len", default="512",
                   help="prompt tokens: N, uniform:LO:HI, normal:MEAN:STD, lognormal:MEAN:STD "
                        "or empirical:N1,N2,... (default 512)")
    t.add_argument("--output-len", default="256",
                   help="output tokens, same forms (default 256)")
    t.add_argument("--num-requests", type=int, default=None,
                   help="requests per level (default 1000, or the whole --trace; at most "
                        "1,000,000)")
    t.add_argument("--seed", type=int, default=0, help="random seed of the traffic (default 0)")
    o = p.add_argument_group("objectives and bounds")
    o.add_argument("--slo", default=None,
                   help="per-request SLOs in ms for goodput and the SLA rule, e.g. "
                        "ttft:500,tpot:50,e2e:20000")
    o.add_argument("--max-sim-time-s", type=float, default=24 * 3600.0,
                   help="stop a level after this much simulated time (default 86400)")
    p.add_argument("--json", action="store_true",
                   help="print the simulate object (a list of them for several levels)")
    p.add_argument("--plot", default=None, metavar="FILE.png|.svg",
                   help="also draw throughput, latency percentiles and preemptions per level "
                        "(needs bstar[plot])")


def run_simulate(args: argparse.Namespace) -> int:
    study = simulate_from_args(args)
    if getattr(args, "plot", None):
        import sys

        from bstar.report import save_simulate_plot

        # stderr: --json keeps stdout to the simulate object(s).
        print(f"plot written to {save_simulate_plot(study.to_objects(), args.plot)}",
              file=sys.stderr)
    if args.json:
        objs = study.to_objects()
        print(json.dumps(objs[0] if len(objs) == 1 else objs, indent=2))
        return 0
    print_simulation(study.deployment, study.rows, study.advice, study.arrivals, args,
                     study.max_num_batched_tokens)
    return 0


def study_options(args: argparse.Namespace) -> Any:
    """The simulate flags as `bstar.sim.study.StudyOptions`."""
    from bstar.sim.study import StudyOptions

    return StudyOptions(
        max_num_seqs=tuple(args.max_num_seqs) if args.max_num_seqs else None,
        max_num_batched_tokens=args.max_num_batched_tokens, preemption=args.preemption,
        swap_space_gib=args.swap_space_gib, rate=args.rate, concurrency=args.concurrency,
        trace=args.trace, think_time_s=args.think_time_s, input_len=args.input_len,
        output_len=args.output_len, num_requests=args.num_requests, seed=args.seed,
        slo=args.slo, max_sim_time_s=args.max_sim_time_s)


def simulate_from_args(args: argparse.Namespace) -> Any:
    """The `bstar.sim.study.Study` these flags ask for (shared with `bstar report`)."""
    from bstar.sim.study import run_study

    return run_study(build_deployment(args), study_options(args))


def print_simulation(d: Any, rows: list[Any], advice: Any, arrivals: Any,
                     args: argparse.Namespace, tokens: int) -> None:
    from rich.table import Table

    from bstar import roofline as rl
    from bstar.report.text import console
    from bstar.sim.traffic import parse_lengths
    from bstar.units import fmt_bytes, sparkline

    c = console()
    first = rows[0]
    inp, out = parse_lengths(args.input_len), parse_lengths(args.output_len)
    c.print(f"[bold]{d.model.name}[/] on [bold]{d.num_gpus} x {d.gpu.name}[/] ({d.gpu.id}): "
            f"KV pool {fmt_bytes(rl.kv_pool_bytes(d))} per GPU = {first.kv_blocks:,} blocks "
            f"of {first.block_size} tokens ({first.kv_blocks * first.block_size:,} tokens)")
    lengths = "lengths from the trace" if args.trace is not None else \
        f"input {inp.describe()}, output {out.describe()}"
    c.print(f"  traffic: {arrivals.describe()}, {lengths}, {first.requests_total:,} requests, "
            f"seed {args.seed}; "
            f"max_num_batched_tokens {tokens}, preemption {args.preemption}")
    t = Table(show_edge=False, pad_edge=False, box=None)
    cols = ["max_num_seqs", "done", "out tok/s", "req/s"]
    if first.goodput_req_s is not None:
        cols.append("goodput\nreq/s")
    cols += ["TTFT ms\np50", "TTFT ms\np99", "TPOT ms\np50", "TPOT ms\np99", "ITL ms\np99",
             "E2E s\np99", "preempt", "KV peak", "queue\nmax", "running\nmax"]
    for col in cols:
        t.add_column(col, justify="right")

    def f(v: float | None, scale: float = 1.0, nd: int = 1) -> str:
        return "-" if v is None else f"{v * scale:,.{nd}f}"

    for r in rows:
        mark = " *" if advice is not None and r.max_num_seqs == advice.max_num_seqs else ""
        cells = [f"{r.max_num_seqs}{mark}",
                 f"{r.requests}/{r.requests_total}" if r.truncated else str(r.requests),
                 f"{r.throughput_tok_s:,.0f}", f"{r.request_throughput_req_s:.2f}"]
        if first.goodput_req_s is not None:
            cells.append(f(r.goodput_req_s, nd=2))
        cells += [f(r.ttft_ms["p50"]), f(r.ttft_ms["p99"]), f(r.tpot_ms["p50"], nd=2),
                  f(r.tpot_ms["p99"], nd=2), f(r.itl_ms["p99"], nd=2),
                  f(r.e2e_ms["p99"], 1e-3, 2),
                  f"[red]{r.preemptions}[/]" if r.preemptions else "0",
                  f"{r.kv_utilization_max * 100:.0f}%", str(r.queue_max), str(r.running_max)]
        t.add_row(*cells)
    c.print(t)
    if len(rows) > 1:
        c.print(f"  throughput {sparkline([r.throughput_tok_s for r in rows])}")
    queue_top = max(max(r.queue_max for r in rows), 1)
    c.print(f"  over time, peak per bin (KV: 0..100% of the pool; queue: 0..{queue_top}):")
    for r in rows:
        tl = r.timeline
        span = tl["time_s"][-1] if tl["time_s"] else 0.0
        c.print(f"    {r.max_num_seqs:>6}  KV {_bars(tl['kv_utilization'][::2], 1.0):<50} "
                f"queue {_bars(tl['num_waiting'][::2], queue_top):<50} 0..{span:,.0f} s")
    rate = getattr(arrivals, "rate_per_s", None)
    best = max(r.request_throughput_req_s for r in rows)
    if rate is not None and best < 0.95 * rate:
        c.print(f"  [yellow]overloaded: {rate:g} req/s offered, at most {best:.2f} req/s served "
                "at any level; the queue grows for the whole run and TTFT is mostly waiting "
                "(its tail grows with --num-requests)[/]")
    for r in rows:
        if r.truncated:
            c.print(f"  [yellow]max_num_seqs {r.max_num_seqs}: stopped at "
                    f"{args.max_sim_time_s:g} s simulated with requests unfinished[/]")
    if advice is not None:
        for k in advice.knees.values():
            c.print(f"  knee ({k.rule}): "
                    + (f"[bold]{k.batch}[/]" if k.batch is not None else "none")
                    + f" - {k.reason}")
        c.print(f"  [bold green]max_num_seqs = {advice.max_num_seqs}[/] ({advice.bound}): "
                f"{advice.reason}")
    c.print("[dim]TPOT per request = (E2E - TTFT)/(output - 1); ITL = gaps between tokens; "
            "out tok/s = output tokens / time to the last finish (vLLM benchmark "
            "definitions). Step times from the cost model; * = recommended.[/]")


def _bars(values: list[float], top: float) -> str:
    """A bar per value on a fixed scale 0..top (so levels compare; units.sparkline rescales
    each series to its own range)."""
    bars = " ▁▂▃▄▅▆▇█"
    return "".join(bars[min(8, max(0, round(v / top * 8)))] for v in values)
