"""What a calibration says: each parameter's value, sigma and status (`ParamFit`), each
point's measured and predicted step (`PointFit`), the whole (`Calibration`, whose
`to_dict` is `bstar calibrate --json`'s shape), and the statistics over points that the
command reports (`median_abs_error`, `repeat_spread`)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bstar.calibrate.params import _eff_dict, scaled
from bstar.deployment import Deployment, Efficiency, EngineBehaviour


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

    def to_dict(self) -> dict[str, Any]:
        """A point as `bstar calibrate --json` writes it (its fit's points and a check's)."""
        return {"batch": self.batch, "context_tokens": self.context_tokens,
                "measured_ms": self.measured_ms, "predicted_ms": self.predicted_ms,
                "rel_error": self.rel_error, "uncalibrated_ms": self.uncalibrated_ms,
                "uncalibrated_rel_error": self.uncalibrated_rel_error,
                "bound": self.bound, "chunk_tokens": self.chunk_tokens,
                "chunk_start": self.chunk_start}


@dataclass(frozen=True, slots=True)
class Calibration:
    eff: Efficiency
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
    # The engine's behaviour the calibration held (its request overhead is a parameter).
    behaviour: EngineBehaviour = field(default_factory=EngineBehaviour)

    def apply(self, d: Deployment) -> Deployment:
        return scaled(d.with_behaviour(self.behaviour), self.eff, self.bandwidth_scale,
                      self.compute_scale)

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
            "efficiency": _eff_dict(self.eff, self.behaviour),
            "gpu_scale": {"bandwidth": self.bandwidth_scale, "compute": self.compute_scale},
            "params": {k: {"value": p.value, "std": p.std, "status": p.status,
                           "prior": p.prior} for k, p in self.params.items()},
            "correlation": self.correlation,
            "median_abs_error": self.median_abs_error,
            "max_abs_error": self.max_abs_error,
            "uncalibrated_median_abs_error": self.uncalibrated_median_abs_error,
            "reserve_bytes": self.reserve_bytes, "kv_pool_bytes": self.kv_pool_bytes,
            "points": [p.to_dict() for p in self.points],
            "notes": list(self.notes),
        }


def median_abs_error(points: Sequence[PointFit], uncalibrated: bool = False) -> float:
    """The median |relative error| of predicted points (`check`'s), calibrated or not."""
    return statistics.median(abs(p.uncalibrated_rel_error if uncalibrated else p.rel_error)
                             for p in points)


def repeat_spread(points: Sequence[PointFit]) -> list[dict[str, Any]]:
    """Per (batch, context) measured more than once: the repeats' step times and their
    spread. Every repeat is a point of the fit; this says how far apart they were."""
    groups: dict[tuple[int, int, int, int], list[float]] = {}
    for p in points:  # a mixed step repeats only with the same chunk
        key = (p.batch, p.context_tokens, p.chunk_tokens, p.chunk_start)
        groups.setdefault(key, []).append(p.measured_ms)
    out = []
    for (b, ctx, _, _), ms in sorted(groups.items()):
        if len(ms) < 2:
            continue
        mean = statistics.fmean(ms)
        out.append({"batch": b, "context_tokens": ctx, "n": len(ms), "measured_ms": ms,
                    "mean_ms": mean, "min_ms": min(ms), "max_ms": max(ms),
                    "std_ms": statistics.stdev(ms),
                    "rel_spread": (max(ms) - min(ms)) / mean})
    return out
