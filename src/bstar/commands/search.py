"""`bstar search`: the cheapest deployment that meets the SLO, by simulation, in this
process, a local process pool (--jobs N) or on Ray (--ray [ADDRESS])."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from bstar.commands.common import (
    add_backend_arguments,
    add_electricity_argument,
    add_force_argument,
    command_line,
    gib_amount,
    int_list,
    non_negative_float,
    positive_float,
    positive_int,
    positive_int_list,
    progress_ticks,
    report_written,
    seed_int,
    step_ms,
    str_list,
    warn,
)
from bstar.commands.traffic_flags import (
    add_from_run_arguments,
    add_prompt_sharing_arguments,
    traffic_from_args,
)
from bstar.engine_defaults import BLOCK_SIZE, DEFAULT_RESERVE_GIB, GPU_MEMORY_UTILIZATION
from bstar.units import GiB

DEFAULT_GPUS = "a100-80gb-sxm,h100-sxm,h200,l40s"


def add_search_arguments(p: argparse.ArgumentParser) -> None:
    _candidate_arguments(p.add_argument_group("candidates"))
    _cost_arguments(p.add_argument_group("cost model terms"))
    _traffic_arguments(p.add_argument_group("traffic and SLO"))
    _speculative_arguments(p.add_argument_group("speculative decoding (docs/search.md)"))
    _execution_arguments(p.add_argument_group("execution and output"))


def _candidate_arguments(c: argparse._ArgumentGroup) -> None:
    c.add_argument("--model", type=str_list, default=None,
                   help="preset names or config.json paths, comma-separated (default "
                        "llama-3-8b)")
    c.add_argument("--gpu", type=str_list, default=None,
                   help=f"GPU catalog ids or GPU files, comma-separated (default {DEFAULT_GPUS})")
    c.add_argument("--num-gpus", type=positive_int_list, default=None,
                   help="GPUs per instance, comma-separated (default 1,2,4,8); each runs "
                        "num_gpus/tp replicas for every valid tensor parallel size tp")
    c.add_argument("--expert-parallel-size", "--ep-size", dest="expert_parallel_size",
                   type=positive_int, default=None,
                   help="each replica's routed experts split over this many of its GPUs "
                        "(default 1: tensor-parallel experts)")
    c.add_argument("--enable-expert-parallel", action="store_true",
                   help="vLLM's spelling: expert parallel over all of each replica's GPUs")
    c.add_argument("--data-parallel-size", dest="data_parallel_size", type=positive_int,
                   default=None,
                   help="attention data-parallel ranks inside each replica of tp GPUs "
                        "(default 1; replicas of num_gpus / tp are counted apart)")
    c.add_argument("--enable-dp-attention", action="store_true",
                   help="SGLang's spelling: attention data parallel, one rank a GPU of each "
                        "replica")
    c.add_argument("--layouts", choices=("auto", "aggregated", "disaggregated", "both"),
                   default="auto",
                   help="aggregated servers, disaggregated prefill/decode units (xPyD: the "
                        "P:D ratio and each side's layout searched too), or both (default "
                        "auto: both when a model is a mixture of experts, else aggregated; "
                        "docs/search.md)")
    c.add_argument("--max-num-seqs", type=positive_int_list, default=None,
                   help="engine limits to try (default: around the predicted knee and B_mem "
                        "of each GPU x tp)")
    c.add_argument("--max-num-batched-tokens", type=positive_int_list, default=None,
                   help="token budgets to try (default: what vllm serve picks on the GPU)")
    c.add_argument("--dtype", default="", help="weight precision (default: the checkpoint's)")
    c.add_argument("--kv-dtype", default="bf16", help="KV cache precision (default bf16)")
    c.add_argument("--gpu-util", type=positive_float, default=GPU_MEMORY_UTILIZATION,
                   help=f"vLLM --gpu-memory-utilization (default {GPU_MEMORY_UTILIZATION:g})")
    c.add_argument("--reserve-gib", type=gib_amount, default=None,
                   help="per-GPU memory kept for activations etc., GiB; given, it wins over "
                        f"a --profile's measured reserve (default: the profile's, else "
                        f"{DEFAULT_RESERVE_GIB:g})")
    c.add_argument("--block-size", type=positive_int, default=BLOCK_SIZE,
                   help=f"KV block size in tokens (default {BLOCK_SIZE})")


def _cost_arguments(e: argparse._ArgumentGroup) -> None:
    e.add_argument("--profile", type=str_list, default=None, metavar="[GPU=]FILE,...",
                   help="calibration profiles from `bstar calibrate`, each applied to the GPU "
                        "it names (or GPU=FILE); other GPUs keep the stated defaults")
    e.add_argument("--engine", default="", metavar="NAME",
                   help="engine whose priors uncalibrated GPUs start from (default vllm; "
                        "docs/cost-model.md)")
    e.add_argument("--bw-eff", type=positive_float, default=None,
                   help="weight-stream efficiency for uncalibrated GPUs (default: the "
                        "engine profile's)")
    e.add_argument("--flops-eff", type=positive_float, default=None,
                   help="compute efficiency for uncalibrated GPUs (default: the engine "
                        "profile's)")
    e.add_argument("--overhead-ms", type=step_ms, default=None,
                   help="per-step overhead for uncalibrated GPUs, ms (default: the engine "
                        "profile's)")
    from bstar.commands.common import add_graph_arguments

    add_graph_arguments(e)


def _traffic_arguments(t: argparse._ArgumentGroup) -> None:
    t.add_argument("--rate", type=positive_float, default=None,
                   help="demand: requests/s over the whole fleet (default with --trace: the "
                        "trace's mean rate)")
    t.add_argument("--trace", default=None, metavar="FILE",
                   help="lengths and arrival pattern from a trace (CSV arrival_s,"
                        "prompt_tokens,output_tokens or JSON lines), rescaled per rate")
    # default None: whether the flag was given decides if a profile's workload applies
    t.add_argument("--input-len", default=None,
                   help="prompt tokens: N, uniform:LO:HI, normal:MEAN:STD, lognormal:MEAN:STD "
                        "or empirical:N1,... (default 512, or a --profile's recorded workload)")
    t.add_argument("--output-len", default=None,
                   help="output tokens, same forms (default 256, or a --profile's recorded "
                        "workload)")
    t.add_argument("--num-requests", type=positive_int, default=None,
                   help="requests per simulation (default 400)")
    t.add_argument("--prefix-cached-tokens", type=int, default=0, metavar="N",
                   help="tokens at the start of every prompt the prefix cache already holds "
                        "(a shared system prompt): prefill computes the rest (default 0)")
    add_prompt_sharing_arguments(t)
    add_from_run_arguments(t)
    t.add_argument("--seed", type=seed_int, default=0,
                   help="random seed of the traffic (default 0)")
    t.add_argument("--draws", type=positive_int, default=3,
                   help="traffic draws (seeds) each rate must meet the SLO on, worst of K "
                        "(default 3)")
    t.add_argument("--slo", default=None, required=False,
                   help="p99 targets in ms, e.g. ttft:1000,tpot:50 (also ttft_p99_ms=1000; "
                        "e2e allowed); needs ttft or e2e")
    t.add_argument("--rel-tol", type=positive_float, default=0.02,
                   help="bisection stops when the rate bracket is this narrow (default 0.02)")
    t.add_argument("--max-utilization", type=positive_float, default=0.95,
                   help="rates tried are at most this fraction of a replica's capacity, the "
                        "largest rate whose queue does not grow (default 0.95: headroom for "
                        "the capacity's growth threshold and tolerance)")


def _speculative_arguments(s: argparse._ArgumentGroup) -> None:
    s.add_argument("--num-speculative-tokens", dest="num_speculative_tokens", type=int_list,
                   default=None, metavar="K,...",
                   help="try each replica with each K draft tokens, 0 = speculation off "
                        "(e.g. 0,2,4); the search then says whether speculation changes the "
                        "cheapest deployment (default: no speculation)")
    s.add_argument("--acceptance-rate", dest="acceptance_rate", type=non_negative_float,
                   default=0.7, metavar="A", help="per-token acceptance rate (default 0.7)")
    s.add_argument("--drafter", default="auto",
                   help="eagle, mtp, ngram or a draft model (default auto: mtp when the "
                        "model ships MTP layers, else eagle)")


def _execution_arguments(x: argparse._ArgumentGroup) -> None:
    add_backend_arguments(x, "the candidates")
    x.add_argument("--db", default=None,
                   help="results store (default ${BSTAR_DATA_DIR:-~/.local/share/bstar}/"
                        "search.db)")
    x.add_argument("--resume", action="store_true",
                   help="reuse the rows an earlier run of the same search stored")
    x.add_argument("--price", default=None, metavar="FILE.toml",
                   help="GPU-hour prices (see examples/gpu-prices-example.toml); without it "
                        "candidates rank by GPU count")
    x.add_argument("--top", type=positive_int, default=15,
                   help="rows of the ranked table per model (default 15)")
    x.add_argument("--json", action="store_true", help="print the search object (contract)")
    x.add_argument("--plot", default=None, metavar="FILE.png|.svg",
                   help="also draw the Pareto charts (needs bstar[plot])")
    add_electricity_argument(x)
    add_force_argument(x)


def spec_from_args(args: argparse.Namespace) -> Any:
    from bstar.errors import BstarError
    from bstar.search import Memory, SearchSpec, Traffic
    from bstar.search.spec import DEFAULT_NUM_GPUS, demand_and_requests, parse_profiles
    from bstar.sim import parse_lengths, parse_slo
    from bstar.sim.traffic import read_trace_file

    if not args.slo:
        raise BstarError("give the SLO: --slo ttft:1000,tpot:50 (p99 targets in ms)")
    slo = parse_slo(args.slo.replace("_p99", ""))
    trace = read_trace_file(args.trace) if args.trace is not None else None
    demand, num_requests = demand_and_requests(args.rate, trace, args.num_requests)
    profiles = parse_profiles(args.profile or ())
    # The first profile's [workload] sizes a search that gives no workload of its own.
    input_len, output_len, shape, measured = traffic_from_args(
        args, profiles[0][1] if profiles else None)
    if measured is not None:
        from bstar.report.text._common import clean_text

        print(f"traffic from {clean_text(measured.describe(), 1000)}", file=sys.stderr)
    traffic = Traffic(demand, parse_lengths(input_len, "--input-len"),
                      parse_lengths(output_len, "--output-len"),
                      num_requests, args.seed, trace, args.draws,
                      args.prefix_cached_tokens, shape, not args.no_prefix_caching)
    from bstar.options import DeploymentOptions

    opts = DeploymentOptions(bw_eff=args.bw_eff, flops_eff=args.flops_eff,
                             overhead_ms=args.overhead_ms, engine=args.engine,
                             enforce_eager=args.enforce_eager,
                             cuda_graph_max_tokens=args.cuda_graph_max_tokens)
    eff = opts.efficiency()
    models = tuple(args.model or ["llama-3-8b"])
    return SearchSpec(
        models=models,
        gpus=tuple(args.gpu or DEFAULT_GPUS.split(",")), traffic=traffic, slo=slo,
        num_gpus=tuple(sorted(set(args.num_gpus or DEFAULT_NUM_GPUS))),
        max_num_seqs=tuple(sorted(set(args.max_num_seqs or ()))),
        max_num_batched_tokens=tuple(sorted(set(args.max_num_batched_tokens or ()))),
        memory=Memory(args.dtype, args.kv_dtype, args.gpu_util,
                      None if args.reserve_gib is None else round(args.reserve_gib * GiB),
                      args.block_size),
        eff=eff, behaviour=opts.behaviour(), profiles=profiles, rel_tol=args.rel_tol,
        max_utilization=args.max_utilization,
        num_speculative_tokens=tuple(sorted(set(args.num_speculative_tokens or ()))),
        acceptance_rate=args.acceptance_rate, drafter=args.drafter,
        engine="ideal" if opts.ideal else _engine_name(opts.engine),
        expert_parallel=args.expert_parallel_size or (0 if args.enable_expert_parallel
                                                       else 1),
        attention_dp=args.data_parallel_size or (0 if args.enable_dp_attention else 1),
        layouts=_layouts(args.layouts, models))


def _layouts(given: str, models: tuple[str, ...]) -> str:
    """--layouts auto: both layouts when a model is a mixture of experts (the models served
    disaggregated at scale), else aggregated."""
    if given != "auto":
        return given
    from bstar.specs.presets import get_model

    return "both" if any(get_model(m).is_moe for m in models) else "aggregated"


def _engine_name(name: str) -> str:
    from bstar.engines import get_engine

    return get_engine(name).name


def search_from_args(args: argparse.Namespace, quiet: bool = False) -> Any:
    """Run the search the flags describe; a progress bar on stderr unless `quiet`."""
    from bstar.search import SearchStore, default_db_path, load_prices, make_backend
    from bstar.specs.gpu import get_gpu
    from bstar.specs.presets import get_model

    spec = spec_from_args(args)
    prices = load_prices(args.price) if args.price else None
    for m in spec.models:  # fail on a typo before starting processes or a cluster
        get_model(m)
    for g in spec.gpus:
        get_gpu(g)
    store = SearchStore(args.db or default_db_path())
    backend = make_backend(args.jobs, args.ray)
    try:
        with backend, progress_ticks("search", quiet) as tick:
            return _run(spec, backend, store, prices, args.resume, tick,
                        args.electricity_usd_per_kwh)
    except KeyboardInterrupt:
        print(f"bstar: search interrupted; rows finished so far are stored in {store.path}: "
              "run the same command with --resume to continue", file=sys.stderr)
        raise
    finally:
        store.close()


def _run(spec: Any, backend: Any, store: Any, prices: Any, resume: bool, tick: Any,
         electricity_usd_per_kwh: float) -> Any:
    from bstar.search import run_search

    return run_search(spec, backend, store, prices, resume, tick, electricity_usd_per_kwh)


def run_search(args: argparse.Namespace) -> int:
    from bstar.commands.emit import emit

    result = search_from_args(args, quiet=args.json or not sys.stderr.isatty())
    obj = result.to_dict()
    for w in result.warnings:
        warn(w)

    def plot(path: str) -> Path:
        from bstar.report import save_search_plot

        return save_search_plot(obj, path)

    def text() -> None:
        from bstar.report.text import print_search

        print_search(obj, args.top)

    return emit(args, lambda: obj, text, plot)


def report_search(args: argparse.Namespace) -> int:
    """`bstar report search`: this command's page (`commands/report.py`)."""
    return report_written(args, lambda: _report_search(args))


def _report_search(args: argparse.Namespace) -> tuple[Any, dict[str, Any] | None]:
    from bstar.report import save_search_plot, write_search_report

    result = search_from_args(args, quiet=True)
    obj = result.to_dict()
    path = write_search_report(obj, args.output, command_line())
    if getattr(args, "plot", None):
        save_search_plot(obj, args.plot)
    winners = {m: {"gpus_total": w["gpus_total"], "gpu": w["gpu"],
                   "cost_per_mtok": w["cost_per_mtok"]} for m, w in obj["winners"].items()}
    return path, {"search_id": obj["search_id"], "winners": winners}
