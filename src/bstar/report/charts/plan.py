"""The plan's pictures: latency, throughput and the roofline per context, and the overview."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from bstar.report.charts.base import (
    AMORT_COLOR,
    CONTEXT_COLORS,
    MARK,
    REGIME_COLOR,
    TPOT_COLOR,
    TPUT_COLOR,
    Chart,
    _fmt,
    _legend_below,
    _log2_axis,
    _mark_batches,
    _new_figure,
    _plain_log_y,
    _shade_regimes,
    _style,
    _thousands,
    _Tips,
)

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.axes import Axes


def _plan_title(p: dict[str, Any]) -> str:
    gpus = f"{p['num_gpus']} x {p.get('gpu_name') or p['gpu']}" if p["num_gpus"] > 1 \
        else (p.get("gpu_name") or p["gpu"])
    return f"{p['model']} on {gpus}"


def draw_latency(ax: Axes, p: dict[str, Any], c: dict[str, Any], tips: _Tips) -> None:
    """Per-request TPOT and amortized time per token against batch, regimes shaded."""
    dn = c["dense"]
    _log2_axis(ax, 1, dn["batch"][-1])
    _shade_regimes(ax, c)
    ax.set_yscale("log")
    ax.plot(dn["batch"], dn["tpot_ms"], color=TPOT_COLOR,
            label="per-request TPOT (= step time)", zorder=4)
    ax.plot(dn["batch"], dn["amortized_ms_per_token"], color=AMORT_COLOR,
            label="amortized ms/token (= step / batch)", zorder=4)
    ax.axhline(c["amortized_floor_ms"], color=AMORT_COLOR, linestyle=(0, (2, 2)), linewidth=1.2,
               label=f"floor kv_per_seq / BW = {_fmt(c['amortized_floor_ms'], 'ms')}")
    for pt in c["curve"]:
        b = pt["batch"]
        head = f"batch {b} · {pt['regime']}" + (
            f" (running {pt['running_batch']})" if pt.get("running_batch", b) != b else "")
        body = (f"{head}\nper-request TPOT {_fmt(pt['tpot_ms'], 'ms')}\namortized "
                f"{_fmt(pt['amortized_ms_per_token'], 'ms/token')}\nthroughput "
                f"{_fmt(pt['throughput_tok_s'], 'tok/s')}")
        tips.point(ax, b, pt["tpot_ms"], body, color=TPOT_COLOR)
        tips.point(ax, b, pt["amortized_ms_per_token"], body, color=AMORT_COLOR)
    if p.get("max_tpot_ms"):
        ax.axhline(p["max_tpot_ms"], color=MARK["sla"][0], linestyle=MARK["sla"][1],
                   linewidth=1.2, label=f"SLA TPOT ≤ {p['max_tpot_ms']:g} ms")
    _mark_batches(ax, c)
    rec = c["recommendation"]["max_num_seqs"]
    y_rec = _interp(dn["batch"], dn["tpot_ms"], rec)
    tips.point(ax, rec, y_rec, f"recommended max_num_seqs = {rec}\n{c['recommendation']['reason']}",
               marker="*", markersize=15, color=MARK["rec"][0], label=f"recommended {rec}",
               zorder=7)
    _plain_log_y(ax)
    ax.set_ylabel("milliseconds (log scale)")
    ax.set_title(f"Time per token vs batch · context {c['context_tokens']:,} tokens")
    _legend_below(ax)




def _interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    import numpy as np

    return float(np.exp(np.interp(np.log(x), np.log(xs), np.log(ys))))


def draw_throughput(ax: Axes, p: dict[str, Any], c: dict[str, Any], tips: _Tips) -> None:
    dn = c["dense"]
    _log2_axis(ax, 1, dn["batch"][-1])
    _shade_regimes(ax, c)
    ys = dn["throughput_tok_s"]
    ax.plot(dn["batch"], ys, color=TPUT_COLOR, label="predicted throughput", zorder=4)
    top = max(ys)
    ymax = top * 1.08
    # Draw a roof where it is near the curve; far above, name it in the legend only.
    for value, color, ls, lw, name in (
            (c["throughput_ceiling_kv_tok_s"], AMORT_COLOR, (0, (2, 2)), 1.2,
             "KV-read ceiling BW / kv_per_seq"),
            (c["compute_roof_tok_s"], MARK["crossover"][0], "-", 1.6, "compute roof")):
        if value <= 2.0 * top:
            ax.axhline(value, color=color, linestyle=ls, linewidth=lw,
                       label=f"{name} = {_fmt(value, 'tok/s')}")
            ymax = max(ymax, value * 1.08)
        else:
            ax.plot([], [], color=color, linestyle=ls, linewidth=lw,
                    label=f"{name} = {_fmt(value, 'tok/s')} (above the chart)")
    for pt in c["curve"]:
        tips.point(ax, pt["batch"], pt["throughput_tok_s"],
                   f"batch {pt['batch']} · {pt['regime']}\nthroughput "
                   f"{_fmt(pt['throughput_tok_s'], 'tok/s')}\nper-request TPOT "
                   f"{_fmt(pt['tpot_ms'], 'ms')}", color=TPUT_COLOR)
    _mark_batches(ax, c)
    rec = c["recommendation"]["max_num_seqs"]
    tips.point(ax, rec, _interp(dn["batch"], ys, rec),
               f"recommended max_num_seqs = {rec}\n{c['recommendation']['reason']}",
               marker="*", markersize=15, color=MARK["rec"][0], label=f"recommended {rec}",
               zorder=7)
    ax.set_ylim(0, ymax)
    ax.yaxis.set_major_formatter(_thousands())
    ax.set_ylabel("output tokens / s (all sequences)")
    ax.set_title(f"Throughput vs batch · context {c['context_tokens']:,} tokens")
    _legend_below(ax, ncol=2)






def draw_roofline(ax: Axes, p: dict[str, Any], tips: _Tips) -> None:
    """Attainable FLOP/s per GPU against arithmetic intensity, each batch a point on it
    (Williams et al. 2009; seed 000's AI(B) = 2BP / (W + B kv_per_seq))."""
    import numpy as np

    r = p["roof"]
    peak, bw = r["peak_flops_per_gpu"], r["hbm_bandwidth_bytes_s_per_gpu"]
    ridge = peak / bw
    ais = [pt["arithmetic_intensity"] for c in p["contexts"] for pt in c["curve"]]
    lo = min(min(ais) / 2.5, 0.5)
    hi = max(max(ais), ridge) * 6
    x = np.geomspace(lo, hi, 300)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.axvspan(lo, ridge, color="#1f4e9c", alpha=0.05, linewidth=0)
    ax.axvspan(ridge, hi, color=REGIME_COLOR["compute-bound"], alpha=0.06, linewidth=0)
    ax.text(math.sqrt(lo * ridge), 0.985, "memory-bound", transform=ax.get_xaxis_transform(),
            ha="center", va="top", fontsize=9, color="#1f4e9c", fontweight="bold")
    ax.text(math.sqrt(ridge * hi), 0.985, "compute-bound", transform=ax.get_xaxis_transform(),
            ha="center", va="top", fontsize=9, color=REGIME_COLOR["compute-bound"],
            fontweight="bold")
    ax.plot(x, np.minimum(peak, x * bw), color="#424242", linewidth=2.2,
            label=f"datasheet roof: {bw / 1e12:.2f} TB/s, {peak / 1e12:.0f} TFLOP/s "
                  f"({r['compute']})")
    ax.plot(x, np.minimum(peak * r["compute_eff"], x * bw * r["bandwidth_eff"]),
            color="#424242", linewidth=1.3, linestyle=(0, (5, 3)),
            label=f"with efficiencies: bandwidth x{r['bandwidth_eff']:g}, compute "
                  f"x{r['compute_eff']:g}")
    ax.axvline(ridge, color="#616161", linestyle=(0, (1, 2)), linewidth=1.2)
    ax.annotate(f"ridge {ridge:.0f} FLOP/byte", xy=(ridge, peak), xytext=(6, -14),
                textcoords="offset points", fontsize=8.5, color="#424242")
    for i, c in enumerate(p["contexts"]):
        color = CONTEXT_COLORS[i % len(CONTEXT_COLORS)]
        dn = c["dense"]
        # Past B_mem the running batch stops growing: those points sit on B_mem's.
        keep = [j for j, b in enumerate(dn["batch"]) if b <= max(c["b_mem"], 1)]
        ax.plot([dn["arithmetic_intensity"][j] for j in keep],
                [dn["achieved_flops_s_per_gpu"][j] for j in keep], color=color, linewidth=1.4,
                alpha=0.75, label=f"context {c['context_tokens']:,}: AI(B) → "
                                  f"{c['ai_limit_flops_per_byte']:.0f} as B → ∞")
        pts = [pt for pt in c["curve"] if pt["batch"] <= max(c["b_mem"], 1)]
        for pt in pts:
            tips.point(ax, pt["arithmetic_intensity"], pt["achieved_flops_s_per_gpu"],
                       f"context {c['context_tokens']:,}, batch {pt['batch']}\nAI "
                       f"{pt['arithmetic_intensity']:.1f} FLOP/byte\nachieved "
                       f"{pt['achieved_flops_s_per_gpu'] / 1e12:.1f} TFLOP/s per GPU\n"
                       f"{pt['regime']}", color=color, markersize=5)
        # Label the largest batch of each context, and batch 1 once (they coincide).
        for pt in ([pts[0]] if i == 0 else []) + pts[-1:]:
            ax.annotate(f"B={pt['batch']}", xy=(pt["arithmetic_intensity"],
                        pt["achieved_flops_s_per_gpu"]), xytext=(4, -11),
                        textcoords="offset points", fontsize=7.5, color=color)
    ax.set_xlim(lo, hi)
    ys = [pt["achieved_flops_s_per_gpu"] for c in p["contexts"] for pt in c["curve"]]
    ax.set_ylim(min(ys) / 3, peak * 2.2)
    ax.set_xlabel("arithmetic intensity (FLOP / byte from HBM)")
    ax.set_ylabel("FLOP/s per GPU (log scale)")
    ax.set_title("Roofline: every batch size is a point")
    ax.yaxis.set_major_formatter(_si_flops())
    _legend_below(ax, ncol=2)


def _si_flops() -> Any:
    from matplotlib.ticker import FuncFormatter

    def f(v: float, _: Any) -> str:
        for div, suf in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M")):
            if v >= div:
                return f"{v / div:g} {suf}"
        return f"{v:g}"
    return FuncFormatter(f)


_LATENCY_CAPTION = ("Per-request TPOT (what one user waits between tokens) is the step time; "
                    "the amortized time per token (step / batch = 1 / throughput) falls toward "
                    "its floor. Shaded bands: the regimes. Hover a point for its values.")
_THROUGHPUT_CAPTION = ("Throughput climbs while the weights dominate the bytes read, bends "
                       "after B*, and stops at B_mem, where the KV cache is full.")


def plan_charts_for_context(p: dict[str, Any], c: dict[str, Any]) -> list[Chart]:
    """The latency and the throughput chart of one context of a plan view."""
    out = []
    ctx = c["context_tokens"]
    for kind, draw, cap in (("latency", draw_latency, _LATENCY_CAPTION),
                            ("throughput", draw_throughput, _THROUGHPUT_CAPTION)):
        fig = _new_figure(7.6, 5.0)
        tips = _Tips(f"{kind}-{ctx}")
        with _style():
            draw(fig.add_subplot(), p, c, tips)
            fig.suptitle(_plan_title(p), x=0.01, ha="left", fontsize=9.5, color="#555555")
        out.append(Chart(f"{kind}-{ctx}", f"{kind.title()} · context {ctx:,}", fig, tips.tips,
                         cap))
    return out


def roofline_chart(p: dict[str, Any]) -> Chart:
    fig = _new_figure(9.0, 5.8)
    tips = _Tips("roofline")
    with _style():
        draw_roofline(fig.add_subplot(), p, tips)
        fig.suptitle(_plan_title(p), x=0.01, ha="left", fontsize=9.5, color="#555555")
    return Chart("roofline", "Roofline", fig, tips.tips,
                 "Decode sits left of the ridge: more sequences per step raise the FLOPs per "
                 "byte, but each sequence's own KV read caps how far.")


def plan_charts(p: dict[str, Any]) -> list[Chart]:
    """Every chart of a plan view: latency and throughput per context, then the roofline."""
    return [ch for c in p["contexts"] for ch in plan_charts_for_context(p, c)] \
        + [roofline_chart(p)]


def plan_overview(p: dict[str, Any]) -> Chart:
    """All of a plan on one image (for `bstar plan --plot`): a row per context with latency
    and throughput, and the roofline."""
    n = len(p["contexts"])
    fig = _new_figure(15.5, 5.0 * n + 5.6)
    tips = _Tips("overview")
    with _style():
        gs = fig.add_gridspec(n + 1, 2, height_ratios=[1.0] * n + [1.12])
        for i, c in enumerate(p["contexts"]):
            draw_latency(fig.add_subplot(gs[i, 0]), p, c, tips)
            draw_throughput(fig.add_subplot(gs[i, 1]), p, c, tips)
        draw_roofline(fig.add_subplot(gs[n, :]), p, tips)
        fig.suptitle(f"bstar plan · {_plan_title(p)}", x=0.01, ha="left", fontsize=14,
                     fontweight="bold")
    return Chart("plan", "Plan", fig, tips.tips)


