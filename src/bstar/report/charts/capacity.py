"""`bstar capacity`: demand, capacity at the SLO and replicas over the curve, one panel per
policy (the capacity JSON contract's first deployment)."""

from __future__ import annotations

from typing import Any

from bstar.errors import BstarError
from bstar.report.charts.base import Chart, _new_figure, _style

DEMAND_COLOR = "#37474f"
CAPACITY_COLOR = "#1f4e9c"
REPLICA_COLOR = "#d1495b"
RAMP_COLOR = "#edae49"


def capacity_chart(c: dict[str, Any]) -> Chart:
    pols = c.get("policies") or []
    if not pols:
        raise BstarError("no policy to draw")
    dep = c["deployments"][0]
    fig = _new_figure(11.0, 2.6 * len(pols) + 0.6)
    with _style():
        axes = fig.subplots(len(pols), 1, sharex=True, squeeze=False)[:, 0]
        for ax, p in zip(axes, pols, strict=True):
            iv = p["intervals"]
            h = [x["start_s"] / 3600.0 for x in iv]
            ax.step(h, [x["demand_req_s"] for x in iv], where="post", color=DEMAND_COLOR,
                    linewidth=1.0, label="demand, req/s")
            ax.step(h, [x["capacity_req_s"] for x in iv], where="post", color=CAPACITY_COLOR,
                    linewidth=1.2, label="capacity at the SLO (ready replicas), req/s")
            for x, t in zip(iv, h, strict=True):
                if x["ready_replicas"] < x["required_replicas"]:
                    ax.axvspan(t, t + c["demand"]["interval_s"] / 3600.0, color=RAMP_COLOR,
                               alpha=0.35, linewidth=0)
            ax.set_ylabel("requests / s")
            r2 = ax.twinx()
            r2.step(h, [x["replicas"] for x in iv], where="post", color=REPLICA_COLOR,
                    linewidth=1.0, linestyle=(0, (4, 2)), label="replicas paid")
            r2.set_ylabel("replicas")
            r2.set_ylim(bottom=0)
            att = p["slo_attainment"]
            cost = p.get("cost_per_day")
            ax.set_title(f"{p['policy']}: {p['gpu_hours']:.1f} GPU-hours"
                         + (f", {cost:.0f} per day" if cost is not None else "")
                         + f", SLO attainment {att:.2%}")
        axes[0].plot([], [], color=REPLICA_COLOR, linestyle=(0, (4, 2)), label="replicas paid")
        axes[0].fill_between([], [], color=RAMP_COLOR, alpha=0.35,
                             label="ramp: fewer ready than needed (replayed)")
        axes[0].legend(loc="upper left", fontsize=8)
        axes[-1].set_xlabel("hours from the curve's start")
    title = (f"{dep['model']} on {dep['tensor_parallel']} x {dep['gpu']}: "
             f"{dep['rate_per_replica_req_s']:.3g} req/s per replica at the SLO")
    fig.suptitle(title)
    return Chart("capacity", title, fig)
