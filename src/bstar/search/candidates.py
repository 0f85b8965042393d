"""Candidate generation and pruning. Pure: specs in, candidates out; no simulation here.

A *candidate* is what an operator buys and runs: `num_gpus` GPUs of one kind serving one
model as `num_gpus / tp` engine replicas of tensor parallel size `tp` (vLLM
`--data-parallel-size` x `--tensor-parallel-size`), with engine limits `max_num_seqs` and
`max_num_batched_tokens`. The unit that is simulated is one *replica* (GPU, tp, limits):
candidates that differ only in how many replicas share an instance share its evaluation.

Tensor parallel sizes follow vLLM's rules for splitting a model: the attention heads divide
by tp, the KV heads divide by tp or tp by them (vLLM replicates KV heads when tp exceeds
them), and the MLP (and each routed expert's) intermediate width divides by tp.

Pruning happens before any simulation and only drops what can never meet the SLO:

- memory: the model's weights leave no KV block, or the longest request drawn cannot fit in
  the KV pool (the simulator would refuse it: `sim.check_feasible`);
- SLO: a lower bound on a p99 latency already exceeds its target. Every step of a replica
  costs at least the step of one sequence decoding one token with no KV at all, so each
  request's TPOT is at least that; a request's TTFT is at least one step that computes its
  whole prompt (chunks cost more, not less: weights are read again per chunk); percentiles
  of values each above a bound are above the percentile of the bounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from bstar import roofline as rl
from bstar.deployment import Deployment
from bstar.engine_defaults import vllm_defaults
from bstar.errors import BstarError
from bstar.recommend import MEMORY_HEADROOM
from bstar.sim import SchedulerConfig, SimConfig, Slo, Workload, check_feasible
from bstar.sim.steptime import coefficients
from bstar.specs.model import ModelSpec


@dataclass(frozen=True, slots=True)
class Replica:
    """One engine replica: the unit a simulation evaluates."""

    model: str
    gpu: str
    tp: int
    max_num_seqs: int
    max_num_batched_tokens: int
    deployment: Deployment
    calibrated: str | None = None  # profile path when calibrated terms apply
    speculative: Any = None  # bstar.sim.speculative.SpecSim; None: plain decode

    layout = "aggregated"  # a disaggregated unit: bstar.search.disagg.DisaggReplica

    @property
    def replica_gpus(self) -> int:
        """GPUs one replica runs on (its rate's divisor for throughput per GPU)."""
        return self.tp

    @property
    def num_speculative_tokens(self) -> int:
        return 0 if self.speculative is None else int(self.speculative.k)

    @property
    def key(self) -> str:
        spec = f"|spec{self.num_speculative_tokens}" if self.speculative is not None else ""
        d = self.deployment
        layout = (f"|ep{d.expert_parallel}|dp{d.data_parallel}"
                  if d.expert_parallel > 1 or d.data_parallel > 1 else "")
        return (f"{self.model}|{self.gpu}|tp{self.tp}|seqs{self.max_num_seqs}|"
                f"tok{self.max_num_batched_tokens}{spec}{layout}")


@dataclass(frozen=True, slots=True)
class Candidate:
    replica: Any  # Replica, or a disaggregated unit (bstar.search.disagg.DisaggReplica)
    num_gpus: int  # GPUs per instance (a disaggregated unit: all its GPUs)

    @property
    def data_parallel(self) -> int:
        """Replicas per instance (a disaggregated unit is one)."""
        return self.num_gpus // self.replica.replica_gpus


@dataclass(frozen=True, slots=True)
class Pruned:
    limit: str  # "memory", "SLO", "tp"
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"status": "pruned", "limit": self.limit, "reason": self.reason}


def tp_split_error(m: ModelSpec, tp: int) -> str | None:
    """Why `m` cannot be split `tp` ways (None: it can)."""
    if m.num_heads % tp:
        return f"{m.num_heads} attention heads do not divide by tensor parallel {tp}"
    if not m.is_mla and m.num_kv_heads % tp and tp % m.num_kv_heads:
        return (f"{m.num_kv_heads} KV heads and tensor parallel {tp}: neither divides the "
                "other")
    if (not m.is_moe or m.num_dense_layers) and m.intermediate_size % tp:
        return f"MLP width {m.intermediate_size} does not divide by tensor parallel {tp}"
    if m.is_moe and m.moe_intermediate_size % tp:
        return (f"expert width {m.moe_intermediate_size} does not divide by tensor "
                f"parallel {tp}")
    return None


def tp_sizes(m: ModelSpec, num_gpus: int) -> list[int]:
    """Valid tensor parallel sizes for an instance of `num_gpus`: divisors of it that split
    the model."""
    return [t for t in range(1, num_gpus + 1) if num_gpus % t == 0
            and tp_split_error(m, t) is None]


def mean_tokens(w: Workload) -> tuple[float, float]:
    return float(w.prompt_tokens.mean()), float(w.output_tokens.mean())


def typical_context(w: Workload) -> int:
    """KV a running sequence holds on average: its prompt plus half its output."""
    i, o = mean_tokens(w)
    return max(1, round(i + o / 2))


def default_max_num_seqs(d: Deployment, w: Workload) -> list[int]:
    """Around the cost model's predicted knee (the plan's: `plan.predicted_knees`) and B_mem
    at the workload's typical context: half the knee, the knee, twice the knee, and 85% of
    B_mem (each at most B_mem)."""
    from bstar.plan import predicted_knees

    ctx = typical_context(w)
    bm = rl.b_mem(d, ctx)
    if bm < 1:
        return []
    knee = predicted_knees(d, ctx, bm)["doubling"].batch
    top = max(1, math.floor(MEMORY_HEADROOM * bm))
    picks = {top}
    if knee is not None:
        picks |= {max(1, knee // 2), knee, min(2 * knee, bm)}
    return sorted(p for p in picks if 1 <= p <= bm)


def sim_config(r: Replica) -> SimConfig:
    return SimConfig(SchedulerConfig(r.max_num_seqs, r.max_num_batched_tokens),
                     speculative=r.speculative)


def slo_lower_bounds_ms(d: Deployment, w: Workload, spec: Any = None) -> dict[str, float]:
    """p99 lower bounds (ms) on TTFT, TPOT and E2E that hold for any rate and any engine
    limits (see the module docstring). With speculation (`spec`, a SpecSim) a step yields
    at most K + 1 tokens: the TPOT bound is the speculative step of one sequence holding no
    KV over K + 1."""
    k = coefficients(d)
    # A decode step of one sequence holding no KV, and a prompt prefilled in one step from
    # nothing: no real step is cheaper (chunking a prompt only adds steps).
    tpot_lb_s = float(k.decode_step_s(1.0)[0])
    if spec is not None:
        from bstar.specdec import scheduled_step_s

        tpot_lb_s = scheduled_step_s(d, spec.drafter, [0], [1], spec.k) / (spec.k + 1)
    prompt = w.prompt_tokens.astype(np.float64)
    ttft_lb = np.array([k.batch_step_s([0], [int(n)]) for n in np.unique(prompt)])
    ttft_each = ttft_lb[np.searchsorted(np.unique(prompt), prompt)]
    e2e_each = ttft_each + (w.output_tokens - 1) * tpot_lb_s
    return {"ttft_ms": float(np.percentile(ttft_each, 99)) * 1e3,
            "tpot_ms": tpot_lb_s * 1e3,
            "e2e_ms": float(np.percentile(e2e_each, 99)) * 1e3}


def prune(r: Replica, w: Workload, slo: Slo) -> Pruned | None:
    """Why this replica can never meet the SLO, or None when it must be simulated."""
    d = r.deployment
    err = tp_split_error(d.model, r.tp)
    if err:
        return Pruned("tp", err)
    try:
        check_feasible(d, sim_config(r), w)
    except BstarError as e:
        return Pruned("memory", str(e))
    lb = slo_lower_bounds_ms(d, w, r.speculative)
    for key, target in slo.to_dict().items():
        if lb[key] > target:
            return Pruned("SLO", f"{key.removesuffix('_ms')} p99 is at least {lb[key]:.1f} ms "
                                 f"at any rate (target {target:g} ms)")
    return None


def layout_size(size: int, tp: int, num_experts: int) -> int:
    """A replica's EP or attention-DP size: `size` (0: all `tp` GPUs) where it divides tp
    (and the experts, for EP), else 1."""
    n = tp if size == 0 else size
    if n <= 1 or tp % n or (num_experts and num_experts % n):
        return 1
    return n


def replicas_for(model: ModelSpec, model_name: str, base: Deployment, tps: list[int],
                 w: Workload, max_num_seqs: tuple[int, ...],
                 max_num_batched_tokens: tuple[int, ...],
                 calibrated: str | None = None, expert_parallel: int = 1,
                 attention_dp: int = 1) -> list[Replica]:
    """Replica configurations of one model on one GPU for each tp: the engine-limit grids,
    given or by default (max_num_seqs around the predicted knee and B_mem; the token budget
    vllm serve picks on that GPU)."""
    out = []
    g = base.gpu
    for t in tps:
        d = replace(base, model=model, num_gpus=t,
                    expert_parallel=layout_size(expert_parallel, t, model.num_experts
                                                if model.is_moe else 0),
                    data_parallel=layout_size(attention_dp, t, 0))
        seqs = list(max_num_seqs) or default_max_num_seqs(d, w) or [1]
        # No cap above B_mem at the requests' full length: the engine runs at most that many
        # sequences, and a higher flag only lets longer requests preempt (regime 3).
        i, o = mean_tokens(w)
        bm = rl.b_mem(d, max(1, round(i + o)))
        if bm >= 1:
            seqs = sorted({min(m, bm) for m in seqs})
        toks = list(max_num_batched_tokens) or [vllm_defaults(g).max_num_batched_tokens]
        for m in seqs:
            for b in toks:
                out.append(Replica(model_name, g.id, t, m, b, d, calibrated))
    return out
