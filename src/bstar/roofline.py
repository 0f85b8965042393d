"""The decode (and prefill) cost model: a roofline over exact bytes and FLOPs. Pure, no I/O.

Per decode step with B sequences each holding s tokens of KV (Williams et al. 2009 roofline;
the per-step accounting of seed 000 and DESIGN.md):

    weight bytes read   W_read(B) = dense + experts * (1 - (1 - k/E)^B)      (MoE)
    KV bytes read       B * kv_bytes_per_seq(s)
    FLOPs               B * (2 * matmul_params_per_token + attention_flops(s))
    step time           max(bytes / (BW * eta_bw), FLOPs / (peak * eta_fl))
                        + all-reduces (tensor parallel) + overhead(B)

Per-request TPOT (inter-token latency) is the step time. Amortized time per token is
step time / B = 1 / throughput: seed 000's "TPOT" curve is the amortized one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from bstar.errors import BstarError
from bstar.specs.gpu import GpuSpec
from bstar.specs.model import ModelSpec
from bstar.specs.precision import KV_DTYPES, WEIGHT_DTYPES, Precision, get_precision

GiB = 1 << 30
IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

REGIMES = ("weight-dominated", "kv-dominated", "compute-bound", "memory-exhausted")


@dataclass(frozen=True, slots=True)
class Efficiency:
    """How far a real engine falls short of the datasheet. Stated defaults, meant to be
    replaced by calibration against a sweep (`bstar calibrate`):

    - bandwidth 0.70: served decode reaches roughly 60-75% of peak HBM bandwidth at batch 1
      (gpt-fast and vLLM batch-1 figures); 0.70 is the middle.
    - compute 0.60: large bf16 GEMMs reach 70-80% of dense peak, decode-shaped ones less.
    - overhead 0.5 ms per step + 5 us per sequence: scheduler, sampling and launch costs of
      a CUDA-graph engine ("low milliseconds" in Python schedulers, seed 004).
    - all-reduce latency 8 us per call (NCCL small-message latency over NVLink).
    Set all to 1 / 0 to get the pure roofline the seeds compute.
    """

    bandwidth: float = 0.70
    compute: float = 0.60
    overhead_s: float = 0.5e-3
    overhead_per_seq_s: float = 5e-6
    allreduce_latency_s: float = 8e-6

    def __post_init__(self) -> None:
        for k in ("bandwidth", "compute"):
            v = getattr(self, k)
            if not 0 < v <= 1:
                raise BstarError(f"{k} efficiency must be in (0, 1], got {v}")
        for k in ("overhead_s", "overhead_per_seq_s", "allreduce_latency_s"):
            if getattr(self, k) < 0:
                raise BstarError(f"{k} must not be negative")


IDEAL = Efficiency(1.0, 1.0, 0.0, 0.0, 0.0)


@dataclass(frozen=True, slots=True)
class Deployment:
    """One model on `num_gpus` GPUs (tensor parallel) with its serving memory settings."""

    model: ModelSpec
    gpu: GpuSpec
    num_gpus: int = 1
    weight_dtype: str = ""  # "" = the checkpoint's own (config torch_dtype / quantization)
    kv_dtype: str = "bf16"
    gpu_util: float = 0.90  # vLLM --gpu-memory-utilization default
    # Activations, CUDA graphs, CUDA context and NCCL buffers, per GPU; vLLM profiles these
    # at start-up. 2 GiB is a rough figure for 7-70B models at default settings.
    reserve_bytes: int = 2 * GiB
    block_tokens: int = 16  # vLLM's default KV block size
    eff: Efficiency = field(default_factory=Efficiency)

    def __post_init__(self) -> None:
        if self.num_gpus < 1:
            raise BstarError(f"--num-gpus must be at least 1, got {self.num_gpus}")
        if not 0 < self.gpu_util <= 1:
            raise BstarError(f"--gpu-util must be in (0, 1], got {self.gpu_util}")
        if self.reserve_bytes < 0:
            raise BstarError("reserve must not be negative")
        if self.block_tokens < 1:
            raise BstarError("block size must be at least 1 token")
        get_precision(self.weight_dtype or self.model.default_dtype,
                      allowed=(*WEIGHT_DTYPES, "fp8-block", "fp32"))
        get_precision(self.kv_dtype, allowed=KV_DTYPES)

    @property
    def weight(self) -> Precision:
        return get_precision(self.weight_dtype or self.model.default_dtype)

    @property
    def kv(self) -> Precision:
        return get_precision(self.kv_dtype)

    def with_eff(self, eff: Efficiency) -> Deployment:
        return replace(self, eff=eff)


# ---- sizes --------------------------------------------------------------------------------
def weight_bytes(d: Deployment) -> int:
    """Resident weights W, all GPUs together (exact, quantization scales included)."""
    return d.model.weight_bytes(d.weight)


def weight_bytes_per_gpu(d: Deployment) -> int:
    # Tensor parallel shards every matrix and the vocabulary; norms (a few KB) replicate.
    return math.ceil(weight_bytes(d) / d.num_gpus)


def kv_bytes_per_token(d: Deployment) -> int:
    """KV bytes per token of context, whole model (the seeds' kv_per_token)."""
    return d.model.kv_bytes_per_token(d.kv)


def kv_bytes_per_seq(d: Deployment, context_tokens: int) -> int:
    """KV bytes a sequence of `context_tokens` holds, whole model, exact tokens (seed's
    kv_per_seq; sliding-window layers capped at their window)."""
    return d.model.kv_bytes_per_seq(context_tokens, d.kv)


def kv_bytes_per_seq_allocated(d: Deployment, context_tokens: int) -> int:
    """What the engine allocates per sequence on each GPU: whole blocks, KV heads sharded."""
    return d.model.kv_bytes_per_seq(context_tokens, d.kv, num_gpus=d.num_gpus,
                                    block_tokens=d.block_tokens)


def kv_pool_bytes(d: Deployment) -> int:
    """Per-GPU KV pool: memory x utilization - weights - reserve (vLLM's accounting)."""
    return math.floor(d.gpu.memory_bytes * d.gpu_util) - weight_bytes_per_gpu(d) \
        - d.reserve_bytes


def b_star(d: Deployment, context_tokens: int) -> float:
    """Saturation batch B* = W / kv_per_seq (seed 000): the batch at which the KV bytes read
    per step equal the resident weight bytes; amortized time per token is 2x its floor."""
    return weight_bytes(d) / kv_bytes_per_seq(d, context_tokens)


def b_mem(d: Deployment, context_tokens: int) -> int:
    """Largest batch whose KV fits: floor(KV pool / allocated KV per sequence)."""
    return math.floor(kv_pool_bytes(d) / kv_bytes_per_seq_allocated(d, context_tokens))


def min_gpus_that_fit(d: Deployment, context_tokens: int, limit: int = 64) -> int | None:
    for n in (1, 2, 4, 8, 16, 32, 64):
        if n <= limit and b_mem(replace(d, num_gpus=n), context_tokens) >= 1:
            return n
    return None


# ---- per-step cost, vectorized over batch sizes ---------------------------------------------
@dataclass(frozen=True, slots=True)
class StepCost:
    """Per-GPU cost of one decode step at each batch size (arrays aligned with `batch`)."""

    batch: IntArray
    weight_bytes_read: FloatArray
    kv_bytes_read: FloatArray
    flops: FloatArray
    memory_s: FloatArray
    compute_s: FloatArray
    comm_s: FloatArray
    overhead_s: FloatArray

    @property
    def step_s(self) -> FloatArray:
        return np.maximum(self.memory_s, self.compute_s) + self.comm_s + self.overhead_s

    @property
    def bytes_read(self) -> FloatArray:
        return self.weight_bytes_read + self.kv_bytes_read

    @property
    def arithmetic_intensity(self) -> FloatArray:
        """FLOPs per byte moved from HBM (same per GPU as for the whole model)."""
        return self.flops / self.bytes_read


def expert_fraction_read(batch: IntArray | FloatArray, top_k: int,
                         num_experts: int) -> FloatArray:
    """Expected fraction of a layer's experts that at least one of B tokens routes to,
    assuming uniform independent routing: 1 - (1 - k/E)^B."""
    return 1.0 - (1.0 - top_k / num_experts) ** np.asarray(batch, dtype=np.float64)


def weight_bytes_read(d: Deployment, batch: IntArray | FloatArray) -> FloatArray:
    """Weight bytes one decode step streams from each GPU's HBM."""
    b = np.asarray(batch, dtype=np.float64)
    m = d.model
    dense, expert, embed = m.weight_bytes_parts(d.weight)
    # A tied table is the LM head, read in full every step; an untied input table is only
    # read for the B looked-up rows.
    rows = embed + 0.0 * b if m.tie_word_embeddings else b * m.hidden_size * 2
    dense = dense + rows
    total = dense + (expert * expert_fraction_read(b, m.num_experts_per_tok, m.num_experts)
                     if m.is_moe else 0.0)
    return np.asarray(total / d.num_gpus, dtype=np.float64)


def decode_step(d: Deployment, batch: npt.ArrayLike, context_tokens: int) -> StepCost:
    b = np.asarray(batch, dtype=np.int64)
    bf = b.astype(np.float64)
    m, g, e, n = d.model, d.gpu, d.eff, d.num_gpus
    w_read = weight_bytes_read(d, bf)
    kv_read = bf * kv_bytes_per_seq(d, context_tokens) / n \
        if not m.is_mla else bf * kv_bytes_per_seq(d, context_tokens)  # MLA latent replicates
    flops = bf * (2 * m.matmul_params_per_token + m.attention_flops_per_token(context_tokens)) / n
    memory_s = (w_read + kv_read) / (g.hbm_bandwidth_bytes_s * e.bandwidth)
    compute_s = flops / (g.peak_flops(d.weight.compute) * e.compute)
    comm_s = allreduce_s(d, bf)
    overhead = e.overhead_s + e.overhead_per_seq_s * bf
    return StepCost(b, w_read, kv_read, flops, memory_s, compute_s, comm_s, overhead)


def allreduce_s(d: Deployment, batch: FloatArray) -> FloatArray:
    """Tensor parallel: two all-reduces per layer (after attention, after the MLP) of the
    B x hidden activations; a ring moves 2(N-1)/N of the message over each link direction
    (half of the datasheet's bidirectional figure)."""
    n = d.num_gpus
    if n == 1:
        return np.zeros_like(batch)
    if d.gpu.interconnect_bytes_s <= 0:
        raise BstarError(f"{d.gpu.id} has no interconnect bandwidth in its spec; cannot model "
                         "tensor parallel")
    msg_bytes = batch * d.model.hidden_size * 2
    one_way_bytes_s = d.gpu.interconnect_bytes_s / 2
    per_call = d.eff.allreduce_latency_s + 2 * (n - 1) / n * msg_bytes / one_way_bytes_s
    return np.asarray(2 * d.model.num_layers * per_call, dtype=np.float64)


def prefill_s(d: Deployment, input_tokens: int, batch: int = 1) -> float:
    """Time to prefill `batch` prompts of `input_tokens` (TTFT without queueing): the
    weights are read once; FLOPs are 2*P per token plus causal attention, 2*s^2*heads*dim
    per layer (QK^T and AV over the lower triangle)."""
    m, g, e, n = d.model, d.gpu, d.eff, d.num_gpus
    tokens = input_tokens * batch
    held = m.kv_tokens_held(input_tokens)
    attn = sum(2 * input_tokens * t for t in held) * m.num_heads * m.head_dim * batch
    flops = (2 * m.matmul_params_per_token * tokens + attn) / n
    kv_write = batch * kv_bytes_per_seq(d, input_tokens) / n
    bytes_ = float(weight_bytes_read(d, np.array([tokens]))[0]) + kv_write
    t = max(bytes_ / (g.hbm_bandwidth_bytes_s * e.bandwidth),
            flops / (g.peak_flops(d.weight.compute) * e.compute))
    return t + float(allreduce_s(d, np.array([float(tokens)]))[0]) + e.overhead_s


# ---- derived points -------------------------------------------------------------------------
def _first_root(fn: Callable[[FloatArray], FloatArray], lo: float = 1e-3,
                hi: float = 1e7) -> float | None:
    """First B in [lo, hi] where fn(B) >= 0, fn vectorized and (piecewise) monotone: a log
    grid finds the bracket, bisection narrows it."""
    grid = np.geomspace(lo, hi, 512)
    idx = np.flatnonzero(fn(grid) >= 0)
    if idx.size == 0:
        return None
    i = int(idx[0])
    if i == 0:
        return float(grid[0])
    a, b = float(grid[i - 1]), float(grid[i])
    for _ in range(60):
        mid = 0.5 * (a + b)
        if fn(np.array([mid]))[0] >= 0:
            b = mid
        else:
            a = mid
    return b


def b_star_read(d: Deployment, context_tokens: int) -> float | None:
    """B where the KV bytes read equal the weight bytes actually read (differs from B* for
    MoE, where a small batch touches only some experts)."""
    kv = kv_bytes_per_seq(d, context_tokens) / (1 if d.model.is_mla else d.num_gpus)
    return _first_root(lambda b: b * kv - weight_bytes_read(d, b))


def compute_crossover(d: Deployment, context_tokens: int) -> float | None:
    """Batch where the compute term of the step time overtakes the memory term, with the
    deployment's efficiencies; None if memory stays the bound at any batch."""

    one = decode_step(d, [1], context_tokens)  # both terms are linear in B but W_read
    per_seq_compute_s = float(one.compute_s[0])
    bw = d.gpu.hbm_bandwidth_bytes_s * d.eff.bandwidth
    per_seq_kv_s = float(one.kv_bytes_read[0]) / bw

    def diff(b: FloatArray) -> FloatArray:
        return b * per_seq_compute_s - (weight_bytes_read(d, b) / bw + b * per_seq_kv_s)

    return _first_root(diff)


def tpot_floor_s(d: Deployment, context_tokens: int) -> float:
    """Floor of the amortized time per token as B grows: reading one sequence's KV
    (seed 000's kv_per_seq / BW, with the bandwidth efficiency)."""
    kv = kv_bytes_per_seq(d, context_tokens) / (1 if d.model.is_mla else d.num_gpus)
    return kv / (d.gpu.hbm_bandwidth_bytes_s * d.eff.bandwidth)


@dataclass(frozen=True, slots=True)
class Curve:
    """The model's prediction over batch sizes at one context length. For B > B_mem only
    B_mem sequences run at once: throughput stays at B_mem's and each request's TPOT grows
    as the engine time-slices (preemption)."""

    batch: IntArray
    running_batch: IntArray
    step_s: FloatArray  # step time of the running batch
    tpot_s: FloatArray  # per-request time between tokens
    amortized_s_per_token: FloatArray
    throughput_tok_s: FloatArray
    arithmetic_intensity: FloatArray
    regime: tuple[str, ...]
    cost: StepCost


def curve(d: Deployment, batch: npt.ArrayLike, context_tokens: int) -> Curve:
    b = np.asarray(batch, dtype=np.int64)
    if b.size == 0 or np.any(b < 1):
        raise BstarError("batch sizes must be positive integers")
    bm = b_mem(d, context_tokens)
    running = np.minimum(b, max(bm, 1))
    cost = decode_step(d, running, context_tokens)
    step = cost.step_s
    tput = running / step
    tpot = step * b / running
    exhausted = b > bm
    compute = cost.compute_s > cost.memory_s
    weight_dom = cost.weight_bytes_read > cost.kv_bytes_read
    regime = np.where(exhausted, REGIMES[3],
                      np.where(compute, REGIMES[2],
                               np.where(weight_dom, REGIMES[0], REGIMES[1])))
    return Curve(b, running, step, tpot, step / running, tput, cost.arithmetic_intensity,
                 tuple(str(r) for r in regime), cost)


def default_batches(bm: int) -> list[int]:
    """Powers of two from 1 to the first one past B_mem (at least 1..256)."""
    top = max(bm, 128)
    out, b = [], 1
    while True:
        out.append(b)
        if b > top:
            return out
        b *= 2
