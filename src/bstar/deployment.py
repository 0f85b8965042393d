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
import numbers
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


# The largest fixed time term (per step, layer, sequence, request or prompt token) an
# efficiency or a behaviour may carry: an engine's are milliseconds. A larger value
# (--overhead-ms 1e308, a profile's request_overhead_s = inf) would price every step or
# request at ~forever and still recommend a batch, or run a simulation to its time cap.
MAX_STEP_TERM_S = 10.0
_EFF = (0.0, 1.0, True)  # a fraction of a datasheet rate: (0, 1]
_TERM = (0.0, MAX_STEP_TERM_S, False)  # seconds: [0, 10]

# The one schema of Efficiency's and EngineBehaviour's fields: (lowest, highest, lowest
# excluded). Every value is a real number in its range; only roof_sharpness may be inf (a
# hard max, IDEAL's). Both records check themselves by it, so a flag, an engine profile and
# a calibration profile are held to the same ranges, and the profile reader adds its file.
FIELD_RANGES: dict[str, tuple[float, float, bool]] = {
    "bandwidth": _EFF, "compute": _EFF, "kv_bandwidth": _EFF, "attention_compute": _EFF,
    "fp8_weight_stream": _EFF, "int4_weight_stream": _EFF, "moe_compute": _EFF,
    "overhead_s": _TERM, "overhead_per_seq_s": _TERM, "allreduce_latency_s": _TERM,
    "layer_s": _TERM, "decode_layer_s": _TERM, "chunk_layer_s": _TERM,
    "prompt_token_s": _TERM, "moe_layer_s": _TERM, "eager_layer_s": _TERM,
    "request_overhead_s": _TERM, "front_token_s": _TERM,
    "cold_start_s": (0.0, 600.0, False),  # seconds, once a run
    "score_bytes": (0.0, 1024.0, False),  # bytes per attention score (2-4 in practice)
    "graph_max_tokens": (0.0, 1e9, False),  # tokens
    "roof_sharpness": (1.0, math.inf, False),
    "scheduling_lag_steps": (0, 1, False),
}


def check_fields(record: Any) -> None:
    """`record`'s fields against FIELD_RANGES: one line naming the field and its range."""
    for f in fields(record):
        rng = FIELD_RANGES.get(f.name)
        if rng is None:
            continue
        v, (lo, hi, open_lo) = getattr(record, f.name), rng
        ok = (not isinstance(v, bool) and isinstance(v, numbers.Real)
              and (math.isfinite(v) or (f.name == "roof_sharpness" and v == math.inf))
              and (lo < v if open_lo else lo <= v) and v <= hi)
        if f.name == "scheduling_lag_steps":
            ok = ok and v in (0, 1)
        if not ok:
            span = ("0 or 1" if f.name == "scheduling_lag_steps" else
                    f"a number in {'(' if open_lo else '['}{lo:g}, {hi:g}]")
            what = f"{f.name} efficiency" if rng is _EFF else f.name
            raise BstarError(f"{what} must be {span}, got {v!r}")


# Efficiency.graph_max_tokens when no step runs in a captured graph (vLLM --enforce-eager,
# SGLang --disable-cuda-graph, a runs table's cuda_graph_mode none): every step of a token
# or more is past it, and pays the eager floor (bstar.step).
NO_GRAPHS = 0.5


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
        check_fields(self)

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
    - cold_start_s: how long a server that has just started keeps its first requests waiting
      before its first step (kernels compiled or tuned for each new shape on first use, as
      ROCm's Triton and AITER kernels are): paid once, by a benchmark that sends its load
      with no warm-up. Only `bstar validate` simulates it (`SimConfig.cold_start_s`, for
      runs measured from a cold start); plan, simulate and search predict a warm server.
      0 by default.
    """

    request_overhead_s: float = 0.0
    front_token_s: float = 0.0
    scheduling_lag_steps: int = field(default=0, metadata={"structure": True})
    cold_start_s: float = 0.0

    def __post_init__(self) -> None:
        check_fields(self)


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


# The step terms that belong to a kernel path: the fused-MoE kernels of one weight precision
# on one architecture (Hopper dequantizing MXFP4 in Marlin/Triton, Blackwell's native FP4,
# FP8 block-scaled GEMMs, AITER on CDNA). Fitted on one path they never price another: a
# deployment on another path gets Efficiency's generic values for them (docs/cost-model.md,
# "Kernel paths"). The stream of 4-bit weights is one of them: a dequantizing kernel
# (Marlin, Triton) converts every weight in its main loop, a native one feeds the packed
# format to the tensor cores. So is the stream of 8-bit weights: the 0.75 default is
# torch._scaled_mm's on the repo's H200 harness, where SGLang's FP8 block-scaled kernels
# fit 0.83-0.84 on H200 and MI300X (docs/transfer.md, "The FP8 weights' stream").
KERNEL_FIELDS = ("moe_compute", "moe_layer_s", "int4_weight_stream", "fp8_weight_stream")


# A `Deployment.kernel_terms_path` no deployment takes: efficiencies whose kernel terms were
# fitted on no path (a fit that left them generic). Every deployment then prices its own
# path's generic ones (`generic_kernel_terms`).
GENERIC_PATH = "generic"


def generic_kernel_terms(path: str) -> dict[str, float]:
    """The KERNEL_FIELDS a deployment on kernel path `path` gets where no entry was fitted
    on it: Efficiency's generic values, except that a native FP4 path ("ARCH:fp4-native")
    streams its packed weights at the 16-bit weights' rate (int4_weight_stream 1: the tensor
    cores read MXFP4/NVFP4 and its scales as they are, with no conversion to run; the 0.70
    default is a guess for the dequantizing kernels). Structural, not fitted: the 56 B200
    gpt-oss runs, fitted with the stream free, put it at its bound of 1
    (docs/cost-model.md, "Kernel paths")."""
    generic = Efficiency()
    out = {k: float(getattr(generic, k)) for k in KERNEL_FIELDS}
    if path.endswith(":fp4-native"):
        out["int4_weight_stream"] = 1.0
    return out


def fitted_kernel_fields(path: str) -> tuple[str, ...]:
    """The KERNEL_FIELDS a fit of kernel path `path`'s rows determines: the 4-bit weights'
    stream only on a dequantizing 4-bit path (structural on a native FP4 one,
    `generic_kernel_terms`; unused with 8- or 16-bit weights), the 8-bit weights' stream
    only on an 8-bit path (FP8 or INT8, native or converted)."""
    dequant4 = path.endswith((":fp4-dequant", ":int4-dequant"))
    eight = path.endswith((":fp8-native", ":fp8-dequant", ":int8-native", ":int8-dequant"))
    return tuple(k for k in KERNEL_FIELDS
                 if (k != "int4_weight_stream" or dequant4)
                 and (k != "fp8_weight_stream" or eight))


def kernel_path(gpu: GpuSpec, weight: Precision) -> str:
    """The kernel path a model's linears take on `gpu`: "ARCH:FAMILY-native" where the
    GPU's tensor cores run the weights' format (the catalog's `native_precisions`),
    "ARCH:FAMILY-dequant" where kernels convert it first (MXFP4 on Hopper or CDNA3), and
    "ARCH:bf16" for 16- and 32-bit weights; ARCH is the catalog's `arch` ("unknown" for a GPU
    file without one)."""
    arch = gpu.arch or "unknown"
    if weight.bits >= 16:
        return f"{arch}:bf16"
    if weight.name in ("mxfp4", "nvfp4"):
        family, native = "fp4", weight.name in gpu.native_precisions
    elif weight.compute in ("fp8", "int8"):
        family, native = weight.compute, weight.compute in gpu.native_precisions
    else:  # weight-only integer formats: dequantized to the 16-bit compute dtype
        family, native = f"int{weight.bits}", False
    return f"{arch}:{family}-{'native' if native else 'dequant'}"


def expert_compute(gpu: GpuSpec, weight: Precision) -> str:
    """The tensor rate the routed experts' GEMMs run at: FP8 where the GPU runs the
    experts' FP4 format natively (vLLM's MXFP4 x MXFP8 kernels on Blackwell: a mixed FP8 x
    FP4 MMA runs at the FP8 rate; a W4A4 NVFP4 kernel's FP4 rate, twice that, is not
    assumed), else the weights' compute dtype. Physics of the catalog, not a fitted term."""
    if kernel_path(gpu, weight).endswith(":fp4-native") and gpu.fp8_flops:
        return "fp8"
    return weight.compute


@dataclass(frozen=True, slots=True)
class Deployment:
    """One model on `num_gpus` GPUs (tensor parallel) with its serving memory settings.

    Parallel layout inside those GPUs (issue 38; docs/cost-model.md, "Expert and attention
    data parallel"):
    - `expert_parallel` (EP): the routed experts are split over EP groups of GPUs, each GPU
      holding whole experts of its group (num_gpus / EP GPUs shard each expert); 1: every
      expert tensor parallel over all GPUs. Each GPU reads only its own experts, and a
      step waits for the rank the router sent the most (bstar.step's expected maximum).
    - `data_parallel` (attention DP): attention runs in `data_parallel` ranks of num_gpus /
      data_parallel GPUs each; a rank runs its own sequences' attention, holds their KV and a
      full copy of the non-expert weights over its GPUs. With DP > 1 the MoE layers exchange
      tokens between ranks (an all-to-all dispatch and combine under EP, else an all-gather
      and a reduce-scatter).
    """

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
    # The kernel path `eff`'s KERNEL_FIELDS were fitted on ("": any, e.g. a calibration on
    # this very GPU). On another path they are replaced by Efficiency's generic values.
    kernel_terms_path: str = ""
    expert_parallel: int = 1
    data_parallel: int = 1

    def __post_init__(self) -> None:
        if self.num_gpus < 1:
            raise BstarError(f"--num-gpus must be at least 1, got {self.num_gpus}")
        for name, v in (("--expert-parallel-size", self.expert_parallel),
                        ("--data-parallel-size", self.data_parallel)):
            if v < 1 or self.num_gpus % v:
                raise BstarError(f"{name} {v} must divide the {self.num_gpus} GPUs")
        if self.expert_parallel > 1 and self.model.is_moe \
                and self.model.num_experts % self.expert_parallel:
            raise BstarError(f"--expert-parallel-size {self.expert_parallel} does not divide "
                             f"the model's {self.model.num_experts} experts")
        if not 0 < self.gpu_util <= 1:
            raise BstarError(f"--gpu-util must be in (0, 1], got {self.gpu_util}")
        if self.reserve_bytes < 0:
            raise BstarError("reserve must not be negative")
        if self.block_size < 1:
            raise BstarError("block size must be at least 1 token")
        get_precision(self.weight_dtype or self.model.default_dtype,
                      allowed=(*WEIGHT_DTYPES, "fp8-block", "fp32"))
        get_precision(self.kv_dtype, allowed=KV_DTYPES)
        if not self.kernel_terms_priced:
            generic = generic_kernel_terms(self.kernel_path)
            reset = {k: v for k, v in generic.items() if getattr(self.eff, k) != v}
            if reset:  # a frozen record: set once, here, as it is made
                object.__setattr__(self, "eff", replace(self.eff, **reset))

    @property
    def attention_tp(self) -> int:
        """GPUs each attention data-parallel rank shards its attention over."""
        return self.num_gpus // self.data_parallel

    @property
    def kernel_path(self) -> str:
        """The kernel path this deployment's linears take (`kernel_path`)."""
        return kernel_path(self.gpu, self.weight)

    @property
    def kernel_terms_priced(self) -> bool:
        """Whether `eff`'s kernel terms are the ones fitted on this deployment's path."""
        return not self.kernel_terms_path or self.kernel_terms_path == self.kernel_path

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
