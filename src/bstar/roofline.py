"""The decode (and prefill) cost model: rooflines over exact bytes and FLOPs. Pure, no I/O.

Cost model 2 prices a step as a sum over kernel groups, each bound by its own resource
(Williams et al. 2009 roofline, applied per group; docs/cost-model.md has every term):

    weight GEMMs        roof(W_read(T) / (BW * eta_w[dtype]),  2 * P * T / (peak * eta_c))
    decode attention    roof((B * kv_per_seq(s) + scores) / (BW * eta_kv),
                             B * attention_flops(s) / (peak * eta_c))
    chunk attention     roof(K/V of the chunk's keys per query tile / (BW * eta_kv),
                             causal FLOPs / (peak * eta_attn * occupancy))     (prefill)
    fixed               layers * (layer_s + decode_layer_s [+ chunk_layer_s])
                        + all-reduces (tensor parallel) + overhead_s + overhead_per_seq_s * B

with W_read(T) = dense + experts * (1 - (1 - k/E)^T) for MoE, and roof(a, b) the soft
maximum (a^k + b^k)^(1/k): a kernel near its ridge point is slower than either roof alone
(measured on an H200, docs/cost-model.md). `IDEAL` is the seeds' arithmetic: one hard
max(bytes / BW, FLOPs / peak) over the step's totals, efficiencies 1, no fixed costs.

Per-request TPOT (inter-token latency) is the step time. Amortized time per token is
step time / B = 1 / throughput: seed 000's "TPOT" curve is the amortized one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from bstar import step as _step
from bstar.deployment import Deployment
from bstar.errors import BstarError
from bstar.kv_pool import kv_bytes_per_seq_allocated, kv_layout

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

REGIMES = ("weight-dominated", "kv-dominated", "compute-bound", "memory-exhausted")


# ---- sizes --------------------------------------------------------------------------------
def weight_bytes(d: Deployment) -> int:
    """Resident weights W, all GPUs together (exact, quantization scales included)."""
    return d.model.weight_bytes(d.weight)


def weight_bytes_per_gpu(d: Deployment) -> int:
    # Tensor parallel shards every matrix and the vocabulary; norms (a few KB) replicate.
    # Under attention data parallel each rank holds the non-expert weights over its own
    # attention_tp GPUs; the routed experts stay split over all GPUs (EP x expert TP).
    if d.data_parallel == 1:
        return math.ceil(weight_bytes(d) / d.num_gpus)
    dense, expert, embed = d.model.weight_bytes_parts(d.weight)
    return math.ceil((dense + embed) / d.attention_tp + expert / d.num_gpus)


def kv_bytes_per_token(d: Deployment) -> int:
    """KV bytes per token of context, whole model (the seeds' kv_per_token)."""
    return d.model.kv_bytes_per_token(d.kv)


def kv_bytes_per_seq(d: Deployment, context_tokens: int) -> int:
    """KV bytes a sequence of `context_tokens` holds, whole model, exact tokens (seed's
    kv_per_seq; sliding-window layers capped at their window)."""
    return d.model.kv_bytes_per_seq(context_tokens, d.kv)


def kv_pool_bytes(d: Deployment) -> int:
    """Per-GPU KV pool: memory x utilization - weights - reserve (vLLM's accounting).

    Under attention data parallel (d.data_parallel > 1) the figure is one attention rank's
    GPU pool times the ranks: each rank's GPUs hold only its own sequences, so the pool a
    sequence's per-GPU bytes (`kv_layout`, at the rank's attention TP) are drawn from is
    data_parallel x one GPU's. MLA's latent KV is not split by TP, so DP multiplies the
    sequences a node holds by up to data_parallel."""
    one = math.floor(d.gpu.memory_bytes * d.gpu_util) - weight_bytes_per_gpu(d) \
        - d.reserve_bytes
    return one * d.data_parallel if one > 0 else one


def b_star(d: Deployment, context_tokens: int) -> float:
    """Saturation batch B* = W / kv_per_seq (seed 000): the batch at which the KV bytes read
    per step equal the resident weight bytes; amortized time per token is 2x its floor."""
    return weight_bytes(d) / kv_bytes_per_seq(d, context_tokens)


def b_mem(d: Deployment, context_tokens: int,
          max_num_batched_tokens: int | None = None) -> int:
    """Largest batch whose KV fits in steady decode (docs/models.md, "The batch a windowed
    model runs"): floor(KV pool / allocated KV per sequence) when no layer frees blocks as
    it decodes; for sliding or chunked layers, one sequence prefilling a budget of tokens
    (the start-up share, `kv_layout`) and as many decoding ones as fit beside it, each
    holding only its window's blocks (`KvLayout.steady_blocks_per_seq`). The budget
    (max_num_batched_tokens) defaults to vLLM's for the GPU."""
    lay = kv_layout(d, context_tokens, max_num_batched_tokens)
    if not lay.recycles:
        return vllm_max_concurrency(d, context_tokens, max_num_batched_tokens)
    pool_blocks = kv_pool_bytes(d) // lay.bytes_per_block
    if pool_blocks < lay.blocks_per_seq:
        return 0
    return 1 + (pool_blocks - lay.blocks_per_seq) // lay.steady_blocks_per_seq


def vllm_max_concurrency(d: Deployment, context_tokens: int,
                         max_num_batched_tokens: int | None = None) -> int:
    """vLLM's start-up "Maximum concurrency for N tokens per request", floored: KV pool /
    the KV it allocates per sequence, every sequence counted as if prefilling a budget of
    tokens in its windowed layers (`kv_layout`; `cache_config_info`'s
    kv_cache_max_concurrency). Equals `b_mem` for a model whose layers all attend fully."""
    return math.floor(kv_pool_bytes(d) / kv_bytes_per_seq_allocated(
        d, context_tokens, max_num_batched_tokens))


def min_gpus_that_fit(d: Deployment, context_tokens: int, limit: int = 64) -> int | None:
    """The smallest power-of-two tensor-parallel size the model shards to
    (`ModelSpec.tensor_parallel_problem`) whose KV pool holds one sequence."""
    for n in (1, 2, 4, 8, 16, 32, 64):
        if n <= limit and d.model.tensor_parallel_problem(n) is None \
                and b_mem(replace(d, num_gpus=n), context_tokens) >= 1:
            return n
    return None


# ---- per-step cost, vectorized over batch sizes ---------------------------------------------
@dataclass(frozen=True, slots=True)
class StepCost:
    """Per-GPU cost of one decode step at each batch size (arrays aligned with `batch`).
    `memory_s` and `compute_s` are the step's totals on each roof (for regimes and the
    arithmetic intensity); `gemm_s` and `attention_s` are the two kernel groups, each on
    its own roofline; `layers_s` the fixed per-layer kernel time."""

    batch: IntArray
    weight_bytes_read: FloatArray
    kv_bytes_read: FloatArray
    flops: FloatArray
    memory_s: FloatArray
    compute_s: FloatArray
    comm_s: FloatArray
    overhead_s: FloatArray
    gemm_s: FloatArray
    attention_s: FloatArray
    layers_s: FloatArray
    grouped: bool = True

    @property
    def step_s(self) -> FloatArray:
        kernels = self.gemm_s + self.attention_s if self.grouped \
            else np.maximum(self.memory_s, self.compute_s)
        return kernels + self.layers_s + self.comm_s + self.overhead_s

    @property
    def bytes_read(self) -> FloatArray:
        return self.weight_bytes_read + self.kv_bytes_read

    @property
    def arithmetic_intensity(self) -> FloatArray:
        """FLOPs per byte moved from HBM (same per GPU as for the whole model)."""
        return self.flops / self.bytes_read


def weight_bytes_read(d: Deployment, batch: IntArray | FloatArray) -> FloatArray:
    """Weight bytes one decode step streams from each GPU's HBM."""
    return _step.shape(d).weight_s(batch) * d.gpu.hbm_bandwidth_bytes_s


def decode_step(d: Deployment, batch: npt.ArrayLike, context_tokens: int) -> StepCost:
    """Per-GPU cost of a decode step of each batch size at `context_tokens`, priced by
    bstar.step (the one price of a step)."""
    bf = np.atleast_1d(np.asarray(batch, dtype=np.float64))  # fractional B for root finding
    sh = _step.shape(d)
    work = sh.decode(bf, context_tokens)
    parts = _step.price_parts(work, d.eff)
    bw = d.gpu.hbm_bandwidth_bytes_s
    peak = d.gpu.peak_flops(d.weight.compute)
    return StepCost(
        batch=bf.astype(np.int64), weight_bytes_read=work.weight_s * bw,
        kv_bytes_read=work.kv_s * bw, flops=(work.gemm_s + work.decode_attention_s) * peak,
        memory_s=parts.memory_s, compute_s=parts.compute_s, comm_s=parts.comm_s,
        overhead_s=parts.overhead_s, gemm_s=parts.gemm_s,
        attention_s=parts.decode_attention_s, layers_s=parts.layers_s, grouped=d.eff.grouped)


def batch_output_tok_s(d: Deployment, batch: int, prompt_tokens: int, output_tokens: int,
                       context_tokens: int | None = None) -> float:
    """Output tokens per second of `batch` requests of `prompt_tokens` in and `output_tokens`
    out, prefill included: min(B, B_mem) x O / (prefill(B x I) + O x step), the step at
    `context_tokens` (default I + O/2, the mean a request holds while it decodes). What a
    static batch measures, and about what a closed loop of B streams does; `bstar validate`
    and a sweep level's prediction compare it with their measured throughput."""
    ctx = prompt_tokens + output_tokens // 2 if context_tokens is None else context_tokens
    c = curve(d, [batch], ctx)
    running = int(c.running_batch[0])
    total_s = prefill_s(d, prompt_tokens, running) + output_tokens * float(c.step_s[0])
    return running * output_tokens / total_s


def prefill_s(d: Deployment, prompt_tokens: int, batch: int = 1) -> float:
    """Time to prefill `batch` prompts of `prompt_tokens` (TTFT without queueing), priced as
    the step that runs them (bstar.step): the weight GEMMs over every token (weights read
    once), the causal attention (2*s^2*heads*dim per layer: QK^T and AV over the lower
    triangle) reading each query tile's keys, the fixed per-layer costs, communication,
    overhead."""
    work = _step.shape(d).prefill(prompt_tokens, batch)
    return float(_step.price(work, d.eff)[0])


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


def kv_bytes_read_per_seq_per_gpu(d: Deployment, context_tokens: int) -> float:
    """KV (and state) bytes one decode step reads on each GPU for one sequence holding
    `context_tokens`: the step's own figure (bstar.step), whose per-GPU share is
    `LayerGroup.kv_values_per_token_per_gpu` (each GPU keeps at least one whole KV head, so
    Llama-3-70B's 8 KV heads at TP 16 cost each GPU 1/8 of the KV, not 1/16; MLA's latent is
    replicated). The one rule for KV per GPU: the step, the pool and the points below use it."""
    return float(_step.shape(d).kv_s_per_seq(float(context_tokens))) \
        * d.gpu.hbm_bandwidth_bytes_s


def b_star_read(d: Deployment, context_tokens: int) -> float | None:
    """B where the KV bytes read equal the weight bytes actually read (differs from B* for
    MoE, where a small batch touches only some experts), both per GPU."""
    kv = kv_bytes_read_per_seq_per_gpu(d, context_tokens)
    return _first_root(lambda b: b * kv - weight_bytes_read(d, b))


def compute_crossover(d: Deployment, context_tokens: int) -> float | None:
    """Batch where the compute term of the step overtakes the memory term (both totals,
    with the deployment's efficiencies); None if memory stays the bound at any batch."""

    def diff(b: FloatArray) -> FloatArray:
        c = decode_step(d, b, context_tokens)
        return c.compute_s - c.memory_s

    return _first_root(diff)


def amortized_floor_s(d: Deployment, context_tokens: int) -> float:
    """Floor of the amortized time per token as B grows: reading one sequence's KV
    (seed 000's kv_per_seq / BW, with the bandwidth efficiency), per GPU."""
    kv = kv_bytes_read_per_seq_per_gpu(d, context_tokens)
    return kv / (d.gpu.hbm_bandwidth_bytes_s * d.eff.kv_stream())


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
