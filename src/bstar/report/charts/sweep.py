"""A sweep's measured levels (p50 with whiskers to p99) over the prediction, TTFT,
preemptions and KV use."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bstar.errors import BstarError
from bstar.report.charts.base import (
    AMORT_COLOR,
    KNEE_RULE,
    MARK,
    REGIME_COLOR,
    TPOT_COLOR,
    TPUT_COLOR,
    Chart,
    _fmt,
    _level_predictions,
    _log2_axis,
    _new_figure,
    _pcts,
    _plain_log_y,
    _shared_legend,
    _style,
    _thousands,
    _Tips,
    _vline,
    _whiskers,
)
from bstar.report.views import BASIS_WORDS, drawable_levels, level_x

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.axes import Axes

UNCAL_COLOR = "#8a8f98"


def sweep_chart(s: dict[str, Any]) -> Chart:
    """Measured levels (p50 with whiskers to p99) over the prediction; TTFT; preemptions
    and KV-cache usage per level.

    Long on purpose: one drawing script over four panels that share the x axis and the
    markers; each panel is a few lines that need the others' scales."""
    levels = drawable_levels(s["levels"])
    if not levels:
        raise BstarError("the sweep has no completed level with a batch to draw")
    xs = [level_x(lv) for lv in levels]
    xname = "max_num_seqs" if levels[0].get("max_num_seqs") is not None else "concurrency"
    fig = _new_figure(14.0, 9.6)
    tips = _Tips("sweep")
    # The measured knee the sweep's recommendation marks (`Recommendation.knee`).
    knee = (s.get("recommendation") or {}).get("knee") or {}
    knee_b = knee.get("batch")
    rec = (s.get("recommendation") or {}).get("max_num_seqs")
    with _style():
        (a_tpot, a_tput), (a_ttft, a_mem) = fig.subplots(2, 2)
        for ax in (a_tpot, a_tput, a_ttft, a_mem):
            _log2_axis(ax, min(xs), max(xs), xname)
        pred = [(x, lv["predicted"]) for x, lv in zip(xs, levels, strict=True)
                if lv.get("predicted")]
        # TPOT
        t = [(x, _pcts(lv, "tpot_ms")) for x, lv in zip(xs, levels, strict=True)]
        t = [(x, v) for x, v in t if v]
        if t:
            _whiskers(a_tpot, [x for x, _ in t], [v[0] for _, v in t], [v[1] for _, v in t],
                      TPOT_COLOR, "measured per-request TPOT (p50, whisker to p99)", tips,
                      "TPOT", "ms")
        dense = s.get("predicted_curve")
        unc = s.get("uncalibrated_curve")
        # Without a dense curve (no cost model named, or an old run) the levels' own stored
        # predictions are the uncalibrated, stored deployment's.
        pred_label = dense["label"] if dense else "uncalibrated cost model" + next(
            (f" ({BASIS_WORDS.get(q.get('throughput_basis'), 'decode only, B / TPOT')})"
             for _, q in pred), "")
        if dense:
            # The dense prediction is the curve; the levels' own predictions lie on it.
            pred = [(b, {"tpot_ms": t, "throughput_tok_s": q}) for b, t, q in zip(
                dense["batch"], dense["tpot_ms"], dense["throughput_tok_s"], strict=True)]
        if pred:
            a_tpot.plot([x for x, _ in pred], [q["tpot_ms"] for _, q in pred], color=TPOT_COLOR,
                        linestyle=(0, (5, 3)), alpha=0.8, label=pred_label)
        if unc:
            a_tpot.plot(unc["batch"], unc["tpot_ms"], color=UNCAL_COLOR, linestyle=(0, (1, 2)),
                        label=unc["label"])
        if s.get("max_tpot_ms"):
            a_tpot.axhline(s["max_tpot_ms"], color=MARK["sla"][0], linestyle=MARK["sla"][1],
                           label=f"SLA {s['max_tpot_ms']:g} ms")
        a_tpot.set_ylim(0, None)
        a_tpot.set_ylabel("ms")
        a_tpot.set_title("Per-request TPOT")
        # throughput
        a_tput.plot(xs, [lv["throughput_tok_s"] for lv in levels], color=TPUT_COLOR,
                    linewidth=1.2, alpha=0.7)
        for x, lv in zip(xs, levels, strict=True):
            tips.point(a_tput, x, lv["throughput_tok_s"],
                       f"{xname} {x}: {_fmt(lv['throughput_tok_s'], 'tok/s')}, "
                       f"{lv.get('requests', '?')} requests, {lv.get('errors', 0)} errors",
                       color=TPUT_COLOR, markersize=7)
        a_tput.plot([], [], marker="o", color=TPUT_COLOR, label="measured throughput")
        if pred:
            a_tput.plot([x for x, _ in pred], [q["throughput_tok_s"] for _, q in pred],
                        color=TPUT_COLOR, linestyle=(0, (5, 3)), alpha=0.8, label=pred_label)
        if unc:
            a_tput.plot(unc["batch"], unc["throughput_tok_s"], color=UNCAL_COLOR,
                        linestyle=(0, (1, 2)), label=unc["label"])
        if s.get("level_predictions"):
            _level_predictions(a_tput, tips, s["level_predictions"], [TPUT_COLOR, UNCAL_COLOR],
                               xname)
        a_tput.set_ylim(0, None)
        a_tput.yaxis.set_major_formatter(_thousands())
        a_tput.set_ylabel("output tokens / s")
        a_tput.set_title("Throughput")
        for ax in (a_tpot, a_tput):
            if dense and dense.get("b_mem"):
                _vline(ax, float(dense["b_mem"]), "b_mem",
                       f"predicted B_mem = {dense['b_mem']:,}")
            if knee_b:
                rule = KNEE_RULE.get(knee.get("rule", ""), "")
                _vline(ax, float(knee_b), "knee", f"knee = {knee_b}"
                       + (f" ({rule})" if rule else ""))
            if rec:
                _vline(ax, float(rec), "rec", f"recommended {rec}")
            _kv_regime_marks(ax, s)
        # TTFT
        t = [(x, _pcts(lv, "ttft_ms")) for x, lv in zip(xs, levels, strict=True)]
        t = [(x, v) for x, v in t if v]
        if t:
            _whiskers(a_ttft, [x for x, _ in t], [v[0] for _, v in t], [v[1] for _, v in t],
                      AMORT_COLOR, "TTFT (p50, whisker to p99)", tips, "TTFT", "ms")
            if max(v[1] for _, v in t) > 20 * max(min(v[0] for _, v in t), 1e-3):
                a_ttft.set_yscale("log")
                _plain_log_y(a_ttft)
        a_ttft.set_ylabel("ms")
        a_ttft.set_title("Time to first token")
        # preemptions and KV usage
        pre = [lv.get("preemptions") for lv in levels]
        kv = [lv.get("kv_cache_usage_max") for lv in levels]
        if any(v is not None for v in pre):
            a_mem.bar(xs, [v or 0 for v in pre], width=[x * 0.35 for x in xs],
                      color=REGIME_COLOR["memory-exhausted"], alpha=0.75, label="preemptions")
        from matplotlib.ticker import MaxNLocator

        a_mem.set_ylim(0, max(max((v or 0) for v in pre), 1) * 1.25)
        a_mem.yaxis.set_major_locator(MaxNLocator(integer=True))
        a_mem.set_ylabel("preemptions during the level")
        a_mem.set_title("Preemptions and KV-cache usage")
        if any(v is not None for v in kv):
            ax2 = a_mem.twinx()
            ax2.plot([x for x, v in zip(xs, kv, strict=True) if v is not None],
                     [100 * v for v in kv if v is not None], color=AMORT_COLOR, marker="s",
                     label="KV-cache usage, max %")
            ax2.set_ylim(0, 105)
            ax2.set_ylabel("KV-cache usage, max %")
            ax2.grid(False)
            ax2.spines["right"].set_visible(True)
            h1, l1 = a_mem.get_legend_handles_labels()
            h2, l2 = ax2.get_legend_handles_labels()
            _kv_regime_marks(a_mem, s)
            h1, l1 = a_mem.get_legend_handles_labels()
            a_mem.legend(h1 + h2, l1 + l2, loc="upper left")
        if all(v is None for v in pre) and all(v is None for v in kv):
            a_mem.text(0.5, 0.5, "the server exposes no preemption or KV-cache metrics\n"
                       "(vLLM's /metrics does; llama.cpp's does not)", ha="center", va="center",
                       transform=a_mem.transAxes, fontsize=10, color="#666666")
            a_mem.set_yticks([])
        _shared_legend(fig, (a_tpot, a_tput, a_ttft), ncol=3)
        title = "bstar sweep"
        if s.get("run_id") is not None:
            title += f" · run {s['run_id']}"
        if s.get("served_model"):
            title += f" · {s['served_model']}"
        fig.suptitle(title, x=0.01, ha="left", fontsize=13, fontweight="bold")
    return Chart("sweep", "Sweep", fig, tips.tips,
                 "Dots: measured median; whiskers reach the 99th percentile. Dashed: the "
                 "cost model's prediction (the legend says whether it is calibrated and "
                 "what its throughput counts); crosses: its value at each level.")


def _kv_regime_marks(ax: Axes, s: dict[str, Any]) -> None:
    """The sweep's KV verdict on its axis: measured B_mem (the server's pool), bstar's B_mem
    for the same model and pool, and the first level with preemptions."""
    kv = s.get("kv_regime") or {}
    if kv.get("measured_b_mem"):
        _vline(ax, float(kv["measured_b_mem"]), "b_mem",
               f"measured B_mem = {kv['measured_b_mem']:,} (server's KV pool)")
    if kv.get("computed_b_mem"):
        _vline(ax, float(kv["computed_b_mem"]), "b_mem_bstar",
               f"bstar's B_mem = {kv['computed_b_mem']:,}")
    if kv.get("preemption_onset"):
        _vline(ax, float(kv["preemption_onset"]), "onset",
               f"preemptions start at {kv['preemption_onset']:,}")

