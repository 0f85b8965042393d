"""What a fit returns: the fitted parameters, each point's residual and regime, the
predictions with their intervals, the knees, and the fitted curve in the quantity the points
measured (`FitResult.curve`); `to_dict()` is the `bstar fit --json` contract."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from bstar import knee as kn
from bstar.fit.model import LOSS, LOSS_SCALE, FloatArray, Params
from bstar.fit.points import Points

INTERVAL_PCT = (5.0, 95.0)
ROOF_SOURCES = ("data", "critical-batch", "cost-model", "unknown")
# How far past the largest batch (measured or predicted) the drawn curve reaches.
CURVE_MARGIN = 1.25


@dataclass(frozen=True, slots=True)
class Prediction:
    batch: int
    tpot_ms: float
    throughput_tok_s: float
    tpot_low_ms: float
    tpot_high_ms: float
    throughput_low_tok_s: float
    throughput_high_tok_s: float
    regime: str  # "memory-bound", "compute-bound", "unknown"
    extrapolated: bool
    bound: str | None  # "tpot_lower_bound" where the roof is unknown past the data

    def to_dict(self) -> dict[str, Any]:
        return {"batch": self.batch, "throughput_tok_s": self.throughput_tok_s,
                "tpot_ms": self.tpot_ms,
                "low": {"tpot_ms": self.tpot_low_ms,
                        "throughput_tok_s": self.throughput_low_tok_s},
                "high": {"tpot_ms": self.tpot_high_ms,
                         "throughput_tok_s": self.throughput_high_tok_s},
                "regime": self.regime, "extrapolated": self.extrapolated,
                "bound": self.bound}


@dataclass(frozen=True, slots=True)
class FitResult:
    points: Points
    params: Params
    roof_source: str  # one of ROOF_SOURCES
    roof_note: str
    critical_batch: float | None
    fitted_tpot_ms: tuple[float, ...]
    residual_pct: tuple[float, ...]  # (measured / fitted - 1) * 100
    outliers: tuple[int, ...]  # batches whose residual is far outside the rest
    regimes: tuple[str, ...]  # per point
    predictions: tuple[Prediction, ...]
    knees_fitted: dict[str, kn.Knee]
    knees_measured: dict[str, kn.Knee]
    knee_batch: int | None
    knee_rule: str | None
    param_intervals: dict[str, tuple[float, float] | None]
    warnings: tuple[str, ...]
    notes: tuple[str, ...]
    n_bootstrap: int
    seed: int
    fit_overhead: bool
    weight_bytes: int | None = None
    kv_bytes_per_seq: int | None = None
    flops_per_token: float | None = None
    max_tpot_ms: float | None = None
    # Closed-loop output throughput (`with_prefill`): TTFT(B) = ttft_line[0] + [1] * B, ms,
    # and the output tokens per request. None: throughput is decode-only, B / TPOT.
    ttft_line: tuple[float, float] | None = None
    output_len: int | None = None
    _boot: FloatArray | None = field(default=None, repr=False, compare=False)

    @property
    def throughput_kind(self) -> str:
        return ("output, prefill included (closed loop: B x O / (TTFT + (O - 1) x TPOT))"
                if self.ttft_line is not None else "decode only (B / TPOT)")

    def throughput_at(self, batch: npt.ArrayLike, tpot_ms: npt.ArrayLike | None = None
                      ) -> FloatArray:
        """Throughput in the quantity the points measured: decode-only B / TPOT, or, after
        `with_prefill`, a closed loop's output throughput with each request's prefill."""
        b = np.asarray(batch, dtype=np.float64)
        t = self.step_ms(b) if tpot_ms is None else np.asarray(tpot_ms, dtype=np.float64)
        if self.ttft_line is None or self.output_len is None:
            return 1e3 * b / t
        ttft = self.ttft_line[0] + self.ttft_line[1] * b
        return 1e3 * b * self.output_len / (ttft + (self.output_len - 1) * t)

    @property
    def roof_known(self) -> bool:
        return self.roof_source != "unknown"

    @property
    def sla_batch(self) -> int | None:
        """The largest batch whose fitted per-request TPOT meets `max_tpot_ms` (the "sla"
        knee on the fitted curve); None when no bound was given or no batch meets it, as
        `ContextPlan.sla_batch` and a sweep's `knee.sla_batch`."""
        k = self.knees_fitted.get("sla")
        return None if k is None else k.batch

    def curve(self, samples: int) -> dict[str, Any]:
        """The fitted curve at `samples` batches on a log grid from 1 to CURVE_MARGIN x the
        largest batch measured or predicted: per-request TPOT (`step_ms`) and throughput in
        the quantity the points measured (`throughput_at`), as JSON lists."""
        batches = [*self.points.batch, *(p.batch for p in self.predictions)]
        top = max(max(batches) * CURVE_MARGIN, 2.0)
        grid = np.unique(np.geomspace(1, top, samples))
        step_ms = np.asarray(self.step_ms(grid), dtype=np.float64)
        return {"batch": [float(x) for x in grid], "tpot_ms": [float(x) for x in step_ms],
                "throughput_tok_s": [float(x) for x in self.throughput_at(grid, step_ms)],
                "last_measured_batch": float(max(self.points.batch))}

    def step_ms(self, batch: npt.ArrayLike) -> FloatArray:
        return self.params.step_ms(batch)

    @property
    def weight_bandwidth_bytes_s(self) -> float | None:
        """Bandwidth equivalent of a: the weight bytes read in a (an upper bound on the time
        spent reading them, so a lower bound on the bandwidth achieved)."""
        if self.weight_bytes is None:
            return None
        return self.weight_bytes / (self.params.a_ms / 1e3)

    @property
    def kv_bandwidth_bytes_s(self) -> float | None:
        if self.kv_bytes_per_seq is None:
            return None
        return self.kv_bytes_per_seq / (self.params.b_ms / 1e3)

    @property
    def achieved_flops(self) -> float | None:
        """FLOP/s implied by a measured roof (data or a known critical batch); None when c
        is the cost model's own assumption or unknown."""
        if self.flops_per_token is None or self.params.c_ms is None \
                or self.roof_source not in ("data", "critical-batch"):
            return None
        return self.flops_per_token / (self.params.c_ms / 1e3)

    def params_dict(self) -> dict[str, Any]:
        p = self.params
        cross = p.crossover_batch
        plateau = 1e3 / p.c_ms if p.c_ms is not None and cross is not None else None
        return {
            "a_ms": p.a_ms, "b_ms": p.b_ms, "c_ms": p.c_ms, "overhead_ms": p.overhead_ms,
            "b_star": p.b_star, "crossover_batch": cross,
            "roof": self.roof_source, "roof_note": self.roof_note,
            "critical_batch": self.critical_batch,
            "plateau_tok_s": plateau,
            "memory_ceiling_tok_s": 1e3 / p.b_ms,
            "weight_bandwidth_bytes_s": self.weight_bandwidth_bytes_s,
            "kv_bandwidth_bytes_s": self.kv_bandwidth_bytes_s,
            "achieved_flops": self.achieved_flops,
            "intervals": {k: (list(v) if v else None) for k, v in self.param_intervals.items()},
            "interval_pct": list(INTERVAL_PCT), "n_bootstrap": self.n_bootstrap,
            "seed": self.seed, "loss": f"{LOSS} on log(step), scale {LOSS_SCALE}",
            "model": "step_ms(B) = overhead_ms + max(a_ms + b_ms*B, c_ms*B)",
        }

    def to_dict(self) -> dict[str, Any]:
        """The `bstar fit --json` contract (docs/contracts.md) plus points, knees, warnings."""
        regime_at = {str(b): r for b, r in zip(self.points.batch, self.regimes, strict=True)}
        for pr in self.predictions:
            regime_at[str(pr.batch)] = pr.regime
        pts = self.points
        return {
            "params": self.params_dict(),
            "knee_batch": self.knee_batch,
            "knee_rule": self.knee_rule,
            "max_tpot_ms": self.max_tpot_ms,
            "sla_batch": self.sla_batch,
            "predictions": [pr.to_dict() for pr in self.predictions],
            "throughput_kind": self.throughput_kind,
            "regime_at": regime_at,
            "points": [{"batch": pts.batch[i], "throughput_tok_s": pts.throughput_tok_s[i],
                        "tpot_ms": pts.tpot_ms[i], "derived": pts.derived[i] or None,
                        "fitted_tpot_ms": self.fitted_tpot_ms[i],
                        "residual_pct": self.residual_pct[i], "regime": self.regimes[i],
                        "outlier": pts.batch[i] in self.outliers}
                       for i in range(len(pts))],
            "knees": {"fitted": {k: v.to_dict() for k, v in self.knees_fitted.items()},
                      "measured": {k: v.to_dict() for k, v in self.knees_measured.items()}},
            "warnings": list(self.warnings),
            "notes": list(self.notes),
            "source": pts.source,
        }
