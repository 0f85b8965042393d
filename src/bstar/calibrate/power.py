"""The power curve from a sweep's stored power (`bstar calibrate RUN`): each completed level
that sampled GPU power (bstar.loadgen.gpu_telemetry, stored in the level's server JSON)
gives one (utilization, watts) pair, the utilization the cost model's decode step at the
level's batch and context runs the GPU at (bstar.energy.step_utilization, with the
deployment's calibrated efficiencies), and `bstar.energy.fit_power_curve` fits idle power
and the exponent to them, the TDP held at the datasheet's. Pure: a stored result in, a fit
out (docs/energy.md, "Calibrating the curve")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from bstar.energy import MIN_FIT_POINTS, PowerFit, decode_energy, fit_power_curve, power_model
from bstar.errors import BstarError


def level_power(level: Any) -> float | None:
    """The mean board power (W, GPU 0) a stored level sampled; None when it has none (a
    store written before issue 39, a sweep without NVML or AMD SMI)."""
    gpu = (getattr(level, "server", None) or {}).get("gpu") or {}
    w = gpu.get("power_mean_w") if isinstance(gpu, dict) else None
    if isinstance(w, bool) or not isinstance(w, int | float) or not 0 < float(w) < 1e4:
        return None
    return float(w)


@dataclass(frozen=True, slots=True)
class PowerCalibration:
    """The fit and the pairs it came from."""

    fit: PowerFit
    batches: tuple[int, ...]
    utilization: tuple[float, ...]
    measured_w: tuple[float, ...]
    context_tokens: int
    source: str

    def predicted_w(self) -> list[float]:
        f = self.fit
        return [f.idle_w + (f.tdp_w - f.idle_w) * u ** f.exponent for u in self.utilization]

    def to_dict(self) -> dict[str, Any]:
        return self.fit.to_dict() | {
            "context_tokens": self.context_tokens, "source": self.source,
            "points": [{"batch": b, "utilization": u, "measured_w": w, "predicted_w": p}
                       for b, u, w, p in zip(self.batches, self.utilization,
                                             self.measured_w, self.predicted_w(),
                                             strict=True)]}

    def toml(self) -> str:
        """The profile's [power] table (read back by bstar.calibrate.profiles)."""
        f = self.fit
        return ("\n[power]  # fitted to the sweep's GPU power (docs/energy.md)\n"
                f"idle_w = {f.idle_w!r}\nexponent = {f.exponent!r}\ntdp_w = {f.tdp_w!r}\n"
                f"points = {f.points}\nrms_error_w = {f.rms_error_w!r}\n")


def power_from_run(d: Any, result: Any, context_tokens: int | None = None
                   ) -> PowerCalibration | None:
    """The power curve of deployment `d`'s GPU fitted to sweep `result`'s stored power; None
    when fewer than MIN_FIT_POINTS completed levels carry power (the sweep had no power
    source) or the GPU states no TDP."""
    pm = power_model(d.gpu)
    if pm is None:
        return None
    from bstar.fit.points import level_batch

    opts = result.run.get("options") or {}
    ctx = context_tokens or int(opts.get("input_len") or 0) \
        + int(opts.get("output_len") or 0) // 2
    if ctx < 1:
        raise BstarError(f"run {result.run_id}: no input/output lengths stored; give "
                         "--context")
    pairs: list[tuple[int, float]] = []
    for lv in result.levels:
        w = level_power(lv)
        b = level_batch(lv)
        if w is None or not b or not (lv.stats or {}).get("completed"):
            continue
        pairs.append((int(b), w))
    if len({b for b, _ in pairs}) < MIN_FIT_POINTS:
        return None
    batches = np.array([b for b, _ in pairs], dtype=np.int64)
    watts = np.array([w for _, w in pairs], dtype=np.float64)
    e = decode_energy(d, batches, ctx, pm)
    assert e is not None
    fit = fit_power_curve(e.utilization, watts, pm.tdp_w)
    return PowerCalibration(fit, tuple(int(b) for b in batches),
                            tuple(float(u) for u in e.utilization),
                            tuple(float(w) for w in watts), ctx,
                            f"sweep run {result.run_id}")
