"""Capacity over time: for each deployment, the rate one replica serves at the SLO (the
search's evaluation, by simulation), each policy's replicas per interval, what they cost,
and the SLO attainment through the day. Pure: specs in, a `CapacityResult` out.

Attainment per interval:
- where at least the per-interval minimum of replicas serves throughout (steady), each
  replica carries demand / ready requests/s, below the rate the search found meets the SLO;
  its attainment is read off `SteadyAttainment`, simulated once per deployment at a few
  fractions of that rate (Poisson arrivals; round-robin spreads them more evenly than
  Poisson, so this is on the safe side);
- where fewer serve (a ramp: a replica still starting, or a schedule below the demand), the
  requests are replayed through the simulator (`bstar.capacity.replay`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from bstar.capacity.demand import DemandCurve
from bstar.capacity.policies import POLICIES, Schedule, Settings, required, schedule
from bstar.capacity.replay import Replayed, Requests, draw_requests, replay, trace_requests
from bstar.capacity.steady import (
    STEADY_FRACTIONS,
    STEADY_REQUESTS,
    SteadyAttainment,
    steady_attainment,
)
from bstar.deployment import Deployment
from bstar.errors import BstarError
from bstar.search.backends import Backend, InProcess
from bstar.search.candidates import Replica, sim_config
from bstar.search.evaluate import Task, evaluate
from bstar.search.prices import PriceTable
from bstar.search.spec import Traffic
from bstar.sim import SimConfig, Slo, Workload
from bstar.units import DEFAULT_ELECTRICITY_USD_PER_KWH

IntArray = npt.NDArray[np.int64]
ROUTER = ("round-robin over the replicas ready at each arrival; a replica still starting "
          "takes nothing, so requests meanwhile queue on the others")


@dataclass
class PolicyResult:
    """One policy's day. `to_dict` is the `policies[]` object of the capacity contract;
    a new per-policy figure (energy) is one more field here and one more key there."""

    policy: str
    intervals: list[dict[str, Any]]
    gpu_hours: float
    cost_total: float | None
    cost_per_day: float | None
    cost_per_mtok: float | None
    idle_fraction: float
    slo_attainment: float
    ramp: dict[str, Any]
    replicas_max: int
    simulations: int
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"policy": self.policy, "gpu_hours": self.gpu_hours,
                "cost_per_day": self.cost_per_day, "cost_total": self.cost_total,
                "cost_per_mtok": self.cost_per_mtok, "idle_fraction": self.idle_fraction,
                "slo_attainment": self.slo_attainment, "ramp": self.ramp,
                "replicas_max": self.replicas_max, "simulations": self.simulations,
                **self.extra, "intervals": self.intervals}


@dataclass
class DeploymentResult:
    replica: Replica
    rate_per_replica_req_s: float
    mean_output_tokens: float
    usd_per_gpu_hour: float | None
    steady: SteadyAttainment
    policies: list[PolicyResult]
    evaluation: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        r = self.replica
        return {"model": r.model, "gpu": r.gpu, "tensor_parallel": r.tp,
                "gpus_per_replica": r.tp, "max_num_seqs": r.max_num_seqs,
                "max_num_batched_tokens": r.max_num_batched_tokens,
                "rate_per_replica_req_s": self.rate_per_replica_req_s,
                "capacity_req_s": self.evaluation["capacity"]["capacity_req_s"],
                "limit": self.evaluation["limit"],
                "mean_output_tokens": self.mean_output_tokens,
                "usd_per_gpu_hour": self.usd_per_gpu_hour,
                "steady_attainment": {"rate_req_s": list(self.steady.rates_req_s),
                                      "slo_attainment": list(self.steady.attainment)},
                "policies": [p.to_dict() for p in self.policies]}


@dataclass
class CapacityResult:
    curve: DemandCurve
    slo: Slo
    settings: Settings
    deployments: list[DeploymentResult]
    prices: PriceTable | None
    timing: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The capacity JSON contract (docs/contracts.md): `policies` is the first
        deployment's; `deployments[]` carries each one's."""
        c = self.curve
        deps = [d.to_dict() for d in self.deployments]
        return {"policies": deps[0]["policies"],
                "demand": {"source": c.source, "interval_s": c.interval_s,
                           "start_s": c.start_s, "intervals": len(c.rates_req_s),
                           "duration_s": c.duration_s, "peak_req_s": c.peak_req_s,
                           "mean_req_s": float(c.rates.mean()), "requests": c.requests()},
                "slo": self.slo.to_dict(), "router": ROUTER,
                "settings": self.settings.to_dict(),
                "prices": None if self.prices is None else self.prices.to_dict(),
                "deployments": deps, "timing": self.timing}


Tick = Callable[[int, int], None]


def plan_capacity(replicas: list[Replica], curve: DemandCurve, traffic: Traffic, slo: Slo,
                  settings: Settings, prices: PriceTable | None = None,
                  policies: tuple[str, ...] = POLICIES, trace: Workload | None = None,
                  seed: int = 0, warmup_s: float = 30.0, rel_tol: float = 0.02,
                  max_utilization: float = 0.95,
                  electricity_usd_per_kwh: float = DEFAULT_ELECTRICITY_USD_PER_KWH,
                  backend: Backend | None = None, tick: Tick | None = None
                  ) -> CapacityResult:
    """Each replica configuration scaled over `curve` under each policy. `traffic` is the
    request mix (its demand is the curve's peak, as `bstar search` at the peak is asked);
    `trace`, when the curve came from a trace, is its requests on the curve's clock and
    the ramps replay them instead of drawing Poisson arrivals.

    The simulations run on `backend` (a started `bstar.search` backend: this process, a
    local process pool or Ray; default this process), in two rounds: every replica's
    evaluation, then every replica's steady simulations and every policy's ramp replays at
    once. Each is a pure function of its inputs and results are placed by index, so the
    answer does not depend on the backend. `tick(done, total)` follows them."""
    if not replicas:
        raise BstarError("no deployment to scale")
    t_start = time.perf_counter()
    be = backend if backend is not None else InProcess()
    count = _Count(tick, len(replicas))
    evs = count.run(be, _evaluate_task, [Task(r, traffic, slo, rel_tol, max_utilization)
                                         for r in replicas])
    plans = [_plan_scale(r, _checked(r, ev), curve, traffic, slo, settings, prices, policies,
                         trace, seed, warmup_s) for r, ev in zip(replicas, evs, strict=True)]
    per_plan = [sp.jobs() for sp in plans]
    jobs = [j for js in per_plan for j in js]
    count.total += len(jobs)
    # The longest first, so the last to finish are short (any order gives the same answer).
    order = sorted(range(len(jobs)), key=lambda k: -jobs[k].size)
    done = count.run(be, _run_job, [jobs[k] for k in order])
    results: list[Any] = [None] * len(jobs)
    for k, v in zip(order, done, strict=True):
        results[k] = v
    out = []
    k = 0
    for sp, js in zip(plans, per_plan, strict=True):
        out.append(sp.result(results[k:k + len(js)], electricity_usd_per_kwh))
        k += len(js)
    return CapacityResult(curve, slo, settings, out, prices,
                          {"wall_s": time.perf_counter() - t_start})


class _Count:
    """Tasks finished and known, told to `tick` as each finishes."""

    def __init__(self, tick: Tick | None, total: int) -> None:
        self.tick, self.done, self.total = tick, 0, total

    def run(self, backend: Backend, fn: Callable[[Any], Any], items: list[Any]) -> list[Any]:
        out: list[Any] = [None] * len(items)
        if self.tick is not None:
            self.tick(self.done, self.total)
        for i, v in backend.imap_unordered(fn, items):
            out[i] = v
            self.done += 1
            if self.tick is not None:
                self.tick(self.done, self.total)
        return out


def _evaluate_task(task: Task) -> dict[str, Any]:
    ev = evaluate(task)
    ev.pop("_timing", None)
    return ev


def _checked(r: Replica, ev: dict[str, Any]) -> dict[str, Any]:
    if ev["status"] != "ok":
        raise BstarError(f"{r.key}: {ev['reason']}")
    return ev


def evaluate_replica(r: Replica, traffic: Traffic, slo: Slo, rel_tol: float = 0.02,
                     max_utilization: float = 0.95) -> dict[str, Any]:
    """`bstar search`'s evaluation of one replica (the largest rate at the SLO, by
    simulation); a replica that cannot meet the SLO at any rate is a one-line error."""
    return _checked(r, _evaluate_task(Task(r, traffic, slo, rel_tol, max_utilization)))


def scale(r: Replica, ev: dict[str, Any], curve: DemandCurve, traffic: Traffic, slo: Slo,
          settings: Settings, prices: PriceTable | None = None,
          policies: tuple[str, ...] = POLICIES, trace: Workload | None = None, seed: int = 0,
          warmup_s: float = 30.0,
          electricity_usd_per_kwh: float = DEFAULT_ELECTRICITY_USD_PER_KWH,
          backend: Backend | None = None) -> DeploymentResult:
    """One replica configuration, evaluated (`evaluate_replica`), over the curve under
    each policy."""
    sp = _plan_scale(r, ev, curve, traffic, slo, settings, prices, policies, trace, seed,
                     warmup_s)
    be = backend if backend is not None else InProcess()
    return sp.result(_Count(None, 0).run(be, _run_job, sp.jobs()), electricity_usd_per_kwh)


@dataclass(frozen=True, slots=True)
class _SteadyJob:
    """`steady_attainment`'s simulations for one replica, as a backend task."""

    replica: Replica
    unit: Workload
    rate_req_s: float
    slo: Slo
    capacity_req_s: float | None

    @property
    def size(self) -> int:
        return STEADY_REQUESTS * len(STEADY_FRACTIONS)

    def __call__(self) -> SteadyAttainment:
        return steady_attainment(self.replica, self.unit, self.rate_req_s, self.slo,
                                 self.capacity_req_s)


@dataclass(frozen=True, slots=True)
class _ReplayJob:
    """One ramp episode's `replay`, as a backend task."""

    d: Deployment
    cfg: SimConfig
    sched: Schedule
    reqs: Requests
    count_from_s: float
    curve: DemandCurve
    slo: Slo

    @property
    def size(self) -> int:
        return int(self.reqs.arrival_s.size)

    def __call__(self) -> Replayed:
        return replay(self.d, self.cfg, self.sched, self.reqs, self.count_from_s, self.curve,
                      self.slo)


def _run_job(job: _SteadyJob | _ReplayJob) -> Any:
    return job()


@dataclass
class _PolicyPlan:
    """A policy's schedule over the curve and the ramp episodes to replay (i, j, job)."""

    name: str
    sched: Schedule
    need: IntArray
    paid: IntArray
    ready: IntArray
    episodes: list[tuple[int, int, _ReplayJob]]


@dataclass
class _ScalePlan:
    """One replica's steady job and policies, then (`result`) what their jobs returned."""

    r: Replica
    ev: dict[str, Any]
    curve: DemandCurve
    rate: float
    mean_out: float
    usd: float | None
    steady: _SteadyJob
    policies: list[_PolicyPlan]

    def jobs(self) -> list[_SteadyJob | _ReplayJob]:
        return [self.steady, *(job for p in self.policies for _, _, job in p.episodes)]

    def result(self, done: list[Any], electricity_usd_per_kwh: float) -> DeploymentResult:
        steady: SteadyAttainment = done[0]
        k = 1
        pols = []
        for p in self.policies:
            n = len(p.episodes)
            pols.append(_policy_result(p, self.r, self.curve, self.rate, self.mean_out,
                                       self.usd, steady, done[k:k + n]))
            k += n
        power_w = (self.ev.get("at_rate") or {}).get("power_w_mean")
        for pol in pols:
            pol.extra.update(policy_energy(self.r.deployment, power_w, self.rate,
                                           pol.intervals, self.curve.interval_s,
                                           self.mean_out, electricity_usd_per_kwh))
        return DeploymentResult(self.r, self.rate, self.mean_out, self.usd, steady, pols,
                                self.ev)


def _plan_scale(r: Replica, ev: dict[str, Any], curve: DemandCurve, traffic: Traffic,
                slo: Slo, settings: Settings, prices: PriceTable | None,
                policies: tuple[str, ...], trace: Workload | None, seed: int,
                warmup_s: float) -> _ScalePlan:
    rate = float(ev["rate_per_replica_req_s"])
    mean_out = float(ev["mean_output_tokens"])
    unit = traffic.unit_workload()
    capacity_req_s = float(ev["capacity"]["capacity_req_s"])
    steady = _SteadyJob(r, unit, rate, slo,
                        capacity_req_s if settings.replay == "overloaded" else None)
    price = prices.get(r.gpu) if prices is not None else None
    usd = None if price is None else price.per_gpu_hour
    pols = [_policy_plan(p, r, curve, rate, capacity_req_s, settings, unit, trace, slo, seed,
                         warmup_s) for p in policies]
    return _ScalePlan(r, ev, curve, rate, mean_out, usd, steady, pols)


def policy_energy(d: Any, power_w_at_rate: float | None, rate_req_s: float,
                  intervals: list[dict[str, Any]], interval_s: float, mean_output_tokens: float,
                  electricity_usd_per_kwh: float) -> dict[str, Any]:
    """A policy's energy over the curve (issue 39; bstar.energy, docs/energy.md): in each
    interval its ready replicas share the demand, each at most at the rate it was simulated
    at, and draw idle power plus the simulated power above idle in proportion to their load
    (`bstar search`'s fleet rule, search/rank.fleet_energy); a replica still starting draws
    idle power. `energy_kwh`, `joules_per_output_token` and `energy_cost` at the stated
    price; all None without a power model for the GPU or a simulated power figure."""
    from bstar.energy import power_model
    from bstar.search.rank import fleet_energy

    pm = power_model(d.gpu)
    none = {"energy_kwh": None, "joules_per_output_token": None, "energy_cost": None,
            "electricity_usd_per_kwh": electricity_usd_per_kwh}
    if pm is None or power_w_at_rate is None or not rate_req_s > 0:
        return none
    joules = 0.0
    tokens = 0.0
    for iv in intervals:
        ready, paid, demand = iv["ready_replicas"], iv["replicas"], iv["demand_req_s"]
        # No demand or no replica ready: every paid GPU idles.
        fleet = fleet_energy(d, power_w_at_rate, rate_req_s, demand, ready,
                             mean_output_tokens) if ready > 0 else None
        busy_w = pm.idle_w if fleet is None else fleet[0]
        watts = (ready * busy_w + max(paid - ready, 0) * pm.idle_w) * d.num_gpus
        joules += watts * interval_s
        tokens += demand * interval_s * mean_output_tokens
    kwh = joules / 3.6e6
    return {"energy_kwh": kwh,
            "joules_per_output_token": joules / tokens if tokens > 0 else None,
            "energy_cost": kwh * electricity_usd_per_kwh,
            "electricity_usd_per_kwh": electricity_usd_per_kwh}


def episode_rng(seed: int, first_interval: int) -> np.random.Generator:
    """The generator of the requests drawn for the episode starting at `first_interval`
    (its own stream: an episode's requests do not depend on the episodes before it)."""
    return np.random.default_rng([seed, first_interval])


def episode_bounds(curve: DemandCurve, i: int, j: int, warmup_s: float
                   ) -> tuple[float, float, float]:
    """(warm-up start, first counted instant, end) of the episode over intervals i..j."""
    a = float(curve.starts_s[i])
    return max(curve.start_s, a - warmup_s), a, float(curve.starts_s[j] + curve.interval_s)


def ramp_episodes(ramp: np.ndarray) -> list[tuple[int, int]]:
    """[first, last] interval of each run of ramp intervals, extended by the interval after
    (its backlog drains there)."""
    out: list[tuple[int, int]] = []
    n = ramp.size
    i = 0
    while i < n:
        if not ramp[i]:
            i += 1
            continue
        j = i
        while j + 1 < n and ramp[j + 1]:
            j += 1
        out.append((i, min(j + 1, n - 1)))
        i = j + 1
    return out


def _policy_plan(name: str, r: Replica, curve: DemandCurve, rate: float,
                 capacity_req_s: float, settings: Settings, unit: Workload,
                 trace: Workload | None, slo: Slo, seed: int, warmup_s: float) -> _PolicyPlan:
    sched: Schedule = schedule(name, curve, rate, settings)
    starts = curve.starts_s
    need = required(curve, rate)
    paid = sched.provisioned(starts)
    ready = sched.min_ready(starts, curve.interval_s)
    demand = curve.rates
    replayed = ready < need  # the ramps
    if settings.replay == "overloaded":
        # Only ramps past the replica's capacity (the queue grows), and the interval after
        # each; the milder ones read the steady simulations up to the capacity.
        over = demand / np.maximum(ready, 1) > capacity_req_s
        replayed = replayed & (over | np.r_[False, over[:-1]])
    cfg = sim_config(r)
    episodes = []
    for i, j in ramp_episodes(replayed):
        lo, a, b = episode_bounds(curve, i, j, warmup_s)
        reqs = (trace_requests(trace, lo, b) if trace is not None
                else draw_requests(curve, lo, b, unit, episode_rng(seed, i)))
        if reqs.arrival_s.size == 0:
            continue
        episodes.append((i, j, _ReplayJob(r.deployment, cfg, sched, reqs, a, curve, slo)))
    return _PolicyPlan(name, sched, need, paid, ready, episodes)


def _policy_result(p: _PolicyPlan, r: Replica, curve: DemandCurve, rate: float,
                   mean_out: float, usd: float | None, steady: SteadyAttainment,
                   replays: list[Replayed]) -> PolicyResult:
    sched, need, paid, ready = p.sched, p.need, p.paid, p.ready
    starts = curve.starts_s
    demand = curve.rates
    ramp = ready < need
    att = np.array([steady.at(x / max(n, 1)) if x > 0 else 1.0
                    for x, n in zip(demand.tolist(), ready.tolist(), strict=True)])
    source = np.array(["steady"] * demand.size, dtype=object)
    replayed_req = np.zeros(demand.size)
    sims = 0
    for (i, j, _), rep in zip(p.episodes, replays, strict=True):
        sims += rep.simulations
        for k in range(i, j + 1):
            if rep.requests[k] > 0:
                att[k] = rep.met[k] / rep.requests[k]
                source[k] = "replay"
                replayed_req[k] = rep.requests[k]
    weights = demand * curve.interval_s
    total_req = float(weights.sum())
    overall = float((att * weights).sum() / total_req)
    ramp_req = float(weights[ramp].sum())
    lost = float(((1 - att) * weights)[ramp].sum())
    gpu_s = sched.replica_seconds() * r.tp
    gpu_hours = gpu_s / 3600.0
    cost_total = None if usd is None else gpu_hours * usd
    days = curve.duration_s / 86_400.0
    tokens_m = total_req * mean_out / 1e6
    idle = 1.0 - total_req / (sched.replica_seconds() * rate)
    intervals = [{"start_s": float(s), "demand_req_s": float(x), "replicas": int(p),
                  "ready_replicas": int(q), "required_replicas": int(n),
                  "capacity_req_s": float(q) * rate, "slo_attainment": float(v),
                  "attainment_from": str(src)}
                 for s, x, p, q, n, v, src in zip(starts, demand, paid, ready, need, att,
                                                  source, strict=True)]
    return PolicyResult(
        p.name, intervals, gpu_hours, cost_total,
        None if cost_total is None else cost_total / days,
        None if cost_total is None or tokens_m <= 0 else cost_total / tokens_m,
        max(0.0, idle), overall,
        {"intervals": int(ramp.sum()), "requests": ramp_req,
         "slo_attainment": None if ramp_req <= 0 else 1 - lost / ramp_req,
         "attainment_lost": lost / total_req if total_req > 0 else 0.0,
         "replayed_requests": float(replayed_req.sum())},
        int(paid.max()), sims)


def replica_for(d: Any, model_label: str, max_num_seqs: int, max_num_batched_tokens: int,
                calibrated: str | None = None) -> Replica:
    """A search replica for one assembled deployment (its tp = its GPUs)."""
    return Replica(model_label, d.gpu.id, d.num_gpus, max_num_seqs, max_num_batched_tokens, d,
                   calibrated)



def search_winners(spec: Any, backend: Any, store: Any,
                   prices: PriceTable | None = None) -> tuple[list[Replica], Any]:
    """Each model's winner of `bstar search` (at the spec's demand: the curve's peak), as
    the replica it runs; with the search result."""
    from bstar.search import plan_candidates, run_search

    result = run_search(spec, backend, store, prices)
    by_key = {c.replica.key: c.replica for c in plan_candidates(spec)[0]}
    reps = [by_key[w["replica_key"]] for w in result.winners.values()]
    if not reps:
        raise BstarError("the search found no deployment that meets the SLO at the peak")
    return reps, result
