"""Policy: turn the cost model's numbers into a max_num_seqs with the reason that bound it,
and print it as each engine's flags."""

from __future__ import annotations

import math
from dataclasses import dataclass

# Seed 000: when B* is close to B_mem, cap at 80-90% of B_mem; 85% is the middle.
MEMORY_HEADROOM = 0.85


@dataclass(frozen=True, slots=True)
class Recommendation:
    max_num_seqs: int
    reason: str
    bound: str  # "b_star", "b_mem", "compute", "sla", "sla-unmet"


def recommend(b_star: float, b_mem: int, compute_crossover: float | None = None,
              sla_batch: int | None = None, max_tpot_ms: float | None = None,
              tpot_at_1_ms: float | None = None) -> Recommendation:
    """Seed 000's rule: B* when it fits well inside B_mem, else 85% of B_mem; lowered to the
    compute crossover when that comes first; capped by the per-request TPOT SLA."""
    if b_star <= MEMORY_HEADROOM * b_mem:
        rec = Recommendation(
            max(1, math.floor(b_star)),
            f"B* = {b_star:.1f} (KV bytes read per step reach the weight bytes; past it each "
            f"added sequence buys less) fits within 85% of B_mem = {b_mem}", "b_star")
    else:
        rec = Recommendation(
            max(1, math.floor(MEMORY_HEADROOM * b_mem)),
            f"memory binds: B* = {b_star:.1f} is above 85% of B_mem = {b_mem}; 85% of B_mem "
            "leaves headroom against preemption (seed 000: 80-90%)", "b_mem")
    if compute_crossover is not None and compute_crossover < rec.max_num_seqs:
        rec = Recommendation(
            max(1, math.floor(compute_crossover)),
            f"compute roof at B = {compute_crossover:.1f}: past it throughput is flat and "
            f"only latency grows (B* = {b_star:.1f}, B_mem = {b_mem})", "compute")
    if max_tpot_ms is not None:
        if sla_batch is None or sla_batch < 1:
            at1 = f" (batch 1 already takes {tpot_at_1_ms:.2f} ms)" if tpot_at_1_ms else ""
            return Recommendation(1, f"no batch meets TPOT <= {max_tpot_ms:g} ms{at1}; "
                                  "the SLA needs faster hardware or more GPUs", "sla-unmet")
        if sla_batch < rec.max_num_seqs:
            rec = Recommendation(
                sla_batch, f"latency SLA: per-request TPOT <= {max_tpot_ms:g} ms holds up to "
                f"B = {sla_batch} (unconstrained: {rec.max_num_seqs}, {rec.bound})", "sla")
    return rec


def engine_flags(max_num_seqs: int, gpu_util: float, num_gpus: int,
                 context_tokens: int) -> dict[str, str]:
    """The same cap in each engine's words."""
    tp_vllm = f" --tensor-parallel-size {num_gpus}" if num_gpus > 1 else ""
    tp_sgl = f" --tp {num_gpus}" if num_gpus > 1 else ""
    tp_trt = f" --tp_size {num_gpus}" if num_gpus > 1 else ""
    tp_tgi = f" --num-shard {num_gpus}" if num_gpus > 1 else ""
    return {
        "vllm": f"--max-num-seqs {max_num_seqs} --gpu-memory-utilization {gpu_util:g}"
                f"{tp_vllm}",
        "sglang": f"--max-running-requests {max_num_seqs} --mem-fraction-static {gpu_util:g}"
                  f"{tp_sgl}",
        "tensorrt-llm": f"--max_batch_size {max_num_seqs}{tp_trt}",
        "tgi": f"--max-batch-size {max_num_seqs} --max-batch-total-tokens "
               f"{max_num_seqs * context_tokens}{tp_tgi}",
    }
