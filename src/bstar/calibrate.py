"""Calibrate the cost model to measured decode steps: efficiencies and per-step overhead.

The roofline (bstar.roofline) predicts a decode step at batch B and context s as

    step_s = max(bytes(B, s) / (BW * eta_bw), flops(B, s) / (peak * eta_fl))
             + comm_s(B) + overhead_s + overhead_per_seq_s * B

Bytes, FLOPs and communication are exact for a given model and deployment; what a real
engine on real hardware adds is captured by four numbers: eta_bw, eta_fl, overhead_s and
overhead_per_seq_s. This module fits them to measured (B, s, step time) points by robust
nonlinear least squares on the log of the step time (relative errors: a 10% miss at batch
1 counts as much as at batch 64), within bounds (overheads >= 0; efficiencies in (0, 1]
against a datasheet GPU, up to MAX_EFF_MEASURED against a probed one, the excess filed as
a scale on the GPU's figures), and reports each parameter's 1-sigma uncertainty and every
point's residual.

Identifiability, stated rather than hidden: a parameter whose term never sets any point's
step time (eta_fl when every point is memory-bound) has a zero column in the Jacobian; it
is reported as not identified and takes the value nearest its prior that fits; parameters
in an exact trade-off (a null direction of the Jacobian) are reported as tied. Compute
efficiency and the per-sequence overhead are both linear in B and separate only through
the kink of the max (and through context length or model size); their correlation is
reported.

Pure: no I/O here beyond `load_profile` (a small TOML reader, the mirror of `profile_toml`).
"""

from __future__ import annotations

import json
import math
import re
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from bstar import roofline as rl
from bstar import step as st
from bstar.errors import BstarError

# Cost model 2's parameters (bstar.roofline.Efficiency), in fitting order.
PARAMS = ("bandwidth", "compute", "overhead_s", "overhead_per_seq_s", "kv_bandwidth",
          "attention_compute", "layer_s", "decode_layer_s", "chunk_layer_s", "score_bytes",
          "allreduce_latency_s", "fp8_weight_stream", "int4_weight_stream",
          "request_overhead_s")
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
          "request_overhead_s": 1e-3}
_LOWER = {k: (1e-3 if _SCALE[k] == 1.0 and k != "score_bytes" else 0.0) for k in PARAMS}
# Bounds wide enough for Python schedulers of any age: up to 50 ms per step and 1 ms per
# running sequence; 1 ms per layer; 100 us per all-reduce.
_UPPER = {"bandwidth": 1.0, "compute": 1.0, "overhead_s": 50e-3, "overhead_per_seq_s": 1e-3,
          "kv_bandwidth": 1.0, "attention_compute": 1.0, "layer_s": 1e-3,
          "decode_layer_s": 1e-3, "chunk_layer_s": 1e-3, "score_bytes": 256.0,
          "allreduce_latency_s": 100e-6, "fp8_weight_stream": 1.0, "int4_weight_stream": 1.0,
          "request_overhead_s": 0.5}
# Efficiencies that may exceed 1 against a probed device (the excess becomes a GPU scale).
_BANDWIDTHS = ("bandwidth", "kv_bandwidth")
_COMPUTES = ("compute", "attention_compute")
# soft_l1 loss scale on log residuals: points off by more than ~5% weigh progressively less,
# so one stalled level (a prefill landing in the window, a noisy neighbour) cannot drag the fit.
ROBUST_SCALE = 0.05
# Against a probed device an engine may beat the figure: the probe's kernels are not the
# engine's, and caches serve part of a small model.
MAX_EFF_MEASURED = 2.0


@dataclass(frozen=True, slots=True)
class Point:
    """One measured step: `batch` sequences decoding together, each holding about
    `context_tokens` of KV, plus (a mixed step) one prompt chunk of `chunk_tokens` new tokens
    on top of `chunk_start` cached ones; one step takes `step_s` (= per-request TPOT/ITL)."""

    batch: int
    context_tokens: int
    step_s: float
    label: str = ""
    chunk_tokens: int = 0
    chunk_start: int = 0

    def __post_init__(self) -> None:
        where = f"point {self.label or ''}"
        if self.chunk_tokens < 0 or self.chunk_start < 0:
            raise BstarError(f"{where}: chunk_tokens and chunk_start must not be negative")
        if self.batch < (0 if self.chunk_tokens else 1):
            raise BstarError(f"{where}: batch must be at least 1, got {self.batch}")
        if self.context_tokens < 1:
            raise BstarError(f"{where}: context_tokens must be at least 1")
        if not (self.step_s > 0 and math.isfinite(self.step_s)):
            raise BstarError(f"{where}: step time must be a positive number, "
                             f"got {self.step_s}")

    @property
    def mixed(self) -> bool:
        return self.chunk_tokens > 0

    def scheduled(self) -> tuple[np.ndarray, np.ndarray]:
        """(start, new) tokens of every scheduled sequence, as the simulator prices them."""
        start = [self.context_tokens - 1] * self.batch
        new = [1] * self.batch
        if self.chunk_tokens:
            start.append(self.chunk_start)
            new.append(self.chunk_tokens)
        return np.array(start, dtype=np.int64), np.array(new, dtype=np.int64)


def points_from_fit(points: Any, context_tokens: int) -> list[Point]:
    """Calibration points from `bstar fit`'s validated Points (bstar.fit.Points) measured
    at one context length. fit's tpot_ms is the per-request step time (it derives it as
    batch / throughput when only throughput was given)."""
    if context_tokens < 1:
        raise BstarError("context_tokens must be at least 1")
    return [Point(int(b), context_tokens, float(t) / 1e3, f"{points.source} batch {b}")
            for b, t in zip(points.batch, points.tpot_ms, strict=True)]


# ---- the model as a function of its parameters ----------------------------------------------
# The step's price is bstar.step.price (the one price of a step, which the plan, the
# simulator and validation use too); here it is evaluated at trial parameters. What the
# points do (StepWork) is built once per fit and does not depend on the parameters.
# Efficiency 1 everywhere, no fixed costs: the starting point's scale.
_UNIT = rl.Efficiency(bandwidth=1.0, compute=1.0, overhead_s=0.0, overhead_per_seq_s=0.0,
                      allreduce_latency_s=0.0, kv_bandwidth=1.0, attention_compute=1.0,
                      layer_s=0.0, decode_layer_s=0.0, chunk_layer_s=0.0, score_bytes=1.0,
                      roof_sharpness=math.inf, fp8_weight_stream=1.0, int4_weight_stream=1.0)


def _terms(d: rl.Deployment, points: Sequence[Point]) -> st.StepWork:
    sh = st.shape(d)
    return st.concat([sh.scheduled(*p.scheduled()) for p in points])


def _with_shape(d: rl.Deployment, v: Mapping[str, float]) -> dict[str, Any]:
    return {"grouped": d.eff.grouped, "roof_sharpness": d.eff.roof_sharpness, **v}


def _bound(t: st.StepWork, v: Mapping[str, Any]) -> np.ndarray:
    """Which resource sets most of each step: "compute" where the groups' compute times sum
    past their memory times, else "memory"."""
    parts = st.price_parts(t, v)
    return np.where(parts.compute_s > parts.memory_s, "compute", "memory")


def predict_step_s(d: rl.Deployment, points: Sequence[Point]) -> np.ndarray:
    """The deployment's predicted step time at each point (its own efficiencies)."""
    return st.price(_terms(d, points), d.eff)


# ---- results ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ParamFit:
    name: str
    value: float
    std: float | None  # 1 sigma; None unless status is "fitted"
    # "fitted"; "fixed" (not asked for); "follows X" (moves with X at the prior's ratio);
    # "unset" (its term sets no step time), "tied" (in an
    # exact trade-off with other parameters), "at-bound": not identified by the points.
    status: str
    prior: float

    @property
    def fitted(self) -> bool:
        return self.status != "fixed" and not self.status.startswith("follows")

    @property
    def identified(self) -> bool:
        return self.status == "fitted"


@dataclass(frozen=True, slots=True)
class PointFit:
    batch: int
    context_tokens: int
    measured_ms: float
    predicted_ms: float
    uncalibrated_ms: float
    bound: str  # "memory" or "compute": which roof sets the calibrated step
    label: str = ""
    chunk_tokens: int = 0  # a mixed step's prompt chunk (Point.chunk_tokens), 0 = decode
    chunk_start: int = 0

    @property
    def rel_error(self) -> float:
        return self.predicted_ms / self.measured_ms - 1.0

    @property
    def uncalibrated_rel_error(self) -> float:
        return self.uncalibrated_ms / self.measured_ms - 1.0


@dataclass(frozen=True, slots=True)
class Calibration:
    eff: rl.Efficiency
    params: dict[str, ParamFit]
    points: tuple[PointFit, ...]
    correlation: dict[str, float]  # "a/b" -> correlation of two fitted parameters
    model: str
    gpu: str
    weight_dtype: str
    kv_dtype: str
    num_gpus: int
    engine: str = ""
    engine_version: str = ""
    source: str = ""
    reserve_bytes: int | None = None  # from a vLLM log, when given
    kv_pool_bytes: int | None = None
    notes: tuple[str, ...] = ()
    # How far the engine beats the device figures (efficiency > 1, allowed against a
    # probed device only): the profile scales the GPU's bandwidth / FLOP/s by these.
    bandwidth_scale: float = 1.0
    compute_scale: float = 1.0

    def apply(self, d: rl.Deployment) -> rl.Deployment:
        return scaled(d, self.eff, self.bandwidth_scale, self.compute_scale)

    @property
    def median_abs_error(self) -> float:
        return float(np.median([abs(p.rel_error) for p in self.points]))

    @property
    def max_abs_error(self) -> float:
        return float(max(abs(p.rel_error) for p in self.points))

    @property
    def uncalibrated_median_abs_error(self) -> float:
        return float(np.median([abs(p.uncalibrated_rel_error) for p in self.points]))

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "gpu": self.gpu, "num_gpus": self.num_gpus,
            "weight_dtype": self.weight_dtype, "kv_dtype": self.kv_dtype,
            "engine": self.engine, "engine_version": self.engine_version,
            "source": self.source,
            "efficiency": _eff_dict(self.eff),
            "gpu_scale": {"bandwidth": self.bandwidth_scale, "compute": self.compute_scale},
            "params": {k: {"value": p.value, "std": p.std, "status": p.status,
                           "prior": p.prior} for k, p in self.params.items()},
            "correlation": self.correlation,
            "median_abs_error": self.median_abs_error,
            "max_abs_error": self.max_abs_error,
            "uncalibrated_median_abs_error": self.uncalibrated_median_abs_error,
            "reserve_bytes": self.reserve_bytes, "kv_pool_bytes": self.kv_pool_bytes,
            "points": [{"batch": p.batch, "context_tokens": p.context_tokens,
                        "measured_ms": p.measured_ms, "predicted_ms": p.predicted_ms,
                        "rel_error": p.rel_error, "uncalibrated_ms": p.uncalibrated_ms,
                        "uncalibrated_rel_error": p.uncalibrated_rel_error,
                        "bound": p.bound, "chunk_tokens": p.chunk_tokens,
                        "chunk_start": p.chunk_start} for p in self.points],
            "notes": list(self.notes),
        }


def _eff_dict(e: rl.Efficiency) -> dict[str, float]:
    return {k: float(getattr(e, k)) for k in PARAMS}


# ---- the fit ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class EfficiencyFit:
    """The outcome of fitting efficiencies to any measured quantity the model predicts."""

    eff: rl.Efficiency
    params: dict[str, ParamFit]
    correlation: dict[str, float]
    tied: tuple[str, ...]
    bandwidth_scale: float = 1.0
    compute_scale: float = 1.0


def scaled(d: rl.Deployment, eff: rl.Efficiency, bandwidth_scale: float = 1.0,
           compute_scale: float = 1.0) -> rl.Deployment:
    """`d` with efficiencies `eff` and its GPU's bandwidth and matmul rates multiplied by the
    scales (an engine faster than a probed figure: efficiency > 1 split into eff 1 x scale)."""
    g = d.gpu
    if bandwidth_scale != 1.0 or compute_scale != 1.0:
        g = replace(g, hbm_bandwidth_bytes_s=g.hbm_bandwidth_bytes_s * bandwidth_scale,
                    bf16_flops=g.bf16_flops * compute_scale,
                    fp16_flops=g.fp16_flops * compute_scale,
                    fp8_flops=g.fp8_flops * compute_scale, int8_ops=g.int8_ops * compute_scale)
    return replace(d, gpu=g, eff=eff)


def fit_efficiency(predict: Callable[[Mapping[str, float]], np.ndarray],
                   measured: Sequence[float], prior: rl.Efficiency,
                   fit: Sequence[str] = DEFAULT_FIT,
                   starts: Sequence[Mapping[str, float]] = (),
                   max_efficiency: float = 1.0) -> EfficiencyFit:
    """Fit the parameters named in `fit` so that `predict(values)` (a positive array aligned
    with `measured`, values = every one of PARAMS) matches `measured` in log space, robustly,
    within bounds; the others stay at `prior`. Used for decode steps (`calibrate`) and for
    any other predicted metric (`bstar validate`)."""
    from scipy.optimize import least_squares

    fit = tuple(dict.fromkeys(fit))
    bad = [k for k in fit if k not in PARAMS]
    if bad:
        raise BstarError(f"cannot fit {', '.join(bad)} (fit any of: {', '.join(PARAMS)})")
    if not fit:
        raise BstarError("nothing to fit")
    if len(measured) < len(fit):
        raise BstarError(f"{len(measured)} point(s) cannot determine {len(fit)} parameters "
                         f"({', '.join(fit)}); measure more batch sizes or fit fewer")
    log_measured = np.log(np.asarray(measured, dtype=np.float64))
    base = _eff_dict(prior)

    follow = {k: lead for k, lead in _FOLLOWS.items() if lead in fit and k not in fit}

    def values(x: np.ndarray) -> dict[str, float]:
        v = {k: base[k] for k in PARAMS}
        for k, xi in zip(fit, x, strict=True):
            v[k] = float(xi) * _SCALE[k]
        for k, lead in follow.items():  # keep the prior's ratio to the fitted lead
            v[k] = min(base[k] * v[lead] / base[lead], max_efficiency)
        return v

    def residuals(x: np.ndarray) -> np.ndarray:
        return np.log(predict(values(x))) - log_measured

    lo = np.array([_LOWER[k] / _SCALE[k] for k in fit])
    upper = {**_UPPER, **dict.fromkeys((*_BANDWIDTHS, *_COMPUTES), max_efficiency)}
    hi = np.array([upper[k] / _SCALE[k] for k in fit])
    best = None
    # The max() makes the problem piecewise smooth: start from a few corners and keep the
    # best, so the result does not depend on which roof the prior happened to favour.
    corners = [{"bandwidth": bw, "kv_bandwidth": bw, "compute": fl}
               for bw, fl in ((1.0, 1.0), (0.5, 0.5), (1.0, 0.2), (0.2, 1.0), (0.2, 0.2))]
    for start in [base, *starts, *({**base, **c} for c in corners)]:
        x0 = np.clip(np.array([start.get(k, base[k]) / _SCALE[k] for k in fit]), lo + 1e-9,
                     np.where(np.isfinite(hi), hi - 1e-9, np.inf))
        r = least_squares(residuals, x0, bounds=(lo, hi), loss="soft_l1",
                          f_scale=ROBUST_SCALE, x_scale="jac", max_nfev=2000)
        if best is None or r.cost < best.cost:
            best = r
    assert best is not None
    x = best.x.copy()
    jac = np.asarray(best.jac, dtype=np.float64)
    col = np.linalg.norm(jac, axis=0)
    unset = col <= 1e-9 * max(1.0, float(col.max(initial=0.0)))
    # A parameter whose term sets no step time is free over a range; report the value in
    # that range closest to the prior (the prior itself when it fits as well), so an
    # unmeasured roof does not come back as whatever corner the optimiser started from.
    def same_fit(trial: np.ndarray) -> bool:
        return 0.5 * float(np.sum(_soft_l1(residuals(trial)))) <= best.cost * (1 + 1e-9) + 1e-15

    for i in np.flatnonzero(unset):
        trial = x.copy()
        trial[i] = base[fit[i]] / _SCALE[fit[i]]
        if same_fit(trial):
            x = trial
            continue
        inside, outside = float(x[i]), float(trial[i])  # bisect towards the prior
        for _ in range(50):
            mid = 0.5 * (inside + outside)
            trial[i] = mid
            if same_fit(trial):
                inside = mid
            else:
                outside = mid
        x[i] = inside
    v = values(x)
    params, corr, tied = _uncertainty(fit, x, jac, np.asarray(best.fun), unset, v, base,
                                      lo, hi)
    for k, lead in follow.items():
        params[k] = ParamFit(k, v[k], None, f"follows {lead}", base[k])
    # Against a probed device an efficiency may pass 1: the excess becomes a scale on the
    # GPU's figure, shared by the efficiencies of that resource.
    bw_scale = max(1.0, *(v[k] for k in _BANDWIDTHS))
    fl_scale = max(1.0, *(v[k] for k in _COMPUTES))
    scaled_v = {k: v[k] / (bw_scale if k in _BANDWIDTHS else fl_scale if k in _COMPUTES
                           else 1.0) for k in PARAMS}
    eff = replace(prior, **scaled_v)
    return EfficiencyFit(eff, params, corr, tuple(tied), bw_scale, fl_scale)


def fit_steps(groups: Sequence[tuple[rl.Deployment, Sequence[Point]]],
              fit: Sequence[str], prior: rl.Efficiency | None = None) -> EfficiencyFit:
    """One set of parameters for measured steps of several deployments (models, precisions)
    on one GPU x engine: what separates the weight stream from the KV stream and the fixed
    costs, which one model's points cannot (its weight read never changes). Each group's
    deployment supplies the model; `prior` (default: the first group's) the values not fitted."""
    if not groups:
        raise BstarError("no points to calibrate on")
    prior = prior or groups[0][0].eff
    shapes = [_unique_shapes(pts) for _, pts in groups]
    terms = [_terms(d.with_eff(prior), u) for (d, _), (u, _) in zip(groups, shapes,
                                                                      strict=True)]
    measured = np.concatenate([[p.step_s for p in pts] for _, pts in groups])
    cap = 1.0 if groups[0][0].gpu.provenance == "datasheet" else MAX_EFF_MEASURED
    shaped = [(t, d.with_eff(prior), inv) for t, (d, _), (_, inv)
              in zip(terms, groups, shapes, strict=True)]
    return fit_efficiency(lambda v: np.concatenate([st.price(t, _with_shape(d, v))[inv]
                                                    for t, d, inv in shaped]),
                          measured, prior, fit, max_efficiency=cap)


def _unique_shapes(points: Sequence[Point]) -> tuple[list[Point], np.ndarray]:
    """The distinct step shapes among `points` (batch, context, chunk) and, per point, the
    index of its shape: the step arithmetic runs once per shape and is gathered back, so
    20k repeated measurements cost what their few hundred shapes cost (issue 19). The fit
    still sees every point's residual: the result is the same."""
    index: dict[tuple[int, int, int, int], int] = {}
    uniq: list[Point] = []
    inverse = np.empty(len(points), dtype=np.int64)
    for i, p in enumerate(points):
        key = (p.batch, p.context_tokens, p.chunk_tokens, p.chunk_start)
        j = index.get(key)
        if j is None:
            j = index[key] = len(uniq)
            uniq.append(p)
        inverse[i] = j
    return uniq, inverse


def calibrate(d: rl.Deployment, points: Sequence[Point],
              fit: Sequence[str] | None = None, *, engine: str = "", engine_version: str = "",
              source: str = "") -> Calibration:
    """Fit the parameters named in `fit` (a subset of PARAMS; default DEFAULT_FIT, plus
    MIXED_FIT when mixed steps are given) to measured steps; the others stay at `d.eff`'s
    values. Raises BstarError on input that cannot determine it."""
    if not points:
        raise BstarError("no points to calibrate on")
    if fit is None:
        fit = DEFAULT_FIT + (MIXED_FIT if any(p.mixed for p in points) else ())
    uniq, inv = _unique_shapes(points)
    terms = _terms(d, uniq)
    measured = np.array([p.step_s for p in points])
    # Efficiencies that would explain the most demanding point outright on each roof.
    unit = _with_shape(d, _eff_dict(_UNIT) | {"score_bytes": 0.0})
    at_unit = st.price_parts(terms, unit)
    mem_1, comp_1 = at_unit.memory_s[inv], at_unit.compute_s[inv]
    starts = [{"bandwidth": float(np.clip(np.max(mem_1 / measured), 0.01, 1.0)),
               "kv_bandwidth": float(np.clip(np.max(mem_1 / measured), 0.01, 1.0)),
               "compute": float(np.clip(np.max(comp_1 / measured), 0.01, 1.0))}]
    # A datasheet peak cannot be beaten; a probed figure can (the probe's kernels are not
    # the engine's, and caches serve part of a small model), so against a measured device
    # the efficiencies may reach MAX_EFF_MEASURED, the excess scaling the GPU's figures.
    cap = 1.0 if d.gpu.provenance == "datasheet" else MAX_EFF_MEASURED
    f = fit_efficiency(lambda v: st.price(terms, _with_shape(d, v))[inv], measured, d.eff,
                       fit, starts, cap)
    eff, params, corr, tied = f.eff, f.params, f.correlation, list(f.tied)
    prior = _eff_dict(d.eff)
    pfits = check(d, eff, points, f.bandwidth_scale, f.compute_scale)
    notes = []
    for k, pf in params.items():
        if pf.status == "unset" and k in MIXED_FIT:
            notes.append(f"{k} is not identified: no point runs its kernel group "
                         f"(it needs mixed prefill + decode steps); kept at {pf.value:.4g}")
        elif pf.status == "unset":
            notes.append(f"{k} is not identified: its term sets no point's step time; "
                         f"reported as {pf.value:.4g}" + (
                             " (the prior)" if pf.value == prior[k]
                             else f", the value nearest the prior {prior[k]:g} that fits"))
        elif pf.status == "at-bound" and k in (*_BANDWIDTHS, *_COMPUTES):
            notes.append(f"{k} efficiency sits at its bound ({pf.value:g}): the points are "
                         "faster than the GPU figure allows; check the figure (bstar probe)")
        elif pf.status == "at-bound":
            notes.append(f"{k} sits at zero: the points leave no room for it")
        if k in (*_BANDWIDTHS, *_COMPUTES) and pf.value > 1.0:
            notes.append(f"{k} efficiency {pf.value:.3g} beats the measured GPU figure: filed "
                         f"as efficiency 1 with the GPU's figure scaled by {pf.value:.3g}")
    if tied:
        notes.append(f"{', '.join(tied)} trade off exactly against each other in these points "
                     "(e.g. one model at one context on one roof): their split is arbitrary; add a "
                     "second context or model, or fix some with --fit")
    for pair, c in corr.items():
        if abs(c) > 0.95:
            notes.append(f"{pair} are {c:+.2f} correlated: the points barely separate them; "
                         "add other batch sizes, contexts or a second model")
    return Calibration(eff, params, pfits, corr, d.model.name, d.gpu.id,
                       d.weight.name, d.kv.name, d.num_gpus, engine, engine_version, source,
                       notes=tuple(notes), bandwidth_scale=f.bandwidth_scale,
                       compute_scale=f.compute_scale)


def _soft_l1(r: np.ndarray) -> np.ndarray:
    """least_squares' soft_l1 loss at f_scale ROBUST_SCALE (its cost is half the sum)."""
    z = (r / ROBUST_SCALE) ** 2
    return ROBUST_SCALE**2 * 2 * (np.sqrt(1 + z) - 1)


def _uncertainty(fit: Sequence[str], x: np.ndarray, jac: np.ndarray, resid: np.ndarray,
                 unset: np.ndarray, v: Mapping[str, float], prior: Mapping[str, float],
                 lo: np.ndarray, hi: np.ndarray
                 ) -> tuple[dict[str, ParamFit], dict[str, float], list[str]]:
    """Gauss-Newton covariance s^2 (J^T J)^-1 over the identified, interior parameters,
    with s^2 from the plain (non-robust) log residuals. No sigma where the linearisation
    says nothing: a parameter at a bound, one whose term sets no step time (zero column),
    or one in an exact trade-off with others (a null direction of J)."""
    n = len(resid)
    at_bound = (np.isclose(x, lo, rtol=1e-6, atol=1e-9)
                | (np.isfinite(hi) & np.isclose(x, hi, rtol=1e-6, atol=1e-9)))
    use = ~unset & ~at_bound
    tied_mask = np.zeros(len(fit), dtype=bool)
    sub = jac[:, use]
    if sub.size:
        _, sv, vt = np.linalg.svd(sub / np.linalg.norm(sub, axis=0), full_matrices=False)
        null = vt[sv < 1e-6 * sv[0]]
        if null.size:
            tied_mask[np.flatnonzero(use)[np.any(np.abs(null) > 0.01, axis=0)]] = True
            use &= ~tied_mask
    stds: dict[str, float | None] = {k: None for k in fit}
    corr: dict[str, float] = {}
    dof = n - int(use.sum())
    if use.any() and dof > 0:
        s2 = float(resid @ resid) / dof
        cov = np.linalg.pinv(jac[:, use].T @ jac[:, use]) * s2
        names = [k for k, u in zip(fit, use, strict=True) if u]
        sd = np.sqrt(np.clip(np.diag(cov), 0, None))
        for i, k in enumerate(names):
            stds[k] = float(sd[i]) * _SCALE[k]
        for i in range(len(names)):
            for j in range(i + 1, len(names)):
                if sd[i] > 0 and sd[j] > 0:
                    corr[f"{names[i]}/{names[j]}"] = float(cov[i, j] / (sd[i] * sd[j]))
    out = {}
    for k in PARAMS:
        if k not in fit:
            out[k] = ParamFit(k, v[k], None, "fixed", prior[k])
            continue
        i = fit.index(k)
        status = ("unset" if unset[i] else "tied" if tied_mask[i]
                  else "at-bound" if at_bound[i] else "fitted")
        out[k] = ParamFit(k, v[k], stds[k], status, prior[k])
    return out, corr, [k for k, t in zip(fit, tied_mask, strict=True) if t]


def check(d: rl.Deployment, eff: rl.Efficiency, points: Sequence[Point],
          bandwidth_scale: float = 1.0, compute_scale: float = 1.0) -> tuple[PointFit, ...]:
    """Predict measured points with efficiencies `eff` (and GPU scales) calibrated elsewhere
    (another context, another model on the same GPU x engine), and with `d`'s own."""
    cal_d = scaled(d, eff, bandwidth_scale, compute_scale)
    uniq, inv = _unique_shapes(points)
    pred = predict_step_s(cal_d, uniq)[inv]
    uncal = predict_step_s(d, uniq)[inv]
    bound = _bound(_terms(cal_d, uniq), _with_shape(cal_d, _eff_dict(cal_d.eff)))[inv]
    return tuple(PointFit(p.batch, p.context_tokens, p.step_s * 1e3, float(pred[i]) * 1e3,
                          float(uncal[i]) * 1e3, str(bound[i]), p.label,
                          p.chunk_tokens, p.chunk_start)
                 for i, p in enumerate(points))


def points_from_sweep(result: Any, metric: str = "itl_p50",
                      context_tokens: int | None = None) -> list[Point]:
    """Decode-step points from a sweep result (bstar.loadgen.sweep.SweepResult): one per
    completed level with a batch (concurrency or max_num_seqs), at the context a request
    holds on average while decoding, input_len + output_len // 2 (as the sweep's own
    prediction). `metric`: itl_p50 (the median gap between streamed tokens: one decode
    step), tpot_mean or tpot_p50 (these also carry stalls behind other requests' prefills).
    Levels whose server preempted (regime 3) are left out: their batch is not what ran."""
    if metric not in ("itl_p50", "tpot_mean", "tpot_p50"):
        raise BstarError(f"metric must be itl_p50, tpot_mean or tpot_p50, got {metric!r}")
    opts = result.run.get("options") or {}
    ctx = context_tokens or int(opts.get("input_len") or 0) + int(opts.get("output_len") or 0) // 2
    if ctx < 1:
        raise BstarError(f"run {result.run_id}: no input/output lengths stored; give --context")
    key, stat = metric.split("_", 1)
    points = []
    for lv in result.levels:
        st = lv.stats or {}
        value = (st.get(f"{key}_ms") or {}).get(stat)
        if not lv.batch or not st.get("completed") or not value:
            continue
        if (getattr(lv, "server", None) or {}).get("preemptions"):
            continue  # regime 3: fewer than `batch` ran, and recomputes stalled the rest
        points.append(Point(int(lv.batch), ctx, float(value) / 1e3,
                            f"run {result.run_id} level {lv.idx}"))
    if not points:
        raise BstarError(f"run {result.run_id}: no completed level with a batch and "
                         f"{key}_ms {stat}")
    return points


# ---- vLLM start-up log: the KV pool it actually got --------------------------------------
@dataclass(frozen=True, slots=True)
class VllmKvLog:
    kv_cache_bytes: int | None  # "Available KV cache memory: 52.37 GiB" (v1, per GPU)
    kv_cache_tokens: int | None  # "GPU KV cache size: 433,392 tokens" (v1)
    gpu_blocks: int | None  # "# GPU blocks: 27084" (v0)


_GIB_RE = re.compile(r"Available KV cache memory:\s*([\d.]+)\s*GiB")
_TOKENS_RE = re.compile(r"(?:GPU|CPU|XPU|TPU) KV cache size:\s*([\d,]+)\s*tokens")
# v0 logs "# GPU blocks: N, # CPU blocks: M"; the CPU blocks there are swap space.
_BLOCKS_RE = re.compile(r"# GPU blocks:\s*(\d+)")


def parse_vllm_log(text: str) -> VllmKvLog:
    """The KV pool figures a vLLM server logs at start-up (last occurrence wins: a log may
    hold several starts). Raises BstarError if none is present."""
    def last(rx: re.Pattern[str]) -> str | None:
        m = rx.findall(text)
        return m[-1] if m else None

    gib, tokens, blocks = last(_GIB_RE), last(_TOKENS_RE), last(_BLOCKS_RE)
    if gib is None and tokens is None and blocks is None:
        raise BstarError("no KV cache size in this log (looked for 'Available KV cache "
                         "memory', 'KV cache size: N tokens', '# GPU blocks')")
    return VllmKvLog(round(float(gib) * 2**30) if gib else None,
                     int(tokens.replace(",", "")) if tokens else None,
                     int(blocks) if blocks else None)


def kv_pool_from_log(d: rl.Deployment, log: VllmKvLog) -> int:
    """Per-GPU KV pool bytes: the logged memory when present, else tokens (or blocks) times
    the deployment's per-GPU KV bytes per token."""
    if log.kv_cache_bytes is not None:
        return log.kv_cache_bytes
    per_token = d.model.kv_bytes_per_token(d.kv, num_gpus=d.num_gpus)
    tokens = log.kv_cache_tokens if log.kv_cache_tokens is not None \
        else (log.gpu_blocks or 0) * d.block_tokens
    return tokens * per_token


def reserve_from_kv_pool(d: rl.Deployment, kv_pool_bytes: int) -> int:
    """The reserve that makes bstar's pool (memory x util - weights - reserve) equal the
    measured one, so B_mem matches the engine's."""
    reserve = math.floor(d.gpu.memory_bytes * d.gpu_util) - rl.weight_bytes_per_gpu(d) \
        - kv_pool_bytes
    if reserve < 0:
        raise BstarError(
            f"the measured KV pool ({kv_pool_bytes / 2**30:.2f} GiB) exceeds memory x util "
            f"- weights ({(kv_pool_bytes + reserve) / 2**30:.2f} GiB): check --gpu-util, "
            "--gpu and --dtype against the server's settings")
    return reserve


# ---- the profile file ---------------------------------------------------------------------
def profile_toml(c: Calibration) -> str:
    """The calibration profile (TOML): GPU x engine x version, efficiencies, overheads,
    their uncertainty, the fit quality, the source and every point's residual."""
    def val(x: Any) -> str:
        if x is None:
            return '"n/a"'
        if isinstance(x, bool):
            return "true" if x else "false"
        if isinstance(x, int):
            return str(x)
        if isinstance(x, float):
            return repr(x) if math.isfinite(x) else '"n/a"'
        return json.dumps(str(x), ensure_ascii=True)

    lines = ["# bstar calibration profile (`bstar calibrate`); use with --profile THIS_FILE",
             "[profile]"]
    for k, x in (("gpu", c.gpu), ("engine", c.engine), ("engine_version", c.engine_version),
                 ("model", c.model), ("num_gpus", c.num_gpus),
                 ("weight_dtype", c.weight_dtype), ("kv_dtype", c.kv_dtype),
                 ("source", c.source),
                 ("created", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))):
        lines.append(f"{k} = {val(x)}")
    lines.append("\n[efficiency]")
    for k, x in _eff_dict(c.eff).items():
        lines.append(f"{k} = {val(x)}")
    # The shape of the model the values belong to (not fitted).
    k = c.eff.roof_sharpness
    lines.append(f"roof_sharpness = {'inf' if math.isinf(k) else val(float(k))}")
    lines.append(f"grouped = {val(c.eff.grouped)}")
    lines.append("\n[gpu_scale]  # the engine beats the (probed) GPU figures by these factors")
    lines.append(f"bandwidth = {val(c.bandwidth_scale)}")
    lines.append(f"compute = {val(c.compute_scale)}")
    lines.append("\n[uncertainty]  # 1 sigma; n/a = not fitted, not identified or at a bound")
    for k, p in c.params.items():
        lines.append(f"{k} = {val(p.std)}")
    lines.append("\n[fit]")
    lines.append(f"fitted = {json.dumps([k for k, p in c.params.items() if p.fitted])}")
    lines.append(f"median_abs_error = {val(c.median_abs_error)}")
    lines.append(f"max_abs_error = {val(c.max_abs_error)}")
    lines.append(f"uncalibrated_median_abs_error = {val(c.uncalibrated_median_abs_error)}")
    lines.append(f"notes = {json.dumps(list(c.notes))}")
    if c.reserve_bytes is not None:
        lines.append("\n[memory]  # from the engine's start-up log")
        lines.append(f"reserve_bytes = {c.reserve_bytes}")
        lines.append(f"kv_pool_bytes = {val(c.kv_pool_bytes)}")
    for p in c.points:
        lines += ["\n[[points]]", f"batch = {p.batch}", f"context_tokens = {p.context_tokens}",
                  f"measured_ms = {val(p.measured_ms)}", f"predicted_ms = {val(p.predicted_ms)}",
                  f"rel_error = {val(p.rel_error)}"]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True, slots=True)
class Profile:
    eff: rl.Efficiency
    gpu: str
    engine: str
    engine_version: str
    reserve_bytes: int | None
    path: str
    bandwidth_scale: float = 1.0
    compute_scale: float = 1.0

    def apply(self, d: rl.Deployment) -> rl.Deployment:
        return scaled(d, self.eff, self.bandwidth_scale, self.compute_scale)


def load_profile(path: str | Path) -> Profile:
    p = Path(path)
    try:
        data = tomllib.loads(p.read_bytes().decode("utf-8-sig"))
    except OSError as e:
        raise BstarError(f"{p}: cannot read profile ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise BstarError(f"{p}: not UTF-8 text (byte {e.start}); a profile is TOML") from None
    except tomllib.TOMLDecodeError as e:
        raise BstarError(f"{p}: not valid TOML ({e})") from None
    eff_tab = data.get("efficiency")
    if not isinstance(eff_tab, dict):
        raise BstarError(f"{p}: not a bstar calibration profile (no [efficiency] table)")
    known = {*PARAMS, "roof_sharpness", "grouped"}
    unknown = set(eff_tab) - known
    if unknown:
        raise BstarError(f"{p}: unknown efficiency field(s) {', '.join(sorted(unknown))}")
    grouped = eff_tab.pop("grouped", True)
    if not isinstance(grouped, bool):
        raise BstarError(f"{p}: grouped must be true or false")
    try:
        values: dict[str, Any] = {k: float(x) for k, x in eff_tab.items()}
    except (TypeError, ValueError):
        raise BstarError(f"{p}: efficiency values must be numbers") from None
    values["grouped"] = grouped
    try:
        eff = replace(rl.Efficiency(), **values)
    except BstarError as e:
        raise BstarError(f"{p}: {e}") from None
    prof, mem, sc = (data.get(k, {}) for k in ("profile", "memory", "gpu_scale"))
    for name, tab in (("profile", prof), ("memory", mem), ("gpu_scale", sc)):
        if not isinstance(tab, dict):
            raise BstarError(f"{p}: [{name}] must be a table")
    reserve = mem.get("reserve_bytes")
    if reserve is not None and (isinstance(reserve, bool)
                                or not isinstance(reserve, int | float)
                                or not 0 <= reserve <= 2**50):
        raise BstarError(f"{p}: memory.reserve_bytes must be a number of bytes in 0..2**50, "
                         f"got {reserve!r}")
    try:
        bs, cs = float(sc.get("bandwidth", 1.0)), float(sc.get("compute", 1.0))
    except (TypeError, ValueError):
        raise BstarError(f"{p}: gpu_scale values must be numbers") from None
    if not (1.0 <= bs <= MAX_EFF_MEASURED and 1.0 <= cs <= MAX_EFF_MEASURED):
        raise BstarError(f"{p}: gpu_scale must be in [1, {MAX_EFF_MEASURED:g}]")
    return Profile(eff, str(prof.get("gpu", "")), str(prof.get("engine", "")),
                   str(prof.get("engine_version", "")),
                   int(reserve) if isinstance(reserve, int | float) else None, str(p), bs, cs)
