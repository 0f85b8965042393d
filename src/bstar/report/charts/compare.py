"""B* and B_mem per model and context (`bstar compare` rows)."""

from __future__ import annotations

from typing import Any

from bstar.report.charts.base import (
    CONTEXT_COLORS,
    REGIME_COLOR,
    Chart,
    _new_figure,
    _plain_log_y,
    _style,
    _Tips,
    literal,
)
from bstar.report.words import words


def compare_chart(rows: list[dict[str, Any]]) -> Chart:
    """B* and B_mem per model (x GPU) and context, as grouped bars on a log axis."""
    import numpy as np

    groups: list[str] = []
    for r in rows:
        g = _row_group(r)
        if g not in groups:
            groups.append(g)
    contexts = sorted({r["context_tokens"] for r in rows})
    fig = _new_figure(max(8.0, 1.5 * len(groups) * max(1, len(contexts)) / 2 + 4), 5.4)
    tips = _Tips("compare")
    width = 0.8 / max(len(contexts), 1)
    x = np.arange(len(groups))
    with _style():
        axes = fig.subplots(1, 2, sharey=True)
        for ax, key, name in ((axes[0], "b_star", "B* = W / kv_per_seq (saturation batch)"),
                              (axes[1], "b_mem", "B_mem (sequences whose KV fits)")):
            ax.set_yscale("log")
            for j, ctx in enumerate(contexts):
                color = CONTEXT_COLORS[j % len(CONTEXT_COLORS)]
                xs, hs = [], []
                for r in rows:
                    if r["context_tokens"] != ctx:
                        continue
                    xi = groups.index(_row_group(r)) + (j - (len(contexts) - 1) / 2) * width
                    v = float(r[key]) if r.get("fits", True) or key == "b_star" else 0.0
                    if v <= 0:
                        ax.text(xi, 1.05, "✕ does not fit", rotation=90, ha="center",
                                va="bottom", fontsize=7.5, color=REGIME_COLOR["memory-exhausted"])
                        continue
                    xs.append(xi)
                    hs.append(v)
                    ax.text(xi, v * 1.06, f"{v:,.0f}", ha="center", va="bottom", fontsize=7,
                            color="#333333")
                    rec = r.get("recommendation") or {}
                    tips.point(ax, xi, v, f"{_row_group(r)} at {ctx:,} tokens\nB* "
                               f"{r['b_star']:.1f}, B_mem {r['b_mem']:,}\nrecommended "
                               f"{rec.get('max_num_seqs', '-')} ({words(rec.get('bound')) or '-'})",
                               marker="_", markersize=max(6.0, 60 * width), color=color,
                               markeredgecolor=color)
                ax.bar(xs, hs, width=width * 0.92, color=color, alpha=0.85,
                       label=f"context {ctx:,}" if key == "b_star" else None, zorder=3)
            ax.set_xticks(x, groups, rotation=20 if len(groups) > 3 else 0, ha="right"
                          if len(groups) > 3 else "center")
            ax.set_title(name, fontsize=11)
            ax.grid(axis="x", visible=False)
            ax.set_xlim(-0.5, len(groups) - 0.5)
            ax.set_ylim(0.8, None)
            _plain_log_y(ax)
        axes[0].set_ylabel("sequences (log scale)")
        axes[0].legend(loc="upper left", ncol=1)
        fig.suptitle("B* and B_mem per model and context", x=0.01, ha="left", fontsize=13,
                     fontweight="bold")
    return Chart("compare", "B* and B_mem", fig, tips.tips,
                 "Where B* exceeds B_mem, memory binds before the weights are amortized.")


def _row_group(r: dict[str, Any]) -> str:
    gpu = f"{r['num_gpus']}x{r['gpu']}" if r.get("num_gpus", 1) > 1 else r["gpu"]
    # A tick label: set at draw time, after literal_texts ran, so made literal here.
    return f"{literal(r['model'])}\n{literal(gpu)}"


