"""Pictures and reports over bstar's results: `--plot FILE.png|.svg` and `bstar report`.

Importing this package is light; matplotlib and jinja2 (the `bstar[plot]` extra) load only
when something is drawn, and their absence is a one-line BstarError naming the extra.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def save_plan_plot(plan: Any, path: str | Path) -> Path:
    """All of a plan on one PNG/SVG: latency and throughput per context, and the roofline."""
    from bstar.report import charts
    from bstar.report.views import plan_view

    return charts.plan_overview(plan_view(plan)).save(path)


def save_compare_plot(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """B* and B_mem per model and context (rows: `bstar compare --json`)."""
    from bstar.report import charts

    return charts.compare_chart(rows).save(path)


def write_plan_report(plan: Any, path: str | Path, command: str = "") -> Path:
    from bstar.report.build import plan_report
    from bstar.report.html import write_html
    from bstar.report.views import plan_view

    return write_html(plan_report(plan_view(plan), command), path)


def write_compare_report(rows: list[dict[str, Any]], path: str | Path,
                         command: str = "") -> Path:
    from bstar.report.build import compare_report
    from bstar.report.html import write_html

    return write_html(compare_report(rows, command), path)


def write_sweep_report(sweep: dict[str, Any], path: str | Path, command: str = "") -> Path:
    """`sweep` is the sweep JSON contract (`bstar sweep --json`)."""
    from bstar.fit import fit_sweep
    from bstar.report.build import sweep_report
    from bstar.report.html import write_html
    from bstar.report.views import run_signature, sweep_view

    signature = run_signature(sweep, fit_sweep(sweep), "The sweep four ways")
    return write_html(sweep_report(sweep_view(sweep), command, signature), path)


def write_simulate_report(results: list[dict[str, Any]], path: str | Path,
                          command: str = "") -> Path:
    """`results` are simulate JSON objects (`bstar simulate --json`), one per max_num_seqs."""
    from bstar.report.build import simulate_report
    from bstar.report.html import write_html

    return write_html(simulate_report(results, command), path)


def save_fit_plot(result: Any, path: str | Path) -> Path:
    """Measured points, the fitted model, its extrapolation and predictions (a FitResult)."""
    from bstar.report import charts
    from bstar.report.views import fit_view

    return charts.fit_chart(fit_view(result)).save(path)


def write_fit_report(result: Any, path: str | Path, command: str = "",
                     deployment: Any = None, context_tokens: int | None = None) -> Path:
    """`deployment`: `DeploymentOptions`; naming a model and a GPU, the report also draws
    the fit beside the cost model's prediction at `context_tokens`."""
    from bstar.report.build import fit_report
    from bstar.report.html import write_html
    from bstar.report.views import fit_signature, fit_view

    signature = fit_signature(result, deployment, context_tokens)
    return write_html(fit_report(fit_view(result), command, signature), path)


def save_simulate_plot(results: list[dict[str, Any]], path: str | Path) -> Path:
    """Simulated throughput, latency percentiles and preemptions per max_num_seqs."""
    from bstar.report import charts

    return charts.simulate_chart(results).save(path)


def save_sweep_plot(sweep: dict[str, Any], path: str | Path) -> Path:
    """Measured levels (p50, whiskers to p99) over the prediction, TTFT, preemptions and KV
    use (`sweep`: the sweep JSON contract)."""
    from bstar.report import charts
    from bstar.report.views import sweep_view

    return charts.sweep_chart(sweep_view(sweep)).save(path)


def save_capacity_plot(capacity: dict[str, Any], path: str | Path) -> Path:
    """Demand, capacity and replicas over the curve per policy (the capacity contract)."""
    from bstar.report import charts

    return charts.capacity_chart(capacity).save(path)


def save_search_plot(search: dict[str, Any], path: str | Path) -> Path:
    """The search's Pareto charts (`search`: the search JSON contract)."""
    from bstar.report import charts

    return charts.search_chart(search).save(path)


def write_search_report(search: dict[str, Any], path: str | Path, command: str = "") -> Path:
    """`search` is the search JSON contract (`bstar search --json`)."""
    from bstar.report.build_search import search_report
    from bstar.report.html import write_html

    return write_html(search_report(search, command), path)
