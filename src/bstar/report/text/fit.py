"""`bstar fit`: the fitted step-time model with its intervals, the points beside the fit,
the predictions and the knee by rule."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bstar.report.text._common import console, elided, gap_row
from bstar.report.text._common import markup_text as mt
from bstar.units import fmt_bytes

if TYPE_CHECKING:
    from rich.console import Console


def interval(v: tuple[float, float] | None, fmt: str) -> str:
    """' [low, high]' after a fitted value, nothing when it has no interval."""
    return f" [{format(v[0], fmt)}, {format(v[1], fmt)}]" if v else ""


def print_fit(r: Any, spec: dict[str, Any] | None = None) -> None:
    """Render a FitResult (bstar.fit) as text and rich tables."""
    from bstar.fit import INTERVAL_PCT, LOSS, LOSS_SCALE

    spec = spec or {}
    c = console()
    p, pts = r.params, r.points
    lo, hi = INTERVAL_PCT
    c.print(f"[bold]bstar fit[/] {mt(pts.source, 400)}: {len(pts)} points; step(B) = "
            + ("d + " if r.fit_overhead else "") + "max(a + b*B, c*B), robust "
            f"({LOSS} on log step time, scale {LOSS_SCALE:g}); intervals are the "
            f"{lo:g}th-{hi:g}th percentiles of {r.n_bootstrap} bootstrap refits (seed {r.seed})")
    for w in r.warnings:
        c.print(f"[yellow]warning:[/] {w}")
    bw = r.weight_bandwidth_bytes_s
    c.print(f"  a = [bold]{p.a_ms:.4g} ms[/]{interval(r.param_intervals.get('a_ms'), '.4g')}  per "
            "step, whatever the batch: weight reads + fixed engine overhead"
            + (f"; {fmt_bytes(r.weight_bytes)} of weights ({spec.get('model_name')}) in a = "
               f"{bw / 1e12:.2f} TB/s if a were all weight reads" if bw else ""))
    kvbw = r.kv_bandwidth_bytes_s
    c.print(f"  b = [bold]{p.b_ms:.4g} ms[/]{interval(r.param_intervals.get('b_ms'), '.4g')}  per "
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
        c.print(f"  c = [bold]{p.c_ms:.4g} ms[/]{interval(r.param_intervals.get('c_ms'), '.4g')}  "
                "per sequence per step on the compute side (its FLOPs at the achieved rate)"
                + src)
    else:
        c.print("  c = [bold]unknown[/]  the points do not reach the compute roof")
    if r.fit_overhead:
        c.print(f"  d = {p.overhead_ms:.4g} ms  constant overhead on both lines")
    b_star = interval(r.param_intervals.get("b_star"), ".1f")
    c.print(f"  B* = a/b = [bold]{p.b_star:.1f}[/]{b_star}  (KV reads per step reach the "
            "weight term; seed 000)")
    cross = p.crossover_batch
    if cross is not None:
        c.print(f"  compute roof: memory line meets compute line at B = {cross:.1f}; "
                f"throughput plateau {1e3 / p.c_ms:,.0f} tok/s")
    c.print(f"  roof: [bold]{r.roof_source}[/]: {r.roof_note}")
    for n in r.notes:
        c.print(f"  [dim]note:[/] {n}")
    print_fit_tables(c, r)


def print_fit_tables(c: Console, r: Any) -> None:
    """The points beside the fit, the predictions with intervals, the knee by rule."""
    from rich.table import Table

    from bstar.fit import INTERVAL_PCT

    pts = r.points
    outliers = set(r.outliers)
    lo, hi = INTERVAL_PCT
    t = Table(title="measured points and the fit", show_edge=False)
    for col in ("batch", "throughput\ntok/s", "TPOT ms\n(per request)", "fitted\nTPOT ms",
                "residual", "regime"):
        t.add_column(col, justify="left" if col == "regime" else "right")
    for i in elided(len(pts.batch)):
        if i is None:
            t.add_row("", "", "", "", "", f"[dim]{gap_row(len(pts.batch))}[/]")
            continue
        b = pts.batch[i]
        d = pts.derived[i]
        star_t = "*" if d == "throughput_tok_s" else ""
        star_p = "*" if d == "tpot_ms" else ""
        flag = " outlier" if b in outliers else ""
        t.add_row(str(b), f"{pts.throughput_tok_s[i]:,.0f}{star_t}",
                  f"{pts.tpot_ms[i]:.4g}{star_p}", f"{r.fitted_tpot_ms[i]:.4g}",
                  f"{r.residual_pct[i]:+.1f}%{flag}", r.regimes[i])
    c.print(t)
    if any(pts.derived):
        c.print("  [dim]* derived: throughput = batch / TPOT[/]")

    t = Table(title=f"predictions ({lo:g}-{hi:g}% interval)", show_edge=False)
    for col in ("batch", "throughput tok/s", "TPOT ms (per request)", "regime", "note"):
        t.add_column(col, justify="left" if col in ("regime", "note") else "right")
    for j in elided(len(r.predictions)):
        if j is None:
            t.add_row("", "", "", "", f"[dim]{gap_row(len(r.predictions))}[/]")
            continue
        pr = r.predictions[j]
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
