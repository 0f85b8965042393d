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
docs/cost-model.md ("Efficiency's fields").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from bstar.engine_defaults import BLOCK_SIZE, GPU_MEMORY_UTILIZATION
from bstar.engine_defaults import DEFAULT_RESERVE_GIB as DEFAULT_RESERVE_GIB  # its home
from bstar.errors import BstarError
from bstar.specs.gpu import GpuSpec
from bstar.specs.model import ModelSpec
from bstar.specs.precision import KV_DTYPES, WEIGHT_DTYPES, Precision, get_precision
from bstar.units import GiB

DEFAULT_MODEL = "llama-3-8b"
DEFAULT_GPU = "a100-80gb-sxm"

def weight_stream_fraction(weight_bits: int, bandwidth: float, fp8_weight_stream: float,
                           int4_weight_stream: float) -> float:
    """Weight-streaming efficiency for weights of `weight_bits`: the bandwidth efficiency,
    times the dequantizing GEMMs' fraction for 8- and 4-bit weights."""
    if weight_bits <= 4:
        return bandwidth * int4_weight_stream
    if weight_bits <= 8:
        return bandwidth * fp8_weight_stream
    return bandwidth


# The largest fixed time term (per step, layer, sequence or request) an efficiency may carry.
MAX_STEP_TERM_S = 10.0


@dataclass(frozen=True, slots=True)
class Efficiency:
    """How far a real engine falls short of the datasheet: the cost model's efficiencies and
    fixed costs per step (bstar.step prices a step with them). Stated defaults (the GPU-side
    ones fitted to real H200 steps, the engine-side ones a generic prior), replaced by an
    engine profile (`--engine`, bstar/presets/engines.toml) or by calibration
    (`bstar calibrate`). Each field's meaning and provenance: docs/cost-model.md
    ("Efficiency's fields").

    `roof_sharpness` and `grouped` are the shape of the model (metadata `shape`), not fitted
    parameters.
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
    roof_sharpness: float = field(default=2.0, metadata={"shape": True})
    fp8_weight_stream: float = 0.75
    int4_weight_stream: float = 0.70
    grouped: bool = field(default=True, metadata={"shape": True})
    moe_compute: float = 1.0
    moe_layer_s: float = 0.0
    eager_layer_s: float = 0.0
    graph_max_tokens: float = 0.0
    prompt_token_s: float = 0.0

    def __post_init__(self) -> None:
        for k in ("bandwidth", "compute", "kv_bandwidth", "attention_compute",
                  "fp8_weight_stream", "int4_weight_stream"):
            v = getattr(self, k)
            if not 0 < v <= 1:
                raise BstarError(f"{k} efficiency must be in (0, 1], got {v}")
        for k in ("overhead_s", "overhead_per_seq_s", "allreduce_latency_s", "layer_s",
                  "decode_layer_s", "chunk_layer_s", "score_bytes", "prompt_token_s"):
            if getattr(self, k) < 0:
                raise BstarError(f"{k} must not be negative")
            # Seconds of one step (or one request): an engine's are milliseconds. A larger
            # value (--overhead-ms 1e308) would price every step at ~forever and still
            # recommend a batch.
            if k.endswith("_s") and not getattr(self, k) <= MAX_STEP_TERM_S:
                raise BstarError(f"{k} must be at most {MAX_STEP_TERM_S:g} s, got "
                                 f"{getattr(self, k)!r}")
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
class EngineBehaviour:
    """What the server does outside a step; the simulator reads it (sim/engine.py).

    - request_overhead_s: the server's fixed work per request outside the GPU steps (HTTP,
      tokenization, hand-off to the engine, the first token's detokenization and stream):
      a request becomes schedulable this long after it arrives, so it adds to TTFT and E2E
      but not to a step. 0 by default (a bare step harness has none); engine profiles set
      it and calibration against load stages fits it. Requests do this work side by side.
    - front_token_s: the server's front-end work per prompt token on one thread (vLLM's API
      server tokenizes on a single-thread executor): requests take it first come, first
      served, before request_overhead_s, so a burst of long prompts queues there, not in
      the engine. It adds to TTFT and E2E, not to a step. 0 by default (no such queue).
    - scheduling_lag_steps: 1 when the engine schedules step k+1 while step k runs (vLLM
      V1's async scheduling, SGLang's overlap scheduler): a request that arrives during a
      step joins the step after next. 0: it joins the next step. The engine's structure
      (metadata `structure`), not a fitted parameter.
    """

    request_overhead_s: float = 0.0
    front_token_s: float = 0.0
    scheduling_lag_steps: int = field(default=0, metadata={"structure": True})

    def __post_init__(self) -> None:
        if self.scheduling_lag_steps not in (0, 1):
            raise BstarError("scheduling_lag_steps must be 0 or 1, got "
                             f"{self.scheduling_lag_steps}")
        if self.request_overhead_s < 0:
            raise BstarError("request_overhead_s must not be negative")
        if not self.front_token_s >= 0:
            raise BstarError("front_token_s must not be negative")


# Every field name of the two records (one source: dataclasses.fields).
EFFICIENCY_FIELDS = tuple(f.name for f in fields(Efficiency))
BEHAVIOUR_FIELDS = tuple(f.name for f in fields(EngineBehaviour))


def split_values(values: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """`values` (field names of either record) split into Efficiency's and
    EngineBehaviour's; an unknown name raises BstarError."""
    unknown = set(values) - {*EFFICIENCY_FIELDS, *BEHAVIOUR_FIELDS}
    if unknown:
        raise BstarError(f"unknown field(s) {', '.join(sorted(unknown))}")
    return ({k: v for k, v in values.items() if k in EFFICIENCY_FIELDS},
            {k: v for k, v in values.items() if k in BEHAVIOUR_FIELDS})


@dataclass(frozen=True, slots=True)
class Deployment:
    """One model on `num_gpus` GPUs (tensor parallel) with its serving memory settings."""

    model: ModelSpec
    gpu: GpuSpec
    num_gpus: int = 1
    weight_dtype: str = ""  # "" = the checkpoint's own (config torch_dtype / quantization)
    kv_dtype: str = "bf16"
    gpu_util: float = GPU_MEMORY_UTILIZATION  # vLLM's default (bstar.engine_defaults)
    # Activations, CUDA graphs, CUDA context and NCCL buffers, per GPU; vLLM profiles these
    # at start-up. DEFAULT_RESERVE_GIB is a rough figure for 7-70B models at default settings.
    reserve_bytes: int = round(DEFAULT_RESERVE_GIB * GiB)
    block_size: int = BLOCK_SIZE  # vLLM's default KV block size (bstar.engine_defaults)
    eff: Efficiency = field(default_factory=Efficiency)
    engine: str = ""  # the engine profile the efficiencies started from (a label)
    behaviour: EngineBehaviour = field(default_factory=EngineBehaviour)

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

    def with_behaviour(self, behaviour: EngineBehaviour) -> Deployment:
        return replace(self, behaviour=behaviour)

    def with_values(self, values: Mapping[str, Any]) -> Deployment:
        """This deployment with `values` (field names of Efficiency or EngineBehaviour),
        each set on the record that holds it; the fields not named keep their values."""
        e, b = split_values(values)
        return replace(self, eff=replace(self.eff, **e) if e else self.eff,
                       behaviour=replace(self.behaviour, **b) if b else self.behaviour)
