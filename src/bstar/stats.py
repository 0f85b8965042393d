"""Percentiles as vLLM's benchmarks compute them: p50, p90, p99 and the mean, interpolating
linearly between order statistics (numpy's default 'linear' method; benchmarks/
benchmark_serving calls np.percentile). One implementation for the sweep's measured levels
(`bstar.loadgen.metrics`), the simulator's runs (`bstar.sim.metrics`) and the simulated load
stages (`bstar.validate_stages`). And the one generator of Poisson arrivals
(`poisson_gaps_s`), for the simulator's open loop and the live sweep's alike. Pure, no I/O."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import numpy.typing as npt

PERCENTILES = (50, 90, 99)

Stats = dict[str, float | None]  # {"p50", "p90", "p99", "mean"}; None when nothing was seen


def no_stats() -> Stats:
    out: Stats = {f"p{p}": None for p in PERCENTILES}
    out["mean"] = None
    return out


def percentile(values: npt.ArrayLike, q: float) -> float:
    """The q-th percentile (q in [0, 100]) by numpy's linear rule; NaN when empty."""
    a = np.asarray(values, dtype=np.float64)
    return float(np.percentile(a, q)) if a.size else math.nan


def percentiles(values: npt.ArrayLike) -> Stats:
    """p50, p90, p99 and the mean of `values` (None each when empty)."""
    a = np.asarray(values, dtype=np.float64)
    if a.size == 0:
        return no_stats()
    out: Stats = {f"p{p}": float(v)
                  for p, v in zip(PERCENTILES, np.percentile(a, PERCENTILES), strict=True)}
    out["mean"] = float(a.mean())
    return out


def percentiles_ms(values_s: Iterable[float]) -> Stats:
    """`percentiles` of times in seconds (an array, or any iterable), in milliseconds."""
    a = values_s if isinstance(values_s, np.ndarray) else np.fromiter(values_s, np.float64)
    return percentiles(np.asarray(a, dtype=np.float64) * 1e3)


def weighted_percentiles(values: npt.ArrayLike, weights: npt.ArrayLike) -> Stats:
    """np.percentile of the array in which each value is repeated `weight` times (exactly),
    without building it: the ITL of a million tokens is a few thousand distinct gaps."""
    v = np.asarray(values, dtype=np.float64)
    w = np.asarray(weights, dtype=np.int64)
    keep = w > 0
    v, w = v[keep], w[keep]
    if v.size == 0:
        return no_stats()
    order = np.argsort(v, kind="stable")
    v, w = v[order], w[order]
    cum = np.cumsum(w)
    n = int(cum[-1])
    out: Stats = {}
    for p in PERCENTILES:
        pos = p / 100 * (n - 1)
        lo, hi = math.floor(pos), math.ceil(pos)
        v_lo = v[np.searchsorted(cum, lo, side="right")]
        v_hi = v[np.searchsorted(cum, hi, side="right")]
        out[f"p{p}"] = float(v_lo + (pos - lo) * (v_hi - v_lo))
    out["mean"] = float((v * w).sum() / n)
    return out


def per_request_tpot(e2e: Any, ttft: Any, output_tokens: Any) -> Any:
    """vLLM's per-request TPOT: (E2E - TTFT) / (output_tokens - 1), in the unit of E2E and
    TTFT; a request of one token has none (the caller leaves it out). Scalars or numpy arrays
    (elementwise). The one definition: the client's measured request, the simulator's
    requests, the simulated load stages and a stages table row without its own TPOT."""
    return (e2e - ttft) / (output_tokens - 1)


def poisson_gaps_s(rate_per_s: float, rng: np.random.Generator, n: int) -> npt.NDArray[
        np.float64]:
    """`n` gaps, seconds, between Poisson arrivals at `rate_per_s`: exponential with mean
    1 / rate (vLLM's benchmark with --request-rate). The simulator's open loop
    (`sim/traffic.Poisson`, their cumulative sum) and the live sweep's
    (`loadgen/worker.run_requests`, one gap per request sent) both draw from here."""
    return rng.exponential(1.0 / rate_per_s, size=n)
