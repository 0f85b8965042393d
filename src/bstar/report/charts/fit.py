"""Measured points, the fitted model, its extrapolation with intervals and predictions."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from bstar.report.charts.base import (
    AMORT_COLOR,
    FIT_COLOR,
    KNEE_RULE,
    MARK,
    MEASURED_COLOR,
    REGIME_COLOR,
    Chart,
    _fmt,
    _log2_axis,
    _new_figure,
    _plain_log_y,
    _shared_legend,
    _style,
    _thousands,
    _Tips,
    _vline,
)
from bstar.report.words import FIT_BOUND_WORDS, words

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.axes import Axes


def _fit_fitted_line(ax: Axes, dn: dict[str, Any], key: str, color: str) -> None:
    last = dn["last_measured_batch"]
    xs, ys = dn["batch"], dn[key]
    inside = [(x, y) for x, y in zip(xs, ys, strict=True) if x <= last * 1.0001]
    beyond = [(x, y) for x, y in zip(xs, ys, strict=True) if x >= last * 0.9999]
    ax.plot([x for x, _ in inside], [y for _, y in inside], color=color, zorder=3,
            label="fit over the measured range")
    if len(beyond) > 1:
        ax.plot([x for x, _ in beyond], [y for _, y in beyond], color=color,
                linestyle=(0, (5, 3)), zorder=3, label="extrapolation")


def _fit_bands(ax: Axes, f: dict[str, Any]) -> None:
    pr = f["params"]
    lo, hi = ax.get_xlim()
    cross = pr.get("crossover_batch")
    last = f["dense"]["last_measured_batch"]
    if cross is not None and lo < cross < hi:
        ax.axvspan(lo, cross, color="#1f4e9c", alpha=0.05, linewidth=0, zorder=0)
        ax.axvspan(cross, hi, color=REGIME_COLOR["compute-bound"], alpha=0.07, linewidth=0,
                   zorder=0)
        for a, b, name, color in ((lo, cross, "memory-bound", "#1f4e9c"),
                                  (cross, hi, "compute-bound", REGIME_COLOR["compute-bound"])):
            if math.log(b / a) / math.log(hi / lo) > 0.16:
                ax.text(math.sqrt(a * b), 0.985, name, transform=ax.get_xaxis_transform(),
                        ha="center", va="top", fontsize=8.5, color=color, fontweight="bold")
    elif pr.get("roof") == "unknown" and last < hi:
        ax.axvspan(last, hi, facecolor="#f5f5f5", edgecolor="#d0d0d0", hatch="//",
                   linewidth=0, zorder=0)
        ax.text(math.sqrt(last * hi), 0.985, "roof unknown past the data",
                transform=ax.get_xaxis_transform(), ha="center", va="top", fontsize=8.5,
                color="#616161", fontweight="bold")


def _fit_marks(ax: Axes, f: dict[str, Any]) -> None:
    pr = f["params"]
    cross = pr.get("crossover_batch")
    if cross is not None:
        what = {"critical-batch": "given critical batch", "data": "roof seen in the data",
                "cost-model": "roof from the cost model"}.get(pr.get("roof", ""), "roof")
        _vline(ax, cross, "crossover", f"compute crossover = {cross:.0f} ({what})")
    if pr.get("b_star") is not None:
        _vline(ax, pr["b_star"], "b_star", f"fitted B* = a / b = {pr['b_star']:.0f}")
    if f.get("knee_batch"):
        rule = KNEE_RULE.get(f.get("knee_rule") or "", f.get("knee_rule") or "")
        _vline(ax, f["knee_batch"], "knee", f"knee = {f['knee_batch']}"
               + (f" ({rule})" if rule else ""))


def fit_chart(f: dict[str, Any]) -> Chart:
    """Measured points, the fitted step-time model and its extrapolation with intervals."""
    dn = f["dense"]
    pts = f["points"]
    fig = _new_figure(14.0, 5.6)
    tips = _Tips("fit")
    with _style():
        a_tpot, a_tput = fig.subplots(1, 2)
        for ax in (a_tpot, a_tput):
            _log2_axis(ax, 1, dn["batch"][-1])
            _fit_bands(ax, f)
        _fit_fitted_line(a_tpot, dn, "tpot_ms", FIT_COLOR)
        _fit_fitted_line(a_tput, dn, "throughput_tok_s", FIT_COLOR)
        for ax, key, unit, name in ((a_tpot, "tpot_ms", "ms", "TPOT"),
                                    (a_tput, "throughput_tok_s", "tok/s", "throughput")):
            for p in pts:
                if p.get(key) is None:
                    continue
                out = p.get("outlier")
                tips.point(ax, p["batch"], p[key],
                           f"measured at batch {p['batch']}: {name} {_fmt(p[key], unit)}\n"
                           f"fit: TPOT {_fmt(p['fitted_tpot_ms'], 'ms')} "
                           f"({p['residual_pct']:+.1f}%)" + ("\noutlier" if out else ""),
                           color=REGIME_COLOR["memory-exhausted"] if out else MEASURED_COLOR,
                           markersize=8, markerfacecolor="white" if out else None)
            ax.plot([], [], marker="o", linestyle="none", color=MEASURED_COLOR,
                    label="measured")
            for qi, q in enumerate(f["predictions"]):
                lo_v, hi_v = q["low"][key], q["high"][key]
                ax.errorbar([q["batch"]], [q[key]], yerr=[[q[key] - lo_v], [hi_v - q[key]]],
                            fmt="none", ecolor=FIT_COLOR, elinewidth=1.6, capsize=5, zorder=5)
                tips.point(ax, q["batch"], q[key],
                           f"predicted at batch {q['batch']} "
                           f"({words(q['regime'])}): "
                           f"{name} {_fmt(q[key], unit)}\ninterval {_fmt(lo_v, unit)} – "
                           f"{_fmt(hi_v, unit)}"
                           + (f"\n{FIT_BOUND_WORDS.get(q['bound'], q['bound'])}"
                              if q.get("bound") else ""),
                           marker="D", markersize=8, color=FIT_COLOR)
                # Alternate above/below: predictions on a plateau share one height.
                ax.annotate(_fmt(q[key], unit), xy=(q["batch"], q[key]),
                            xytext=(7, 6 if qi % 2 == 0 else -15),
                            textcoords="offset points", fontsize=8.5, color=FIT_COLOR,
                            fontweight="bold")
            if f["predictions"]:
                ax.plot([], [], marker="D", linestyle="none", color=FIT_COLOR,
                        label="prediction (interval: bootstrap 5–95%)")
            _fit_marks(ax, f)
        pr = f["params"]
        if f.get("max_tpot_ms"):
            a_tpot.axhline(f["max_tpot_ms"], color=MARK["sla"][0], linestyle=MARK["sla"][1],
                           linewidth=1.2, label=f"SLA TPOT ≤ {f['max_tpot_ms']:g} ms")
        a_tpot.set_yscale("log")
        _plain_log_y(a_tpot)
        a_tpot.set_ylabel("per-request TPOT, ms (log scale)")
        a_tpot.set_title("Per-request TPOT: measured and fitted")
        if pr.get("plateau_tok_s"):
            a_tput.axhline(pr["plateau_tok_s"], color=MARK["crossover"][0], linewidth=1.4,
                           label=f"compute roof = {_fmt(pr['plateau_tok_s'], 'tok/s')}")
        # Every measured point and prediction stays on the chart, not only the fitted line.
        top = max([*dn["throughput_tok_s"], *(p["throughput_tok_s"] for p in pts
                                               if p.get("throughput_tok_s") is not None),
                   *(q["throughput_tok_s"] for q in f["predictions"])])
        ceil = pr.get("memory_ceiling_tok_s")
        if ceil and ceil <= 2 * top:
            a_tput.axhline(ceil, color=AMORT_COLOR, linestyle=(0, (2, 2)), linewidth=1.2,
                           label=f"memory ceiling 1 / b = {_fmt(ceil, 'tok/s')}")
        a_tput.set_ylim(0, max(top, ceil if ceil and ceil <= 2 * top else 0) * 1.12)
        a_tput.yaxis.set_major_formatter(_thousands())
        a_tput.set_ylabel("output tokens / s")
        a_tput.set_title("Throughput: measured and fitted")
        _shared_legend(fig, (a_tpot, a_tput))
        fig.suptitle(f"bstar fit · step(B) = {pr['a_ms']:.3g} + {pr['b_ms']:.3g}·B ms"
                     + (f", roof {pr['c_ms']:.3g}·B ms" if pr.get("c_ms") else "")
                     + (f" + {pr['overhead_ms']:.3g} ms" if pr.get("overhead_ms") else ""),
                     x=0.01, ha="left", fontsize=13, fontweight="bold")
    return Chart("fit", "Fit", fig, tips.tips,
                 "Dots: measured. Solid: the fitted step-time model over the measured range; "
                 "dashed: its extrapolation. Diamonds: predictions with their bootstrap "
                 "interval.")


