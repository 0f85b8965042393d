"""`bstar capacity`: replicas per interval over a demand curve under static, reactive and
scheduled policies, their cost and the SLO attainment through the transitions
(docs/capacity.md). A thin layer: flags to a demand curve, deployments and settings, then
`bstar.capacity.plan_capacity`."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from bstar.commands.common import (
    add_backend_arguments,
    add_deployment_arguments,
    add_electricity_argument,
    add_force_argument,
    non_negative_float,
    positive_float,
    positive_int,
    seed_int,
    str_list,
)
from bstar.commands.emit import emit


def add_capacity_arguments(p: argparse.ArgumentParser) -> None:
    add_deployment_arguments(p, many=True)
    e = p.add_argument_group("engine limits (each replica)")
    e.add_argument("--max-num-seqs", type=positive_int, default=None,
                   help="the replica's max_num_seqs (default: what vllm serve picks on the "
                        "GPU)")
    e.add_argument("--max-num-batched-tokens", type=positive_int, default=None,
                   help="the replica's token budget (default: vllm serve's on the GPU)")
    e.add_argument("--winners", action="store_true",
                   help="scale each model's winner of `bstar search` at the curve's peak over "
                        "--model x --gpu on --num-gpus GPUs (every valid tensor parallel "
                        "size, max_num_seqs around the knee and B_mem) instead of the "
                        "replica the flags name")
    e.add_argument("--db", default=None,
                   help="--winners: the search's results store (default: bstar search's)")
    _demand_arguments(p.add_argument_group("demand curve (one of --trace, --demand-csv, "
                                           "--diurnal)"))
    _policy_arguments(p.add_argument_group("policies and SLO"))
    add_backend_arguments(p.add_argument_group("execution"),
                          "the evaluations, steady simulations and ramp replays")
    o = p.add_argument_group("output")
    o.add_argument("--price", default=None, metavar="FILE.toml",
                   help="GPU-hour prices (examples/gpu-prices-example.toml): $ per day and "
                        "per million output tokens")
    o.add_argument("--json", action="store_true", help="print the capacity object (contract)")
    o.add_argument("--plot", default=None, metavar="FILE.png|.svg",
                   help="also draw demand, capacity and replicas over the curve (needs "
                        "bstar[plot])")
    add_force_argument(o)


def _demand_arguments(d: argparse._ArgumentGroup) -> None:
    d.add_argument("--trace", default=None, metavar="FILE",
                   help="a trace in any format `bstar simulate --trace` reads: its requests "
                        "are the mix, and without --demand-csv or --diurnal its arrivals "
                        "counted per --interval-s are the demand (ramps replay its requests)")
    d.add_argument("--demand-csv", default=None, metavar="FILE",
                   help="a CSV with columns time_s,rate_req_s (each rate holds until the "
                        "next row's time)")
    d.add_argument("--diurnal", default=None, metavar="PEAK:TROUGH",
                   help="a generated day: a cosine from TROUGH to PEAK requests/s")
    d.add_argument("--peak-hour", type=non_negative_float, default=14.0,
                   help="--diurnal: hour of the peak (default 14)")
    d.add_argument("--bursts", type=int, default=0,
                   help="--diurnal: bursts at seeded times (default 0)")
    d.add_argument("--burst-factor", type=positive_float, default=1.5,
                   help="--diurnal: each burst multiplies the rate by this (default 1.5)")
    d.add_argument("--burst-s", type=positive_float, default=300.0,
                   help="--diurnal: length of a burst, s (default 300)")
    d.add_argument("--duration-h", type=positive_float, default=24.0,
                   help="--diurnal: hours generated (default 24)")
    d.add_argument("--interval-s", type=positive_float, default=60.0,
                   help="the curve's interval, s (default 60)")
    d.add_argument("--input-len", default=None,
                   help="prompt tokens of the mix without --trace (default 512; forms as "
                        "`bstar simulate`)")
    d.add_argument("--output-len", default=None,
                   help="output tokens of the mix without --trace (default 256)")
    d.add_argument("--seed", type=seed_int, default=0,
                   help="seed of the bursts, the drawn requests and the mix (default 0)")


def _policy_arguments(s: argparse._ArgumentGroup) -> None:
    s.add_argument("--slo", default=None,
                   help="p99 targets in ms, e.g. ttft:1000,tpot:50 (needs ttft or e2e); a "
                        "request meets it when within every target")
    s.add_argument("--policies", type=str_list, default=None,
                   help="comma-separated, of static, reactive, scheduled (default all)")
    s.add_argument("--provision-delay-s", type=non_negative_float, default=300.0,
                   help="seconds from asking for a replica to its serving (GPU node, "
                        "engine start, model load; default 300)")
    s.add_argument("--cooldown-s", type=non_negative_float, default=600.0,
                   help="reactive: scale down only to the most the last this many seconds "
                        "needed (default 600)")
    s.add_argument("--schedule-period-s", type=positive_float, default=3600.0,
                   help="scheduled: one target per this many seconds of the day (default "
                        "3600: hourly)")
    s.add_argument("--history", default=None, metavar="FILE",
                   help="scheduled: the demand history its targets come from, a "
                        "time_s,rate_req_s CSV (default: the demand curve itself)")
    s.add_argument("--replay", choices=("all", "overloaded"), default="all",
                   help="ramp intervals replayed through the simulator: all (default), or "
                        "only those whose load per ready replica passes its capacity (the "
                        "milder ones read steady simulations up to the capacity; faster)")
    s.add_argument("--draws", type=positive_int, default=3,
                   help="traffic draws the per-replica rate must meet the SLO on (default 3, "
                        "as bstar search)")
    add_electricity_argument(s)
    s.add_argument("--warmup-s", type=non_negative_float, default=30.0,
                   help="seconds of demand before a ramp replayed but not counted "
                        "(default 30)")


def _curve(args: argparse.Namespace, trace: Any) -> Any:
    from bstar import safeio
    from bstar.capacity import diurnal, from_trace, parse_rate_csv
    from bstar.errors import BstarError

    given = [f for f, v in (("--demand-csv", args.demand_csv), ("--diurnal", args.diurnal))
             if v is not None]
    if len(given) > 1:
        raise BstarError("give one of --demand-csv and --diurnal")
    if args.demand_csv is not None:
        text = safeio.read_text(args.demand_csv, safeio.MAX_TABLE_BYTES, "demand CSV")
        return parse_rate_csv(text, args.interval_s, args.demand_csv)
    if args.diurnal is not None:
        peak, sep, trough = args.diurnal.partition(":")
        try:
            hi, lo = float(peak), float(trough if sep else 0.0)
        except ValueError:
            raise BstarError(f"--diurnal {args.diurnal!r}: expected PEAK:TROUGH in "
                             "requests/s, e.g. 120:20") from None
        return diurnal(hi, lo, args.interval_s, args.duration_h * 3600.0, args.bursts,
                       args.burst_factor, args.burst_s, args.peak_hour, args.seed)
    if trace is None:
        raise BstarError("give the demand: --trace FILE, --demand-csv FILE or --diurnal "
                         "PEAK:TROUGH")
    return from_trace(trace, args.interval_s)


def capacity_from_args(args: argparse.Namespace, quiet: bool = True) -> Any:
    """The capacity the flags describe; a progress bar on stderr unless `quiet`."""
    from bstar import safeio
    from bstar.capacity import POLICIES, Settings, parse_rate_csv, plan_capacity
    from bstar.capacity.replay import trace_workload
    from bstar.commands.common import progress_ticks
    from bstar.errors import BstarError
    from bstar.search import load_prices, make_backend
    from bstar.search.spec import Traffic
    from bstar.sim import parse_lengths, parse_slo, parse_trace

    if not args.slo:
        raise BstarError("give the SLO: --slo ttft:1000,tpot:50 (p99 targets in ms)")
    slo = parse_slo(args.slo.replace("_p99", ""))
    trace = None
    if args.trace is not None:
        if args.input_len is not None or args.output_len is not None:
            raise BstarError("--input-len/--output-len with --trace: the trace gives every "
                             "request's lengths; drop one")
        data = safeio.read_bytes(args.trace, safeio.MAX_TRACE_BYTES, "trace")
        try:
            trace = parse_trace(data)
        except BstarError as e:
            raise BstarError(f"--trace {args.trace}: {e}") from None
    curve = _curve(args, trace)
    policies = tuple(args.policies or POLICIES)
    for p in policies:
        if p not in POLICIES:
            raise BstarError(f"--policies: unknown policy {p!r}: one of {', '.join(POLICIES)}")
    history = None
    if args.history is not None:
        history = parse_rate_csv(safeio.read_text(args.history, safeio.MAX_TABLE_BYTES,
                                                  "history CSV"), args.interval_s, args.history)
    settings = Settings(args.provision_delay_s, args.cooldown_s, args.schedule_period_s,
                        history, args.replay)
    n_req = 400 if trace is None else min(len(trace.arrival_s), 100_000)
    traffic = Traffic(curve.peak_req_s, parse_lengths(args.input_len or "512", "--input-len"),
                      parse_lengths(args.output_len or "256", "--output-len"), n_req,
                      args.seed, trace, args.draws)
    # With the trace as the demand, ramps replay its own requests.
    replay_trace = trace_workload(trace) if trace is not None and args.demand_csv is None \
        and args.diurnal is None else None
    prices = load_prices(args.price) if args.price else None
    # A typo in --model or --gpu fails here, before any process or cluster starts.
    replicas = None if args.winners else _replicas(args)
    with make_backend(args.jobs, args.ray) as backend:
        if replicas is None:
            replicas = _winners(args, traffic, slo, prices, backend)
        with progress_ticks("capacity", quiet) as tick:
            return plan_capacity(replicas, curve, traffic, slo, settings, prices, policies,
                                 replay_trace, args.seed, args.warmup_s,
                                 electricity_usd_per_kwh=args.electricity_usd_per_kwh,
                                 backend=backend, tick=tick)


def _replicas(args: argparse.Namespace) -> list[Any]:
    from bstar.capacity import replica_for
    from bstar.commands.common import build_deployment
    from bstar.engine_defaults import vllm_defaults

    replicas = []
    for m in args.model or [None]:
        for g in args.gpu or [None]:
            d = build_deployment(args, m, g)
            lim = vllm_defaults(d.gpu)
            replicas.append(replica_for(d, m or d.model.name, args.max_num_seqs or
                                        lim.max_num_seqs, args.max_num_batched_tokens or
                                        lim.max_num_batched_tokens, getattr(args, "profile",
                                                                            None)))
    return replicas


def _winners(args: argparse.Namespace, traffic: Any, slo: Any, prices: Any,
             backend: Any) -> list[Any]:
    """The search's winners at the peak: the models and GPUs the flags name, the memory and
    efficiency flags as `bstar search` reads them."""
    from bstar.capacity.run import search_winners
    from bstar.commands.common import deployment_options
    from bstar.search import Memory, SearchSpec, SearchStore, default_db_path
    from bstar.units import GiB

    opts = deployment_options(args)
    spec = SearchSpec(
        tuple(args.model or ["llama-3-8b"]), tuple(args.gpu or ["h100-sxm"]), traffic, slo,
        memory=Memory(args.dtype, args.kv_dtype, args.gpu_util,
                      None if args.reserve_gib is None else round(args.reserve_gib * GiB),
                      args.block_size),
        num_gpus=(args.num_gpus,), eff=opts.efficiency(), behaviour=opts.behaviour(),
        profiles=(("", args.profile),) if getattr(args, "profile", None) else (),
        engine="ideal" if opts.ideal else _engine_name(opts.engine))
    store = SearchStore(args.db or default_db_path())
    try:
        reps, _ = search_winners(spec, backend, store, prices)
    finally:
        store.close()
    return reps


def _engine_name(name: str) -> str:
    from bstar.engines import get_engine

    return get_engine(name).name


def run_capacity(args: argparse.Namespace) -> int:
    result = capacity_from_args(args, quiet=args.json or not sys.stderr.isatty())
    obj = result.to_dict()

    def plot(path: str) -> Any:
        from bstar.report import save_capacity_plot

        return save_capacity_plot(obj, path)

    def text() -> None:
        from bstar.report.text import print_capacity

        print_capacity(obj)

    return emit(args, lambda: obj, text, plot)
