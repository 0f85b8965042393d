"""Pictures of the batch-size story (matplotlib, the optional `bstar[plot]` extra).

Every drawing function takes the plain dicts of `bstar.report.views` or a contract JSON
(plan, compare rows, sweep, fit, simulate), so each result renders the same way whether it
was just computed or loaded from a file. Figures are built with `matplotlib.figure.Figure`
directly (no pyplot, no global state, no GUI backend: PNG goes through Agg, SVG through the
SVG backend). Each point carries a hover text: in SVG output it becomes a `<title>`, which
browsers show as a tooltip without any script.
"""

from __future__ import annotations

import io
import math
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bstar.errors import BstarError

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

INSTALL_HINT = "plots need matplotlib: pip install 'bstar[plot]'"

REGIME_COLOR = {"weight-dominated": "#2e7d32", "kv-dominated": "#e0a100",
                "compute-bound": "#7b1fa2", "memory-exhausted": "#c62828"}
REGIME_LABEL = {"weight-dominated": "1 weight-dominated", "kv-dominated": "2 KV-dominated",
                "compute-bound": "compute-bound", "memory-exhausted": "3 memory-exhausted"}
TPOT_COLOR = "#1f4e9c"
AMORT_COLOR = "#e07b00"
TPUT_COLOR = "#00796b"
MEASURED_COLOR = "#212121"
FIT_COLOR = "#6a1b9a"
SIM_COLOR = "#ad1457"
MARK = {  # vertical markers: color, line style
    "b_star": ("#37474f", (0, (6, 3))), "b_mem": ("#c62828", "-"),
    "crossover": ("#7b1fa2", (0, (1, 2))), "knee": ("#000000", (0, (4, 2, 1, 2))),
    "sla": ("#1565c0", (0, (8, 3, 2, 3))), "rec": ("#2e7d32", "-"),
    "knee_pred": ("#1f77b4", (0, (4, 2, 1, 2))), "knee_fit": ("#6a1b9a", (0, (4, 2, 1, 2))),
    "knee_meas": ("#000000", (0, (4, 2, 1, 2))),
    "b_mem_bstar": ("#ef9a9a", (0, (3, 2))), "onset": ("#ff6f00", (0, (1, 1))),
}
KNEE_RULE = {"step": "amortized gain < 5% per step", "doubling": "next doubling < +15%",
             "bca": "BCA advisor", "sla": "latency SLA"}
CONTEXT_COLORS = ("#1f4e9c", "#d1495b", "#00798c", "#edae49", "#66a182", "#8e5572")

STYLE: dict[str, Any] = {
    "font.size": 10, "axes.titlesize": 12, "axes.titleweight": "bold",
    "axes.titlelocation": "left", "axes.labelsize": 10, "axes.spines.top": False,
    "axes.spines.right": False, "axes.grid": True, "grid.alpha": 0.28, "grid.linewidth": 0.6,
    "axes.edgecolor": "#555555", "xtick.color": "#333333", "ytick.color": "#333333",
    "legend.fontsize": 8.5, "legend.frameon": False, "svg.fonttype": "path",
    "figure.facecolor": "white", "savefig.facecolor": "white", "lines.linewidth": 2.0,
    "svg.hashsalt": "bstar",  # stable ids: the same input gives the same SVG
}


def _mpl() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise BstarError(INSTALL_HINT) from None
    return matplotlib


@contextmanager
def _style() -> Iterator[None]:
    mpl = _mpl()
    with mpl.rc_context(STYLE):
        yield


@dataclass
class Chart:
    """One figure plus the hover texts of its points (keyed by the artists' gids)."""

    name: str
    title: str
    fig: Figure
    tips: dict[str, str] = field(default_factory=dict)
    caption: str = ""

    def svg(self) -> str:
        """The figure as an SVG document with a `<title>` tooltip on every marked point."""
        buf = io.BytesIO()
        with _style():
            self.fig.savefig(buf, format="svg", metadata={"Date": None})
        return add_svg_tooltips(buf.getvalue(), self.tips)

    def png(self, dpi: int = 144) -> bytes:
        buf = io.BytesIO()
        with _style():
            self.fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None})
        return buf.getvalue()

    def save(self, path: str | Path) -> Path:
        return save(self, path)


def save(chart: Chart, path: str | Path) -> Path:
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in (".png", ".svg"):
        raise BstarError(f"--plot wants a .png or .svg file name, got {str(path)!r}")
    if p.parent and not p.parent.exists():
        raise BstarError(f"folder {str(p.parent)!r} does not exist")
    data = chart.svg().encode() if suffix == ".svg" else chart.png()
    p.write_bytes(data)
    return p


_SVG_NS = "http://www.w3.org/2000/svg"


def add_svg_tooltips(svg: bytes, tips: dict[str, str]) -> str:
    """Insert `<title>` as first child of each group whose id has a tip (the way the
    matplotlib gallery's SVG tooltip example does it, without the script)."""
    ET.register_namespace("", _SVG_NS)
    ET.register_namespace("xlink", "http://www.w3.org/1999/xlink")
    root = ET.fromstring(svg)
    if tips:
        for el in root.iter(f"{{{_SVG_NS}}}g"):
            text = tips.get(el.get("id", ""))
            if text is not None:
                t = ET.Element(f"{{{_SVG_NS}}}title")
                t.text = text
                el.insert(0, t)
    return ET.tostring(root, encoding="unicode")


# ---- small drawing helpers -----------------------------------------------------------------
class _Tips:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.tips: dict[str, str] = {}

    def point(self, ax: Axes, x: float, y: float, text: str, **kw: Any) -> None:
        gid = f"tip-{self.prefix}-{len(self.tips)}"
        style: dict[str, Any] = {"marker": "o", "markersize": 5.5, "linestyle": "none",
                                 "markeredgecolor": "white", "markeredgewidth": 0.8,
                                 "zorder": 5}
        style.update(kw)
        (line,) = ax.plot([x], [y], **style)
        line.set_gid(gid)
        self.tips[gid] = text


def _new_figure(w_in: float, h_in: float) -> Figure:
    _mpl()
    from matplotlib.figure import Figure

    with _style():
        return Figure(figsize=(w_in, h_in), layout="constrained")


def _log2_axis(ax: Axes, lo: float, hi: float, label: str = "batch (sequences running)") -> None:
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    ax.set_xscale("log", base=2)
    lo_e, hi_e = math.floor(math.log2(max(lo, 1))), math.ceil(math.log2(max(hi, 2)))
    step = 1 if hi_e - lo_e <= 14 else 2
    ticks = [2.0**k for k in range(lo_e, hi_e + 1, step)]
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _int_label(v)))
    ax.set_xlim(2.0**lo_e / 1.15, 2.0**hi_e * 1.15)
    ax.set_xlabel(label)


def _int_label(v: float) -> str:
    if v >= 10_000:
        return f"{v / 1024:.0f}k"
    return f"{v:.0f}"


def _vline(ax: Axes, x: float | None, kind: str, label: str) -> None:
    if x is None or not math.isfinite(x) or x <= 0:
        return
    lo, hi = ax.get_xlim()
    color, ls = MARK[kind]
    if not lo <= x <= hi:
        # Still named in the legend, so a missing line is not mistaken for a missing number.
        ax.plot([], [], color=color, linestyle=ls, linewidth=1.4,
                label=f"{label} ({'right' if x > hi else 'left'} of the chart)")
        return
    ax.axvline(x, color=color, linestyle=ls, linewidth=1.4, label=label, zorder=3)


def regime_spans(b_star_read: float, crossover: float | None, b_mem: int, lo: float,
                 hi: float) -> list[tuple[float, float, str]]:
    """Contiguous x ranges of each regime: weight-dominated below B* (weights read >= KV
    read), KV-dominated to B_mem, compute-bound from the crossover, memory-exhausted past
    B_mem. Pure; the curve's own per-point regime agrees at every sampled batch."""
    cut_mem = float(b_mem) + 0.5  # batch b_mem still fits; b_mem + 1 does not
    edges: list[tuple[float, str]] = [(lo, "weight-dominated")]
    if crossover is not None and crossover < b_star_read:
        edges.append((crossover, "compute-bound"))
    else:
        edges.append((b_star_read, "kv-dominated"))
        if crossover is not None:
            edges.append((crossover, "compute-bound"))
    spans = []
    for i, (x0, reg) in enumerate(edges):
        x1 = edges[i + 1][0] if i + 1 < len(edges) else math.inf
        a, b = max(x0, lo), min(x1, cut_mem, hi)
        if b > a:
            spans.append((a, b, reg))
    if cut_mem < hi:
        spans.append((max(cut_mem, lo), hi, "memory-exhausted"))
    return spans


def _shade_regimes(ax: Axes, c: dict[str, Any]) -> None:
    lo, hi = ax.get_xlim()
    bsr = c.get("b_star_weights_read") or c["b_star"]
    for a, b, reg in regime_spans(bsr, c.get("compute_crossover_batch"), c["b_mem"], lo, hi):
        ax.axvspan(a, b, color=REGIME_COLOR[reg], alpha=0.09, linewidth=0, zorder=0)
        # Name the band across it where it is wide enough on the log axis, else upright.
        frac = math.log(b / a) / math.log(hi / lo)
        if frac > 0.28:
            ax.text(math.sqrt(a * b), 0.985, REGIME_LABEL[reg], transform=ax.get_xaxis_transform(),
                    ha="center", va="top", fontsize=8.5, color=REGIME_COLOR[reg],
                    fontweight="bold", alpha=0.9)
        elif frac > 0.022:
            ax.text(math.sqrt(a * b), 0.985, REGIME_LABEL[reg], transform=ax.get_xaxis_transform(),
                    ha="center", va="top", rotation=90, fontsize=7.5, color=REGIME_COLOR[reg],
                    fontweight="bold", alpha=0.9)


def _fmt(v: float, unit: str = "") -> str:
    if v >= 100:
        s = f"{v:,.0f}"
    elif v >= 10:
        s = f"{v:.1f}"
    elif v >= 1:
        s = f"{v:.2f}"
    else:
        s = f"{v:.3g}"
    return f"{s} {unit}".rstrip()


def _shared_legend(fig: Figure, axes: Sequence[Axes], ncol: int = 4) -> None:
    """One legend under side-by-side panels: each label once, in order of appearance."""
    seen: dict[str, Any] = {}
    for ax in axes:
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(_short_label(label), h)
    if seen:
        fig.legend(list(seen.values()), list(seen), loc="outside lower center", ncol=ncol,
                   handlelength=2.4, columnspacing=1.6)


def _short_label(label: str, limit: int = 72) -> str:
    # A file path in a label (a model folder, a probed GPU file) must not push the plot
    # out of its figure.
    return label if len(label) <= limit else label[:limit - 1] + "…"


def _legend_below(ax: Axes, ncol: int = 3) -> None:
    handles, labels = ax.get_legend_handles_labels()
    labels = [_short_label(x) for x in labels]
    if handles:
        ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.16),
                  ncol=ncol, handlelength=2.4, columnspacing=1.4)


# ---- plan: latency, throughput, roofline --------------------------------------------------
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
    ax.axhline(c["tpot_floor_ms"], color=AMORT_COLOR, linestyle=(0, (2, 2)), linewidth=1.2,
               label=f"floor kv_per_seq / BW = {_fmt(c['tpot_floor_ms'], 'ms')}")
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


def _mark_batches(ax: Axes, c: dict[str, Any]) -> None:
    _vline(ax, c["b_star"], "b_star", f"B* = W / kv_per_seq = {c['b_star']:.1f}")
    _vline(ax, c["b_mem"], "b_mem", f"B_mem = {c['b_mem']:,} (KV fits)")
    cross = c.get("compute_crossover_batch")
    if cross is not None:
        _vline(ax, cross, "crossover", f"compute crossover = {cross:.0f}")
    knee = c.get("knee")
    if knee and knee.get("batch"):
        _vline(ax, knee["batch"], "knee", f"knee = {knee['batch']}"
               + (f" ({KNEE_RULE[knee['rule']]})" if knee.get("rule") in KNEE_RULE else ""))
    if c.get("sla_batch"):
        _vline(ax, c["sla_batch"], "sla", f"SLA-bound batch = {c['sla_batch']}")


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


def _plain_log_y(ax: Axes) -> None:
    """Log y ticks as plain numbers (0.1, 1, 10 ms), with 2 and 5 between decades when the
    axis spans few decades, so values read without exponent arithmetic."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    lo, hi = ax.get_ylim()
    decades = math.log10(hi / lo) if lo > 0 else 9
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if decades < 3.5
                                          else (1.0,), numticks=30))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _thousands() -> Any:
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda v, _: f"{v / 1000:g}k" if abs(v) >= 1000 else f"{v:g}")


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


# ---- compare -------------------------------------------------------------------------------
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
                               f"{rec.get('max_num_seqs', '-')} ({rec.get('bound', '-')})",
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
    return f"{r['model']}\n{gpu}"


# ---- sweep ---------------------------------------------------------------------------------
def level_x(level: dict[str, Any]) -> int:
    """The batch a level ran at: max_num_seqs when the server was restarted per level (it
    caps the running batch), else the client's concurrency."""
    for k in ("max_num_seqs", "concurrency"):
        if level.get(k) is not None:
            return int(level[k])
    raise BstarError("a sweep level has neither 'concurrency' nor 'max_num_seqs'")


def drawable_levels(levels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Levels with a batch and a measured throughput (a failed or rate-only level has no
    place on a batch axis), in batch order."""
    ok = [lv for lv in levels if (lv.get("max_num_seqs") is not None
                                  or lv.get("concurrency") is not None)
          and lv.get("throughput_tok_s")]
    return sorted(ok, key=level_x)


def sweep_knee(s: dict[str, Any]) -> dict[str, Any] | None:
    """The measured knee to mark: the rule the sweep's recommendation followed, else seed
    000's step rule, else seed 004's doubling rule; also accepts a flat {"batch": ...}."""
    knee = s.get("knee") or {}
    if knee.get("batch"):
        return knee
    rules = knee.get("rules") or {}
    rec = s.get("recommendation") or {}
    if rec.get("bound") == "knee":  # the rule the recommendation followed
        for k in rules.values():
            if k.get("batch") == rec.get("max_num_seqs"):
                return k
    for name in ("step", "doubling"):
        k = rules.get(name) or {}
        if k.get("batch"):
            return k
    return None


def _pcts(level: dict[str, Any], key: str) -> tuple[float, float] | None:
    d = level.get(key) or {}
    if d.get("p50") is None:
        return None
    return float(d["p50"]), float(d.get("p99") if d.get("p99") is not None else d["p50"])


def _whiskers(ax: Axes, xs: list[int], p50: list[float], p99: list[float], color: str,
              label: str, tips: _Tips, what: str, unit: str) -> None:
    ax.errorbar(xs, p50, yerr=[[0.0] * len(xs), [b - a for a, b in zip(p50, p99, strict=True)]],
                fmt="none", ecolor=color, elinewidth=1.4, capsize=4, capthick=1.4, zorder=4)
    ax.plot(xs, p50, color=color, linewidth=1.0, alpha=0.6, zorder=4)
    ax.plot([], [], marker="o", color=color, linewidth=1.0, label=label)
    for x, a, b in zip(xs, p50, p99, strict=True):
        tips.point(ax, x, a, f"{what} at {x}: p50 {_fmt(a, unit)}, p99 {_fmt(b, unit)}",
                   color=color, markersize=6.5)


def sweep_chart(s: dict[str, Any]) -> Chart:
    """Measured levels (p50 with whiskers to p99) over the prediction; TTFT; preemptions
    and KV-cache usage per level."""
    levels = drawable_levels(s["levels"])
    if not levels:
        raise BstarError("the sweep has no completed level with a batch to draw")
    xs = [level_x(lv) for lv in levels]
    xname = "max_num_seqs" if levels[0].get("max_num_seqs") is not None else "concurrency"
    fig = _new_figure(14.0, 9.6)
    tips = _Tips("sweep")
    knee = sweep_knee(s) or {}
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
        pred_label = ("predicted: " + f"{dense['model']} on {dense['gpu']}, context "
                      f"{dense['context_tokens']:,}") if dense else "predicted (cost model)"
        if dense:
            # The dense prediction is the curve; the levels' own predictions lie on it.
            pred = [(b, {"tpot_ms": t, "throughput_tok_s": q}) for b, t, q in zip(
                dense["batch"], dense["tpot_ms"], dense["throughput_tok_s"], strict=True)]
        if pred:
            a_tpot.plot([x for x, _ in pred], [q["tpot_ms"] for _, q in pred], color=TPOT_COLOR,
                        linestyle=(0, (5, 3)), alpha=0.8, label=pred_label)
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
                 "cost model's prediction at the same level.")


# ---- simulate ------------------------------------------------------------------------------
def simulate_chart(results: list[dict[str, Any]]) -> Chart:
    """Simulated throughput, latency percentiles, preemptions and KV use per max_num_seqs,
    with the knee and the recommendation of the simulated sweep."""
    rs = sorted(results, key=lambda r: r["max_num_seqs"])
    xs = [int(r["max_num_seqs"]) for r in rs]
    advice = next((r["sweep"] for r in rs if r.get("sweep")), None) or {}
    rec = advice.get("max_num_seqs")
    # The advice takes the smaller of the two throughput knees that fire; mark that one.
    fired = [k for k in (advice.get("knees") or {}).values()
             if k.get("batch") and k.get("rule") in ("step", "doubling")]
    knee = min(fired, key=lambda k: k["batch"]) if fired else None
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


# ---- fit -----------------------------------------------------------------------------------
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
                           f"predicted at batch {q['batch']} ({q['regime']}): "
                           f"{name} {_fmt(q[key], unit)}\ninterval {_fmt(lo_v, unit)} – "
                           f"{_fmt(hi_v, unit)}" + (f"\n{q['bound']}" if q.get("bound") else ""),
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
        top = max(dn["throughput_tok_s"])
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


# ---- the signature picture: predicted, fitted, measured and simulated on one chart --------
PRED_COLOR = "#1f77b4"


def _clip(series: dict[str, Any], key: str, lo: float, hi: float) -> tuple[list[float],
                                                                            list[float]]:
    pts = [(b, y) for b, y in zip(series["batch"], series[key], strict=True)
           if y is not None and lo <= b <= hi]
    return [b for b, _ in pts], [y for _, y in pts]


def signature_chart(v: dict[str, Any], name: str = "signature") -> Chart:
    """Per-request TPOT and throughput against batch with every source that is present:
    the cost model's prediction (dashed, with its regime bands, B*, B_mem and knee), the fit
    (solid, dashed past the data), the measured levels (dots, whiskers to p99) and the
    simulation (squares, whiskers to p99)."""
    meas, sim, fit, pred, plan = (v.get(k) for k in ("measured", "simulated", "fitted",
                                                     "predicted", "plan"))
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
                        label=f"predicted: {plan['model']} on {plan['gpu']}" if plan
                        else "predicted (cost model)", zorder=3)
            if fit:
                last = fit["last_measured_batch"]
                xs, ys = _clip(fit, key, xlo, min(last, xhi))
                ax.plot(xs, ys, color=FIT_COLOR, linewidth=2.0, label="fitted", zorder=4)
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
            for src, color, marker, label in ((sim, SIM_COLOR, "s", "simulated"),
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
            if plan:
                _mark_batches(ax, {**plan, "sla_batch": None, "knee": None})
                if (plan.get("knee") or {}).get("batch"):
                    _vline(ax, plan["knee"]["batch"], "knee_pred",
                           f"predicted knee = {plan['knee']['batch']}")
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
                 "regimes), the fit of the measurements (solid; dotted past the data), the "
                 "measured levels (dots) and the simulator (squares).")


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
