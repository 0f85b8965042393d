"""Simulated throughput, latency percentiles and preemptions per max_num_seqs."""

from __future__ import annotations

from typing import Any

from bstar.report.charts.base import (
    AMORT_COLOR,
    KNEE_RULE,
    REGIME_COLOR,
    SIM_COLOR,
    TPOT_COLOR,
    TPUT_COLOR,
    Chart,
    _fmt,
    _log2_axis,
    _new_figure,
    _pcts,
    _plain_log_y,
    _style,
    _thousands,
    _Tips,
    _vline,
    _whiskers,
)


def simulate_chart(results: list[dict[str, Any]]) -> Chart:
    """Simulated throughput, latency percentiles, preemptions and KV use per max_num_seqs,
    with the knee and the recommendation of the simulated sweep."""
    rs = sorted(results, key=lambda r: r["max_num_seqs"])
    xs = [int(r["max_num_seqs"]) for r in rs]
    advice = next((r["sweep"] for r in rs if r.get("sweep")), None) or {}
    rec = advice.get("max_num_seqs")
    knee = advice.get("knee")  # the one the advice marks (`Recommendation.knee`)
    fig = _new_figure(15.0, 5.4)
    tips = _Tips("sim")
    from matplotlib.ticker import MaxNLocator

    with _style():
        a_tput, a_lat, a_pre = fig.subplots(1, 3)
        for ax in (a_tput, a_lat, a_pre):
            _log2_axis(ax, min(xs), max(xs), "max_num_seqs")
        a_tput.plot(xs, [r["throughput_tok_s"] for r in rs], color=TPUT_COLOR, linewidth=1.4)
        for x, r in zip(xs, rs, strict=True):
            tips.point(a_tput, x, r["throughput_tok_s"],
                       f"max_num_seqs {x}: {_fmt(r['throughput_tok_s'], 'tok/s')}, "
                       f"{r.get('preemptions', 0)} preemptions", color=TPUT_COLOR,
                       markersize=7)
        a_tput.plot([], [], marker="o", color=TPUT_COLOR, label="simulated throughput")
        a_tput.set_ylim(0, max(r["throughput_tok_s"] for r in rs) * 1.12)
        a_tput.yaxis.set_major_formatter(_thousands())
        a_tput.set_title("Throughput")
        a_tput.set_ylabel("output tokens / s")
        for key, color, name in (("ttft_ms", AMORT_COLOR, "TTFT"), ("tpot_ms", TPOT_COLOR,
                                 "TPOT"), ("e2e_ms", SIM_COLOR, "E2E")):
            t = [(x, _pcts(r, key)) for x, r in zip(xs, rs, strict=True)]
            t = [(x, v) for x, v in t if v]
            if t:
                _whiskers(a_lat, [x for x, _ in t], [v[0] for _, v in t], [v[1] for _, v in t],
                          color, f"{name} p50 → p99", tips, name, "ms")
        a_lat.set_yscale("log")
        _plain_log_y(a_lat)
        a_lat.set_title("Latency (p50, whisker to p99)")
        a_lat.set_ylabel("ms (log scale)")
        pre = [r.get("preemptions") or 0 for r in rs]
        a_pre.bar(xs, pre, width=[x * 0.35 for x in xs],
                  color=REGIME_COLOR["memory-exhausted"], alpha=0.75, label="preemptions")
        a_pre.set_ylim(0, max(max(pre), 1) * 1.25)
        a_pre.yaxis.set_major_locator(MaxNLocator(integer=True))
        a_pre.set_ylabel("preemptions")
        a_pre.set_title("Preemptions and KV-cache use")
        handles, labels = a_pre.get_legend_handles_labels()
        if any(r.get("kv_utilization_max") is not None for r in rs):
            ax2 = a_pre.twinx()
            kx = [x for x, r in zip(xs, rs, strict=True) if r.get("kv_utilization_max")
                  is not None]
            ky = [100 * r["kv_utilization_max"] for r in rs
                  if r.get("kv_utilization_max") is not None]
            ax2.plot(kx, ky, color=AMORT_COLOR, marker="s", label="KV cache used, max %")
            ax2.set_ylim(0, 105)
            ax2.set_ylabel("KV cache used, max %")
            ax2.grid(False)
            ax2.spines["right"].set_visible(True)
            h2, l2 = ax2.get_legend_handles_labels()
            handles, labels = handles + h2, labels + l2
        a_pre.legend(handles, labels, loc="upper left")
        for ax in (a_tput, a_lat):
            if knee:
                _vline(ax, float(knee["batch"]), "knee", f"knee = {knee['batch']} "
                       f"({KNEE_RULE.get(knee['rule'], knee['rule'])})")
            if rec:
                _vline(ax, float(rec), "rec", f"recommended {rec}")
            ax.legend(loc="best")
        fig.suptitle("bstar simulate · continuous batching driven by the cost model", x=0.01,
                     ha="left", fontsize=13, fontweight="bold")
    return Chart("simulate", "Simulation", fig, tips.tips,
                 "Each level ran the same traffic through a vLLM-style scheduler with paged KV; "
                 "when the KV pool runs out the scheduler preempts and the tail grows.")


