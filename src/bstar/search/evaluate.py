"""One evaluation: the largest request rate one replica serves within the SLO, by bisection
on the rate with the simulator. This is the unit of work every backend runs; it takes a
picklable `Task` and returns plain JSON-able data, so all backends give identical results.

A rate is sustainable only below the replica's capacity: a queue fed faster than it is
served grows without bound, whatever a finite run's percentiles say, and a run that starts
from an empty server near full load has not yet built the queue steady state would. So rates
are capped at `max_utilization` (default 0.95) of the capacity, which is measured first by
`bstar.sim.capacity` (the definition `bstar simulate` reports too): one saturated
simulation, requests finished per second while the batch is full. Rates above the cap fail
without simulating.

"Meets the SLO" at a rate at most the cap: on each of the traffic's draws (`--draws`,
default 3 seeds) the simulation finished every request and each p99 the SLO names (TTFT,
TPOT, E2E) is within its target. Reported p99s are the worst over the draws.

The bracket starts at the cap and halves until a rate meets the SLO; bisection
(geometric) then narrows [lo, hi] until hi / lo - 1 <= rel_tol. The answer is `lo`, a rate
known to meet the SLO.

The binding limit is what failed at `hi`:
- compute: `hi` is the cap itself: the replica's throughput roof (steps at a full batch)
  binds, and the latency targets still hold just below it;
- memory: the KV pool ran out (preemptions at `hi`, or a capacity run whose batch the
  KV pool held below max_num_seqs when the capacity binds);
- SLO: a latency target broke below the capacity.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

from bstar.search.bisect import bisect_rate, timing
from bstar.search.candidates import Replica, mean_tokens, sim_config
from bstar.search.spec import Traffic, at_rate
from bstar.sim import SimSummary, Slo, Workload, simulate, summarize
from bstar.sim.capacity import capacity as sim_capacity


@dataclass(frozen=True, slots=True)
class Task:
    replica: Replica
    traffic: Traffic
    slo: Slo
    rel_tol: float
    max_utilization: float = 0.95

    @property
    def key(self) -> str:
        return self.replica.key


def _brief(s: SimSummary, rate: float) -> dict[str, Any]:
    return {"rate_req_s": rate, "ttft_p99_ms": s.ttft_ms["p99"], "tpot_p99_ms": s.tpot_ms["p99"],
            "e2e_p99_ms": s.e2e_ms["p99"], "throughput_tok_s": s.throughput_tok_s,
            "preemptions": s.preemptions, "kv_utilization_max": s.kv_utilization_max,
            "queue_mean": s.queue_mean, "running_max": s.running_max,
            "truncated": s.truncated, "power_w_mean": s.power_w_mean,
            "joules_per_output_token": s.joules_per_output_token}


def failures(s: SimSummary, slo: Slo) -> list[str]:
    """The SLO terms a run misses (empty: it meets the SLO)."""
    out = []
    if s.truncated:
        out.append("unfinished")
    for key, target in slo.to_dict().items():
        v = getattr(s, key)["p99"]
        if v is not None and v > target:
            out.append(f"{key.removesuffix('_ms')} p99 {v:.1f} > {target:g} ms")
    return out


def slo_score(s: SimSummary, slo: Slo) -> float | None:
    """The worst p99 / target over the SLO's terms (below 1: met); None when not known (a run
    left unfinished, a term with no value). Places the rate search's probes
    (search.bisect)."""
    if s.truncated:
        return None
    ratios = []
    for key, target in slo.to_dict().items():
        v = getattr(s, key)["p99"]
        if v is None:
            return None
        ratios.append(v / target)
    return max(ratios) if ratios else None


def _worst(a: SimSummary, b: SimSummary) -> SimSummary:
    """`a` with each latency p99 and the failure counters the worse of the two draws."""
    def p99(x: dict[str, float | None], y: dict[str, float | None]) -> dict[str, float | None]:
        vals = [v for v in (x["p99"], y["p99"]) if v is not None]
        return {**x, "p99": max(vals) if vals else None}

    return replace(a, ttft_ms=p99(a.ttft_ms, b.ttft_ms), tpot_ms=p99(a.tpot_ms, b.tpot_ms),
                   e2e_ms=p99(a.e2e_ms, b.e2e_ms), preemptions=max(a.preemptions, b.preemptions),
                   kv_utilization_max=max(a.kv_utilization_max, b.kv_utilization_max),
                   running_max=max(a.running_max, b.running_max),
                   truncated=a.truncated or b.truncated)


def evaluate(task: Task) -> dict[str, Any]:
    """Capacity, then bisection on the rate below it. Returns the result row (JSON-able)
    with `elapsed_s` apart under `_timing` (not part of the answer: backends differ). A
    disaggregated candidate (search.disagg.DisaggReplica) is evaluated by its own two-pool
    simulation (search.disagg.evaluate_disagg)."""
    if getattr(task.replica, "layout", "aggregated") == "disaggregated":
        from bstar.search.disagg import evaluate_disagg

        return evaluate_disagg(task)
    t0 = time.perf_counter()
    c0 = time.process_time()
    r, slo = task.replica, task.slo
    units = task.traffic.unit_workloads()
    unit = units[0]
    cfg = sim_config(r)
    d = r.deployment
    # The one definition of capacity (bstar.sim.capacity), shared with `bstar simulate`.
    # Its precision only places the bracket's top (the SLO bisection narrows below it).
    sat, _ = sim_capacity(d, cfg, unit, rel_tol=max(task.rel_tol, 0.05))
    cap = sat.capacity_req_s
    sims = 1

    def run(rate: float) -> tuple[bool, SimSummary]:
        nonlocal sims
        worst: SimSummary | None = None
        for u in units:  # stop at the first draw that misses
            sims += 1
            s = summarize(simulate(r.deployment, cfg, at_rate(u, rate)), slo, energy=True)
            worst = s if worst is None else _worst(worst, s)
            if failures(s, slo):
                return False, worst
        assert worst is not None
        return True, worst

    capacity = {"capacity_req_s": cap, "running_max": sat.running_max,
                "preemptions": sat.preemptions,
                "kv_utilization_max": sat.kv_utilization_max}
    lo, hi = bisect_rate(run, task.max_utilization * cap, task.rel_tol,
                         lambda x: slo_score(x, slo))
    if lo is None:
        fs = hi[1]
        assert fs is not None
        return {"status": "infeasible", "limit": "SLO",
                "reason": f"misses the SLO even at {hi[0]:.3g} req/s per replica: "
                          + "; ".join(failures(fs, slo)),
                "simulations": sims, "capacity": capacity, "at_fail": _brief(fs, hi[0]),
                "_timing": timing(t0, c0)}
    return _ok(r, unit, lo, hi, capacity, sims, timing(t0, c0), slo)


def _ok(r: Replica, unit: Workload, lo: tuple[float, SimSummary],
        hi: tuple[float, SimSummary | None], capacity: dict[str, Any], sims: int,
        timing: dict[str, float], slo: Slo) -> dict[str, Any]:
    rate, s = lo
    fs = hi[1]
    if fs is None:
        kv_bound = capacity["preemptions"] > 0 or capacity["running_max"] < r.max_num_seqs
        limit = "memory" if kv_bound else "compute"
        held = (f"the KV pool holds {capacity['running_max']} of max_num_seqs "
                f"{r.max_num_seqs}" if kv_bound else
                f"a full batch of {capacity['running_max']}")
        reason = (f"{hi[0]:.3g} req/s = {hi[0] / capacity['capacity_req_s']:.0%} of the "
                  f"capacity {capacity['capacity_req_s']:.3g} req/s ({held}); the SLO still "
                  "holds there")
    else:
        why = "; ".join(failures(fs, slo))
        if fs.preemptions > 0:
            limit = "memory"
            reason = (f"at {hi[0]:.3g} req/s the KV pool runs out ({fs.preemptions} "
                      f"preemptions, KV {fs.kv_utilization_max:.0%}): {why}")
        else:
            limit = "SLO"
            reason = (f"at {hi[0]:.3g} req/s, below the capacity {capacity['capacity_req_s']:.3g}"
                      f" req/s: {why}")
    return {"status": "ok", "limit": limit, "reason": reason,
            "rate_per_replica_req_s": rate,
            "mean_output_tokens": mean_tokens(unit)[1], "capacity": capacity,
            "at_rate": _brief(s, rate), "at_fail": None if fs is None else _brief(fs, hi[0]),
            "simulations": sims, "_timing": timing}
