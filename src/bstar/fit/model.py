"""The fit's model, step(B) = overhead + max(a + b*B, c*B) in ms (see bstar.fit), its
parameters and the robust log-space solver; `_check_roof` says whether the data show the
compute roof."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

# Soft-L1 loss scale in log space: residuals past ~5% count linearly, not quadratically.
LOSS = "soft_l1"
LOSS_SCALE = 0.05
# The roof counts as seen in the data when at least two points lie on the fitted compute line
# and either they sit above the memory-only fit by more than 3 robust sigmas of the full fit
# (and at least 2%), or the memory-only fit misses by 3x the full fit's robust sigma.
ROOF_SIGMAS = 3.0
ROOF_MIN_EXCESS = 0.02


# ---- the model ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Params:
    a_ms: float
    b_ms: float
    c_ms: float | None  # None: roof unknown
    overhead_ms: float = 0.0

    def step_ms(self, batch: npt.ArrayLike) -> FloatArray:
        b = np.asarray(batch, dtype=np.float64)
        mem = self.a_ms + self.b_ms * b
        if self.c_ms is None:
            return np.asarray(self.overhead_ms + mem, dtype=np.float64)
        return np.asarray(self.overhead_ms + np.maximum(mem, self.c_ms * b), dtype=np.float64)

    @property
    def b_star(self) -> float:
        return self.a_ms / self.b_ms

    @property
    def crossover_batch(self) -> float | None:
        """Where the memory line meets the compute line; None if compute never wins."""
        if self.c_ms is None or self.c_ms <= self.b_ms:
            return None
        return self.a_ms / (self.c_ms - self.b_ms)


@dataclass(frozen=True, slots=True)
class _Mode:
    """How c is obtained: "free" (fitted), "tied" (c = a/N + b), "fixed" (given), "none"."""

    kind: str
    critical_batch: float | None = None
    c_ms: float | None = None
    overhead: bool = False

    def unpack(self, x: FloatArray) -> Params:
        a, b = math.exp(x[0]), math.exp(x[1])
        i = 2
        c: float | None
        if self.kind == "free":
            c = math.exp(x[2])
            i = 3
        elif self.kind == "tied":
            assert self.critical_batch is not None
            c = a / self.critical_batch + b
        elif self.kind == "fixed":
            c = self.c_ms
        else:
            c = None
        d = math.exp(x[i]) if self.overhead else 0.0
        return Params(a, b, c, d)

    def pack(self, p: Params) -> list[float]:
        x = [math.log(p.a_ms), math.log(p.b_ms)]
        if self.kind == "free":
            assert p.c_ms is not None
            x.append(math.log(p.c_ms))
        if self.overhead:
            x.append(math.log(max(p.overhead_ms, 1e-6)))
        return x


_LOG_LO, _LOG_HI = -40.0, 40.0


def _solve(mode: _Mode, b: FloatArray, y: FloatArray, start: Params) -> tuple[Params, float]:
    """Robust least squares in log space from `start`; returns (params, robust cost)."""
    from scipy.optimize import least_squares

    def resid(x: FloatArray) -> FloatArray:
        return np.log(mode.unpack(x).step_ms(b)) - y

    x0 = np.clip(np.array(mode.pack(start)), _LOG_LO + 1, _LOG_HI - 1)
    r = least_squares(resid, x0, loss=LOSS, f_scale=LOSS_SCALE, method="trf",
                      bounds=(_LOG_LO, _LOG_HI), x_scale=1.0, max_nfev=2000)
    return mode.unpack(r.x), float(r.cost)


# Past this many points the solver fits a summary: equal-count bins of consecutive batches,
# each its median batch and median log step (a robust summary; equal counts keep the bins
# equally weighted), so the solves cost O(MAX_FIT_POINTS), not O(n), and the whole fit is
# O(n log n) in the points (the sort), not O(n^2).
MAX_FIT_POINTS = 1024


def summarize(b: FloatArray, y: FloatArray, max_points: int = MAX_FIT_POINTS
              ) -> tuple[FloatArray, FloatArray]:
    """(batch, log step) of at most `max_points` bins of consecutive batches (`b` sorted);
    the data themselves when they are no more."""
    if b.size <= max_points:
        return b, y
    edges = np.linspace(0, b.size, max_points + 1).astype(int)
    bs = np.empty(max_points)
    ys = np.empty(max_points)
    for i in range(max_points):
        lo, hi = edges[i], edges[i + 1]
        bs[i] = float(np.median(b[lo:hi]))
        ys[i] = float(np.median(y[lo:hi]))
    # Bins of repeated batches share a median: keep one (the roof needs distinct batches).
    keep = np.concatenate(([True], np.diff(bs) > 0))
    return bs[keep], ys[keep]


def _line_start(b: FloatArray, step: FloatArray) -> Params:
    """a, b from a plain straight-line fit, kept positive: a starting point only."""
    if b.size >= 2:
        slope, icpt = np.polyfit(b, step, 1)
    else:
        slope, icpt = 0.0, float(step[0])
    lo = float(np.min(step))
    a = float(icpt) if icpt > 0.05 * lo else 0.5 * lo
    s = float(slope) if slope > 0 else 1e-3 * lo / max(float(b.max()), 1.0)
    return Params(a, s, None)


# Splits tried as starts of the free-roof fit: every split up to this many, else a
# geometric grid of GRID_SPLITS and a refinement around the grid's best (so the number of
# solves stays constant and the fit is O(n) per solve, not O(n^2) in all).
ALL_SPLITS_UP_TO = 32
GRID_SPLITS = 24
REFINE_SPLITS = 8


def _splits(n: int) -> list[int]:
    """The first candidate splits m (the top m points start on the compute line)."""
    if n - 3 <= ALL_SPLITS_UP_TO:
        return list(range(2, n - 1))
    grid = np.unique(np.rint(np.geomspace(2, n - 2, GRID_SPLITS)).astype(int))
    return [int(m) for m in grid]


def _refine(tried: list[int], best_m: int, n: int) -> list[int]:
    """Splits between the grid's neighbours of `best_m` not tried yet."""
    tried_sorted = sorted(tried)
    i = tried_sorted.index(best_m)
    lo = tried_sorted[i - 1] if i > 0 else 2
    hi = tried_sorted[i + 1] if i + 1 < len(tried_sorted) else n - 2
    cand = np.unique(np.rint(np.linspace(lo, hi, REFINE_SPLITS + 2)).astype(int))
    return [int(m) for m in cand if int(m) not in tried and 2 <= m <= n - 2]


def _fit_free_roof(b: FloatArray, y: FloatArray, overhead: bool) -> tuple[Params, float] | None:
    """The best fit with c free, over starts that put the top m points on the compute line
    (every m for small data; a grid and a local refinement past ALL_SPLITS_UP_TO)."""
    n, step = b.size, np.exp(y)
    best: tuple[Params, float] | None = None
    best_m = 0
    mode = _Mode("free", overhead=overhead)

    def start_at(m: int) -> Params:
        lo = _line_start(b[: n - m], step[: n - m])
        c0 = float(np.median(step[n - m:] / b[n - m:]))
        return Params(lo.a_ms, lo.b_ms, max(c0, lo.b_ms * 1.01),
                      0.05 * lo.a_ms if overhead else 0.0)

    tried = _splits(n)
    for m in tried:
        got = _solve(mode, b, y, start_at(m))
        if best is None or got[1] < best[1]:
            best, best_m = got, m
    if n - 3 > ALL_SPLITS_UP_TO and best is not None:
        for m in _refine(tried, best_m, n):
            got = _solve(mode, b, y, start_at(m))
            if got[1] < best[1]:
                best = got
    return best


@dataclass(frozen=True, slots=True)
class RoofCheck:
    """What the data say about the compute roof on their own."""

    identified: bool
    params: Params | None  # the free-roof fit, when one was tried
    points_on_roof: tuple[int, ...]
    reason: str


def _check_roof(b: FloatArray, y: FloatArray, mem_fit: Params, overhead: bool) -> RoofCheck:
    if b.size < 4:
        return RoofCheck(False, None, (), f"{b.size} points cannot show a roof (it needs two "
                         "points on each line)")
    got = _fit_free_roof(b, y, overhead)
    assert got is not None
    full = got[0]
    assert full.c_ms is not None
    on = (full.c_ms * b) > (full.a_ms + full.b_ms * b) * 1.001
    on_batches = tuple(int(x) for x in b[on])
    if on.sum() < 2:
        return RoofCheck(False, full, on_batches,
                         "no two points lie on a compute line (throughput flat, step "
                         "proportional to batch)")
    r_full = np.log(full.step_ms(b)) - y
    r_mem = np.log(mem_fit.step_ms(b)) - y
    sigma_full = max(1.4826 * float(np.median(np.abs(r_full))), 0.01)
    sigma_mem = 1.4826 * float(np.median(np.abs(r_mem)))
    excess = -r_mem[on]  # how far the roof points sit above the memory-only fit
    need = max(ROOF_SIGMAS * sigma_full, ROOF_MIN_EXCESS)
    where = (f"B={', '.join(map(str, on_batches))}" if len(on_batches) <= 8 else
             f"B={on_batches[0]}..{on_batches[-1]} ({len(on_batches):,} points)")
    # Two ways a roof shows: the memory-only fit treats the roof points as outliers (they sit
    # above it), or it bends to reach them and then misfits everything (its typical residual
    # is several times the full model's).
    if np.all(excess > 0) and float(np.mean(excess)) > need:
        return RoofCheck(True, full, on_batches,
                         f"points at {where} sit {float(np.mean(excess)) * 100:.0f}% above the "
                         "memory line, on a flat-throughput line")
    if sigma_mem > ROOF_SIGMAS * sigma_full:
        return RoofCheck(True, full, on_batches,
                         f"points at {where} lie on a flat-throughput line; a memory line alone "
                         f"misses the data by {sigma_mem * 100:.0f}% (typical), the roofline by "
                         f"{sigma_full * 100:.1f}%")
    return RoofCheck(False, full, on_batches,
                     f"the points at {where} are within noise of the memory line (typical "
                     f"miss {sigma_mem * 100:.1f}% without a roof, {sigma_full * 100:.1f}% with "
                     "one)")


