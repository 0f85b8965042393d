"""The parameters a calibration fits (cost model 2's, bstar.Efficiency, and the engine's
request overhead, bstar.deployment.EngineBehaviour): their names, what is fitted unless
told, the units they are fitted in and their bounds; and how a deployment takes fitted
values (`scaled`)."""

from __future__ import annotations

from dataclasses import fields, replace

from bstar.deployment import Deployment, Efficiency, EngineBehaviour

# The parameters: every field of Efficiency and EngineBehaviour but the model's shape
# (roof_sharpness, grouped) and the engine's structure (scheduling_lag_steps), which carry
# metadata saying so; in the records' order.
PARAMS = tuple(f.name for rec in (Efficiency, EngineBehaviour) for f in fields(rec)
               if not f.metadata)


def param_field(name: str) -> str:
    """The field a parameter name fits: the name itself, or FIELD of "FIELD@PATH", a kernel
    term fitted for one kernel path (bstar.validate_stages.fit_stages_by_path), which takes
    FIELD's unit and bounds."""
    return name.split("@", 1)[0]


def param_path(name: str) -> str | None:
    """The kernel path of a "FIELD@PATH" parameter name; None for a plain field."""
    return name.split("@", 1)[1] if "@" in name else None


# What `calibrate` fits unless told (--fit): the streams, the compute rate and the engine's
# CPU time. Chunk terms join when mixed (prefill + decode) points are given.
DEFAULT_FIT = ("bandwidth", "compute", "overhead_s", "overhead_per_seq_s")
# A parameter not fitted follows its lead's fit at the prior's ratio: one model's weight
# read is the same at every batch, so the weight stream and overhead_s trade off exactly;
# the KV stream's slope then sets both streams, as cost model 1's one efficiency did. Fit
# kv_bandwidth too (--fit) when the points span models of different weight sizes.
_FOLLOWS = {"kv_bandwidth": "bandwidth", "attention_compute": "compute"}
MIXED_FIT = ("attention_compute", "chunk_layer_s")
# Fitting happens in these units so that all parameters are O(0.01..1).
_SCALE = {"bandwidth": 1.0, "compute": 1.0, "overhead_s": 1e-3, "overhead_per_seq_s": 1e-6,
          "kv_bandwidth": 1.0, "attention_compute": 1.0, "layer_s": 1e-6,
          "decode_layer_s": 1e-6, "chunk_layer_s": 1e-6, "score_bytes": 1.0,
          "allreduce_latency_s": 1e-6, "fp8_weight_stream": 1.0, "int4_weight_stream": 1.0,
          "request_overhead_s": 1e-3, "moe_compute": 1.0, "moe_layer_s": 1e-6,
          "eager_layer_s": 1e-6, "graph_max_tokens": 1.0,
          "prompt_token_s": 1e-6, "front_token_s": 1e-6, "cold_start_s": 1.0}
_LOWER = {k: (1e-3 if _SCALE[k] == 1.0 and k != "score_bytes" else 0.0) for k in PARAMS}
# Bounds wide enough for Python schedulers of any age: up to 50 ms per step and 1 ms per
# running sequence; 1 ms per layer; 100 us per all-reduce.
_UPPER = {"bandwidth": 1.0, "compute": 1.0, "overhead_s": 50e-3, "overhead_per_seq_s": 1e-3,
          "kv_bandwidth": 1.0, "attention_compute": 1.0, "layer_s": 1e-3,
          "decode_layer_s": 1e-3, "chunk_layer_s": 1e-3, "score_bytes": 256.0,
          "allreduce_latency_s": 100e-6, "fp8_weight_stream": 1.0, "int4_weight_stream": 1.0,
          "request_overhead_s": 0.5, "moe_compute": 1.0, "moe_layer_s": 1e-3,
          "eager_layer_s": 1e-3, "graph_max_tokens": 1e6,
          "prompt_token_s": 1e-4, "front_token_s": 1e-4, "cold_start_s": 60.0}
# Efficiencies that may exceed 1 against a probed device (the excess becomes a GPU scale).
_BANDWIDTHS = ("bandwidth", "kv_bandwidth")
_COMPUTES = ("compute", "attention_compute")
# soft_l1 loss scale on log residuals: points off by more than ~5% weigh progressively less,
# so one stalled level (a prefill landing in the window, a noisy neighbour) cannot drag the fit.
ROBUST_SCALE = 0.05
# Against a probed device an engine may beat the figure: the probe's kernels are not the
# engine's, and caches serve part of a small model.
MAX_EFF_MEASURED = 2.0


def _eff_dict(e: Efficiency, b: EngineBehaviour | None = None) -> dict[str, float]:
    """Every parameter's value: from `e`, and from `b` (default: EngineBehaviour's
    defaults) for the engine's."""
    b = EngineBehaviour() if b is None else b
    return {k: float(getattr(e if hasattr(e, k) else b, k)) for k in PARAMS}


def scaled(d: Deployment, eff: Efficiency, bandwidth_scale: float = 1.0,
           compute_scale: float = 1.0) -> Deployment:
    """`d` with efficiencies `eff` and its GPU's bandwidth and matmul rates multiplied by the
    scales (an engine faster than a probed figure: efficiency > 1 split into eff 1 x scale)."""
    g = d.gpu
    if bandwidth_scale != 1.0 or compute_scale != 1.0:
        g = replace(g, hbm_bandwidth_bytes_s=g.hbm_bandwidth_bytes_s * bandwidth_scale,
                    bf16_flops=g.bf16_flops * compute_scale,
                    fp16_flops=g.fp16_flops * compute_scale,
                    fp8_flops=g.fp8_flops * compute_scale, int8_ops=g.int8_ops * compute_scale)
    return replace(d, gpu=g, eff=eff)
