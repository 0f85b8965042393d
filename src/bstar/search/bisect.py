"""The rate bisection both layouts' evaluations share (`bstar.search.evaluate` for a replica,
`bstar.search.disagg` for a disaggregated unit), and the timing each reports. Pure."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TypeVar

MAX_EXPANSIONS = 16  # doublings/halvings to find the bracket (a factor of 65,536)
MIN_RATE_REQ_S = 1e-4
S = TypeVar("S")


def bisect_rate(run: Callable[[float], tuple[bool, S]], roof: float, rel_tol: float
                ) -> tuple[tuple[float, S] | None, tuple[float, S | None]]:
    """The bracket and bisection `bstar.search.evaluate`'s docstring describes, over
    `run(rate) -> (meets the SLO, summary)`: from `roof` (not simulated) halve until a rate
    meets the SLO, then narrow geometrically until hi / lo - 1 <= rel_tol. Returns (lo, hi):
    lo None when no rate down to MIN_RATE_REQ_S (or MAX_EXPANSIONS halvings) meets it; hi's
    summary None when hi is the roof itself. Both layouts' evaluations share it."""
    lo: tuple[float, S] | None = None
    hi: tuple[float, S | None] = (roof, None)
    rate = roof
    for _ in range(MAX_EXPANSIONS):
        ok, s = run(rate)
        if ok:
            lo = (rate, s)
            break
        hi = (rate, s)
        rate /= 2
        if rate < MIN_RATE_REQ_S:
            break
    if lo is None:
        return None, hi
    while hi[0] / lo[0] - 1 > rel_tol:
        rate = math.sqrt(lo[0] * hi[0])
        ok, s = run(rate)
        if ok:
            lo = (rate, s)
        else:
            hi = (rate, s)
    return lo, hi


def timing(t0: float, c0: float) -> dict[str, float]:
    """Wall and CPU seconds of the task where it ran (their ratio: the CPU share it got)."""
    return {"elapsed_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}
