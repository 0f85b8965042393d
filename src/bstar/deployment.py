"""What a deployment is, as plain values. Pure, no I/O.

- `Deployment`: one model on N GPUs (tensor parallel) with its serving memory settings, the
  efficiencies its step is priced at and how its engine behaves.
- `Efficiency`: how far the engine's step falls short of the datasheet (the cost model's
  efficiencies and fixed costs, bstar.step prices a step with them).
- `EngineBehaviour`: what the server does outside a step (work per request, scheduling a
  step ahead); the simulator reads it.
- `IDEAL`: the seeds' arithmetic.

`bstar.options.DeploymentOptions` builds a Deployment from names (presets, files, profiles);
`bstar.roofline` holds the formulas over it. Each field's provenance is in
docs/cost-model.md ("Efficiencies").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from bstar.errors import BstarError
from bstar.specs.gpu import GpuSpec
from bstar.specs.model import ModelSpec
from bstar.specs.precision import KV_DTYPES, WEIGHT_DTYPES, Precision, get_precision
from bstar.units import GiB

DEFAULT_MODEL = "llama-3-8b"
DEFAULT_GPU = "a100-80gb-sxm"
DEFAULT_RESERVE_GIB = 2.0

def weight_stream_fraction(weight_bits: int, bandwidth: float, fp8_weight_stream: float,
                           int4_weight_stream: float) -> float:
    """Weight-streaming efficiency for weights of `weight_bits`: the bandwidth efficiency,
    times the dequantizing GEMMs' fraction for 8- and 4-bit weights."""
    if weight_bits <= 4:
        return bandwidth * int4_weight_stream
    if weight_bits <= 8:
        return bandwidth * fp8_weight_stream
    return bandwidth


@dataclass(frozen=True, slots=True)
class Efficiency:
    """How far a real engine falls short of the datasheet: stated defaults, replaced by an
    engine profile (`--engine`, bstar/presets/engines.toml) or by calibration against a
    sweep (`bstar calibrate`). The GPU-side defaults are fitted to real H200 steps
    (data/h200/, `python bench/accuracy.py`); the engine-side ones (overheads, per-layer
    costs) are a generic prior (the first `vllm` guess): `--engine` (default vllm, fitted to
    real vLLM load stages) replaces them.

    - bandwidth 0.80: weight streaming by the GEMMs (H200 fit 0.800; big matrices reach
      0.92 of the datasheet in data/h200/gemv.jsonl, small ones far less; the per-layer
      costs below carry the small-matrix latency).
    - kv_bandwidth 0.93: KV-cache streaming by decode attention (H200 fit 0.930).
    - compute 0.70: GEMM and decode-attention FLOPs against the dense peak (H200 fit 0.702).
    - attention_compute 0.21: prefill/chunk attention FLOPs, before occupancy (H200 fit
      0.214, PyTorch's attention kernels; the torch-graph profile).
    - layer_s, decode_layer_s, chunk_layer_s: fixed time per layer per step of the kernels
      every step runs, of decode attention (when sequences decode), of chunk attention
      (when a prompt chunk runs): launch and tail latency of small kernels. The engine-side
      defaults are the `vllm` profile's (presets/engines.toml).
    - overhead_s + overhead_per_seq_s * B: the engine's CPU time per step (scheduling,
      input preparation, sampling) not hidden behind the GPU.
    - allreduce_latency_s 8 us per call at TP=2 (a custom NVLink all-reduce's small-message
      latency), times log2(N) at N GPUs (allreduce_rounds).
    - score_bytes: bytes per (query head, cached token, layer) that an unfused attention
      writes and reads for its scores; 0 for fused kernels (FlashAttention, paged attention).
    - roof_sharpness k = 2 of the soft maximum (inf = a hard max): of 1, 1.5, 2, 3 and inf,
      2 fits the H200 steps best (`bench/accuracy.py --fit-profiles`).
    - fp8_weight_stream, int4_weight_stream: weight streaming with those weights runs at
      this fraction of bf16's efficiency (the dequantizing GEMMs; fp8 fitted 0.753 on an
      H200 with torch._scaled_mm, int4 a stated guess): 8-bit weights do not halve the step time.
    - grouped: price the step per kernel group (cost model 2); False = one max over the
      step's totals (cost model 1, the seeds' arithmetic).
    - request_overhead_s: the server's fixed work per request outside the GPU steps (HTTP,
      tokenization, hand-off to the engine, the first token's detokenization and stream):
      a request becomes schedulable this long after it arrives, so it adds to TTFT and E2E
      but not to a step. 0 by default (a bare step harness has none); engine profiles set it.
    - moe_compute: the fused-MoE kernels' GEMM rate as a fraction of the dense GEMMs'
      (`compute`): few tokens per expert, small-M tiles padded to the block, weights
      dequantized in the kernel (MXFP4 on Hopper, FP8 block scales). 1: priced as dense
      GEMMs (the default; engine profiles fit it: docs/cost-model.md, "2026 models").
    - moe_layer_s: fixed time per MoE layer per step of the fused-MoE path's kernels
      (router, top-k, token alignment or permutation, the expert GEMMs' tails, un-permute and
      sum) that does not shrink with few tokens. 0 by default; engine profiles fit it.
    - eager_layer_s, graph_max_tokens: a step of more tokens than the engine's largest
      captured CUDA graph runs eagerly, each kernel launched from the CPU; such a step takes
      at least layers x eager_layer_s (the launches of one layer's kernels). 0: no floor.
    - scheduling_lag_steps: 1 when the engine schedules step k+1 while step k runs (vLLM
      V1's async scheduling, SGLang's overlap scheduler): a request that arrives during a
      step joins the step after next. 0: it joins the next step.
    """

    bandwidth: float = 0.80
    compute: float = 0.70
    overhead_s: float = 0.3e-3
    overhead_per_seq_s: float = 5e-6
    allreduce_latency_s: float = 8e-6
    kv_bandwidth: float = 0.93
    attention_compute: float = 0.21
    layer_s: float = 0.0
    decode_layer_s: float = 6e-6
    chunk_layer_s: float = 6e-6
    score_bytes: float = 0.0
    roof_sharpness: float = 2.0
    fp8_weight_stream: float = 0.75
    int4_weight_stream: float = 0.70
    grouped: bool = True
    request_overhead_s: float = 0.0
    scheduling_lag_steps: int = 0
    moe_compute: float = 1.0
    moe_layer_s: float = 0.0
    eager_layer_s: float = 0.0
    graph_max_tokens: float = 0.0

    def __post_init__(self) -> None:
        if self.scheduling_lag_steps not in (0, 1):
            raise BstarError("scheduling_lag_steps must be 0 or 1, got "
                             f"{self.scheduling_lag_steps}")
        for k in ("bandwidth", "compute", "kv_bandwidth", "attention_compute",
                  "fp8_weight_stream", "int4_weight_stream"):
            v = getattr(self, k)
            if not 0 < v <= 1:
                raise BstarError(f"{k} efficiency must be in (0, 1], got {v}")
        for k in ("overhead_s", "overhead_per_seq_s", "allreduce_latency_s", "layer_s",
                  "decode_layer_s", "chunk_layer_s", "score_bytes", "request_overhead_s"):
            if getattr(self, k) < 0:
                raise BstarError(f"{k} must not be negative")
        if not self.roof_sharpness >= 1:
            raise BstarError(f"roof_sharpness must be at least 1, got {self.roof_sharpness}")

    def weight_stream(self, weight: Precision) -> float:
        """Weight-streaming efficiency for weights of this precision (bstar.step)."""
        return weight_stream_fraction(weight.bits, self.bandwidth, self.fp8_weight_stream,
                                      self.int4_weight_stream)

    def kv_stream(self) -> float:
        """KV-streaming efficiency (cost model 1 had one bandwidth efficiency for both)."""
        return self.kv_bandwidth if self.grouped else self.bandwidth


# The seeds' arithmetic: datasheet rates, one hard max over the step, nothing else.
IDEAL = Efficiency(bandwidth=1.0, compute=1.0, overhead_s=0.0, overhead_per_seq_s=0.0,
                   allreduce_latency_s=0.0, kv_bandwidth=1.0, attention_compute=1.0,
                   layer_s=0.0, decode_layer_s=0.0, chunk_layer_s=0.0, score_bytes=0.0,
                   roof_sharpness=math.inf, fp8_weight_stream=1.0, int4_weight_stream=1.0,
                   grouped=False)


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
    block_size: int = 16  # vLLM's default KV block size
    eff: Efficiency = field(default_factory=Efficiency)
    engine: str = ""  # the engine profile the efficiencies started from (a label)

    def __post_init__(self) -> None:
        if self.num_gpus < 1:
            raise BstarError(f"--num-gpus must be at least 1, got {self.num_gpus}")
        if not 0 < self.gpu_util <= 1:
            raise BstarError(f"--gpu-util must be in (0, 1], got {self.gpu_util}")
        if self.reserve_bytes < 0:
            raise BstarError("reserve must not be negative")
        if self.block_size < 1:
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
