"""The signature picture: predicted, fitted, measured and simulated curves on one chart."""

from __future__ import annotations

from typing import Any

from bstar.errors import BstarError
from bstar.report.charts.base import (
    FIT_COLOR,
    MEASURED_COLOR,
    SIM_COLOR,
    Chart,
    _fmt,
    _level_predictions,
    _log2_axis,
    _mark_batches,
    _new_figure,
    _plain_log_y,
    _shade_regimes,
    _shared_legend,
    _style,
    _thousands,
    _Tips,
    _vline,
)

PRED_COLOR = "#1f77b4"
UNCAL_COLOR = "#8a8f98"


def _clip(series: dict[str, Any], key: str, lo: float, hi: float) -> tuple[list[float],
                                                                            list[float]]:
    pts = [(b, y) for b, y in zip(series["batch"], series[key], strict=True)
           if y is not None and lo <= b <= hi]
    return [b for b, _ in pts], [y for _, y in pts]


def signature_chart(v: dict[str, Any], name: str = "signature") -> Chart:
    """Per-request TPOT and throughput against batch with every source that is present:
    the cost model's prediction (dashed, with its regime bands, B*, B_mem and knee), the fit
    (solid, dashed past the data), the measured levels (dots, whiskers to p99) and the
    simulation (squares, whiskers to p99).

    Long on purpose: one drawing script, layer by layer (regimes, each source's curve,
    markers, legend) on two shared axes."""
    meas, sim, fit, pred, plan, unc = (v.get(k) for k in (
        "measured", "simulated", "fitted", "predicted", "plan", "predicted_uncalibrated"))
    data_x = [b for s in (meas, sim) if s for b in s["batch"]]
    if fit:
        data_x += [p["batch"] for p in fit["predictions"]] + [fit["last_measured_batch"]]
    if not data_x and pred:
        data_x = list(pred["batch"])
    if not data_x:
        raise BstarError("nothing to draw: no measured, simulated, fitted or predicted curve")
    lo, hi = 1.0, float(max(data_x))
    fig = _new_figure(14.0, 5.9)
    tips = _Tips(name)
    with _style():
        a_tpot, a_tput = fig.subplots(1, 2)
        for ax, key, unit in ((a_tpot, "tpot_ms", "ms"), (a_tput, "throughput_tok_s", "tok/s")):
            _log2_axis(ax, lo, hi)
            xlo, xhi = ax.get_xlim()
            if plan:
                _shade_regimes(ax, plan)
            if pred:
                xs, ys = _clip(pred, key, xlo, xhi)
                ax.plot(xs, ys, color=PRED_COLOR, linestyle=(0, (5, 3)), linewidth=1.8,
                        label=pred["label"], zorder=3)
            if unc:
                xs, ys = _clip(unc, key, xlo, xhi)
                ax.plot(xs, ys, color=UNCAL_COLOR, linestyle=(0, (1, 2)), linewidth=1.4,
                        label=unc["label"], zorder=2)
            if fit:
                fit_label = "fit of the measured levels" + (
                    " (output tok/s incl. prefill)" if str(fit.get("throughput_kind") or "")
                    .startswith("output") else " (decode only, B / TPOT)")
                last = fit["last_measured_batch"]
                xs, ys = _clip(fit, key, xlo, min(last, xhi))
                ax.plot(xs, ys, color=FIT_COLOR, linewidth=2.0, label=fit_label, zorder=4)
                xs, ys = _clip(fit, key, last, xhi)
                if len(xs) > 1:
                    ax.plot(xs, ys, color=FIT_COLOR, linewidth=2.0, linestyle=(0, (2, 2)),
                            label="fit, extrapolated", zorder=4)
                for q in fit["predictions"]:
                    if xlo <= q["batch"] <= xhi:
                        tips.point(ax, q["batch"], q[key],
                                   f"fit predicts batch {q['batch']}: {_fmt(q[key], unit)} "
                                   f"({_fmt(q['low'][key], unit)} – {_fmt(q['high'][key], unit)})",
                                   marker="D", markersize=7, color=FIT_COLOR)
            sim_label = ("simulated (calibrated cost model)" if (sim or {}).get("calibrated")
                         else "simulated (uncalibrated cost model)")
            for src, color, marker, label in ((sim, SIM_COLOR, "s", sim_label),
                                              (meas, MEASURED_COLOR, "o", "measured")):
                if not src:
                    continue
                xs = src["batch"]
                ys = src[key]
                ok = [i for i, y in enumerate(ys) if y is not None]
                if key == "tpot_ms" and src.get("tpot_p99_ms"):
                    ax.errorbar([xs[i] for i in ok], [ys[i] for i in ok],
                                yerr=[[0.0] * len(ok), [max(0.0, (src["tpot_p99_ms"][i] or ys[i])
                                                        - ys[i]) for i in ok]],
                                fmt="none", ecolor=color, elinewidth=1.2, capsize=3.5,
                                alpha=0.8, zorder=5)
                ax.plot([xs[i] for i in ok], [ys[i] for i in ok], color=color, linewidth=0.9,
                        alpha=0.5, zorder=5)
                for i in ok:
                    extra = (f", p99 {_fmt(src['tpot_p99_ms'][i], 'ms')}"
                             if key == "tpot_ms" and src.get("tpot_p99_ms") else "")
                    tips.point(ax, xs[i], ys[i], f"{label} at batch {xs[i]}: "
                               f"{_fmt(ys[i], unit)}{extra}", marker=marker, markersize=7,
                               color=color)
                ax.plot([], [], marker=marker, color=color, linestyle="none", label=label)
            if key == "throughput_tok_s" and v.get("level_predictions"):
                _level_predictions(ax, tips, v["level_predictions"], [PRED_COLOR, UNCAL_COLOR])
            if plan:
                _mark_batches(ax, {**plan, "sla_batch": None, "knee": None})
                if (plan.get("knee") or {}).get("batch"):
                    cal = "calibrated" if (pred or {}).get("calibrated") else "uncalibrated"
                    _vline(ax, plan["knee"]["batch"], "knee_pred",
                           f"predicted knee ({cal}, decode only) = {plan['knee']['batch']}")
            if fit and fit.get("knee_batch"):
                _vline(ax, fit["knee_batch"], "knee_fit", f"fitted knee = {fit['knee_batch']}")
            if v.get("measured_knee"):
                _vline(ax, v["measured_knee"], "knee_meas",
                       f"measured knee = {v['measured_knee']}")
        a_tpot.set_yscale("log")
        _plain_log_y(a_tpot)
        a_tpot.set_ylabel("per-request TPOT, ms (log scale)")
        a_tpot.set_title("Per-request TPOT (p50, whisker to p99)")
        a_tput.set_ylim(0, None)
        a_tput.yaxis.set_major_formatter(_thousands())
        a_tput.set_ylabel("output tokens / s")
        a_tput.set_title("Throughput")
        _shared_legend(fig, (a_tpot, a_tput))
        fig.suptitle(v.get("title") or "Predicted, fitted, measured and simulated",
                     x=0.01, ha="left", fontsize=13, fontweight="bold")
    return Chart(name, "Predicted, fitted, measured, simulated", fig, tips.tips,
                 "One picture, four ways: the cost model's prediction (dashed, with its "
                 "regimes; the legend says whether it is calibrated and what its throughput "
                 "counts, and a dotted grey line is the uncalibrated one where a calibration "
                 "exists), the fit of the measurements (solid; dotted past the data), the "
                 "measured levels (dots) and the simulator (squares).")
