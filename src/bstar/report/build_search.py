"""The search page's Report (`bstar report search`, `bstar search`'s page) from the search
JSON contract: the winner per model (a disaggregated unit with each side's flags), the
ranked feasible candidates, what was not feasible, the Pareto charts. Apart from build.py,
which holds every other command's page, to keep each module readable."""

from __future__ import annotations

from typing import Any

from bstar.report import charts as ch
from bstar.report.html import Card, Report, Section, Table
from bstar.report.words import TPOT_NOTE, UNITS_NOTE
from bstar.units import fmt_ms as _ms


def _shape(w: dict[str, Any]) -> str:
    """A winner's deployment in a few words: instances and TP x DP, or units of P:D."""
    if w.get("layout") == "disaggregated":
        p, d = w["prefill"], w["decode"]
        return (f"{w['instances']} unit(s) of {w['pd_ratio']} ({w['num_gpus']} GPUs each: "
                f"prefill TP {p['tp']}, decode TP {d['tp']} EP {d['ep']} DP {d['dp']}), "
                f"decode max_num_seqs {d['max_num_seqs']}")
    return (f"{w['instances']} instance(s) of {w['num_gpus']} GPUs, TP "
            f"{w['tensor_parallel']} × DP {w['data_parallel']}, max_num_seqs "
            f"{w['max_num_seqs']}")


def _flat_flags(flags: dict[str, Any]) -> dict[str, str]:
    """A winner's flags as the card lists them: a disaggregated unit's per side
    ({"prefill": {"sglang": ...}} as "prefill, sglang")."""
    out: dict[str, str] = {}
    for k, v in flags.items():
        if isinstance(v, dict):
            out.update({f"{k}, {e}": str(line) for e, line in v.items()})
        else:
            out[k] = str(v)
    return out


def search_report(s: dict[str, Any], command: str = "") -> Report:
    """`s` is the search JSON contract (`bstar search --json`)."""
    slo = ", ".join(f"{k.removesuffix('_ms')} p99 ≤ {v:g} ms" for k, v in s["slo"].items())
    tr = s["traffic"]
    n = s["counts"]
    r = Report("search", "Search: the cheapest deployment that meets the SLO",
               f"{', '.join(s['models'])} on {', '.join(s['gpus'])}; demand "
               f"{s['demand_req_s']:g} req/s; {slo}", command=command)
    cur = (s.get("prices") or {}).get("currency", "USD")
    for model, w in (s.get("winners") or {}).items():
        cost = (f"{w['cost_per_mtok']:.3f} {cur} per million output tokens; "
                if w.get("cost_per_mtok") is not None else "")
        r.cards.append(Card(
            f"{model} → cheapest deployment",
            f"{w['gpus_total']} × {w['gpu']}",
            f"{cost}{_shape(w)}, {w['rate_per_replica_req_s']:.2f} req/s per "
            f"{'unit' if w.get('layout') == 'disaggregated' else 'replica'}; "
            f"binding: {w['reason']}", f"bound: {w['limit']}", _flat_flags(w["flags"]),
            "good"))
    if not s.get("winners"):
        r.cards.append(Card("no deployment", "none meets the SLO",
                            "loosen the SLO, or add GPUs or faster ones", tone="bad"))

    def f(v: float | None, nd: int = 1) -> str:
        return "–" if v is None else f"{v:,.{nd}f}"

    ok = [x for x in s["candidates"] if x["status"] == "ok"]
    rows = [[str(x["rank"]), x["model"], x["gpu"], str(x["num_gpus"]),
             str(x["tensor_parallel"]), str(x["data_parallel"]), str(x["max_num_seqs"]),
             str(x["max_num_batched_tokens"]), f(x["rate_per_replica_req_s"], 2),
             str(x["gpus_total"]), f(x["tok_s_per_gpu"], 0), _ms(x["ttft_p99_ms"]),
             _ms(x["tpot_p99_ms"]), f(x["cost_per_mtok"], 3), x["limit"], x["terms"]]
            for x in ok]
    rest = [[x["model"], x["gpu"], str(x["num_gpus"]), str(x["tensor_parallel"]),
             str(x["max_num_seqs"] or "–"), x["status"], x["limit"], x["reason"]]
            for x in s["candidates"] if x["status"] != "ok"]
    charts = []
    if ok:
        charts.append(ch.search_chart(s))
    p = s.get("prices")
    facts = [("traffic", f"input {tr['input_len']['describe']}, output "
                         f"{tr['output_len']['describe']}, {tr['num_requests']} requests per "
                         f"simulation, seed {tr['seed']}"),
             ("candidates", f"{n['candidates']} ({n['pruned']} pruned before simulating, "
                            f"{n['infeasible']} infeasible, {n['feasible']} feasible)"),
             ("simulated", f"{n['evaluations']} replica configurations, "
                           f"{n['simulations']} simulations on {s['backend']}"),
             ("prices", f"{p['path']} as of {p['as_of']} ({p['currency']}); the file's "
                        "figures, not current quotes" if p else "none: ranked by GPUs")]
    r.sections.append(Section(
        "Candidates", "search",
        "Each replica configuration's largest request rate within the SLO was found by "
        "bisection with the simulator; replicas for the demand and the cost follow.",
        facts=facts, charts=charts,
        tables=[Table("Feasible, cheapest first", ["#", "model", "GPU", "GPUs/inst", "TP", "DP",
                                                   "max seqs", "batched tokens",
                                                   "req/s/replica", "GPUs", "tok/s/GPU",
                                                   "TTFT p99", "TPOT p99",
                                                   f"{cur}/Mtok", "binding", "terms"], rows),
                *([Table("Not feasible", ["model", "GPU", "GPUs/inst", "TP", "max seqs",
                                          "status", "limit", "reason"], rest,
                         collapsed=True)] if rest else [])]))
    r.assumptions = [
        "Rates per replica are simulated with the cost model's step times and a vLLM-style "
        "scheduler on the stated traffic; 'defaults' rows use the stated efficiencies, "
        "'calibrated' rows a calibration profile.",
        "Cost = GPUs bought (whole instances) × price per GPU-hour, over the output tokens the "
        "demand asks for; prices are the user's file, never bstar's.",
        TPOT_NOTE, UNITS_NOTE]
    return r
