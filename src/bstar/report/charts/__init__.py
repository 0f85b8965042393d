"""Pictures of the batch-size story (matplotlib, the optional `bstar[plot]` extra): a small
shared base (`base`: the Chart type, style, colours, axes and tooltips) and one module per
chart family: `plan`, `compare`, `sweep`, `simulate`, `fit`, `signature`, `search`,
`capacity`. Each takes the plain dicts of `bstar.report.views` or a contract JSON.
Importing this package loads no matplotlib; drawing does."""

from __future__ import annotations

from bstar.report.charts.base import (
    AMORT_COLOR,
    CONTEXT_COLORS,
    FIT_COLOR,
    INSTALL_HINT,
    KNEE_RULE,
    MARK,
    MEASURED_COLOR,
    REGIME_COLOR,
    REGIME_LABEL,
    SIM_COLOR,
    TPOT_COLOR,
    TPUT_COLOR,
    Chart,
    add_svg_tooltips,
    regime_spans,
    save,
)
from bstar.report.charts.capacity import (
    capacity_chart,
)
from bstar.report.charts.compare import (
    compare_chart,
)
from bstar.report.charts.fit import (
    fit_chart,
)
from bstar.report.charts.plan import (
    draw_latency,
    draw_roofline,
    draw_throughput,
    plan_charts,
    plan_charts_for_context,
    plan_overview,
    roofline_chart,
)
from bstar.report.charts.search import (
    search_chart,
)
from bstar.report.charts.signature import (
    PRED_COLOR,
    signature_chart,
)
from bstar.report.charts.simulate import (
    simulate_chart,
)
from bstar.report.charts.sweep import (
    sweep_chart,
)

__all__ = [
    "AMORT_COLOR",
    "CONTEXT_COLORS",
    "FIT_COLOR",
    "INSTALL_HINT",
    "KNEE_RULE",
    "MARK",
    "MEASURED_COLOR",
    "PRED_COLOR",
    "REGIME_COLOR",
    "REGIME_LABEL",
    "SIM_COLOR",
    "TPOT_COLOR",
    "TPUT_COLOR",
    "Chart",
    "add_svg_tooltips",
    "capacity_chart",
    "compare_chart",
    "draw_latency",
    "draw_roofline",
    "draw_throughput",
    "fit_chart",
    "plan_charts",
    "plan_charts_for_context",
    "plan_overview",
    "regime_spans",
    "roofline_chart",
    "save",
    "search_chart",
    "signature_chart",
    "simulate_chart",
    "sweep_chart",
]
