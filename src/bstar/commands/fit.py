"""`bstar fit POINTS`: fit measured points, extrapolate past the compute roof, find the knee."""

from __future__ import annotations

import argparse
from typing import Any

from bstar.commands.common import (
    add_force_argument,
    command_line,
    deployment_options,
    positive_float,
    positive_int,
    positive_int_list,
    report_written,
    seed_int,
)
from bstar.commands.emit import emit

MAX_BOOTSTRAP = 10_000


def add_fit_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("points", metavar="POINTS",
                   help="CSV or JSON with 'batch' and at least one of 'throughput_tok_s', "
                        "'tpot_ms' (the other is derived: throughput = batch / TPOT); or a "
                        "sweep result (--json of bstar sweep)")
    p.add_argument("--predict", type=positive_int_list, default=None,
                   help="batch sizes to predict, comma-separated (default: 2x and 4x the "
                        "largest measured batch)")
    p.add_argument("--critical-batch", type=positive_float, default=None, metavar="N",
                   help="a known compute roof: the batch where the memory line meets the "
                        "compute line (c = step(N)/N)")
    g = p.add_argument_group("roof from the cost model (the compute term of bstar plan)")
    g.add_argument("--model", default=None,
                   help="preset name or config.json (or its folder); alone it only converts a "
                        "into a bandwidth, with --gpu it gives the compute roof")
    g.add_argument("--gpu", default=None, help="GPU catalog id or GPU file (TOML/JSON)")
    g.add_argument("--num-gpus", "--tensor-parallel-size", dest="num_gpus", type=positive_int,
                   default=1, help="tensor-parallel degree (default: 1)")
    g.add_argument("--dtype", default="", help="weight precision (default: the checkpoint's)")
    g.add_argument("--kv-dtype", "--kv-cache-dtype", dest="kv_dtype", default="bf16",
                   help="KV cache precision (default: bf16)")
    g.add_argument("--context", "--max-model-len", dest="context", type=positive_int, default=None,
                   help="tokens each sequence holds while decoding (attention FLOPs, KV bytes "
                        "per sequence; default 512)")
    g.add_argument("--flops-eff", type=positive_float, default=None,
                   help="achieved fraction of dense peak FLOP/s (default 0.60, as bstar plan)")
    k = p.add_argument_group("knee rules")
    k.add_argument("--knee-step", type=positive_float, default=0.05,
                   help="seed 000: amortized time per token improves less than this per step "
                        "(default 0.05)")
    k.add_argument("--knee-doubling", type=positive_float, default=0.15,
                   help="seed 004: throughput gains less than this per doubling (default 0.15)")
    k.add_argument("--max-tpot-ms", type=positive_float, default=None,
                   help="per-request TPOT SLA in ms: the largest batch that meets it")
    k.add_argument("--bca-epsilon-tok-s", type=positive_float, default=None,
                   help="BCA (Recasens et al. 2025): throughput gain per added sequence that "
                        "counts as flat, tok/s (default: 10%% of T(B)/B at the batch judged)")
    k.add_argument("--bca-latency-factor", type=positive_float, default=5.0,
                   help="BCA: TPOT may grow to this multiple of TPOT at the reference batch "
                        "(default 5)")
    k.add_argument("--bca-reference-batch", type=positive_int, default=32,
                   help="BCA: reference batch for the latency bound (default 32)")
    f = p.add_argument_group("fit")
    f.add_argument("--fit-overhead", action="store_true",
                   help="also fit a constant overhead d: step = d + max(a + bB, cB) (needs "
                        "points past the roof)")
    f.add_argument("--bootstrap", type=int, default=200, metavar="N",
                   help="bootstrap resamples for the intervals (default 200; 0: none)")
    f.add_argument("--seed", type=seed_int, default=0, help="bootstrap seed (default 0)")
    p.add_argument("--json", action="store_true", help="print one JSON object (contract)")
    p.add_argument("--plot", default=None, metavar="FILE.png|.svg",
                   help="also draw the points, the fit and its predictions (needs bstar[plot])")
    add_force_argument(p)


def run_fit(args: argparse.Namespace) -> int:
    from bstar.report import save_fit_plot
    from bstar.report.text import print_fit

    result, spec = fit_from_args(args)

    def data() -> dict[str, Any]:
        out = result.to_dict()
        if spec:
            out["spec"] = dict(spec)
        return out

    return emit(args, data, lambda: print_fit(result, spec),
                lambda path: save_fit_plot(result, path))


def fit_from_args(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """The FitResult and the spec terms for these flags (shared with `bstar report fit`)."""
    from bstar.errors import BstarError
    from bstar.fit import KneeRules, fit_points, load_points

    if not 0 <= args.bootstrap <= MAX_BOOTSTRAP:
        # Each resample is a whole fit, so the count bounds the run time; 10,000 is 50x the
        # default and far past where more resamples move a percentile interval.
        raise BstarError(f"--bootstrap must be between 0 and {MAX_BOOTSTRAP:,}, got "
                         f"{args.bootstrap:,}")
    points = load_points(args.points)
    spec = deployment_options(args).spec_terms(args.context)
    result = fit_points(
        points, predict=args.predict or (), critical_batch=args.critical_batch,
        compute_ms_per_seq=spec.get("compute_ms_per_seq"), fit_overhead=args.fit_overhead,
        knees=KneeRules(step=args.knee_step, doubling=args.knee_doubling,
                        max_tpot_ms=args.max_tpot_ms,
                        bca_epsilon_tok_s=args.bca_epsilon_tok_s,
                        bca_latency_factor=args.bca_latency_factor,
                        bca_reference_batch=args.bca_reference_batch),
        n_bootstrap=args.bootstrap,
        seed=args.seed, weight_bytes=spec.get("weight_bytes"),
        kv_bytes_per_seq=spec.get("kv_bytes_per_seq"),
        flops_per_token=spec.get("flops_per_token"))
    return result, spec


def report_fit(args: argparse.Namespace) -> int:
    """`bstar report fit`: this command's page (`commands/report.py`)."""
    return report_written(args, lambda: _report_fit(args))


def _report_fit(args: argparse.Namespace) -> tuple[Any, dict[str, Any] | None]:
    from bstar.report import save_fit_plot, write_fit_report

    result, _spec = fit_from_args(args)
    path = write_fit_report(result, args.output, command_line(), deployment_options(args),
                            args.context)
    if getattr(args, "plot", None):
        save_fit_plot(result, args.plot)
    return path, {"knee_batch": result.knee_batch}
