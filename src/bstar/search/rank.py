"""From per-replica rates to deployments: replicas for the demand, GPUs, cost per million
output tokens, the ranking (cheapest first) and the Pareto fronts. Pure arithmetic.

For a candidate of `num_gpus` GPUs per instance running `num_gpus / tp` replicas:

    instances      = ceil(demand / (replicas per instance x rate per replica))
    GPUs           = instances x num_gpus
    cost per hour  = GPUs x price per GPU-hour
    cost per Mtok  = cost per hour / (demand x mean output tokens x 3600 / 1e6)

so the cost counts what is bought, rounding waste included, against the tokens the demand
asks for. Throughput per GPU (at the SLO) = rate per replica x mean output tokens / tp.
"""

from __future__ import annotations

import math
from typing import Any

from bstar.energy import DEFAULT_ELECTRICITY_USD_PER_KWH, energy_usd_per_mtok, power_model
from bstar.recommend import engine_flags
from bstar.search.candidates import Candidate, Pruned
from bstar.search.prices import PriceTable

STATUS_ORDER = {"ok": 0, "infeasible": 1, "pruned": 2}


def candidate_row(c: Candidate, ev: dict[str, Any] | Pruned, demand_req_s: float,
                  prices: PriceTable | None,
                  electricity_usd_per_kwh: float = DEFAULT_ELECTRICITY_USD_PER_KWH
                  ) -> dict[str, Any]:
    r = c.replica
    row: dict[str, Any] = {
        "model": r.model, "gpu": r.gpu, "num_gpus": c.num_gpus, "tensor_parallel": r.tp,
        "data_parallel": c.data_parallel, "max_num_seqs": r.max_num_seqs,
        "max_num_batched_tokens": r.max_num_batched_tokens,
        "calibrated": r.calibrated, "terms": "calibrated" if r.calibrated else "defaults",
        "status": "", "limit": "", "reason": "", "rate_per_replica_req_s": None,
        "instances": None, "gpus_total": None, "tok_s_per_gpu": None,
        "ttft_p99_ms": None, "tpot_p99_ms": None, "e2e_p99_ms": None,
        "usd_per_gpu_hour": None, "cost_per_hour": None, "cost_per_mtok": None,
        "power_w": None, "joules_per_output_token": None, "energy_usd_per_mtok": None,
        "simulations": 0, "replica_key": r.key,
        "num_speculative_tokens": r.num_speculative_tokens,
        "drafter": None if r.speculative is None else r.speculative.drafter.name,
        "drafter_kind": None if r.speculative is None else r.speculative.drafter.kind,
        "layout": r.layout}
    if r.layout == "disaggregated":
        row.update(r.sides(), pd_ratio=r.ratio)
    else:  # each replica's layout inside its tp GPUs
        row.update(expert_parallel=r.deployment.expert_parallel,
                   attention_dp=r.deployment.data_parallel)
    price = prices.get(r.gpu) if prices is not None else None
    if price is not None:
        row["usd_per_gpu_hour"] = price.per_gpu_hour
    if isinstance(ev, Pruned):
        row.update(ev.to_dict())
        return row
    row.update(status=ev["status"], limit=ev["limit"], reason=ev["reason"],
               simulations=ev["simulations"])
    if ev["status"] != "ok":
        return row
    rate = float(ev["rate_per_replica_req_s"])
    out_tok = float(ev["mean_output_tokens"])
    at = ev["at_rate"]
    per_instance = c.data_parallel * rate
    # A relative epsilon: a demand equal to a whole number of instances needs no extra one.
    instances = max(1, math.ceil(demand_req_s / per_instance * (1 - 1e-9)))
    gpus = instances * c.num_gpus
    row.update(rate_per_replica_req_s=rate, instances=instances, gpus_total=gpus,
               tok_s_per_gpu=rate * out_tok / r.replica_gpus, ttft_p99_ms=at["ttft_p99_ms"],
               tpot_p99_ms=at["tpot_p99_ms"], e2e_p99_ms=at["e2e_p99_ms"])
    if price is not None:
        per_hour = gpus * price.per_gpu_hour
        mtok_per_hour = demand_req_s * out_tok * 3600 / 1e6
        row.update(cost_per_hour=per_hour, cost_per_mtok=per_hour / mtok_per_hour)
    fleet = fleet_energy(r.deployment, at.get("power_w_mean"), rate, demand_req_s,
                         instances * c.data_parallel, out_tok)
    if fleet is not None:
        watts, joules = fleet
        row.update(power_w=watts, joules_per_output_token=joules,
                   energy_usd_per_mtok=energy_usd_per_mtok(joules, electricity_usd_per_kwh))
    return row


def fleet_energy(d: Any, power_w_at_rate: float | None, rate_req_s: float,
                 demand_req_s: float, replicas: int, mean_output_tokens: float
                 ) -> tuple[float, float] | None:
    """(mean power per GPU, joules per output token) of the fleet serving the demand: each of
    its `replicas` takes demand / replicas, at most the rate it was simulated at, and draws
    idle power plus the simulated power above idle in proportion to its load (the busy time
    a replica spends scales with the requests it serves); the rounding waste idles. None
    without a power model or an energy figure (a search stored before issue 39)."""
    pm = power_model(d.gpu)
    if pm is None or power_w_at_rate is None or not rate_req_s > 0 or not demand_req_s > 0:
        return None
    load = min(1.0, demand_req_s / replicas / rate_req_s)
    watts = pm.idle_w + (power_w_at_rate - pm.idle_w) * load
    fleet_w = watts * d.num_gpus * replicas
    return watts, fleet_w / (demand_req_s * mean_output_tokens)


def rank(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per model (in the order given): cheapest first (cost per Mtok; without a price, fewest
    GPUs), then more throughput per GPU, then the configuration itself so ties order the
    same on every backend; infeasible and pruned rows follow. Adds `rank` (1-based within
    the model, feasible rows only) and the Pareto flags (per model)."""
    model_pos = {m: i for i, m in enumerate(dict.fromkeys(x["model"] for x in rows))}

    def key(x: dict[str, Any]) -> tuple[Any, ...]:
        cost = x["cost_per_mtok"]
        return (model_pos[x["model"]], STATUS_ORDER.get(x["status"], 3),
                math.inf if cost is None else cost,
                math.inf if x["gpus_total"] is None else x["gpus_total"],
                -(x["tok_s_per_gpu"] or 0.0), x["model"], x["gpu"], x["num_gpus"],
                x["tensor_parallel"], x["max_num_seqs"], x["max_num_batched_tokens"],
                x.get("num_speculative_tokens", 0), x.get("layout", "aggregated"),
                x["replica_key"])

    out = sorted(rows, key=key)
    n: dict[str, int] = {}
    for x in out:
        if x["status"] == "ok":
            n[x["model"]] = n.get(x["model"], 0) + 1
            x["rank"] = n[x["model"]]
        else:
            x["rank"] = None
    front_cost: set[int] = set()
    front_tput: set[int] = set()
    for m in model_pos:
        ok = [x for x in out if x["status"] == "ok" and x["model"] == m]
        front_cost |= pareto(ok, "cost_per_mtok", lower_is_better=True)
        front_tput |= pareto(ok, "tok_s_per_gpu", lower_is_better=False)
    for x in out:
        x["pareto_cost"] = id(x) in front_cost
        x["pareto_throughput"] = id(x) in front_tput
    return out


def pareto(rows: list[dict[str, Any]], metric: str, lower_is_better: bool) -> set[int]:
    """Rows no other row beats on both `metric` and TPOT p99 (ids of the row dicts)."""
    pts = [(x[metric], x["tpot_p99_ms"], id(x)) for x in rows
           if x.get(metric) is not None and x.get("tpot_p99_ms") is not None]
    sign = 1.0 if lower_is_better else -1.0
    front = set()
    for m, t, i in pts:
        dominated = any(sign * m2 <= sign * m and t2 <= t and (sign * m2 < sign * m or t2 < t)
                        for m2, t2, _ in pts)
        if not dominated:
            front.add(i)
    return front


def winner_flags(row: dict[str, Any], gpu_util: float, context_tokens: int,
                 served: str = "MODEL") -> dict[str, str]:
    """The winner's engine settings: vLLM's full command line, and the cap in the other
    engines' words."""
    tp, dp = row["tensor_parallel"], row["data_parallel"]
    ep, adp = row.get("expert_parallel") or 1, row.get("attention_dp") or 1
    vllm = (f"vllm serve {served} --max-num-seqs {row['max_num_seqs']} "
            f"--max-num-batched-tokens {row['max_num_batched_tokens']} "
            f"--gpu-memory-utilization {gpu_util:g}")
    # vLLM runs attention DP as data-parallel ranks of tp / adp GPUs each, the experts
    # spread over all of them; SGLang as --enable-dp-attention inside --tp.
    if tp // adp > 1:
        vllm += f" --tensor-parallel-size {tp // adp}"
    if dp * adp > 1:
        vllm += f" --data-parallel-size {dp * adp}"
    if ep > 1:
        vllm += " --enable-expert-parallel"
    flags = engine_flags(row["max_num_seqs"], gpu_util, tp, context_tokens)
    if adp > 1:
        flags["sglang"] += f" --enable-dp-attention --dp-size {adp}"
    if ep > 1:
        flags["sglang"] += f" --ep-size {ep}"
    k = row.get("num_speculative_tokens") or 0
    if k:
        from bstar.specdec import Drafter, SpecConfig
        from bstar.specdec import engine_flags as spec_flags

        spec = spec_flags(SpecConfig(k, float(row["acceptance_rate"]), row["drafter"]),
                          Drafter(row["drafter_kind"], row["drafter"], None, 0), None)
        vllm += " " + spec["vllm"]
        flags["sglang"] += " " + spec["sglang"]
    flags["vllm"] = vllm
    return flags


def speculation_effect(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per model: the cheapest feasible row, the cheapest without speculation, and whether
    speculation changes the cheapest deployment (the winner speculates and costs less, by
    cost per Mtok or else GPUs, than every plain row; or no plain row is feasible)."""
    out: dict[str, Any] = {}
    for m in dict.fromkeys(x["model"] for x in rows):
        ok = [x for x in rows if x["model"] == m and x["status"] == "ok"]
        best = ok[0] if ok else None
        plain = next((x for x in ok if not x.get("num_speculative_tokens")), None)

        def cost(x: dict[str, Any]) -> tuple[float, float]:
            c = x["cost_per_mtok"]
            return (math.inf if c is None else c, float(x["gpus_total"]))

        changes = best is not None and bool(best.get("num_speculative_tokens")) and (
            plain is None or cost(best) < cost(plain))
        out[m] = {"cheapest": None if best is None else _brief_row(best),
                  "cheapest_plain": None if plain is None else _brief_row(plain),
                  "changes_cheapest": changes}
    return out


def _brief_row(x: dict[str, Any]) -> dict[str, Any]:
    keys = ("gpu", "num_gpus", "tensor_parallel", "max_num_seqs", "max_num_batched_tokens",
            "num_speculative_tokens", "drafter", "gpus_total", "cost_per_mtok",
            "tok_s_per_gpu", "tpot_p99_ms")
    return {k: x.get(k) for k in keys}
