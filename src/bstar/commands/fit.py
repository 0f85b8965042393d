"""`bstar fit POINTS`: fit measured points, extrapolate past the compute roof, find the knee."""

from __future__ import annotations

import argparse
import json
from typing import Any

from bstar.commands.common import deployment_options, int_list, positive_float, positive_int


def add_fit_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("points", metavar="POINTS",
                   help="CSV or JSON with 'batch' and at least one of 'throughput_tok_s', "
                        "'tpot_ms' (the other is derived: throughput = batch / TPOT); or a "
                        "sweep result (--json of bstar sweep)")
    p.add_argument("--predict", type=int_list, default=None,
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
    g.add_argument("--num-gpus", type=positive_int, default=1,
                   help="tensor-parallel degree (default: 1)")
    g.add_argument("--dtype", default="", help="weight precision (default: the checkpoint's)")
    g.add_argument("--kv-dtype", default="bf16", help="KV cache precision (default: bf16)")
    g.add_argument("--context", type=positive_int, default=None,
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
                        "counts as flat, tok/s (default: 10%% of T(B0)/B0)")
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
    f.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    p.add_argument("--json", action="store_true", help="print one JSON object (contract)")
    p.add_argument("--plot", default=None, metavar="FILE.png|.svg",
                   help="also draw the points, the fit and its predictions (needs bstar[plot])")


def run_fit(args: argparse.Namespace) -> int:
    result, spec = fit_from_args(args)
    if getattr(args, "plot", None):
        import sys

        from bstar.report import save_fit_plot

        # stderr: --json keeps stdout to the one JSON object.
        print(f"plot written to {save_fit_plot(result, args.plot)}", file=sys.stderr)
    if args.json:
        out = result.to_dict()
        if spec:
            out["spec"] = {k: v for k, v in spec.items()}
        print(json.dumps(out, indent=2))
        return 0
    print_fit(result, spec)
    return 0


def fit_from_args(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """The FitResult and the spec terms for these flags (shared with `bstar report fit`)."""
    from bstar.errors import BstarError
    from bstar.fit import KneeRules, fit_points, load_points, spec_terms

    if args.bootstrap < 0:
        raise BstarError("--bootstrap must not be negative")
    points = load_points(args.points)
    spec = spec_terms(deployment_options(args), args.context)
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


# ---- human output ---------------------------------------------------------------------------
def _iv(v: tuple[float, float] | None, fmt: str) -> str:
    return f" [{format(v[0], fmt)}, {format(v[1], fmt)}]" if v else ""


def print_fit(r: Any, spec: dict[str, Any] | None = None) -> None:
    """Render a FitResult (bstar.fit) as text and rich tables."""
    from rich.table import Table

    from bstar.report.text import console
    from bstar.fit import INTERVAL_PCT, LOSS, LOSS_SCALE
    from bstar.units import fmt_bytes

    spec = spec or {}
    c = console()
    p, pts = r.params, r.points
    lo, hi = INTERVAL_PCT
    c.print(f"[bold]bstar fit[/] {pts.source}: {len(pts)} points; step(B) = "
            + ("d + " if r.fit_overhead else "") + "max(a + b*B, c*B), robust "
            f"({LOSS} on log step time, scale {LOSS_SCALE:g}); intervals are the "
            f"{lo:g}th-{hi:g}th percentiles of {r.n_bootstrap} bootstrap refits (seed {r.seed})")
    for w in r.warnings:
        c.print(f"[yellow]warning:[/] {w}")
    bw = r.weight_bandwidth_bytes_s
    c.print(f"  a = [bold]{p.a_ms:.4g} ms[/]{_iv(r.param_intervals.get('a_ms'), '.4g')}  per "
            "step, whatever the batch: weight reads + fixed engine overhead"
            + (f"; {fmt_bytes(r.weight_bytes)} of weights ({spec.get('model_name')}) in a = "
               f"{bw / 1e12:.2f} TB/s if a were all weight reads" if bw else ""))
    kvbw = r.kv_bandwidth_bytes_s
    c.print(f"  b = [bold]{p.b_ms:.4g} ms[/]{_iv(r.param_intervals.get('b_ms'), '.4g')}  per "
            "sequence per step: its KV-cache reads (memory side)"
            + (f"; {fmt_bytes(r.kv_bytes_per_seq)} of KV per sequence at "
               f"{spec.get('context')} tokens = {kvbw / 1e12:.2f} TB/s" if kvbw else ""))
    if p.c_ms is not None:
        fl = r.achieved_flops
        src = ""
        if r.roof_source == "cost-model":
            src = (f"; the cost model's: {spec.get('model_name')} on {spec.get('gpu_name')} "
                   f"at {spec.get('flops_eff'):g} of peak")
        elif fl:
            src = (f"; {r.flops_per_token / 1e9:.1f} GFLOP per token in c = "
                   f"{fl / 1e12:.0f} TFLOP/s achieved")
        c.print(f"  c = [bold]{p.c_ms:.4g} ms[/]{_iv(r.param_intervals.get('c_ms'), '.4g')}  "
                "per sequence per step on the compute side (its FLOPs at the achieved rate)"
                + src)
    else:
        c.print("  c = [bold]unknown[/]  the points do not reach the compute roof")
    if r.fit_overhead:
        c.print(f"  d = {p.overhead_ms:.4g} ms  constant overhead on both lines")
    c.print(f"  B* = a/b = [bold]{p.b_star:.1f}[/]{_iv(r.param_intervals.get('b_star'), '.1f')}"
            "  (KV reads per step reach the weight term; seed 000)")
    cross = p.crossover_batch
    if cross is not None:
        c.print(f"  compute roof: memory line meets compute line at B = {cross:.1f}; "
                f"throughput plateau {1e3 / p.c_ms:,.0f} tok/s")
    c.print(f"  roof: [bold]{r.roof_source}[/]: {r.roof_note}")
    for n in r.notes:
        c.print(f"  [dim]note:[/] {n}")

    t = Table(title="measured points and the fit", show_edge=False)
    for col in ("batch", "throughput\ntok/s", "TPOT ms\n(per request)", "fitted\nTPOT ms",
                "residual", "regime"):
        t.add_column(col, justify="left" if col == "regime" else "right")
    for i, b in enumerate(pts.batch):
        d = pts.derived[i]
        star_t = "*" if d == "throughput_tok_s" else ""
        star_p = "*" if d == "tpot_ms" else ""
        flag = " outlier" if b in r.outliers else ""
        t.add_row(str(b), f"{pts.throughput_tok_s[i]:,.0f}{star_t}",
                  f"{pts.tpot_ms[i]:.4g}{star_p}", f"{r.fitted_tpot_ms[i]:.4g}",
                  f"{r.residual_pct[i]:+.1f}%{flag}", r.regimes[i])
    c.print(t)
    if any(pts.derived):
        c.print("  [dim]* derived: throughput = batch / TPOT[/]")

    t = Table(title=f"predictions ({lo:g}-{hi:g}% interval)", show_edge=False)
    for col in ("batch", "throughput tok/s", "TPOT ms (per request)", "regime", "note"):
        t.add_column(col, justify="left" if col in ("regime", "note") else "right")
    for pr in r.predictions:
        note = ""
        if pr.bound == "tpot_lower_bound":
            note = ("roof unknown: TPOT at least this, throughput at most; high = roof at "
                    f"the last point (B={pts.batch[-1]})")
        elif pr.extrapolated:
            note = "extrapolated past the data"
        t.add_row(str(pr.batch),
                  f"{pr.throughput_tok_s:,.0f} [{pr.throughput_low_tok_s:,.0f}, "
                  f"{pr.throughput_high_tok_s:,.0f}]",
                  f"{pr.tpot_ms:.4g} [{pr.tpot_low_ms:.4g}, {pr.tpot_high_ms:.4g}]",
                  pr.regime, note)
    c.print(t)

    t = Table(title="knee by rule", show_edge=False)
    for col in ("rule", "fitted curve", "measured points", "why (fitted curve)"):
        t.add_column(col, justify="right" if col in ("fitted curve", "measured points")
                     else "left")
    names = {"step": "seed 000: <5%/step", "doubling": "seed 004: <15%/doubling",
             "bca": "BCA (Recasens 2025)", "sla": "SLA"}
    if r.max_tpot_ms is not None:
        names["sla"] = f"SLA TPOT <= {r.max_tpot_ms:g} ms"
    for rule, kf in r.knees_fitted.items():
        km = r.knees_measured.get(rule)
        t.add_row(names.get(rule, rule), "-" if kf.batch is None else str(kf.batch),
                  "-" if km is None or km.batch is None else str(km.batch), kf.reason)
    c.print(t)
    if r.knee_batch is not None:
        c.print(f"[bold green]knee: B = {r.knee_batch}[/] ({r.knee_rule} rule on the fitted "
                "curve)")
    elif r.knee_rule == "sla":
        c.print("[bold red]knee: none[/]: no batch meets the TPOT limit")
    else:
        c.print("[bold]knee: not within the curve[/] (no rule fires where the fit is "
                "trusted)")
