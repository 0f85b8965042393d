"""`bstar simulate`: continuous batching with paged KV and preemption, stepped by the cost
model; several --max-num-seqs run the sweep in simulation and apply the knee rules."""

from __future__ import annotations

import argparse
from typing import Any

from bstar.commands.common import (
    add_deployment_arguments,
    add_electricity_argument,
    add_force_argument,
    add_speculative_arguments,
    build_deployment,
    command_line,
    gib_amount,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    positive_int_list,
    report_written,
    seed_int,
    speculative_from_args,
)
from bstar.commands.emit import emit
from bstar.commands.traffic_flags import (
    DEFAULT_LENGTHS,
    add_from_run_arguments,
    add_prompt_sharing_arguments,
    measured_from_args,
    traffic_from_args,
)


def add_simulate_arguments(p: argparse.ArgumentParser) -> None:
    add_deployment_arguments(p)
    _add_scheduler_arguments(p)
    _add_traffic_and_output_arguments(p)


def _add_scheduler_arguments(p: argparse.ArgumentParser) -> None:
    s = p.add_argument_group("scheduler (vLLM V1)")
    s.add_argument("--max-num-seqs", type=positive_int_list, default=None,
                   help="levels to simulate, comma-separated (default: what `vllm serve` "
                        "picks on this GPU: 256, or 1024 on >= 70 GiB non-A100 GPUs)")
    s.add_argument("--max-num-batched-tokens", type=positive_int, default=None,
                   help="token budget per step; chunked prefill splits prompts to fit "
                        "(default: vllm serve's, 2048, or 8192 on >= 70 GiB non-A100 GPUs)")
    s.add_argument("--num-continuous-decode-steps", "--decode-steps-per-schedule",
                   dest="decode_steps_per_schedule", type=positive_int, default=1,
                   metavar="N",
                   help="decode steps a batch that only decodes runs before the scheduler "
                        "looks at the queue again (SGLang --num-continuous-decode-steps; "
                        "default 1, as vLLM)")
    s.add_argument("--scheduler-recv-interval", dest="scheduler_recv_interval",
                   type=positive_int, default=1, metavar="N",
                   help="scheduling rounds of pure decode between two looks at the request "
                        "queue (SGLang --scheduler-recv-interval; default 1: every round)")
    s.add_argument("--attention-dp-timeout-iters", dest="adp_timeout_iters",
                   type=non_negative_int, default=0, metavar="N",
                   help="TensorRT-LLM's attention-DP balance (attention_dp_config "
                        "enable_balance, timeout_iters): new prompts wait until every "
                        "data-parallel rank has one, at most N iterations (default 0: no "
                        "balance, TensorRT-LLM's default; InferenceX's scripts: 60)")
    s.add_argument("--attention-dp-batching-wait-iters", dest="adp_batching_wait_iters",
                   type=non_negative_int, default=0, metavar="N",
                   help="with the balance on, iterations a full round of prompts waits "
                        "while every rank decodes (attention_dp_config batching_wait_iters; "
                        "default 0)")
    s.add_argument("--preemption", choices=("recompute", "swap"), default="recompute",
                   help="what a preempted request loses: recompute (V1) drops its KV; swap "
                        "(V0) parks it in host memory (default recompute)")
    s.add_argument("--swap-space-gib", type=gib_amount, default=4.0,
                   help="host swap space per GPU for --preemption swap, GiB (default 4)")


def _add_traffic_and_output_arguments(p: argparse.ArgumentParser) -> None:
    t = p.add_argument_group("traffic")
    load = t.add_mutually_exclusive_group()
    load.add_argument("--rate", type=float, default=None,
                      help="open loop: Poisson arrivals, requests/s")
    load.add_argument("--concurrency", type=positive_int, default=None,
                      help="closed loop: this many users, each with one request in flight")
    load.add_argument("--trace", default=None, metavar="FILE",
                      help="replay arrivals and lengths: bstar's CSV or JSON lines "
                           "(arrival_s,prompt_tokens,output_tokens[,prefix_id,prefix_tokens,"
                           "hash_ids]), Mooncake JSON lines, Azure LLM inference or BurstGPT "
                           "CSV, told by the header (docs/simulate.md)")
    t.add_argument("--think-time-s", type=non_negative_float, default=0.0,
                   help="closed loop: mean pause between a response and the user's next "
                        "request (exponential; default 0)")
    # default None: whether the flag was given decides if a profile's workload applies
    t.add_argument("--input-len", default=None,
                   help="prompt tokens: N, uniform:LO:HI, normal:MEAN:STD, lognormal:MEAN:STD "
                        f"or empirical:N1,N2,... (default {DEFAULT_LENGTHS[0]}, or a "
                        "--profile's recorded workload)")
    t.add_argument("--output-len", default=None,
                   help=f"output tokens, same forms (default {DEFAULT_LENGTHS[1]}, or a "
                        "--profile's recorded workload)")
    t.add_argument("--prefix-cached-tokens", type=int, default=0, metavar="N",
                   help="tokens at the start of every prompt that the prefix cache already "
                        "holds (a shared system prompt; vLLM V1 caches prefixes by default): "
                        "prefill computes only the rest, in whole KV blocks (default 0)")
    add_prompt_sharing_arguments(t)
    add_from_run_arguments(t)
    t.add_argument("--num-requests", type=int, default=None,
                   help="requests per level (default 1000, or the whole --trace; at most "
                        "100,000: docs/simulate.md)")
    t.add_argument("--seed", type=seed_int, default=0,
                   help="random seed of the traffic (default 0)")
    o = p.add_argument_group("objectives and bounds")
    o.add_argument("--slo", default=None,
                   help="per-request SLOs in ms for goodput and the SLA rule, e.g. "
                        "ttft:500,tpot:50,e2e:20000")
    o.add_argument("--max-sim-time-s", type=positive_float, default=24 * 3600.0,
                   help="stop a level after this much simulated time (default 86400)")
    from bstar.commands.disagg_flags import add_disagg_arguments

    add_disagg_arguments(p, load=False)
    p.add_argument("--json", action="store_true",
                   help="print the simulate object (a list of them for several levels)")
    p.add_argument("--plot", default=None, metavar="FILE.png|.svg",
                   help="also draw throughput, latency percentiles and preemptions per level "
                        "(needs bstar[plot])")
    add_electricity_argument(p)
    add_force_argument(p)
    add_speculative_arguments(p)


def run_simulate(args: argparse.Namespace) -> int:
    from bstar.report import save_simulate_plot
    from bstar.report.text import print_simulation

    if args.disaggregate or args.deployment:
        return run_disagg_simulate(args)
    study = simulate_from_args(args)
    measured = measured_from_args(args, getattr(args, "profile", None))

    def data() -> Any:
        objs = study.to_objects()
        if measured is not None:
            for o in objs:
                o["from_run"] = measured.to_dict()
        return objs[0] if len(objs) == 1 else objs

    def text() -> None:
        from bstar.report.text.prefix import print_measured_hit_rates

        print_simulation(study)
        if measured is not None:
            print_measured_hit_rates(measured, study.rows)

    return emit(args, data, text, lambda path: save_simulate_plot(study.to_objects(), path))


def study_options(args: argparse.Namespace) -> Any:
    """The simulate flags as `bstar.sim.study.StudyOptions`."""
    from bstar.energy import DEFAULT_ELECTRICITY_USD_PER_KWH
    from bstar.sim.study import StudyOptions

    input_len, output_len, shape, _ = traffic_from_args(args, getattr(args, "profile", None))
    caching = not getattr(args, "no_prefix_caching", False)
    return StudyOptions(
        max_num_seqs=tuple(args.max_num_seqs) if args.max_num_seqs else None,
        max_num_batched_tokens=args.max_num_batched_tokens, preemption=args.preemption,
        decode_steps_per_schedule=args.decode_steps_per_schedule,
        scheduler_recv_interval=args.scheduler_recv_interval,
        adp_timeout_iters=args.adp_timeout_iters,
        adp_batching_wait_iters=args.adp_batching_wait_iters,
        swap_space_gib=args.swap_space_gib, rate=args.rate, concurrency=args.concurrency,
        trace=args.trace, think_time_s=args.think_time_s, input_len=input_len,
        output_len=output_len, num_requests=args.num_requests, seed=args.seed,
        slo=args.slo, max_sim_time_s=args.max_sim_time_s,
        prefix_cached_tokens=args.prefix_cached_tokens, prompt_shape=shape,
        prefix_caching=caching,
        electricity_usd_per_kwh=getattr(args, "electricity_usd_per_kwh",
                                        DEFAULT_ELECTRICITY_USD_PER_KWH))


def simulate_from_args(args: argparse.Namespace) -> Any:
    """The `bstar.sim.study.Study` these flags ask for (shared with `bstar report`)."""
    from dataclasses import replace

    from bstar.sim.study import run_study

    d = build_deployment(args)
    o = study_options(args)
    spec, drafter = speculative_from_args(args, d)
    if spec is not None:
        from bstar.sim.speculative import SpecSim

        o = replace(o, speculative=SpecSim(spec, drafter, seed=args.seed))
    return run_study(d, o)


def report_simulate(args: argparse.Namespace) -> int:
    """`bstar report simulate`: this command's page (`commands/report.py`)."""
    return report_written(args, lambda: _report_simulate(args))


def _report_simulate(args: argparse.Namespace) -> tuple[Any, dict[str, Any] | None]:
    from bstar.report import save_simulate_plot, write_simulate_report

    study = simulate_from_args(args)
    objs = study.to_objects()
    advice = study.advice
    path = write_simulate_report(objs, args.output, command_line())
    if getattr(args, "plot", None):
        save_simulate_plot(objs, args.plot)
    return path, {"max_num_seqs": advice.max_num_seqs if advice else None}


def run_disagg_simulate(args: argparse.Namespace) -> int:
    """`bstar simulate --disaggregate`: the plan's two sides run by bstar.sim.disagg at
    --concurrency (closed loop) or --rate (Poisson), --num-requests of them (default 10 a
    user, or 1000), lengths uniform in [--range-ratio x L, L]."""
    from bstar.disaggregate import plan_disaggregated
    from bstar.errors import BstarError
    from bstar.report.text import print_disagg_simulation
    from bstar.sim.disagg import simulate_plan

    if args.concurrency is None and args.rate is None:
        raise BstarError("bstar simulate --disaggregate needs --concurrency or --rate")
    if not 0 < args.range_ratio <= 1:
        raise BstarError(f"--range-ratio must be in (0, 1], got {args.range_ratio}")
    from bstar.commands.disagg_flags import disagg_from_args, disagg_speculative

    dd = disagg_from_args(args)
    prompt, output = args.prompt_tokens or 1024, args.output_tokens or 1024
    plan = plan_disaggregated(dd, prompt, output, concurrency=args.concurrency,
                              rate_req_s=None if args.concurrency else args.rate,
                              speculative=disagg_speculative(args))
    n = args.num_requests or (10 * args.concurrency if args.concurrency else 1000)

    def rng(length: int) -> tuple[int, int]:
        return max(1, int(length * args.range_ratio)), length

    res = simulate_plan(plan, num_requests=n, prompt_len=rng(prompt),
                        output_len=rng(output), concurrency=args.concurrency,
                        rate_req_s=None if args.concurrency else args.rate, seed=args.seed)
    data = plan.to_dict() | {"simulation": res.to_dict()}
    return emit(args, lambda: data, lambda: print_disagg_simulation(data))
