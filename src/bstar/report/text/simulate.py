"""`bstar simulate`: the pool and the traffic, a row per max_num_seqs, KV and queue over
time, capacities, and the knees and advice."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bstar.energy import energy_usd_per_mtok
from bstar.report.text._common import console
from bstar.report.text._common import markup_text as mt
from bstar.units import fmt_bytes, fmt_num, sparkline

if TYPE_CHECKING:
    from rich.console import Console

    from bstar.sim.study import Study


def print_simulation(study: Study) -> None:
    """A `bstar simulate` study: the pool, the traffic, a row per level, the timelines and
    the advice."""
    from rich.table import Table

    from bstar import roofline as rl
    from bstar.sim.traffic import parse_lengths

    c = console()
    d, rows, advice, arrivals = study.deployment, study.rows, study.advice, study.arrivals
    args, tokens = study.options, study.max_num_batched_tokens
    first = rows[0]
    inp, out = parse_lengths(args.input_len), parse_lengths(args.output_len)
    c.print(f"[bold]{mt(d.model.name)}[/] on [bold]{d.num_gpus} x {mt(d.gpu.name)}[/] "
            f"({mt(d.gpu.id)}): "
            + (f"KV pool {fmt_bytes(rl.kv_pool_bytes(d))} per GPU" if d.data_parallel == 1
               else f"KV pool {fmt_bytes(rl.kv_pool_bytes(d) // d.data_parallel)} per GPU x "
                    f"{d.data_parallel} attention DP ranks")
            + (f", EP {d.expert_parallel}" if d.expert_parallel > 1 else "")
            + f" = {first.kv_blocks:,} blocks "
            f"of {first.block_size} tokens ({first.kv_blocks * first.block_size:,} tokens)")
    lengths = "lengths from the trace" if args.trace is not None else \
        f"input {inp.describe()}, output {out.describe()}"
    c.print(f"  traffic: {arrivals.describe()}, {lengths}, {first.requests_total:,} requests, "
            f"seed {args.seed}; "
            f"max_num_batched_tokens {tokens}, preemption {args.preemption}")
    t = Table(show_edge=False, pad_edge=False, box=None)
    cols = ["max_num_seqs", "done", "out tok/s", "req/s"]
    if first.goodput_req_s is not None:
        cols.append("goodput\nreq/s")
    cols += ["TTFT ms\np50", "TTFT ms\np99", "TPOT ms\np50", "TPOT ms\np99", "ITL ms\np99",
             "E2E s\np99", "preempt", "KV peak", "queue\nmax", "running\nmax"]
    for col in cols:
        t.add_column(col, justify="right")

    def cell(v: float | None, scale: float = 1.0, nd: int = 1) -> str:
        return fmt_num(None if v is None else v * scale, nd, "-")

    for r in rows:
        mark = " *" if advice is not None and r.max_num_seqs == advice.max_num_seqs else ""
        cells = [f"{r.max_num_seqs}{mark}",
                 f"{r.requests}/{r.requests_total}" if r.truncated else str(r.requests),
                 f"{r.throughput_tok_s:,.0f}", f"{r.request_throughput_req_s:.2f}"]
        if first.goodput_req_s is not None:
            cells.append(cell(r.goodput_req_s, nd=2))
        cells += [cell(r.ttft_ms["p50"]), cell(r.ttft_ms["p99"]), cell(r.tpot_ms["p50"], nd=2),
                  cell(r.tpot_ms["p99"], nd=2), cell(r.itl_ms["p99"], nd=2),
                  cell(r.e2e_ms["p99"], 1e-3, 2),
                  f"[red]{r.preemptions}[/]" if r.preemptions else "0",
                  f"{r.kv_utilization_max * 100:.0f}%", str(r.queue_max), str(r.running_max)]
        t.add_row(*cells)
    c.print(t)
    print_simulation_energy(c, study)
    print_simulation_tail(c, study)


def print_simulation_energy(c: Console, study: Study) -> None:
    """Each level's mean power and joules per output token, and their electricity cost
    (bstar.energy; nothing without a power model)."""
    price = study.options.electricity_usd_per_kwh
    for r in study.rows:
        if r.joules_per_output_token is None or r.power_w_mean is None:
            continue
        c.print(f"  energy at max_num_seqs {r.max_num_seqs}: {r.power_w_mean:,.0f} W mean per "
                f"GPU, {r.joules_per_output_token:.3g} J per output token, "
                f"${energy_usd_per_mtok(r.joules_per_output_token, price):.3g} per million "
                f"output tokens at ${price:g}/kWh (docs/energy.md)")


def print_simulation_tail(c: Console, study: Study) -> None:
    """Throughput across levels, KV and queue over time, warnings, the knees and advice."""
    rows, advice, arrivals = study.rows, study.advice, study.arrivals
    if len(rows) > 1:
        c.print(f"  throughput {sparkline([r.throughput_tok_s for r in rows])}")
    queue_top = max(max(r.queue_max for r in rows), 1)
    c.print(f"  over time, peak per bin (KV: 0..100% of the pool; queue: 0..{queue_top}):")
    for r in rows:
        tl = r.timeline
        span = tl["time_s"][-1] if tl["time_s"] else 0.0
        kv = fixed_scale_bars(tl["kv_utilization"][::2], 1.0)
        queue = fixed_scale_bars(tl["num_waiting"][::2], queue_top)
        c.print(f"    {r.max_num_seqs:>6}  KV {kv:<50} queue {queue:<50} 0..{span:,.0f} s")
    rate = getattr(arrivals, "rate_per_s", None)
    caps = study.capacities or []
    for r, cap in zip(rows, caps, strict=False):
        if cap is None:
            continue
        bound = ("prompt steps only: every request ends in its prompt's step"
                 if not cap["running_max"] else
                 f"the KV pool holds {cap['running_max']}" if cap["kv_bound"]
                 else f"a full batch of {cap['running_max']}")
        line = (f"  capacity at max_num_seqs {r.max_num_seqs}: sustains up to "
                f"{cap['capacity_req_s']:.2f} req/s ({cap['capacity_tok_s']:,.0f} out tok/s, "
                f"{bound})")
        if cap.get("at_rate_req_s"):
            line += (f"; at {cap['at_rate_fraction']:.0%} of it ({cap['at_rate_req_s']:.2f} "
                     f"req/s, Poisson) TTFT p50/p99 {_ms(cap['ttft_ms'], 'p50', ',.1f')}/"
                     f"{_ms(cap['ttft_ms'], 'p99', ',.1f')} ms, TPOT p50/p99 "
                     f"{_ms(cap['tpot_ms'], 'p50', '.2f')}/{_ms(cap['tpot_ms'], 'p99', '.2f')}"
                     " ms")
        c.print(line)
    best = max(r.request_throughput_req_s for r in rows)
    top = max((cap["capacity_req_s"] for cap in caps if cap is not None), default=None)
    if rate is not None and ((top is not None and rate >= top)
                             or (top is None and best < 0.95 * rate)):
        c.print(f"  [yellow]overloaded: {rate:g} req/s offered, above the capacity of every "
                "level; the queue grows for the whole run and TTFT is mostly waiting "
                "(its tail grows with --num-requests)[/]")
    for r in rows:
        if r.truncated:
            c.print(f"  [yellow]max_num_seqs {r.max_num_seqs}: stopped at "
                    f"{study.options.max_sim_time_s:g} s simulated with requests unfinished[/]")
    if advice is not None:
        for k in advice.knees.values():
            c.print(f"  knee ({k.rule}): "
                    + (f"[bold]{k.batch}[/]" if k.batch is not None else "none")
                    + f" - {k.reason}")
        c.print(f"  [bold green]max_num_seqs = {advice.max_num_seqs}[/] ({advice.bound}): "
                f"{advice.reason}")
    c.print("[dim]TPOT per request = (E2E - TTFT)/(output - 1); ITL = gaps between tokens; "
            "out tok/s = output tokens / time to the last finish (vLLM benchmark "
            "definitions). Step times from the cost model; * = recommended.[/]")


def fixed_scale_bars(values: list[float], top: float) -> str:
    """A bar per value on a fixed scale 0..top (so levels compare; units.sparkline rescales
    each series to its own range)."""
    bars = " ▁▂▃▄▅▆▇█"
    return "".join(bars[min(8, max(0, round(v / top * 8)))] for v in values)


def _ms(pcts: dict[str, Any] | None, key: str, spec: str) -> str:
    """One percentile of a latency, or "n/a" where it has none (TPOT when every output is
    one token: no second token, no time per output token)."""
    v = (pcts or {}).get(key)
    return "n/a" if v is None else format(v, spec)
