"""Disaggregated candidates for `bstar search` (issue 38): P prefill and D decode workers of
one GPU kind (xPyD) as one *unit*, each side's parallel layout and engine limits, and the
P:D ratio as dimensions beside the aggregated candidates. Pure: no I/O.

What is tried, per model and GPU (docs/search.md, "Disaggregated candidates"):

- prefill workers: the smallest tensor-parallel size of the search's that holds the weights
  and the longest prompt, as tensor parallel (a prefill step is compute-bound: splitting it
  further buys no step time per GPU);
- decode workers: the two smallest tensor-parallel sizes that hold the weights and the
  longest request, each as tensor parallel and, for a mixture of experts, as wide expert
  parallel with attention data parallel over all its GPUs (ep = dp = tp: the Dynamo
  recipes' decode layout, where MLA's latent KV, which TP does not split, is held once);
- the decode cap: the plan's recommendation and, where its step misses the TPOT target,
  the largest batch whose cost-model step is within 90% of the target (or the search's
  --max-num-seqs values); the prefill budget: DEFAULT_PREFILL_BUDGET (or the search's
  --max-num-batched-tokens);
- P:D: the three ratios of workers (P, D <= 4, coprime) nearest the ratio that balances the
  two sides at the workload's mean lengths (bstar.disaggregate: mu_d(S) / mu_p).

A unit is evaluated as a replica is (`bstar.search.evaluate`): its capacity is the slower
side's (P mu_p against D mu_d), rates are capped at `max_utilization` of it, and the largest
rate per unit that meets the SLO on every traffic draw is found by bisection, each rate
simulated by the two-pool simulator (`bstar.sim.disagg.simulate_pools`) on the same drawn
requests the aggregated candidates see. Not modelled here, as in `bstar simulate
--disaggregate`: prefix-cache hits (prompts are prefilled whole), preemption on the decode
side (the cap keeps the pool from running out), links shared by concurrent transfers.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from bstar import roofline as rl
from bstar.deployment import Deployment
from bstar.disaggregate import DEFAULT_PREFILL_BUDGET, WorkerSpec, decode_side, prefill_side
from bstar.errors import BstarError
from bstar.kv_link import KvLink, default_link_kind, kv_link
from bstar.search.bisect import bisect_rate, timing
from bstar.search.candidates import Pruned, layout_size, mean_tokens, slo_lower_bounds_ms
from bstar.sim import Slo, Workload
from bstar.specs.model import ModelSpec

MAX_WORKERS_PER_SIDE = 4  # P and D of a unit: larger fleets are more units
RATIOS_TRIED = 3
TPOT_MARGIN = 0.9  # the SLO-sized decode cap: its cost-model step within 90% of the target
GPUS_PER_NODE = 8


@dataclass(frozen=True, slots=True)
class DisaggReplica:
    """One disaggregated unit: `prefill.workers` prefill and `decode.workers` decode
    workers, each side's deployment, the link the KV crosses. Plays a Replica's part in the
    search (key, deployment, limits); `replica_gpus` is the whole unit's GPUs."""

    model: str
    gpu: str
    prefill: WorkerSpec
    decode: WorkerSpec  # max_num_seqs: the engine's cap per decode worker
    prefill_d: Deployment
    decode_d: Deployment
    link: KvLink
    decode_batch: int  # min(cap, B_mem at the longest request): what a worker holds
    calibrated: str | None = None

    layout = "disaggregated"
    speculative = None
    num_speculative_tokens = 0

    @property
    def deployment(self) -> Deployment:
        return self.decode_d

    @property
    def tp(self) -> int:
        return self.decode.tp

    @property
    def max_num_seqs(self) -> int:
        assert self.decode.max_num_seqs is not None
        return self.decode.max_num_seqs

    @property
    def max_num_batched_tokens(self) -> int:
        return self.prefill.max_num_batched_tokens or DEFAULT_PREFILL_BUDGET

    @property
    def replica_gpus(self) -> int:
        return self.prefill.num_gpus + self.decode.num_gpus

    @property
    def ratio(self) -> str:
        return f"{self.prefill.workers}P:{self.decode.workers}D"

    @property
    def key(self) -> str:
        def side(s: WorkerSpec) -> str:
            return f"tp{s.tp}ep{s.ep}dp{s.dp}"

        return (f"{self.model}|{self.gpu}|disagg|{self.prefill.workers}P-{side(self.prefill)}|"
                f"{self.decode.workers}D-{side(self.decode)}|seqs{self.max_num_seqs}|"
                f"tok{self.max_num_batched_tokens}|{self.link.kind}")

    def task_parts(self) -> list[Any]:
        """What decides its result beyond the decode deployment (search.run._task_key)."""
        return [repr(self.prefill_d), self.prefill.to_dict(), self.decode.to_dict(),
                repr(self.link), self.decode_batch]

    def sides(self) -> dict[str, dict[str, Any]]:
        """Each side as the search JSON gives it (docs/contracts.md)."""
        return {
            "prefill": {"workers": self.prefill.workers, "tp": self.prefill.tp,
                        "ep": self.prefill.ep, "dp": self.prefill.dp,
                        "max_num_seqs": self.prefill.max_num_seqs,
                        "max_num_batched_tokens": self.max_num_batched_tokens},
            "decode": {"workers": self.decode.workers, "tp": self.decode.tp,
                       "ep": self.decode.ep, "dp": self.decode.dp,
                       "max_num_seqs": self.max_num_seqs, "batch": self.decode_batch},
            "link": {"kind": self.link.kind, "name": self.link.name}}


def _side_d(base: Deployment, m: ModelSpec, tp: int, ep: int, dp: int) -> Deployment:
    return replace(base, model=m, num_gpus=tp, expert_parallel=ep, data_parallel=dp)


def _decode_caps(d: Deployment, spec: WorkerSpec, prompt: int, output: int, bm: int,
                 slo: Slo, given: tuple[int, ...]) -> list[int]:
    """Decode caps to try (module docstring), each at most `bm`."""
    if given:
        return sorted({min(c, bm) for c in given})
    rec = decode_side(d, spec, prompt, output)
    caps = {min(rec.max_num_seqs, bm)}
    if slo.tpot_ms is not None:
        target_s = TPOT_MARGIN * slo.tpot_ms / 1e3
        grid = np.arange(1, bm + 1, dtype=np.float64)
        step = rl.decode_step(d, grid, prompt + output // 2).step_s
        ok = np.nonzero(step <= target_s)[0]
        if len(ok):
            caps.add(int(grid[ok[-1]]))
    return sorted(caps)


def _ratios(balanced: float) -> list[tuple[int, int]]:
    """The RATIOS_TRIED (P, D) pairs nearest `balanced` prefill workers per decode worker
    (log distance; P, D <= MAX_WORKERS_PER_SIDE, coprime; fewer GPUs first on a tie)."""
    pairs = [(p, q) for p in range(1, MAX_WORKERS_PER_SIDE + 1)
             for q in range(1, MAX_WORKERS_PER_SIDE + 1) if math.gcd(p, q) == 1]
    pairs.sort(key=lambda x: (abs(math.log(x[0] / x[1] / balanced)), x[0] + x[1], x))
    return pairs[:RATIOS_TRIED]


def disagg_replicas(m: ModelSpec, label: str, base: Deployment, tps: list[int],
                    units: list[Workload], slo: Slo, max_num_seqs: tuple[int, ...] = (),
                    max_num_batched_tokens: tuple[int, ...] = (),
                    calibrated: str | None = None
                    ) -> tuple[list[DisaggReplica], dict[str, Pruned]]:
    """The disaggregated units of one model on one GPU (module docstring) and the ones
    pruned before simulating (by key), from the search's tensor-parallel sizes `tps`."""
    w = units[0]
    mean_in, mean_out = mean_tokens(w)
    prompt, output = max(1, round(mean_in)), max(1, round(mean_out))
    longest_prompt = max(int(u.prompt_tokens.max()) for u in units)
    longest = max(int((u.prompt_tokens + u.output_tokens).max()) for u in units)
    experts = m.num_experts if m.is_moe else 0
    pre_tp = next((t for t in tps if rl.b_mem(_side_d(base, m, t, 1, 1), longest_prompt) >= 1),
                  None)
    dec_tps = [t for t in tps if rl.b_mem(_side_d(base, m, t, 1, 1), longest) >= 1][:2]
    if pre_tp is None or not dec_tps:
        return [], {}
    budgets = sorted(set(max_num_batched_tokens)) or [DEFAULT_PREFILL_BUDGET]
    pre_d = _side_d(base, m, pre_tp, 1, 1)
    out: list[DisaggReplica] = []
    pruned: dict[str, Pruned] = {}
    for t in dec_tps:
        layouts = {(1, 1)}
        if experts and t > 1:
            layouts.add((layout_size(0, t, experts), t))
        for ep, dp in sorted(layouts):
            dec_d = _side_d(base, m, t, ep, dp)
            bm = rl.b_mem(dec_d, longest)
            if bm < 1:
                continue
            probe = WorkerSpec(tp=t, ep=ep, dp=dp)
            for cap in _decode_caps(dec_d, probe, prompt, output, bm, slo, max_num_seqs):
                for budget in budgets:
                    pspec = WorkerSpec(tp=pre_tp, max_num_batched_tokens=budget)
                    dspec = WorkerSpec(tp=t, ep=ep, dp=dp, max_num_seqs=cap)
                    mu_p = prefill_side(pre_d, pspec, prompt).req_s
                    mu_d = decode_side(dec_d, dspec, prompt, output).req_s
                    for p, q in _ratios(mu_d / mu_p):
                        gpus = p * pre_tp + q * t
                        link = kv_link(default_link_kind(dec_d.gpu, gpus, GPUS_PER_NODE),
                                       dec_d.gpu)
                        r = DisaggReplica(label, base.gpu.id, replace(pspec, workers=p),
                                          replace(dspec, workers=q), pre_d, dec_d, link,
                                          min(cap, bm), calibrated)
                        out.append(r)
                        why = _prune(r, units, slo)
                        if why is not None:
                            pruned[r.key] = why
    return out, pruned


def _prune(r: DisaggReplica, units: list[Workload], slo: Slo) -> Pruned | None:
    """SLO lower bounds that hold at any rate: TTFT at least the prompt's prefill step on
    an idle prefill worker, TPOT at least a decode step of one sequence (as for a replica:
    search.candidates.slo_lower_bounds_ms)."""
    for w in units:
        lb = slo_lower_bounds_ms(r.prefill_d, w)
        lb["tpot_ms"] = slo_lower_bounds_ms(r.decode_d, w)["tpot_ms"]
        lb.pop("e2e_ms")
        for key, target in slo.to_dict().items():
            if key in lb and lb[key] > target:
                return Pruned("SLO", f"{key.removesuffix('_ms')} p99 is at least "
                                     f"{lb[key]:.1f} ms at any rate (target {target:g} ms)")
    return None


# ---- evaluation ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Summary:
    rate_req_s: float
    p99_ms: dict[str, float]  # ttft_ms, tpot_ms, e2e_ms
    prefill_wait_p99_ms: float
    kv_to_first_token_p99_ms: float
    throughput_tok_s: float

    def brief(self) -> dict[str, Any]:
        return {"rate_req_s": self.rate_req_s, "ttft_p99_ms": self.p99_ms["ttft_ms"],
                "tpot_p99_ms": self.p99_ms["tpot_ms"], "e2e_p99_ms": self.p99_ms["e2e_ms"],
                "throughput_tok_s": self.throughput_tok_s, "preemptions": 0,
                "prefill_wait_p99_ms": self.prefill_wait_p99_ms,
                "kv_to_first_token_p99_ms": self.kv_to_first_token_p99_ms,
                "truncated": False, "power_w_mean": None, "joules_per_output_token": None}


def _misses(s: _Summary, slo: Slo) -> list[str]:
    return [f"{k.removesuffix('_ms')} p99 {s.p99_ms[k]:.1f} > {v:g} ms"
            for k, v in slo.to_dict().items() if s.p99_ms[k] > v]


def _worse(a: _Summary, b: _Summary) -> _Summary:
    return _Summary(a.rate_req_s, {k: max(a.p99_ms[k], b.p99_ms[k]) for k in a.p99_ms},
                    max(a.prefill_wait_p99_ms, b.prefill_wait_p99_ms),
                    max(a.kv_to_first_token_p99_ms, b.kv_to_first_token_p99_ms),
                    min(a.throughput_tok_s, b.throughput_tok_s))


def evaluate_disagg(task: Any) -> dict[str, Any]:
    """A unit's capacity (its slower side), then bisection on the rate below it
    (search.bisect.bisect_rate), each rate simulated on every traffic draw. The result
    row has the aggregated evaluation's keys; `rate_per_replica_req_s` is per unit."""
    from bstar.search.spec import at_rate
    from bstar.sim.disagg import MAX_REQUESTS, PoolSpec, simulate_pools

    t0, c0 = time.perf_counter(), time.process_time()
    r: DisaggReplica = task.replica
    slo: Slo = task.slo
    units = task.traffic.unit_workloads()
    mean_in, mean_out = mean_tokens(units[0])
    prompt, output = max(1, round(mean_in)), max(1, round(mean_out))
    pre = prefill_side(r.prefill_d, r.prefill, prompt)
    dec = decode_side(r.decode_d, replace(r.decode, max_num_seqs=r.decode_batch), prompt,
                      output)
    p_req_s = r.prefill.workers * pre.req_s
    d_req_s = r.decode.workers * dec.req_s
    cap = min(p_req_s, d_req_s)
    bound = "prefill" if p_req_s < d_req_s else "decode"
    capacity = {"capacity_req_s": cap, "prefill_req_s": p_req_s, "decode_req_s": d_req_s,
                "bound": bound, "balanced_prefill_per_decode": dec.req_s / pre.req_s,
                "running_max": r.decode_batch * r.decode.workers, "preemptions": 0,
                "kv_utilization_max": None}
    pools = (PoolSpec(r.prefill_d, r.prefill.workers, r.prefill.max_num_seqs or MAX_REQUESTS,
                      r.max_num_batched_tokens),
             PoolSpec(r.decode_d, r.decode.workers, r.decode_batch, 0))
    sims = 0

    def one(u: Workload, rate: float) -> _Summary:
        a = at_rate(u, rate)
        assert a.arrival_s is not None
        # a day past the last arrival: a rate this far over the unit's capacity has failed
        res = simulate_pools(*pools, r.link, a.prompt_tokens, a.output_tokens,
                             arrival_s=a.arrival_s, attention_tp=r.decode.attention_tp,
                             max_sim_time_s=float(a.arrival_s[-1]) + 86_400.0)

        def p99(x: np.ndarray) -> float:
            return float(np.percentile(x, 99)) * 1e3

        return _Summary(rate, {"ttft_ms": p99(res.ttft_s), "tpot_ms": p99(res.tpot_s),
                               "e2e_ms": p99(res.e2e_s)}, p99(res.prefill_wait_s),
                        p99(res.kv_to_first_token_s), res.output_tokens / res.span_s)

    def run(rate: float) -> tuple[bool, _Summary]:
        nonlocal sims
        worst: _Summary | None = None
        for u in units:  # stop at the first draw that misses
            sims += 1
            s = one(u, rate)
            worst = s if worst is None else _worse(worst, s)
            if _misses(s, slo):
                return False, worst
        assert worst is not None
        return True, worst

    try:
        lo, hi = bisect_rate(run, task.max_utilization * cap, task.rel_tol,
                             lambda x: max((x.p99_ms[k] / v for k, v in slo.to_dict().items()),
                                           default=None))
    except BstarError as e:
        return {"status": "infeasible", "limit": "SLO", "reason": str(e), "simulations": sims,
                "capacity": capacity, "at_fail": None, "_timing": timing(t0, c0)}
    sides = (f"{r.prefill.workers} prefill x {pre.req_s:.3g} req/s, {r.decode.workers} "
             f"decode x {dec.req_s:.3g} req/s at a batch of {r.decode_batch}")
    return _result(lo, hi, capacity, sides, slo, mean_out, sims) | {
        "_timing": timing(t0, c0)}


def _result(lo: tuple[float, _Summary] | None, hi: tuple[float, _Summary | None],
            capacity: dict[str, Any], sides: str, slo: Slo, mean_out: float,
            sims: int) -> dict[str, Any]:
    """The evaluation's row from the bisection's bracket: infeasible (no rate met the
    SLO), or the rate per unit and what bound it (the roof: a side's throughput; else the
    SLO terms missed just above it, with the two waits inside TTFT)."""
    cap, bound = capacity["capacity_req_s"], capacity["bound"]
    if lo is None:
        fs = hi[1]
        assert fs is not None
        return {"status": "infeasible", "limit": "SLO",
                "reason": f"misses the SLO even at {hi[0]:.3g} req/s per unit: "
                          + "; ".join(_misses(fs, slo)),
                "simulations": sims, "capacity": capacity, "at_fail": fs.brief()}
    rate, s = lo
    fs = hi[1]
    if fs is None:
        limit = "compute"
        reason = (f"{hi[0]:.3g} req/s = {hi[0] / cap:.0%} of the unit's capacity {cap:.3g} "
                  f"req/s, bound by its {bound} side ({sides}); the SLO still holds there")
    else:
        limit = "SLO"
        reason = (f"at {hi[0]:.3g} req/s per unit, below its capacity {cap:.3g} req/s "
                  f"({sides}): {'; '.join(_misses(fs, slo))} (p99 prefill queue "
                  f"{fs.prefill_wait_p99_ms:.0f} ms, KV arrival to first token "
                  f"{fs.kv_to_first_token_p99_ms:.0f} ms)")
    return {"status": "ok", "limit": limit, "reason": reason, "rate_per_replica_req_s": rate,
            "mean_output_tokens": mean_out, "capacity": capacity, "at_rate": s.brief(),
            "at_fail": None if fs is None else fs.brief(), "simulations": sims}


# ---- flags --------------------------------------------------------------------------------------
def side_flags(side: str, s: dict[str, Any], gpu_util: float, served: str) -> dict[str, str]:
    """One side's launch line in SGLang's words (PD disaggregation, as the Dynamo recipes
    run it) and vLLM's (a NIXL KV connector; attention DP as vLLM's data parallel ranks of
    TP / DP GPUs each)."""
    tp, ep, dp = s["tp"], s["ep"], s["dp"]
    sg = (f"python -m sglang.launch_server --model-path {served} --disaggregation-mode {side} "
          f"--disaggregation-transfer-backend nixl --tp-size {tp} "
          f"--mem-fraction-static {gpu_util:g}")
    vl = f"vllm serve {served} --gpu-memory-utilization {gpu_util:g}"
    if dp > 1:
        sg += f" --enable-dp-attention --dp-size {dp}"
        vl += f" --data-parallel-size {dp}"
    if tp // dp > 1:
        vl += f" --tensor-parallel-size {tp // dp}"
    if ep > 1:
        sg += f" --ep-size {ep}"
        vl += " --enable-expert-parallel"
    if side == "prefill":
        sg += f" --max-prefill-tokens {s['max_num_batched_tokens']}"
        vl += f" --max-num-batched-tokens {s['max_num_batched_tokens']}"
    else:
        sg += f" --max-running-requests {s['max_num_seqs']}"
        vl += f" --max-num-seqs {s['max_num_seqs']}"
    vl += (" --kv-transfer-config '{\"kv_connector\":\"NixlConnector\","
           "\"kv_role\":\"kv_both\"}'")
    return {"sglang": sg, "vllm": vl}
