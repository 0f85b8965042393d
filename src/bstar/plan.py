"""`bstar plan` as a library call: one serializable result; renderers live elsewhere."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from bstar import roofline as rl
from bstar.deployment import DEFAULT_GPU, DEFAULT_MODEL, Deployment
from bstar.energy import (
    DEFAULT_ELECTRICITY_USD_PER_KWH,
    DecodeEnergy,
    check_electricity_price,
    decode_energy,
    energy_usd_per_mtok,
    power_model,
)
from bstar.engine_defaults import RULE as VLLM_RULE
from bstar.engine_defaults import SGLANG_RULE, sglang_max_running_requests, vllm_defaults
from bstar.errors import BstarError
from bstar.knee import Knee, slo_knee
from bstar.kv_pool import kv_bytes_per_seq_allocated, kv_per_kind
from bstar.options import DeploymentOptions
from bstar.recommend import Recommendation, engine_flags
from bstar.specdec import Drafter, SpecConfig, SpecPlan, plan_context
from bstar.specdec import b_mem as feasible_b_mem
from bstar.units import GB, GiB

__all__ = ["DEFAULT_CONTEXTS", "DEFAULT_GPU", "DEFAULT_MODEL", "ContextPlan", "Plan",
           "compare", "make_plan"]
DEFAULT_CONTEXTS = (512, 2048, 8192)
MAX_CONTEXT = 10_000_000
MAX_BATCH = 1_000_000


@dataclass(frozen=True, slots=True)
class ContextPlan:
    context_tokens: int
    kv_bytes_per_seq: int
    kv_bytes_per_seq_allocated: int
    b_star: float
    b_star_read: float | None
    b_mem: int
    compute_crossover_batch: float | None
    amortized_floor_s: float
    curve: rl.Curve
    recommendation: Recommendation
    flags: dict[str, str]
    prefill_s: float
    warnings: tuple[str, ...] = ()
    at_recommendation: dict[str, Any] | None = None
    engine_defaults: tuple[dict[str, Any], ...] = ()
    tpot_batch1_s: float | None = None
    # What one sequence holds per kind of layer and what the engine allocates for it
    # (kv_per_kind): full, sliding, chunked, dsa, state.
    kv_per_kind: tuple[dict[str, Any], ...] = ()
    # The largest batch up to B_mem whose per-request TPOT meets `--max-tpot-ms`; None when
    # no bound was given or no batch meets it (then `sla_unmet`).
    sla_batch: int | None = None
    # vLLM's start-up "Maximum concurrency", floored (`rl.vllm_max_concurrency`): every
    # sequence counted as prefilling a budget in its windowed layers; = b_mem otherwise.
    vllm_max_concurrency: int | None = None
    # Speculative decoding at this context (`--num-speculative-tokens`); None without it.
    speculative: SpecPlan | None = None
    # Power per GPU and joules per output token at each curve batch (bstar.energy); None
    # when the GPU states no power.
    energy: DecodeEnergy | None = None
    electricity_usd_per_kwh: float = DEFAULT_ELECTRICITY_USD_PER_KWH

    @property
    def sla_unmet(self) -> bool:
        """True when no batch meets the TPOT SLA (`--max-tpot-ms`) on this hardware."""
        return self.recommendation.bound == "sla-unmet"

    @property
    def knee(self) -> Knee | None:
        """The predicted knee the recommendation was chosen from, the one a picture marks
        (`Recommendation.knee`: seed 004's doubling rule on the plan's fine grid)."""
        return self.recommendation.knee

    def _energy_point(self, i: int) -> dict[str, float | None]:
        """A curve point's power per GPU, joules per output token (all GPUs) and their
        electricity cost per million output tokens; None each without a power model."""
        e = self.energy
        if e is None:
            return {"power_w": None, "joules_per_output_token": None,
                    "energy_usd_per_mtok": None}
        j = float(e.joules_per_output_token[i])
        return {"power_w": float(e.power_w[i]), "joules_per_output_token": j,
                "energy_usd_per_mtok": energy_usd_per_mtok(j, self.electricity_usd_per_kwh)}

    def to_dict(self) -> dict[str, Any]:
        c = self.curve
        return {
            "context_tokens": self.context_tokens,
            "kv_bytes_per_seq": self.kv_bytes_per_seq,
            "kv_bytes_per_seq_allocated_per_gpu": self.kv_bytes_per_seq_allocated,
            "kv_per_kind": [dict(k) for k in self.kv_per_kind],
            "b_star": self.b_star,
            "b_star_weights_read": self.b_star_read,
            "b_mem": self.b_mem,
            "vllm_max_concurrency": self.vllm_max_concurrency,
            "compute_crossover_batch": self.compute_crossover_batch,
            "amortized_floor_ms": self.amortized_floor_s * 1e3,
            "tpot_floor_ms": self.amortized_floor_s * 1e3,  # the old name, kept for readers
            "prefill_ms": self.prefill_s * 1e3,
            "warnings": list(self.warnings),
            "curve": [
                {"batch": int(c.batch[i]), "step_ms": float(c.step_s[i] * 1e3),
                 "amortized_ms_per_token": float(c.amortized_s_per_token[i] * 1e3),
                 "throughput_tok_s": float(c.throughput_tok_s[i]),
                 "arithmetic_intensity": float(c.arithmetic_intensity[i]),
                 "regime": c.regime[i],
                 "tpot_ms": float(c.tpot_s[i] * 1e3),
                 "running_batch": int(c.running_batch[i]),
                 "waiting": int(c.batch[i] - c.running_batch[i]),
                 "running_tpot_ms": float(c.step_s[i] * 1e3)} | self._energy_point(i)
                for i in range(c.batch.size)],
            "recommendation": {"max_num_seqs": self.recommendation.max_num_seqs,
                               "reason": self.recommendation.reason,
                               "bound": self.recommendation.bound,
                               "flags": self.flags,
                               "b_star": self.b_star,
                               "knees": {k: v.to_dict()
                                         for k, v in self.recommendation.knees.items()},
                               "knee": None if self.knee is None else self.knee.to_dict(),
                               "at_batch": self.at_recommendation},
            "sla_met": not self.sla_unmet,
            "sla_batch": self.sla_batch,
            "tpot_batch1_ms": (None if self.tpot_batch1_s is None
                               else self.tpot_batch1_s * 1e3),
            "engine_defaults": [dict(e) for e in self.engine_defaults],
        } | ({} if self.speculative is None
             else {"speculative": self.speculative.to_dict()})


@dataclass(frozen=True, slots=True)
class Plan:
    deployment: Deployment
    weight_bytes: int
    weight_bytes_per_gpu: int
    kv_bytes_per_token: int
    kv_pool_bytes: int
    contexts: tuple[ContextPlan, ...]
    max_tpot_ms: float | None = None  # the per-request TPOT bound the plan was made for
    electricity_usd_per_kwh: float = DEFAULT_ELECTRICITY_USD_PER_KWH

    @property
    def power_basis(self) -> dict[str, Any] | None:
        """The power model the curve's watts and joules come from (bstar.energy), with the
        electricity price; None when the GPU states no power."""
        pm = power_model(self.deployment.gpu)
        return None if pm is None else pm.to_dict() | {
            "electricity_usd_per_kwh": self.electricity_usd_per_kwh,
            "num_gpus": self.deployment.num_gpus,
            "joules_per_output_token": "num_gpus x power_w x step_s / running_batch"}

    def to_dict(self) -> dict[str, Any]:
        d = self.deployment
        m, e = d.model, d.eff
        return {
            "model": m.name, "gpu": d.gpu.id, "num_gpus": d.num_gpus,
            "expert_parallel": d.expert_parallel, "data_parallel": d.data_parallel,
            "max_tpot_ms": self.max_tpot_ms,
            "power_basis": self.power_basis,
            "weight_bytes": self.weight_bytes,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "ridge_flops_per_byte": d.gpu.ridge_flops_per_byte,
            "contexts": [c.to_dict() for c in self.contexts],
            "num_params": m.num_params, "num_active_params": m.num_active_params,
            "attention": m.attention_kind, "weight_dtype": d.weight.name,
            "kv_dtype": d.kv.name, "gpu_memory_bytes": d.gpu.memory_bytes,
            "gpu_util": d.gpu_util, "reserve_bytes": d.reserve_bytes,
            "kv_pool_bytes_per_gpu": self.kv_pool_bytes,
            "weight_bytes_per_gpu": self.weight_bytes_per_gpu,
            # cost model 2's terms (docs/cost-model.md); times in ms
            "efficiency": _record_dict(e),
            "behaviour": _record_dict(d.behaviour),
            "engine_profile": _engine_dict(d),
            "units": {"bytes": "exact bytes", "GB": 1e9, "GiB": GiB,
                      "tpot_ms": "per-request time between tokens (= step time)",
                      "amortized_ms_per_token": "step time / batch = 1 / throughput "
                                                "(seed 000's 'TPOT' curve)"},
        }


def _record_dict(record: Any) -> dict[str, Any]:
    """A record's fields (Efficiency, EngineBehaviour) for the JSON: times in ms (`_s` ->
    `_ms`), an infinite roof sharpness (a hard max) as None."""
    out: dict[str, Any] = {}
    for f in fields(record):
        v = getattr(record, f.name)
        if f.name.endswith("_s"):
            out[f.name[:-2] + "_ms"] = v * 1e3
        else:
            out[f.name] = None if isinstance(v, float) and np.isinf(v) else v
    return out


def _engine_dict(d: Deployment) -> dict[str, str] | None:
    """Which bundled engine priors the efficiencies started from, and on what basis; the
    kernel path the deployment's linears take and whose terms price it
    (`EngineProfile.for_path`; docs/cost-model.md, "Kernel paths")."""
    from bstar.engines import engine_profiles

    p = engine_profiles().get(d.engine)
    if p is None:
        return None
    path = d.kernel_path
    kernel_basis = p.for_gpu(d.gpu.arch, path, mla=d.model.is_mla)[3]
    if not d.kernel_terms_path and p.kernel_path and p.kernel_path != path:
        kernel_basis = f"{path}: calibrated (a profile's own kernel terms)"
    return {"name": p.name, "title": p.title, "basis": p.basis, "source": p.source,
            "kernel_path": path, "kernel_basis": kernel_basis}


def check_contexts(contexts: list[int] | tuple[int, ...]) -> None:
    if not contexts:
        raise BstarError("give at least one context length")
    for c in contexts:
        if not 1 <= c <= MAX_CONTEXT:
            raise BstarError(f"context length must be in 1..{MAX_CONTEXT:,} tokens, got {c}")


def check_tensor_parallel(d: Deployment) -> None:
    """--num-gpus is the tensor-parallel size: refuse one the engines cannot shard the model
    by (vLLM's rule, `ModelSpec.tensor_parallel_problem`), naming the sizes that work."""
    problem = d.model.tensor_parallel_problem(d.num_gpus)
    if problem is not None:
        sizes = ", ".join(str(n) for n in d.model.tensor_parallel_sizes())
        raise BstarError(f"--num-gpus {d.num_gpus} cannot shard {d.model.name}: {problem}; "
                         f"tensor-parallel sizes that work: {sizes}")


def sglang_default_cap(d: Deployment, ctx: int) -> int:
    """SGLang's default --max-running-requests on deployment `d`: its rule
    (engine_defaults.sglang_max_running_requests) over the KV pool's tokens, for the model's
    whole context (SGLang serves it unless told, --context-length; `ctx` without one)."""
    pool_tokens = rl.kv_pool_bytes(d) // max(1, kv_bytes_per_seq_allocated(d, 1)
                                             // max(1, d.block_size))
    max_pos = d.model.config.get("max_position_embeddings")
    return sglang_max_running_requests(
        pool_tokens, max_pos if isinstance(max_pos, int) and max_pos > 0 else ctx)


def engine_defaults(d: Deployment, ctx: int, b_mem: int,
                    recommended: int) -> tuple[dict[str, Any], ...]:
    """What each engine runs when --max-num-seqs (or its equivalent) is not given, and a
    note when that default is above B_mem or far (over 2x either way) from the
    recommendation."""
    out: list[dict[str, Any]] = []
    vllm = vllm_defaults(d.gpu)
    v, rule = vllm.max_num_seqs, VLLM_RULE
    note = None
    if v > b_mem:
        note = (f"vLLM's default max_num_seqs {v} is above B_mem = {b_mem}: the KV pool, "
                "not the cap, limits the batch, and growing sequences get preempted")
    elif v > 2 * recommended or 2 * v < recommended:
        note = (f"vLLM's default max_num_seqs {v} is far from the recommended {recommended}")
    out.append({"engine": "vllm", "max_num_seqs": v, "rule": rule, "note": note,
                "max_num_batched_tokens": vllm.max_num_batched_tokens})
    sgl = sglang_default_cap(d, ctx)
    out.append({"engine": "sglang", "max_num_seqs": sgl, "rule": SGLANG_RULE,
                "note": (f"SGLang's default --max-running-requests ~{sgl:,} is above B_mem "
                         f"= {b_mem}: the KV pool binds" if sgl > b_mem else None)})
    out.append({"engine": "tgi", "max_num_seqs": None,
                "rule": "no --max-batch-size by default; --max-batch-total-tokens is "
                        "inferred from free memory",
                "note": "TGI sets no batch-size cap by default: its token budget (the KV "
                        "memory) binds, as B_mem does here"})
    return tuple(out)


def check_batches(batches: list[int] | tuple[int, ...]) -> None:
    for b in batches:
        if not 1 <= b <= MAX_BATCH:
            raise BstarError(f"batch size must be in 1..{MAX_BATCH:,}, got {b}")


def make_plan(d: Deployment, contexts: tuple[int, ...] | list[int] = DEFAULT_CONTEXTS,
              batches: list[int] | None = None, max_tpot_ms: float | None = None,
              prompt_tokens: int | None = None, spec: SpecConfig | None = None,
              drafter: Drafter | None = None,
              electricity_usd_per_kwh: float = DEFAULT_ELECTRICITY_USD_PER_KWH) -> Plan:
    """The cost model at each context: sizes, B*, B_mem, crossover, curve, recommendation;
    with `spec` and its `drafter` (bstar.specdec.make_drafter), speculative decoding's
    speedup over that curve, its break-even batch and the best K per batch.

    `context_tokens` is the KV each running sequence holds (prompt + generated so far; the
    seeds' seq_len). `prompt_tokens` (default: the context) sizes the prefill estimate.
    Each curve point is priced in watts and joules per output token (bstar.energy), their
    electricity at `electricity_usd_per_kwh`.
    """
    check_contexts(contexts)
    check_electricity_price(electricity_usd_per_kwh)
    check_tensor_parallel(d)
    if batches is not None:
        check_batches(batches)
    if max_tpot_ms is not None and not max_tpot_ms > 0:
        raise BstarError(f"--max-tpot-ms must be positive, got {max_tpot_ms}")
    out = []
    for ctx in contexts:
        bm = rl.b_mem(d, ctx)
        if bm < 1:
            need = rl.min_gpus_that_fit(d, ctx)
            pool = rl.kv_pool_bytes(d)
            raise BstarError(
                f"{d.model.name} does not fit on {d.num_gpus} x {d.gpu.id} at {ctx} tokens: "
                f"weights {rl.weight_bytes_per_gpu(d) / GB:.2f} GB per GPU, KV pool "
                f"{pool / GB:.2f} GB per GPU (memory {d.gpu.memory_bytes / GiB:.2f} GiB x "
                f"{d.gpu_util:g} - weights - reserve {d.reserve_bytes / GiB:.2f} GiB), one "
                f"sequence needs {kv_bytes_per_seq_allocated(d, ctx) / GB:.3f} GB; "
                + (f"the smallest tensor-parallel size that fits is --num-gpus {need}"
                   if need else "no tensor-parallel size up to 64 fits"))
        bs = batches if batches is not None else rl.default_batches(bm)
        c = rl.curve(d, bs, ctx)
        bstar = rl.b_star(d, ctx)
        cross = rl.compute_crossover(d, ctx)
        sla_b = None
        tpot1 = None
        if max_tpot_ms is not None:
            grid = np.arange(1, bm + 1)
            tp = rl.curve(d, grid, ctx).tpot_s * 1e3
            # knee.slo_knee: the batch below the first violation (the one SLO-batch rule)
            sla_b = slo_knee(grid, tp, max_tpot_ms).batch
            tpot1 = float(tp[0])
        knees = None if d.engine == "ideal" else predicted_knees(d, ctx, bm)
        rec = Recommendation.from_cost_model(bstar, bm, cross, sla_b, max_tpot_ms, tpot1,
                                             knees)
        warnings = []
        max_pos = d.model.config.get("max_position_embeddings")
        if isinstance(max_pos, int) and ctx > max_pos:
            warnings.append(f"context {ctx} exceeds the model's max_position_embeddings "
                            f"({max_pos}); engines refuse --max-model-len above it")
        out.append(ContextPlan(
            context_tokens=ctx, kv_bytes_per_seq=rl.kv_bytes_per_seq(d, ctx),
            kv_bytes_per_seq_allocated=kv_bytes_per_seq_allocated(d, ctx),
            b_star=bstar, b_star_read=rl.b_star_read(d, ctx), b_mem=bm,
            compute_crossover_batch=cross, amortized_floor_s=rl.amortized_floor_s(d, ctx),
            curve=c,
            recommendation=rec,
            flags=engine_flags(rec.max_num_seqs, d.gpu_util, d.num_gpus, ctx),
            prefill_s=rl.prefill_s(d, prompt_tokens or ctx), warnings=tuple(warnings),
            at_recommendation=at_batch(d, rec.max_num_seqs, ctx, electricity_usd_per_kwh),
            engine_defaults=engine_defaults(d, ctx, bm, rec.max_num_seqs),
            tpot_batch1_s=float(rl.curve(d, [1], ctx).tpot_s[0]),
            kv_per_kind=tuple(kv_per_kind(d, ctx)), sla_batch=sla_b,
            vllm_max_concurrency=rl.vllm_max_concurrency(d, ctx),
            energy=decode_energy(d, c.batch, ctx),
            electricity_usd_per_kwh=electricity_usd_per_kwh,
            speculative=None if spec is None or drafter is None
            else plan_context(d, drafter, spec, ctx, c.batch, Recommendation.from_cost_model(
                # The same pick on the pool with the drafter (specdec.b_mem): what runs
                # with speculation on.
                bstar, feasible_b_mem(d, drafter, ctx, spec.num_speculative_tokens), cross,
                sla_b,
                max_tpot_ms, tpot1, knees).max_num_seqs)))
    return Plan(d, rl.weight_bytes(d), rl.weight_bytes_per_gpu(d), rl.kv_bytes_per_token(d),
                rl.kv_pool_bytes(d), tuple(out), max_tpot_ms, electricity_usd_per_kwh)


def at_batch(d: Deployment, batch: int, ctx: int,
             electricity_usd_per_kwh: float) -> dict[str, Any]:
    """The curve at one batch (the recommendation's): its TPOT, step, throughput and
    regime, and its power, joules per output token and their cost (None without a power
    model)."""
    at = rl.curve(d, [batch], ctx)
    e = decode_energy(d, [batch], ctx)
    j = None if e is None else float(e.joules_per_output_token[0])
    return {"batch": batch, "tpot_ms": float(at.tpot_s[0] * 1e3),
            "step_ms": float(at.step_s[0] * 1e3),
            "throughput_tok_s": float(at.throughput_tok_s[0]), "regime": at.regime[0],
            "power_w": None if e is None else float(e.power_w[0]),
            "joules_per_output_token": j,
            "energy_usd_per_mtok": None if j is None
            else energy_usd_per_mtok(j, electricity_usd_per_kwh)}


def predicted_knees(d: Deployment, context_tokens: int, b_mem: int) -> dict[str, Knee]:
    """Knees of the predicted throughput curve at one context: seed 004's doubling rule on
    a fine grid (four points per doubling, up to twice B_mem, where the running batch stops
    growing and throughput flattens), and seed 000's 5%-per-step rule on powers of two."""
    from bstar.knee import all_knees

    top = max(2, 2 * b_mem)
    # sorted(set()), not np.unique: np.unique imports numpy.ma (a fifth of `bstar plan`'s
    # start-up, bench/startup.py).
    fine = np.array(sorted(set(np.round(2.0 ** (np.arange(0, 4 * np.log2(top) + 1) / 4))
                               .astype(int).tolist())), dtype=int)
    pow2 = 2 ** np.arange(0, int(np.log2(top)) + 1)
    return all_knees(pow2, rl.curve(d, pow2, context_tokens).throughput_tok_s,
                     doubling_grid=(fine, rl.curve(d, fine, context_tokens).throughput_tok_s))


def compare(options: DeploymentOptions, models: list[str] | None = None,
            gpus: list[str] | None = None, contexts: tuple[int, ...] | list[int] | None = None,
            max_tpot_ms: float | None = None,
            warn: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """One row per model x GPU x context (`bstar compare --json`), each deployment the
    `options` with that model and GPU. A model that does not fit gets a row saying so."""
    rows = []
    for m in models or [DEFAULT_MODEL]:
        for g in gpus or [DEFAULT_GPU]:
            d = options.with_target(m, g).build(warn=warn)
            for ctx in tuple(contexts or DEFAULT_CONTEXTS):
                try:
                    p = make_plan(d, (ctx,), [1], max_tpot_ms)
                except BstarError as e:
                    if rl.b_mem(d, ctx) >= 1:
                        raise
                    # One model that does not fit must not hide the rest of the table.
                    rows.append(no_fit_row(d, ctx, rl.min_gpus_that_fit(d, ctx), str(e)))
                    continue
                rows.append(compare_row(p, p.contexts[0]))
    return rows


def compare_row(plan: Plan, c: ContextPlan) -> dict[str, Any]:
    d = plan.deployment
    return {"model": d.model.name, "gpu": d.gpu.id, "num_gpus": d.num_gpus,
            "attention": d.model.attention_kind, "weight_bytes": plan.weight_bytes,
            "kv_bytes_per_token": plan.kv_bytes_per_token,
            "context_tokens": c.context_tokens, "kv_bytes_per_seq": c.kv_bytes_per_seq,
            "b_star": c.b_star, "b_mem": c.b_mem,
            "compute_crossover_batch": c.compute_crossover_batch,
            "amortized_floor_ms": c.amortized_floor_s * 1e3,
            "tpot_floor_ms": c.amortized_floor_s * 1e3,  # the old name, kept for readers
            "tpot_batch1_ms": float(c.curve.tpot_s[0] * 1e3),
            "warnings": list(c.warnings),
            "recommendation": {"max_num_seqs": c.recommendation.max_num_seqs,
                               "reason": c.recommendation.reason,
                               "bound": c.recommendation.bound},
            "fits": True}


def no_fit_row(d: Deployment, ctx: int, min_gpus: int | None,
               message: str) -> dict[str, Any]:
    return {"model": d.model.name, "gpu": d.gpu.id, "num_gpus": d.num_gpus,
            "attention": d.model.attention_kind, "weight_bytes": rl.weight_bytes(d),
            "kv_bytes_per_token": rl.kv_bytes_per_token(d), "context_tokens": ctx,
            "kv_bytes_per_seq": rl.kv_bytes_per_seq(d, ctx), "b_star": rl.b_star(d, ctx),
            "b_mem": 0, "compute_crossover_batch": None, "amortized_floor_ms": None,
            "tpot_floor_ms": None,
            "tpot_batch1_ms": None, "recommendation": None, "fits": False,
            "min_num_gpus": min_gpus, "error": message}
