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
    gib_amount,
    non_negative_float,
    positive_float,
    positive_int,
    positive_int_list,
    seed_int,
    speculative_from_args,
)
from bstar.commands.emit import emit

DEFAULT_LENGTHS = ("512", "256")  # --input-len, --output-len  (simulate, search)

def add_simulate_arguments(p: argparse.ArgumentParser) -> None:
    add_deployment_arguments(p)
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
    s.add_argument("--preemption", choices=("recompute", "swap"), default="recompute",
                   help="what a preempted request loses: recompute (V1) drops its KV; swap "
                        "(V0) parks it in host memory (default recompute)")
    s.add_argument("--swap-space-gib", type=gib_amount, default=4.0,
                   help="host swap space per GPU for --preemption swap, GiB (default 4)")
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
    from bstar.commands.disagg import add_disagg_arguments

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
        from bstar.commands.disagg import run_disagg_simulate

        return run_disagg_simulate(args)
    study = simulate_from_args(args)
    measured = _measured(args)

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


def _measured(args: argparse.Namespace) -> Any:
    """The stored sweep --from-run names (`bstar.loadgen.measured`), else the traffic a
    --profile recorded when no workload is given (`profile_traffic`), or None."""
    if not getattr(args, "from_run", None):
        return profile_traffic(args, getattr(args, "profile", None))
    if getattr(args, "trace", None):
        from bstar.errors import BstarError

        raise BstarError("--from-run with --trace: both say what the requests are (the "
                         "run's measured lengths and sharing, or the trace's); drop one")
    from bstar.loadgen.measured import measured_traffic

    return measured_traffic(getattr(args, "runs_db", None), args.from_run)


def given_lengths(args: argparse.Namespace) -> tuple[str, str]:
    """(--input-len, --output-len) as given, else their defaults. With --trace a given one
    is refused, not ignored: the trace says each request's lengths, and a flag that changes
    nothing would let the user believe the run used it (issue 40). Refused rather than a
    note, because a note scrolls past in a script and the run would still not be what was
    asked for."""
    from bstar.errors import BstarError

    given = [flag for flag, v in (("--input-len", args.input_len),
                                  ("--output-len", args.output_len)) if v is not None]
    if getattr(args, "trace", None) and given:
        raise BstarError(f"{' and '.join(given)} with --trace: the trace gives every "
                         f"request's lengths; drop {' and '.join(given)} or --trace")
    return (args.input_len if args.input_len is not None else DEFAULT_LENGTHS[0],
            args.output_len if args.output_len is not None else DEFAULT_LENGTHS[1])


def profile_traffic(args: argparse.Namespace, profile: str | None) -> Any:
    """The [workload] table of calibration profile `profile` (the sweep `bstar calibrate`
    read), when the flags give no workload: no --trace, --prefix-cached-tokens or
    prompt-sharing flag, and neither --input-len nor --output-len given (an explicit
    `--input-len 512` counts, though it is the default's value). None otherwise."""
    if not profile or getattr(args, "trace", None) or args.prefix_cached_tokens \
            or prompt_shape(args) is not None \
            or args.input_len is not None or args.output_len is not None:
        return None
    from bstar.loadgen.measured import traffic_from_profile

    return traffic_from_profile(profile)


def study_options(args: argparse.Namespace) -> Any:
    """The simulate flags as `bstar.sim.study.StudyOptions`."""
    from bstar.energy import DEFAULT_ELECTRICITY_USD_PER_KWH
    from bstar.sim.study import StudyOptions

    shape = prompt_shape(args)
    caching = not getattr(args, "no_prefix_caching", False)
    input_len, output_len = given_lengths(args)
    measured = _measured(args)
    if measured is not None:
        input_len, output_len = measured.lengths(shared=caching and shape is None)
        shape = shape or (measured.prompt_shape() if caching else None)
    return StudyOptions(
        max_num_seqs=tuple(args.max_num_seqs) if args.max_num_seqs else None,
        max_num_batched_tokens=args.max_num_batched_tokens, preemption=args.preemption,
        decode_steps_per_schedule=args.decode_steps_per_schedule,
        swap_space_gib=args.swap_space_gib, rate=args.rate, concurrency=args.concurrency,
        trace=args.trace, think_time_s=args.think_time_s, input_len=input_len,
        output_len=output_len, num_requests=args.num_requests, seed=args.seed,
        slo=args.slo, max_sim_time_s=args.max_sim_time_s,
        prefix_cached_tokens=args.prefix_cached_tokens, prompt_shape=shape,
        prefix_caching=caching,
        electricity_usd_per_kwh=getattr(args, "electricity_usd_per_kwh",
                                        DEFAULT_ELECTRICITY_USD_PER_KWH))


def add_prompt_sharing_arguments(t: Any) -> None:
    """Which prompts share which tokens (bstar.sim.prefix), and the engine's cache switch."""
    t.add_argument("--shared-prefix-tokens", type=int, default=0, metavar="N",
                   help="every prompt starts with its group's N-token system prompt, on top "
                        "of its --input-len draw; the prefix cache finds the hits (default 0)")
    t.add_argument("--prefix-groups", type=positive_int, default=1, metavar="G",
                   help="G distinct system prompts, request i in group i mod G (default 1)")
    t.add_argument("--distinct-prompts", type=int, default=0, metavar="K",
                   help="send K prompts in turn: request i repeats prompt i mod K, lengths "
                        "and all (default 0: every prompt its own)")
    t.add_argument("--multi-turn", type=int, default=0, metavar="T",
                   help="T-turn conversations: each turn's prompt is the previous prompt, its "
                        "answer and a new --input-len question (default 0: single turn)")
    t.add_argument("--no-prefix-caching", action="store_true",
                   help="simulate the engine with prefix caching off (vLLM's flag)")


def add_from_run_arguments(t: Any) -> None:
    t.add_argument("--from-run", default=None, metavar="RUN",
                   help="the traffic a stored sweep measured: its prompt and output lengths "
                        "and its prefix-cache hit rate (docs/simulate.md)")
    t.add_argument("--runs-db", default=None, metavar="FILE",
                   help="the sweep results DB --from-run reads (default: bstar sweep's)")


def prompt_shape(args: argparse.Namespace) -> Any:
    """The prompt-sharing flags as `bstar.sim.prefix.PromptShape` (None: none given)."""
    from bstar.sim.prefix import PromptShape

    shape = PromptShape(*(getattr(args, k, d) for k, d in (
        ("shared_prefix_tokens", 0), ("prefix_groups", 1), ("distinct_prompts", 0),
        ("multi_turn", 0))))
    return shape if shape.active else None


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
