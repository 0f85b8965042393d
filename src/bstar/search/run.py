"""The search: resolve the spec, generate and prune candidates, evaluate the replicas that
remain on a backend (storing each row as it finishes), then rank.

    from bstar.search import SearchSpec, Traffic, run_search, InProcess
    result = run_search(spec, InProcess(), store, prices)
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from bstar import roofline as rl
from bstar.energy import DEFAULT_ELECTRICITY_USD_PER_KWH
from bstar.errors import BstarError
from bstar.options import assemble
from bstar.search.backends import Backend, TaskFailed
from bstar.search.candidates import (
    Candidate,
    Pruned,
    Replica,
    prune,
    replicas_for,
    tp_sizes,
    tp_split_error,
    typical_context,
)
from bstar.search.evaluate import Task, evaluate
from bstar.search.prices import PriceTable
from bstar.search.rank import candidate_row, rank, speculation_effect, winner_flags
from bstar.search.spec import SearchSpec
from bstar.search.store import SearchStore
from bstar.specs.gpu import GpuSpec, get_gpu
from bstar.specs.model import ModelSpec
from bstar.specs.presets import get_model

Progress = Callable[[int, int], None]  # (finished, total)


@dataclass
class SearchResult:
    spec: SearchSpec
    search_id: str
    rows: list[dict[str, Any]]
    prices: PriceTable | None
    backend: str
    db: str
    context_tokens: int
    mean_output_tokens: float
    timing: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    electricity_usd_per_kwh: float = DEFAULT_ELECTRICITY_USD_PER_KWH

    @property
    def winners(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for r in self.rows:
            if r["status"] == "ok" and r["model"] not in out:
                w = dict(r)
                if r.get("num_speculative_tokens"):
                    w["acceptance_rate"] = self.spec.acceptance_rate
                served = _served_name(r["model"])
                if r.get("layout") == "disaggregated":
                    from bstar.search.disagg import side_flags

                    w["flags"] = {side: side_flags(side, r[side], self.spec.memory.gpu_util,
                                                   served) for side in ("prefill", "decode")}
                else:
                    w["flags"] = winner_flags(w, self.spec.memory.gpu_util,
                                              self.context_tokens, served)
                out[r["model"]] = w
        return out

    def layouts(self) -> dict[str, Any]:
        """Per model, with both layouts searched: the cheapest of each, the winner, the
        runner-up (the second-ranked candidate) and why the winner wins."""
        out: dict[str, Any] = {}
        for m in dict.fromkeys(x["model"] for x in self.rows):
            ok = [x for x in self.rows if x["model"] == m and x["status"] == "ok"]
            best = {lay: next((x for x in ok if x.get("layout", "aggregated") == lay), None)
                    for lay in ("aggregated", "disaggregated")}
            win = ok[0] if ok else None
            out[m] = {"aggregated": _layout_brief(best["aggregated"]),
                      "disaggregated": _layout_brief(best["disaggregated"]),
                      "winner": None if win is None else win.get("layout", "aggregated"),
                      "runner_up": _layout_brief(ok[1] if len(ok) > 1 else None),
                      "why": _layout_why(best["aggregated"], best["disaggregated"],
                                         self.prices is not None)}
        return out

    def counts(self) -> dict[str, int]:
        keys = {r["replica_key"] for r in self.rows if r["status"] != "pruned"}
        return {"candidates": len(self.rows),
                "pruned": sum(r["status"] == "pruned" for r in self.rows),
                "infeasible": sum(r["status"] == "infeasible" for r in self.rows),
                "feasible": sum(r["status"] == "ok" for r in self.rows),
                "evaluations": len(keys),
                "simulations": sum(r["simulations"] for r in
                                   {r["replica_key"]: r for r in self.rows}.values())}

    def to_dict(self) -> dict[str, Any]:
        """The search JSON contract (docs/contracts.md)."""
        s = self.spec
        return {"search_id": self.search_id, "db": self.db, "backend": self.backend,
                "models": list(s.models), "gpus": list(s.gpus),
                "demand_req_s": s.traffic.demand_req_s, "slo": s.slo.to_dict(),
                "traffic": s.traffic.to_dict(), "context_tokens": self.context_tokens,
                "mean_output_tokens": self.mean_output_tokens,
                "prices": None if self.prices is None else self.prices.to_dict(),
                "ranked_by": "cost_per_mtok" if self.prices is not None else "gpus_total",
                "electricity_usd_per_kwh": self.electricity_usd_per_kwh,
                "counts": self.counts(), "winners": self.winners,
                "candidates": self.rows, "spec": s.to_dict(), "timing": self.timing,
                "warnings": self.warnings} | (
                    {} if not s.num_speculative_tokens
                    else {"speculative": speculation_effect(self.rows)}) | (
                    {} if s.layouts == "aggregated" else {"layouts": self.layouts()})


def _layout_brief(x: dict[str, Any] | None) -> dict[str, Any] | None:
    if x is None:
        return None
    keys = ("layout", "rank", "gpu", "num_gpus", "tensor_parallel", "data_parallel",
            "expert_parallel", "attention_dp", "max_num_seqs", "pd_ratio", "gpus_total",
            "instances", "cost_per_mtok", "tok_s_per_gpu", "ttft_p99_ms", "tpot_p99_ms",
            "limit", "reason")
    out = {k: x.get(k) for k in keys}
    out["layout"] = x.get("layout", "aggregated")
    for side in ("prefill", "decode"):
        if side in x:
            out[side] = x[side]
    return out


def _layout_why(agg: dict[str, Any] | None, dis: dict[str, Any] | None,
                priced: bool) -> str:
    """One sentence: which layout needs less at the SLO, by what, and what binds each."""
    if agg is None and dis is None:
        return "neither layout meets the SLO"
    if agg is None or dis is None:
        only, other = ("aggregated", "disaggregated") if dis is None else \
            ("disaggregated", "aggregated")
        x = agg or dis
        assert x is not None
        return (f"only {only} meets the SLO ({x['gpus_total']} GPUs; binding: "
                f"{x['limit']}); no {other} candidate does")

    def what(x: dict[str, Any]) -> str:
        lay = x.get("layout", "aggregated")
        if lay == "disaggregated":
            shape = f"{x['pd_ratio']} units"
        else:
            ep, adp = x.get("expert_parallel") or 1, x.get("attention_dp") or 1
            shape = (f"replicas of TP {x['tensor_parallel']}"
                     + (f", EP {ep}" if ep > 1 else "")
                     + (f", attention DP {adp}" if adp > 1 else ""))
        cost = (f", {x['cost_per_mtok']:.3f} per Mtok" if priced and
                x.get("cost_per_mtok") is not None else "")
        return (f"{lay} ({shape}) needs {x['gpus_total']} GPUs{cost} at "
                f"{x['tok_s_per_gpu']:,.0f} output tok/s per GPU within the SLO, bound by "
                f"{x['limit']}")

    first, second = (agg, dis) if agg["rank"] < dis["rank"] else (dis, agg)
    return f"{what(first)}; {what(second)}"


def _served_name(model: str) -> str:
    """What `vllm serve` is given: the Hugging Face repo of a preset, else the name."""
    from bstar.specs.presets import model_index

    info = model_index().get(model)
    return info.hf_repo if info is not None else model


def _task_key(r: Any, spec: SearchSpec) -> str:
    """The replica's key plus a hash of every input that decides its result."""
    parts: list[Any] = [repr(r.deployment), r.max_num_seqs, r.max_num_batched_tokens,
                        spec.traffic.to_dict(), spec.slo.to_dict(), spec.rel_tol,
                        spec.max_utilization]
    if r.speculative is not None:  # absent for plain replicas: their stored keys hold
        sp = r.speculative
        parts.append([sp.k, sp.config.acceptance_rate, sp.drafter.name, sp.seed])
    if r.layout == "disaggregated":
        parts.append(r.task_parts())
    text = json.dumps(parts, sort_keys=True)
    return f"{r.key}#{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def _profiles(spec: SearchSpec, gpus: list[GpuSpec]) -> tuple[dict[str, Any], list[str]]:
    from bstar.calibrate import load_profile

    out: dict[str, Any] = {}
    warnings = []
    ids = {g.id for g in gpus}
    for gpu_id, path in spec.profiles:
        prof = load_profile(path)
        target = (gpu_id or prof.gpu).lower()
        if not target:
            raise BstarError(f"profile {path} names no GPU; give it as GPU=FILE")
        if target not in ids:
            warnings.append(f"profile {path} is for {target}, which is not among the GPUs "
                            "searched; not applied")
            continue
        if target in out:
            raise BstarError(f"two profiles for {target}")
        out[target] = prof
    return out, warnings


def plan_candidates(spec: SearchSpec) -> tuple[list[Candidate], dict[str, Pruned],
                                               list[str], Any]:
    """All candidates, the pruned replicas (by replica key) and warnings. No simulation."""
    models: list[ModelSpec] = [get_model(m) for m in spec.models]
    gpus = [get_gpu(g) for g in spec.gpus]
    profiles, warnings = _profiles(spec, gpus)
    units = spec.traffic.unit_workloads()
    unit = units[0]
    mem = spec.memory
    cands: list[Candidate] = []
    pruned: dict[str, Pruned] = {}
    for m in models:
        label = m.name
        for g in gpus:
            prof = profiles.get(g.id)
            base = assemble(m, g, weight_dtype=mem.weight_dtype, kv_dtype=mem.kv_dtype,
                            gpu_util=mem.gpu_util, reserve_bytes=mem.reserve_bytes,
                            block_size=mem.block_size, eff=spec.eff, engine=spec.engine,
                            behaviour=spec.behaviour, profile=prof)
            valid = sorted({t for n in spec.num_gpus for t in tp_sizes(m, n)})
            cal = prof.path if prof is not None else None
            if spec.aggregated:
                cands += _aggregated(spec, m, label, g.id, base, valid, units, cal, pruned)
            if spec.disaggregated:
                from bstar.search.disagg import disagg_replicas

                units_d, pruned_d = disagg_replicas(
                    m, label, base, valid, units, spec.slo, spec.max_num_seqs,
                    spec.max_num_batched_tokens, cal)
                pruned.update(pruned_d)
                cands += [Candidate(r, r.replica_gpus) for r in units_d]
                if not units_d:
                    warnings.append(f"{label} on {g.id}: no disaggregated unit fits (no "
                                    "tensor-parallel size of --num-gpus holds the weights "
                                    "and the longest request)")
    return cands, pruned, warnings, unit


def _aggregated(spec: SearchSpec, m: ModelSpec, label: str, gpu: str, base: Any,
                valid: list[int], units: list[Any], cal: str | None,
                pruned: dict[str, Pruned]) -> list[Candidate]:
    """The aggregated candidates of one model on one GPU; the replicas pruned before
    simulating go into `pruned`. A search that also tries disaggregated units tries a
    mixture of experts aggregated with wide expert parallel and attention DP too (as its
    decode workers run), unless the flags chose the layout: the two layouts then compete on
    the same parallelism."""
    reps = with_speculation(spec, replicas_for(
        m, label, base, valid, units[0], spec.max_num_seqs, spec.max_num_batched_tokens,
        cal, spec.expert_parallel, spec.attention_dp))
    if spec.disaggregated and m.is_moe and spec.expert_parallel == spec.attention_dp == 1:
        seen = {r.key for r in reps}
        reps += [r for r in with_speculation(spec, replicas_for(
            m, label, base, valid, units[0], spec.max_num_seqs,
            spec.max_num_batched_tokens, cal, 0, 0)) if r.key not in seen]
    cands: list[Candidate] = []
    by_tp: dict[int, list[Replica]] = {}
    for r in reps:
        by_tp.setdefault(r.tp, []).append(r)
        # Every draw must meet the SLO: a draw that cannot prunes the replica.
        p = next((x for x in (prune(r, u, spec.slo) for u in units) if x), None)
        if p is not None:
            pruned[r.key] = p
    for n in sorted(set(spec.num_gpus)):
        for t in range(1, n + 1):
            if n % t:
                continue
            if t in by_tp:
                cands += [Candidate(r, n) for r in by_tp[t]]
            else:
                err = tp_split_error(m, t) or "no engine limits"
                r = Replica(label, gpu, t, 0, 0, replace(base, num_gpus=t), cal)
                pruned[r.key] = Pruned("tp", err)
                cands.append(Candidate(r, n))
    return cands


def with_speculation(spec: SearchSpec, reps: list[Replica]) -> list[Replica]:
    """Each replica once per K of `spec.num_speculative_tokens` (0: plain decode); the
    replicas unchanged when the search has no speculation."""
    if not spec.num_speculative_tokens:
        return reps
    from bstar.sim.speculative import SpecSim
    from bstar.specdec import AUTO_DRAFTER, DRAFTER_KINDS, SpecConfig, make_drafter

    draft = None
    if spec.drafter not in (*DRAFTER_KINDS, AUTO_DRAFTER):
        draft = get_model(spec.drafter)
    out = []
    for r in reps:
        for k in sorted(set(spec.num_speculative_tokens)):
            if k == 0:
                out.append(r)
                continue
            cfg = SpecConfig(k, spec.acceptance_rate, spec.drafter)
            dr = make_drafter(r.deployment, spec.drafter, draft)
            out.append(replace(r, speculative=SpecSim(cfg, dr)))
    return out


def _cost_order(r: Replica, ctx: int, slo: Any) -> tuple[int, int]:
    """Longest first, so the short ones fill the tail: a replica whose full-batch step
    (cost model) already misses the TPOT target is latency-bound and bisects (many
    simulations); otherwise its capacity roof usually decides in three. Then smaller
    running batches, which take more simulated steps."""
    b = min(r.max_num_seqs, max(rl.b_mem(r.deployment, ctx), 1))
    step_ms = float(rl.curve(r.deployment, [b], ctx).step_s[0]) * 1e3
    bisects = slo.tpot_ms is not None and step_ms > slo.tpot_ms
    return (0 if bisects else 1, b)


def run_search(spec: SearchSpec, backend: Backend, store: SearchStore,
               prices: PriceTable | None = None, resume: bool = False,
               progress: Progress | None = None,
               electricity_usd_per_kwh: float = DEFAULT_ELECTRICITY_USD_PER_KWH
               ) -> SearchResult:
    """Evaluate every replica that survives pruning (those already stored are reused with
    `resume`), store each row as it finishes, and rank. The backend must be started."""
    t_plan = time.perf_counter()
    cands, pruned, warnings, unit = plan_candidates(spec)
    ctx = typical_context(unit)
    sid = spec.search_id()
    store.begin(sid, spec.to_dict(), resume)
    stored = store.done(sid) if resume else {}
    tasks: dict[str, Task] = {}
    keys: dict[str, str] = {}
    for c in cands:
        r = c.replica
        if r.key in pruned or r.key in keys:
            continue
        keys[r.key] = _task_key(r, spec)
        if keys[r.key] not in stored:
            tasks[keys[r.key]] = Task(r, spec.traffic, spec.slo, spec.rel_tol,
                                      spec.max_utilization)
    order = sorted(tasks, key=lambda k: (_cost_order(tasks[k].replica, ctx, spec.slo), k))
    todo = [tasks[k] for k in order]
    results = {k: stored[k] for k in keys.values() if k in stored}
    total = len(keys)
    reused = len(results)
    task_s: list[float] = []
    task_cpu_s: list[float] = []
    plan_s = time.perf_counter() - t_plan
    t0 = time.perf_counter()
    if progress:
        progress(reused, total)
    try:
        for i, res in backend.imap_unordered(evaluate, todo):
            timing = res.pop("_timing", {})
            k = order[i]
            task_s.append(float(timing.get("elapsed_s", 0.0)))
            task_cpu_s.append(float(timing.get("cpu_s", 0.0)))
            store.add(sid, k, res, timing.get("elapsed_s"), backend.name)
            results[k] = json.loads(json.dumps(res, sort_keys=True))
            if progress:
                progress(len(results), total)
    except TaskFailed as e:
        store.finish(sid, "interrupted")
        what = (f"candidate {tasks[order[e.index]].replica.key}"
                if 0 <= e.index < len(order) else "a candidate")
        raise BstarError(f"search: {what} failed: {e.why}; the {len(results) - reused} "
                         f"rows finished are stored in {store.path}: run the same command "
                         "with --resume to continue") from None
    except BaseException:
        store.finish(sid, "interrupted")
        raise
    wall_s = time.perf_counter() - t0
    store.finish(sid, "completed")
    demand = spec.traffic.demand_req_s
    rows = []
    for c in cands:
        k = c.replica.key
        ev: dict[str, Any] | Pruned = pruned[k] if k in pruned else results[keys[k]]
        rows.append(candidate_row(c, ev, demand, prices, electricity_usd_per_kwh))
    rows = rank(rows)
    if prices is not None:
        missing = sorted({g for g in (r["gpu"] for r in rows) if prices.get(g) is None})
        if missing:
            warnings.append(f"no price for {', '.join(missing)} in {prices.path}: ranked "
                            "after the priced ones")
    timing = {"plan_s": plan_s, "wall_s": wall_s, "evaluations_run": len(todo),
              "evaluations_reused": reused, "task_s_total": sum(task_s),
              "task_cpu_s_total": sum(task_cpu_s),
              "task_s_mean": sum(task_s) / len(task_s) if task_s else None,
              "task_s_max": max(task_s) if task_s else None,
              "workers": backend.workers,
              "backend_start_s": getattr(backend, "start_s", None)}
    return SearchResult(spec, sid, rows, prices, backend.describe(), str(store.path), ctx,
                        float(unit.output_tokens.mean()), timing, warnings,
                        electricity_usd_per_kwh)
