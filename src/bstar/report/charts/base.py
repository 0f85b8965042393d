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

from bstar import safeio
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
    "text.usetex": False,  # names from servers and files are text (`literal_texts`)
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
        literal_texts(self.fig)
        with _style():
            self.fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": "bstar"})
        return add_svg_tooltips(buf.getvalue(), self.tips)

    def png(self, dpi: int = 144) -> bytes:
        buf = io.BytesIO()
        literal_texts(self.fig)
        with _style():
            self.fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": "bstar"})
        return buf.getvalue()

    def save(self, path: str | Path) -> Path:
        return save(self, path)


def literal_texts(fig: Figure) -> None:
    """Every text of `fig` but its tick labels drawn as literal characters: no mathtext (a model id
    `$\\bogus$` raised a ParseException), each control character (ESC) shown as an escape
    and each line bounded (report/text/_common.clean_text)."""
    from matplotlib.text import Text

    from bstar.report.text._common import clean_text

    ticks = {id(label) for ax in fig.axes for axis in (ax.xaxis, ax.yaxis)
             for tick in (*axis.majorTicks, *axis.minorTicks)
             for label in (tick.label1, tick.label2)}
    for t in fig.findobj(Text):
        if id(t) in ticks:
            continue  # numbers from the axis' formatter (a log axis' 10^k is mathtext)
        t.set_parse_math(False)
        text = t.get_text()
        lines = [clean_text(x, TEXT_CHARS) for x in text.split("\n")]
        if "\n".join(lines) != text:
            t.set_text("\n".join(lines))


TEXT_CHARS = 200  # a line of a chart's text (titles name a model and a GPU)


def literal(name: object, limit: int = TEXT_CHARS) -> str:
    """A name for a text that keeps mathtext on (a tick label): control characters shown
    as escapes, bounded, and each `$` escaped so that it never opens math."""
    from bstar.report.text._common import clean_text

    return clean_text(name, limit).replace("$", r"\$")


def save(chart: Chart, path: str | Path) -> Path:
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in (".png", ".svg"):
        raise BstarError(f"--plot wants a .png or .svg file name, got {str(path)!r}")
    if p.parent and not p.parent.exists():
        raise BstarError(f"folder {str(p.parent)!r} does not exist")
    data = chart.svg().encode() if suffix == ".svg" else chart.png()
    return safeio.write_output(p, data, "--plot")


_SVG_NS = "http://www.w3.org/2000/svg"


def add_svg_tooltips(svg: bytes, tips: dict[str, str]) -> str:
    """Insert `<title>` as first child of each group whose id has a tip (the way the
    matplotlib gallery's SVG tooltip example does it, without the script)."""
    from bstar.report.text._common import clean_text

    ET.register_namespace("", _SVG_NS)
    ET.register_namespace("xlink", "http://www.w3.org/1999/xlink")
    root = ET.fromstring(svg)
    if tips:
        for el in root.iter(f"{{{_SVG_NS}}}g"):
            text = tips.get(el.get("id", ""))
            if text is not None:
                t = ET.Element(f"{{{_SVG_NS}}}title")
                # XML 1.0 has no control characters: an ESC in a name would void the SVG.
                t.text = "\n".join(clean_text(x, 400) for x in text.split("\n"))
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
    line = ax.axvline(x, color=color, linestyle=ls, linewidth=1.4, label=label, zorder=3)
    line.set_gid(f"mark-{kind}")  # the SVG names the mark, so a test can find where it is


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


def level_prediction_text(b: int, q: dict[str, Any], xname: str = "batch") -> str:
    """A predicted throughput point beside a measured level, as its tooltip says it: which
    prediction, the value, its error against the level and, past the tolerance, the miss."""
    text = (f"{q['label']} at {xname} {b}: {_fmt(q['throughput_tok_s'], 'tok/s')}, "
            f"{q['error']:+.0%} vs measured")
    from bstar.report.views import AGREE_TOL

    return text if q["agrees"] or not q["calibrated"] else (
        text + f" (misses by more than {AGREE_TOL:.0%})")


def _level_predictions(ax: Axes, tips: _Tips, rows: list[dict[str, Any]], colors: list[str],
                       xname: str = "batch") -> None:
    """Each predicted series' throughput at each measured level, as a hoverable mark."""
    for row in rows:
        for q, color in zip(row["predicted"], colors, strict=False):
            tips.point(ax, row["batch"], q["throughput_tok_s"],
                       level_prediction_text(row["batch"], q, xname), marker="x",
                       markersize=6, color=color, markeredgecolor=color, zorder=4)
