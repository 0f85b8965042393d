"""`bstar capacity`: the demand curve, each deployment's rate per replica at the SLO, the
policies side by side (GPU-hours, cost, idle fraction, SLO attainment, what the ramps
lost), and the replicas per hour under each policy."""

from __future__ import annotations

from typing import Any

from bstar.report.text._common import console
from bstar.report.text._common import markup_text as mt
from bstar.units import fmt_num


def print_capacity(c: dict[str, Any]) -> None:
    from rich.table import Table

    con = console()
    dm = c["demand"]
    slo = ", ".join(f"{k.removesuffix('_ms')} <= {v:g} ms" for k, v in c["slo"].items())
    st = c["settings"]
    con.print(f"[bold]capacity[/] over {mt(dm['source'])}: {dm['intervals']} intervals, "
              f"peak {dm['peak_req_s']:.3g} req/s, mean {dm['mean_req_s']:.3g} req/s; SLO "
              f"{slo} (each request)")
    con.print(f"  provisioning delay {st['provision_delay_s']:g} s, reactive cool-down "
              f"{st['cooldown_s']:g} s, scheduled period {st['schedule_period_s']:g} s from "
              f"{mt(st['history'])}; ramps replayed: {st['replay']}; router: {c['router']}")
    cur = (c.get("prices") or {}).get("currency", "USD")
    for d in c["deployments"]:
        con.print(f"\n[bold]{mt(d['model'])}[/] on {d['tensor_parallel']} x {mt(d['gpu'])} "
                  f"(max_num_seqs {d['max_num_seqs']}): {d['rate_per_replica_req_s']:.3g} "
                  f"req/s per replica at the SLO ({d['limit']} binds; capacity "
                  f"{d['capacity_req_s']:.3g} req/s)")
        tab = Table(show_edge=False, pad_edge=False, box=None)
        for h in ("policy", "replicas max", "GPU-hours", f"{cur}/day", f"{cur}/Mtok", "idle",
                  "SLO attainment", "ramp intervals", "lost in ramps", "kWh", "J/out tok"):
            tab.add_column(h, justify="left" if h == "policy" else "right")
        for p in d["policies"]:
            r = p["ramp"]
            tab.add_row(p["policy"], str(p["replicas_max"]), f"{p['gpu_hours']:.4g}",
                        fmt_num(p["cost_per_day"], 0, "-"),
                        fmt_num(p["cost_per_mtok"], 3, "-"), f"{p['idle_fraction']:.0%}",
                        f"{p['slo_attainment']:.2%}", str(r["intervals"]),
                        f"{r['attainment_lost']:.2%}",
                        fmt_num(p.get("energy_kwh"), 1, "-"),
                        fmt_num(p.get("joules_per_output_token"), 3, "-"))
        con.print(tab)
        hours = _hourly(d["policies"], c["demand"]["interval_s"])
        if hours:
            h = Table(show_edge=False, pad_edge=False, box=None, title="replicas paid, most "
                      "in each hour (ready below needed: *)", title_justify="left")
            h.add_column("hour", justify="right")
            h.add_column("demand max req/s", justify="right")
            h.add_column("needed", justify="right")
            for p in d["policies"]:
                h.add_column(p["policy"], justify="right")
            for row in hours:
                h.add_row(*row)
            con.print(h)
    if not c.get("prices"):
        con.print("\nno --price: no cost columns")


def _hourly(policies: list[dict[str, Any]], interval_s: float) -> list[list[str]]:
    """Per hour of the curve: the most demand, the per-interval minimum and each policy's
    replicas (a star where some interval of that hour had fewer ready than needed)."""
    if not policies:
        return []
    iv0 = policies[0]["intervals"]
    per = max(1, round(3600.0 / interval_s))
    rows = []
    for k in range(0, len(iv0), per):
        chunk = iv0[k:k + per]
        row = [f"{chunk[0]['start_s'] / 3600:.0f}",
               f"{max(x['demand_req_s'] for x in chunk):.3g}",
               str(max(x["required_replicas"] for x in chunk))]
        for p in policies:
            ch = p["intervals"][k:k + per]
            short = any(x["ready_replicas"] < x["required_replicas"] for x in ch)
            row.append(f"{max(x['replicas'] for x in ch)}{'*' if short else ''}")
        rows.append(row)
    return rows
