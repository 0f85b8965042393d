"""Power and energy per output token: a GPU's power model and what a decode step draws.
Pure computation, no I/O (docs/energy.md has the model, its sources and its defaults).

A GPU draws its idle power plus a share of the range up to its TDP that grows with how
busy the step keeps it:

    power_w(u) = idle_w + (tdp_w - idle_w) * u^k            0 <= u <= 1

The step's utilization u follows the energy roofline (Choi, Bedard, Fowler, Vuduc, "A
roofline model of energy", IPDPS 2013: energy = FLOPs x e_flop + bytes x e_byte + constant
power x time): the dynamic power is the sum of a compute part and a memory part, each in
proportion to the rate the step runs that resource at, and the board's power limit caps it:

    u = min(1, flops / (peak x step_s) + m x bytes / (BW x step_s))

with `m` (power_memory_fraction) the share of (TDP - idle) a step that streams HBM at the
full datasheet bandwidth draws with its tensor cores idle, and k = 1 (linear, as the energy
roofline) unless a GPU's entry or `bstar calibrate` says otherwise. So a memory-bound decode
step draws about idle + m x eta_bw x (TDP - idle); a compute-bound one (prefill, big
batches) runs into the TDP. Joules per output token are the deployment's GPUs' power times
the step time over the tokens the step produces (its running batch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from bstar.errors import BstarError
from bstar.specs.gpu import GpuSpec
from bstar.units import DEFAULT_ELECTRICITY_USD_PER_KWH, J_PER_KWH

__all__ = [
    "DEFAULT_ELECTRICITY_USD_PER_KWH",
    "J_PER_KWH",
    "MIN_FIT_POINTS",
    "UTILIZATION_RULE",
    "DecodeEnergy",
    "PowerFit",
    "PowerModel",
    "busy_energy_j",
    "check_electricity_price",
    "decode_energy",
    "energy_usd_per_mtok",
    "fit_power_curve",
    "joules_per_output_token",
    "power_model",
    "power_w",
    "step_utilization",
]

FloatArray = npt.NDArray[np.float64]

# Defaults where a GPU's entry gives none (docs/energy.md says why each).
DEFAULT_IDLE_FRACTION = 0.10  # idle_w = 10% of the TDP: guessed
DEFAULT_MEMORY_FRACTION = 0.6  # share of (TDP - idle) at full HBM bandwidth: guessed
DEFAULT_EXPONENT = 1.0  # linear in utilization: the energy roofline's form

UTILIZATION_RULE = ("u = min(1, flops / (peak_flops x step_s) + memory_fraction x "
                    "bytes_read / (hbm_bandwidth x step_s)), per GPU, from the step's "
                    "roofline (energy roofline, Choi et al. IPDPS 2013)")


@dataclass(frozen=True, slots=True)
class PowerModel:
    """One GPU's power curve and where each of its numbers comes from."""

    gpu_id: str
    tdp_w: float
    idle_w: float
    memory_fraction: float
    exponent: float
    tdp_basis: str  # "datasheet", "guessed" or "calibrated"
    idle_basis: str  # "guessed", "catalog" or "calibrated"
    curve_basis: str  # "default" or "catalog" or "calibrated"
    source: str = ""

    def __post_init__(self) -> None:
        for k in ("tdp_w", "idle_w", "memory_fraction", "exponent"):
            v = getattr(self, k)
            if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
                raise BstarError(f"power model of {self.gpu_id}: {k} must be a finite "
                                 f"number, not negative, got {v!r}")
        if not 0 <= self.idle_w < self.tdp_w:
            raise BstarError(f"power model of {self.gpu_id}: idle power {self.idle_w:g} W "
                             f"must be below the TDP {self.tdp_w:g} W")
        if not 0 < self.memory_fraction <= 1 or not self.exponent > 0:
            raise BstarError(f"power model of {self.gpu_id}: memory_fraction must be in "
                             "(0, 1] and the exponent positive")

    def power_w(self, utilization: npt.ArrayLike) -> FloatArray:
        """Board power at each utilization (clipped to 0..1)."""
        u = np.clip(np.asarray(utilization, dtype=np.float64), 0.0, 1.0)
        return np.asarray(self.idle_w + (self.tdp_w - self.idle_w) * u ** self.exponent,
                          dtype=np.float64)

    def to_dict(self) -> dict[str, Any]:
        return {"gpu": self.gpu_id, "tdp_w": self.tdp_w, "idle_w": self.idle_w,
                "memory_fraction": self.memory_fraction, "exponent": self.exponent,
                "tdp_basis": self.tdp_basis, "idle_basis": self.idle_basis,
                "curve_basis": self.curve_basis, "source": self.source,
                "formula": "power_w = idle_w + (tdp_w - idle_w) * u^exponent",
                "utilization_rule": UTILIZATION_RULE}


def power_model(gpu: GpuSpec) -> PowerModel | None:
    """The GPU's power model: its datasheet TDP (or, where none is published, its guessed
    `power_limit_w`), its idle power (the entry's, else DEFAULT_IDLE_FRACTION of the TDP)
    and the curve's figures (the entry's, else the defaults). None when the GPU states no
    power at all (a probed GPU, a user file without tdp_w)."""
    calibrated = gpu.power_source.startswith("calibrated")
    if gpu.tdp_w > 0:
        tdp, tdp_basis = gpu.tdp_w, "datasheet"
    elif gpu.power_limit_w > 0:
        tdp, tdp_basis = gpu.power_limit_w, "guessed"
    else:
        return None
    idle = gpu.idle_w or DEFAULT_IDLE_FRACTION * tdp
    curve_given = bool(gpu.power_memory_fraction or gpu.power_exponent)
    src = gpu.power_source or (gpu.chip_source and f"TDP: {gpu.chip_source}")
    return PowerModel(
        gpu_id=gpu.id, tdp_w=tdp, idle_w=idle,
        memory_fraction=gpu.power_memory_fraction or DEFAULT_MEMORY_FRACTION,
        exponent=gpu.power_exponent or DEFAULT_EXPONENT, tdp_basis=tdp_basis,
        idle_basis=("calibrated" if calibrated else "catalog") if gpu.idle_w else "guessed",
        curve_basis=("calibrated" if calibrated else "catalog") if curve_given else "default",
        source=src)


def power_w(gpu: GpuSpec, utilization: npt.ArrayLike) -> FloatArray | None:
    """Board power of `gpu` at each utilization (0..1); None without a power model."""
    pm = power_model(gpu)
    return None if pm is None else pm.power_w(utilization)


def step_utilization(gpu: GpuSpec, compute: str, flops: npt.ArrayLike,
                     bytes_read: npt.ArrayLike, step_s: npt.ArrayLike,
                     memory_fraction: float) -> FloatArray:
    """u of a step per GPU (UTILIZATION_RULE): the rates the step runs the tensor cores and
    HBM at, as fractions of their datasheet peaks, the memory part weighted by the power a
    bandwidth-bound step draws, capped at 1."""
    t = np.atleast_1d(np.asarray(step_s, dtype=np.float64))
    if np.any(~(t > 0)):
        raise BstarError("step times must be positive to price their power")
    u_c = np.asarray(flops, dtype=np.float64) / (gpu.peak_flops(compute) * t)
    u_m = np.asarray(bytes_read, dtype=np.float64) / (gpu.hbm_bandwidth_bytes_s * t)
    return np.asarray(np.minimum(1.0, u_c + memory_fraction * u_m), dtype=np.float64)


@dataclass(frozen=True, slots=True)
class DecodeEnergy:
    """Power and energy of decode at each batch (arrays aligned with `batch`)."""

    batch: npt.NDArray[np.int64]
    utilization: FloatArray  # per GPU
    power_w: FloatArray  # per GPU
    joules_per_output_token: FloatArray  # all the deployment's GPUs


def decode_energy(d: Any, batch: npt.ArrayLike, context_tokens: int,
                  model: PowerModel | None = None) -> DecodeEnergy | None:
    """Power per GPU and joules per output token of decode at each batch on deployment `d`
    (a bstar.deployment.Deployment) at `context_tokens`: the roofline's step (rl.curve, so
    a batch past B_mem runs B_mem) priced by the GPU's power model. None without one."""
    from bstar import roofline as rl

    pm = model or power_model(d.gpu)
    if pm is None:
        return None
    c = rl.curve(d, batch, context_tokens)
    u = step_utilization(d.gpu, d.weight.compute, c.cost.flops, c.cost.bytes_read,
                         c.step_s, pm.memory_fraction)
    p = pm.power_w(u)
    j = d.num_gpus * p * c.step_s / c.running_batch
    return DecodeEnergy(c.batch, u, p, np.asarray(j, dtype=np.float64))


def joules_per_output_token(d: Any, batch: int, context_tokens: int) -> float | None:
    """Joules all of `d`'s GPUs spend per output token decoding `batch` sequences at
    `context_tokens` (`decode_energy`); None without a power model."""
    e = decode_energy(d, [batch], context_tokens)
    return None if e is None else float(e.joules_per_output_token[0])


def energy_usd_per_mtok(joules_per_token: float, usd_per_kwh: float) -> float:
    """Electricity cost of a million output tokens at `usd_per_kwh`."""
    return joules_per_token * 1e6 / J_PER_KWH * usd_per_kwh


def check_electricity_price(usd_per_kwh: float) -> None:
    if not (math.isfinite(usd_per_kwh) and 0 <= usd_per_kwh <= 100):
        raise BstarError("--electricity-usd-per-kwh must be between 0 and 100, got "
                         f"{usd_per_kwh!r}")


def busy_energy_j(d: Any, busy_s_by_seqs: dict[int, float], duration_s: float,
                  context_tokens: int) -> float | None:
    """Energy of all of `d`'s GPUs over a simulated run (bstar.sim) of `duration_s`: each
    step's time at the power of a decode step of its number of sequences at
    `context_tokens` (`busy_s_by_seqs`: seconds spent in steps of each size), idle power for
    the rest. A step that prefills is priced as a decode step of the same size: below its
    real power (docs/energy.md, "What is not modelled")."""
    pm = power_model(d.gpu)
    if pm is None:
        return None
    sizes = np.array(sorted(k for k, v in busy_s_by_seqs.items() if k > 0 and v > 0),
                     dtype=np.int64)
    busy = np.array([busy_s_by_seqs[int(k)] for k in sizes], dtype=np.float64)
    joules = pm.idle_w * max(0.0, duration_s - float(busy.sum()))
    if sizes.size:
        e = decode_energy(d, sizes, context_tokens, pm)
        assert e is not None
        joules += float((e.power_w * busy).sum())
    return d.num_gpus * joules


@dataclass(frozen=True, slots=True)
class PowerFit:
    """A power curve fitted to measured (utilization, watts) pairs (`fit_power_curve`)."""

    idle_w: float
    exponent: float
    tdp_w: float
    points: int
    rms_error_w: float

    def to_dict(self) -> dict[str, Any]:
        return {"idle_w": self.idle_w, "exponent": self.exponent, "tdp_w": self.tdp_w,
                "points": self.points, "rms_error_w": self.rms_error_w}


MIN_FIT_POINTS = 3


def fit_power_curve(utilization: npt.ArrayLike, watts: npt.ArrayLike,
                    tdp_w: float) -> PowerFit:
    """idle_w and the exponent k of watts = idle + (tdp - idle) * u^k by least squares over
    the measured pairs, the TDP held at the datasheet's (a level rarely reaches it): for each
    k on a fine grid idle is linear, solved exactly; the best k is then refined. Needs
    MIN_FIT_POINTS pairs at distinct utilizations in (0, 1]."""
    u = np.asarray(utilization, dtype=np.float64)
    w = np.asarray(watts, dtype=np.float64)
    ok = np.isfinite(u) & np.isfinite(w) & (u > 0) & (u <= 1) & (w > 0)
    u, w = u[ok], w[ok]
    if np.unique(np.round(u, 6)).size < MIN_FIT_POINTS:
        raise BstarError(f"fitting a power curve needs at least {MIN_FIT_POINTS} levels with "
                         f"power and distinct utilizations, got {np.unique(u).size}")
    if not tdp_w > 0:
        raise BstarError("fitting a power curve needs the GPU's TDP")

    def solve(k: float) -> tuple[float, float]:
        # w = idle * (1 - u^k) + tdp * u^k: one unknown, linear least squares.
        x = 1.0 - u ** k
        r = w - tdp_w * u ** k
        xx = float((x * x).sum())
        idle = float((x * r).sum() / xx) if xx > 0 else 0.0
        idle = min(max(idle, 0.0), tdp_w * (1 - 1e-9))
        resid = w - (idle + (tdp_w - idle) * u ** k)
        return idle, float((resid * resid).sum())

    grid = np.geomspace(0.1, 10.0, 400)
    errs = [solve(float(k))[1] for k in grid]
    i = int(np.argmin(errs))
    lo, hi = float(grid[max(i - 1, 0)]), float(grid[min(i + 1, grid.size - 1)])
    g = (math.sqrt(5) - 1) / 2
    for _ in range(80):  # golden-section refinement of k inside the bracket
        a, b = hi - g * (hi - lo), lo + g * (hi - lo)
        if solve(a)[1] < solve(b)[1]:
            hi = b
        else:
            lo = a
    k = 0.5 * (lo + hi)
    idle, sse = solve(k)
    return PowerFit(idle_w=idle, exponent=k, tdp_w=tdp_w, points=int(u.size),
                    rms_error_w=math.sqrt(sse / u.size))
