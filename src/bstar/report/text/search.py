"""`bstar search`: what was searched, the ranked feasible deployments, what was not
feasible, and per model the winner with its engine flags."""

from __future__ import annotations

from typing import Any

from bstar.report.text._common import console
from bstar.report.text._common import markup_text as mt
from bstar.units import fmt_num


def num_or_dash(v: float | None, digits: int) -> str:
    """A table cell: the number with `digits` places, '-' for a value not known."""
    return fmt_num(v, digits, "-")


def print_search(s: dict[str, Any], top: int = 15) -> None:
    from rich.table import Table

    c = console()
    tr = s["traffic"]
    slo = ", ".join(f"{k.removesuffix('_ms')} p99 <= {v:g} ms" for k, v in s["slo"].items())
    n = s["counts"]
    c.print(f"[bold]search[/] {', '.join(s['models'])} on {', '.join(s['gpus'])}: demand "
            f"{s['demand_req_s']:g} req/s, input {tr['input_len']['describe']}, output "
            f"{tr['output_len']['describe']} ({tr['num_requests']} requests per simulation, "
            f"seed {tr['seed']}); SLO {slo}")
    t = s["timing"]
    c.print(f"  {n['candidates']} candidates, {n['pruned']} pruned before simulating, "
            f"{n['evaluations']} replica configurations ({t['evaluations_reused']} reused "
            f"from the store), {n['simulations']} simulations; {s['backend']}, "
            f"{t['wall_s']:.1f} s")
    p = s["prices"]
    if p is not None:
        c.print(f"  prices: {p['path']} (as of {p['as_of']}, {p['currency']}; the file's "
                "figures, not current quotes)")
    else:
        c.print("  no --price: ranked by GPUs needed")
    tab = Table(show_edge=False, pad_edge=False, box=None)
    for col in ("#", "model", "GPU", "GPUs\n/inst", "TP", "DP", "max\nseqs", "batched\ntokens",
                "req/s\n/replica", "GPUs\ntotal", "tok/s\n/GPU", "TTFT\np99 ms",
                "TPOT\np99 ms", "cost\n/Mtok", "binding", "terms"):
        tab.add_column(col, justify="left" if col in ("model", "GPU", "binding", "terms")
                       else "right")
    spec = s.get("speculative")
    if spec is not None:
        tab.add_column("spec\nK", justify="right")
    shown = [r for r in s["candidates"] if r["status"] == "ok" and r["rank"] <= top]
    with_layout = "layouts" in s or any(layout_cell(r) != "aggregated" for r in shown)
    if with_layout:
        tab.add_column("layout")
    for r in shown:
        mark = " *" if r["pareto_cost"] or r["pareto_throughput"] else ""
        tab.add_row(f"{r['rank']}{mark}", mt(r["model"]), mt(r["gpu"]), str(r["num_gpus"]),
                    str(r["tensor_parallel"]), str(r["data_parallel"]),
                    str(r["max_num_seqs"]), str(r["max_num_batched_tokens"]),
                    num_or_dash(r["rate_per_replica_req_s"], 2), str(r["gpus_total"]),
                    num_or_dash(r["tok_s_per_gpu"], 0), num_or_dash(r["ttft_p99_ms"], 0),
                    num_or_dash(r["tpot_p99_ms"], 1), num_or_dash(r["cost_per_mtok"], 3),
                    r["limit"], r["terms"],
                    *([str(r.get("num_speculative_tokens") or "off")] if spec is not None
                      else []), *([layout_cell(r)] if with_layout else []))
    c.print(tab)
    rest = [r for r in s["candidates"] if r["status"] != "ok"]
    if rest:
        by: dict[str, int] = {}
        for r in rest:
            by[f"{r['status']} ({r['limit']})"] = by.get(f"{r['status']} ({r['limit']})", 0) + 1
        c.print("  not feasible: " + ", ".join(f"{v} {k}" for k, v in sorted(by.items())))
    _print_winners(c, s)
    for model, e in (spec or {}).items():
        c.print(speculation_line(model, e))
    if not s["winners"]:
        c.print("[red]no candidate meets the SLO[/]: loosen it, or add GPUs or faster ones")
    cal = sorted({r["gpu"] for r in s["candidates"] if r["calibrated"]})
    c.print("[dim]terms: "
            + (f"calibrated profiles apply on {', '.join(cal)}; " if cal else "")
            + f"'defaults' rows rest on the stated efficiencies ({_search_eff(s)}). "
              "* = on a Pareto front (cost or tok/s per GPU vs TPOT p99). binding: what "
              "stopped a higher rate per replica (SLO, memory, compute).[/]")


def _print_winners(c: Any, s: dict[str, Any]) -> None:
    """Per model: the winner, its energy, its engine flags (each side's for a
    disaggregated unit) and, with both layouts searched, which won and why."""
    for model, w in s["winners"].items():
        cost = (f", {num_or_dash(w['cost_per_mtok'], 3)} {s['prices']['currency']} per "
                "million output tokens" if w["cost_per_mtok"] is not None else "")
        shape = (f"{w['instances']} unit(s) of {layout_cell(w)}"
                 if w.get("layout") == "disaggregated" else
                 f"{w['instances']} instance(s) of {w['num_gpus']} GPUs, TP "
                 f"{w['tensor_parallel']} x DP {w['data_parallel']}"
                 + (f", {layout_cell(w)}" if layout_cell(w) != "aggregated" else ""))
        c.print(f"[bold green]{mt(model)}[/]: {w['gpus_total']} x {mt(w['gpu'])} ({shape})"
                f"{cost}; binding: {w['limit']} - {w['reason']}")
        if w.get("joules_per_output_token") is not None:
            c.print(f"  energy: {w['power_w']:,.0f} W mean per GPU at the demand, "
                    f"{w['joules_per_output_token']:.3g} J per output token, "
                    f"${w['energy_usd_per_mtok']:.3g} per million output tokens at "
                    f"${s.get('electricity_usd_per_kwh', 0):g}/kWh (docs/energy.md)")
        if w.get("layout") == "disaggregated":
            for side in ("prefill", "decode"):
                c.print(f"  {side} x {w[side]['workers']}: {w['flags'][side]['sglang']}")
                c.print(f"  {side} (vLLM): {w['flags'][side]['vllm']}")
        else:
            c.print(f"  {w['flags']['vllm']}")
            c.print(f"  sglang: {w['flags']['sglang']}")
        lay = (s.get("layouts") or {}).get(model)
        if lay is not None:
            c.print(layouts_line(lay))


def layout_cell(r: dict[str, Any]) -> str:
    """A row's layout in a few words: "aggregated" (with EP and attention DP where used), or
    a disaggregated unit's P:D and each side's parallel sizes."""
    if r.get("layout") == "disaggregated":
        def side(x: dict[str, Any]) -> str:
            return f"TP {x['tp']}" + (f" EP {x['ep']}" if x["ep"] > 1 else "") + (
                f" DP-attn {x['dp']}" if x["dp"] > 1 else "")

        return (f"{r['pd_ratio']} (prefill {side(r['prefill'])}; decode "
                f"{side(r['decode'])})")
    ep, dp = r.get("expert_parallel") or 1, r.get("attention_dp") or 1
    return "aggregated" + (f" EP {ep}" if ep > 1 else "") + (
        f" DP-attn {dp}" if dp > 1 else "")


def layouts_line(lay: dict[str, Any]) -> str:
    """With both layouts searched: which won, the runner-up, and why."""
    win, ru = lay["winner"], lay["runner_up"]
    if win is None:
        return f"  layouts: {lay['why']}"
    runner = ("" if ru is None else
              f"; runner-up: #{ru['rank']} {layout_cell(ru)}, {ru['gpus_total']} GPUs, "
              f"binding {ru['limit']}")
    return f"  layouts: {win} wins{runner}. Why: {lay['why']}"


def speculation_line(model: str, e: dict[str, Any]) -> str:
    """Whether speculative decoding changes the model's cheapest deployment."""
    best, plain = e["cheapest"], e["cheapest_plain"]
    if best is None:
        return f"{model}: speculation: no candidate meets the SLO with or without it"

    def what(x: dict[str, Any]) -> str:
        k = x["num_speculative_tokens"]
        return (f"{x['gpus_total']} x {x['gpu']} at max_num_seqs {x['max_num_seqs']}"
                + (f", K = {k} ({x['drafter']})" if k else ", no speculation"))

    if e["changes_cheapest"]:
        tail = (f"; without it: {what(plain)}" if plain is not None
                else "; without it no candidate meets the SLO")
        return f"{model}: speculation changes the cheapest deployment: {what(best)}{tail}"
    return f"{model}: speculation does not change the cheapest deployment ({what(best)})"


def _search_eff(s: dict[str, Any]) -> str:
    """The efficiencies the search's 'defaults' rows used, from its own spec."""
    e = s["spec"]["efficiency"]
    return (f"bandwidth {e['bandwidth']:.2f}, compute {e['compute']:.2f}, "
            f"{e['overhead_s'] * 1e3:g} ms + {e['overhead_per_seq_s'] * 1e6:g} us/seq per step")
