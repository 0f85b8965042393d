"""SLO attainment through the intervals where a policy has fewer replicas serving than the
demand needs (ramps), by replaying the requests through the simulator. Pure.

The router is round-robin over the replicas serving at each request's arrival: request k
goes to the (c mod n)-th of the n replicas ready then, c counting every request routed.
It is stated, and it is what lets each replica be simulated on its own (least-loaded
routing would need the replicas simulated in lock-step). A replica still starting takes
nothing, so requests that arrive meanwhile queue on the others; a replica that comes up
mid-interval takes its share from then on; a removed one takes no new request and finishes
what it holds.

An episode is a run of consecutive ramp intervals plus the interval after (the backlog
drains there), with `warmup_s` of the demand before it routed and simulated but not counted
(the replicas enter the ramp with a steady batch). Replicas that became ready and were
removed at the same instants are exchangeable under round-robin: one of each such group is
simulated and its requests stand for the group's (weighted by the group's size), so an
episode costs one simulation per group, not per replica (replicas ready before the episode and
still there after it are one group, however long ago each came up). A request meets the SLO when it
finishes and its TTFT, TPOT and E2E are within every target the SLO names (`Slo.met`); an
interval's attainment is the weighted share of its arrivals that meet it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from bstar.capacity.demand import DemandCurve
from bstar.capacity.policies import Schedule
from bstar.deployment import Deployment
from bstar.sim import SimConfig, Slo, Trace, Workload, simulate

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class Requests:
    """An episode's requests in arrival order (absolute times, the curve's clock)."""

    arrival_s: FloatArray
    prompt_tokens: IntArray
    output_tokens: IntArray
    cached_tokens: IntArray | None = None


def draw_requests(curve: DemandCurve, a_s: float, b_s: float, unit: Workload,
                  rng: np.random.Generator) -> Requests:
    """Poisson arrivals at each interval's rate over [a_s, b_s) (a count per interval, the
    times uniform within it), each request's lengths drawn from `unit`'s."""
    times: list[FloatArray] = []
    for s, r in zip(curve.starts_s.tolist(), curve.rates_req_s, strict=True):
        lo, hi = max(a_s, s), min(b_s, s + curve.interval_s)
        if hi <= lo or r <= 0:
            continue
        times.append(rng.uniform(lo, hi, size=rng.poisson(r * (hi - lo))))
    t = np.sort(np.concatenate(times)) if times else np.zeros(0)
    idx = rng.integers(0, unit.num_requests, size=t.size)
    cached = None if unit.cached_tokens is None else np.asarray(unit.cached_tokens)[idx]
    return Requests(t, unit.prompt_tokens[idx], unit.output_tokens[idx], cached)


def trace_requests(trace: Workload, a_s: float, b_s: float) -> Requests:
    """The trace's own requests that arrive in [a_s, b_s) (its clock is the curve's)."""
    assert trace.arrival_s is not None
    sel = (trace.arrival_s >= a_s) & (trace.arrival_s < b_s)
    cached = None if trace.cached_tokens is None else np.asarray(trace.cached_tokens)[sel]
    return Requests(trace.arrival_s[sel], trace.prompt_tokens[sel], trace.output_tokens[sel],
                    cached)


def trace_workload(trace: Trace) -> Workload:
    """A trace's requests in arrival order on the demand curve's clock (its first arrival
    at 0, as `demand.from_trace` bins them)."""
    order = np.argsort(np.asarray(trace.arrival_s), kind="stable")
    a = np.asarray(trace.arrival_s, dtype=np.float64)[order]
    return Workload(np.asarray(trace.prompt_tokens, dtype=np.int64)[order],
                    np.asarray(trace.output_tokens, dtype=np.int64)[order], a - a[0])


def route(sched: Schedule, arrival_s: FloatArray) -> IntArray:
    """Round-robin: the replica (index into `sched.replicas`) each request goes to."""
    out = np.full(arrival_s.size, -1, dtype=np.int64)
    change = sorted({x for r in sched.replicas for x in (r.ready_s, r.removed_s)
                     if np.isfinite(x)})
    c = 0
    k = 0
    while k < arrival_s.size:
        t = float(arrival_s[k])
        ids = sched.ready_ids(t)
        nxt = next((x for x in change if x > t), np.inf)
        j = int(np.searchsorted(arrival_s, nxt, "left"))
        j = max(j, k + 1)
        if ids:
            n = len(ids)
            out[k:j] = np.asarray(ids)[(c + np.arange(j - k)) % n]
            c += j - k
        k = j
    return out


def met(run_arrival_s: FloatArray, first_s: FloatArray, finish_s: FloatArray,
        done: npt.NDArray[np.bool_], output_tokens: IntArray, slo: Slo) -> npt.NDArray[np.bool_]:
    """Which requests finished within every SLO target (a one-token request has no TPOT)."""
    ttft = first_s - run_arrival_s
    e2e = finish_s - run_arrival_s
    multi = output_tokens > 1
    tpot = np.zeros(ttft.size)
    tpot[multi] = (e2e[multi] - ttft[multi]) / (output_tokens[multi] - 1)
    with np.errstate(invalid="ignore"):
        return done & slo.met(np.nan_to_num(ttft, nan=np.inf), tpot, np.nan_to_num(e2e, nan=np.inf))


@dataclass(frozen=True, slots=True)
class Replayed:
    """Per interval of the episode: requests (weighted) and those that met the SLO."""

    requests: FloatArray
    met: FloatArray
    simulations: int


def replay(d: Deployment, cfg: SimConfig, sched: Schedule, reqs: Requests, count_from_s: float,
           curve: DemandCurve, slo: Slo) -> Replayed:
    """Route `reqs`, simulate one replica of each exchangeable group, and count per
    interval of `curve` the requests arriving at or after `count_from_s` and those that
    met the SLO, each simulated request standing for its group's size."""
    n_int = len(curve.rates_req_s)
    total = np.zeros(n_int)
    good = np.zeros(n_int)
    where = route(sched, reqs.arrival_s)
    lo = float(reqs.arrival_s[0]) if reqs.arrival_s.size else 0.0
    hi = float(reqs.arrival_s[-1]) if reqs.arrival_s.size else 0.0
    groups: dict[tuple[float, float], list[int]] = {}
    for j in np.unique(where[where >= 0]).tolist():
        r = sched.replicas[j]
        # Within the episode only its own changes tell replicas apart: one ready before its
        # first request is as good as ready forever, one removed after its last as never.
        key = (-np.inf if r.ready_s <= lo else r.ready_s,
               np.inf if r.removed_s > hi else r.removed_s)
        groups.setdefault(key, []).append(j)
    sims = 0
    for members in groups.values():
        j = members[0]
        sel = where == j
        t = reqs.arrival_s[sel]
        t0 = float(t[0])
        w = Workload(reqs.prompt_tokens[sel], reqs.output_tokens[sel], t - t0,
                     cached_tokens=None if reqs.cached_tokens is None
                     else reqs.cached_tokens[sel])
        run = simulate(d, replace(cfg, max_sim_time_s=max(cfg.max_sim_time_s,
                                                          float(t[-1] - t0) * 4 + 3600)), w)
        sims += 1
        rq = run.requests
        ok = met(t - t0, rq.first_token_s, rq.finish_s, rq.done, rq.output_tokens, slo)
        counted = t >= count_from_s
        k = np.clip(((t - curve.start_s) // curve.interval_s).astype(np.int64), 0, n_int - 1)
        weight = float(len(members))
        np.add.at(total, k[counted], weight)
        np.add.at(good, k[counted & ok], weight)
    return Replayed(total, good, sims)
