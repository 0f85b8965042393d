"""The search's Pareto charts: cost per million output tokens and throughput per GPU, each
against TPOT p99 at the rate per replica that met the SLO."""

from __future__ import annotations

from typing import Any

from bstar.errors import BstarError
from bstar.report.charts.base import Chart, _fmt, _new_figure, _plain_log_y, _style, _Tips

SEARCH_GPU_COLORS = ("#1f4e9c", "#d1495b", "#00798c", "#edae49", "#66a182", "#8e5572",
                     "#37474f", "#7b1fa2")
SEARCH_MODEL_MARKERS = ("o", "s", "^", "D", "v", "P")


def search_chart(s: dict[str, Any]) -> Chart:
    """The search's feasible candidates (the search JSON contract) on two planes: cost per
    million output tokens vs TPOT p99, and output tokens/s per GPU at the SLO vs TPOT p99;
    each Pareto front drawn as a step line, the winner ringed."""
    ok = [r for r in s["candidates"] if r["status"] == "ok" and r.get("tpot_p99_ms")]
    if not ok:
        raise BstarError("no candidate meets the SLO: nothing to draw")
    gpus = sorted({r["gpu"] for r in ok})
    models = sorted({r["model"] for r in ok})
    color = {g: SEARCH_GPU_COLORS[i % len(SEARCH_GPU_COLORS)] for i, g in enumerate(gpus)}
    marker = {m: SEARCH_MODEL_MARKERS[i % len(SEARCH_MODEL_MARKERS)]
              for i, m in enumerate(models)}
    priced = any(r.get("cost_per_mtok") is not None for r in ok)
    cur = (s.get("prices") or {}).get("currency", "USD")
    fig = _new_figure(13.0, 5.2)
    tips = _Tips("search")
    winners = {id(r) for r in ok for w in (s.get("winners") or {}).values()
               if r["replica_key"] == w["replica_key"] and r["num_gpus"] == w["num_gpus"]}
    with _style():
        a_cost, a_tput = fig.subplots(1, 2)
        panels = ((a_tput, "tok_s_per_gpu", "pareto_throughput", "Throughput per GPU at the SLO",
                   "output tokens / s per GPU"),)
        if priced:
            panels = ((a_cost, "cost_per_mtok", "pareto_cost", "Cost per million output tokens",
                       f"{cur} per million output tokens"), *panels)
        else:
            a_cost.text(0.5, 0.5, "no --price file: no cost axis", ha="center", va="center",
                        transform=a_cost.transAxes, color="#5b6475")
            a_cost.set_axis_off()
        for ax, key, front, title, ylabel in panels:
            for r in ok:
                if r.get(key) is None:
                    continue
                text = (f"{r['model']} on {r['num_gpus']} x {r['gpu']} (TP {r['tensor_parallel']}"
                        f", DP {r['data_parallel']}), max_num_seqs {r['max_num_seqs']}: "
                        f"{r['gpus_total']} GPUs, {_fmt(r['tok_s_per_gpu'], 'tok/s')} per GPU, "
                        f"TPOT p99 {r['tpot_p99_ms']:.1f} ms"
                        + (f", {r['cost_per_mtok']:.3f} {cur}/Mtok"
                           if r.get("cost_per_mtok") is not None else "")
                        + f"; binding {r['limit']}")
                tips.point(ax, r["tpot_p99_ms"], r[key], text, color=color[r["gpu"]],
                           marker=marker[r["model"]], markersize=6.5, alpha=0.85)
                if id(r) in winners:
                    ax.plot([r["tpot_p99_ms"]], [r[key]], marker="o", markersize=14,
                            markerfacecolor="none", markeredgecolor="#000000",
                            linestyle="none", zorder=6)
            for m in models:
                pts = sorted((r["tpot_p99_ms"], r[key]) for r in ok
                             if r[front] and r["model"] == m and r.get(key) is not None)
                if pts:
                    ax.step([p[0] for p in pts], [p[1] for p in pts], where="post",
                            color="#555555", linewidth=1.0, linestyle=(0, (4, 2)))
            ax.set_xlabel("TPOT p99 at the rate per replica, ms")
            ax.set_ylabel(ylabel)
            ax.set_title(title)
            if key == "cost_per_mtok":
                ax.set_yscale("log")
                _plain_log_y(ax)
        for g in gpus:
            a_tput.plot([], [], marker="o", linestyle="none", color=color[g], label=g)
        for m in models:
            a_tput.plot([], [], marker=marker[m], linestyle="none", color="#555555", label=m)
        a_tput.plot([], [], color="#555555", linewidth=1.0, linestyle=(0, (4, 2)),
                    label="Pareto front (per model)")
        a_tput.plot([], [], marker="o", markersize=11, markerfacecolor="none",
                    markeredgecolor="#000000", linestyle="none", label="cheapest per model")
        a_tput.legend(loc="best")
        fig.suptitle("bstar search · feasible deployments at their SLO-limited rate", x=0.01,
                     ha="left", fontsize=13, fontweight="bold")
    return Chart("search", "Search", fig, tips.tips,
                 "Each point is a deployment at the largest rate per replica that met the SLO in "
                 "simulation; lower-left is better on the cost plane, upper-left on the "
                 "throughput plane. Dashed steps: each model's Pareto front (no other "
                 "deployment of it is better on both axes).")
