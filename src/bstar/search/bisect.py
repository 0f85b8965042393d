"""The rate search both layouts' evaluations share (`bstar.search.evaluate` for a replica,
`bstar.search.disagg` for a disaggregated unit), and the timing each reports. Pure.

The answer is the bracket [lo, hi] with lo meeting the SLO (on every draw), hi missing it
(or the roof, never simulated), and hi / lo - 1 <= rel_tol. Where each probe goes is free:
any probe inside the bracket keeps that contract. Geometric bisection needs about six
probes to narrow a factor of two to 2%, and a probe that meets the SLO costs every draw (3
simulations by default) where one that misses stops at the first draw that misses.

So, given each probe's *score* (the worst p99 / target over the SLO's terms: below 1 it
meets it; `score`), the probes go where the score crosses 1 (issue 41's search speed):

- below the roof, the next probe is hi / score(hi) (a p99 30% over its target: hi / 1.3),
  between hi / 2 and hi / (1 + rel_tol): a far miss still halves, as plain bisection did;
- inside the bracket, the crossing is interpolated between lo and hi with 1 / score linear
  in the rate (regula falsi; a queue's latency grows as 1 / (capacity - rate)), and the
  probe is put a third of rel_tol past it on the side the last probe did not move, so that
  the next probe likely closes the bracket from the other side (a miss there costs one
  simulation);
- every third probe, or when a score is not known (a run left unfinished), the probe is
  the geometric midpoint: the bracket shrinks at least as fast as bisection every three
  probes, whatever the scores do.

The search against a dense sweep of simulations (tests/test_search.py) holds either way;
`bench/sim_capacity_bench.py` prints the simulations one candidate takes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TypeVar

MAX_EXPANSIONS = 16  # halvings (or steps) to find the bracket (at least a factor of 65,536)
MIN_RATE_REQ_S = 1e-4
S = TypeVar("S")


def _crossing(lo: float, s_lo: float, hi: float, s_hi: float) -> float | None:
    """The rate where the score crosses 1 on the line through (lo, 1 / s_lo) and
    (hi, 1 / s_hi): a queue's latency grows as 1 / (capacity - rate), so its inverse is
    close to linear in the rate; None when the scores do not bracket 1."""
    if not (0 < s_lo < 1 < s_hi and math.isfinite(s_hi)):
        return None
    y0, y1 = 1.0 / s_lo, 1.0 / s_hi
    return lo + (y0 - 1.0) * (hi - lo) / (y0 - y1)


def bisect_rate(run: Callable[[float], tuple[bool, S]], roof: float, rel_tol: float,
                score: Callable[[S], float | None] | None = None
                ) -> tuple[tuple[float, S] | None, tuple[float, S | None]]:
    """The largest rate that meets the SLO, bracketed (module docstring), over
    `run(rate) -> (meets the SLO, summary)` from `roof` (not simulated) down. `score(summary)`
    places the probes (None: plain halving and bisection). Returns (lo, hi): lo None when no
    rate down to MIN_RATE_REQ_S (or MAX_EXPANSIONS steps) meets it; hi's summary None when hi
    is the roof itself."""
    def sc(s: S | None) -> float | None:
        v = None if score is None or s is None else score(s)
        return v if v is not None and v > 0 and math.isfinite(v) else None

    lo: tuple[float, S] | None = None
    hi: tuple[float, S | None] = (roof, None)
    rate = roof
    for _ in range(MAX_EXPANSIONS):
        ok, s = run(rate)
        if ok:
            lo = (rate, s)
            break
        hi = (rate, s)
        miss = sc(s)
        step = 0.5 if miss is None else min(max(1.0 / miss, 0.5), 1.0 / (1.0 + rel_tol))
        rate *= step
        if rate < MIN_RATE_REQ_S:
            break
    if lo is None:
        return None, hi
    probes = 0
    last_ok = True  # the bracket's last move: lo (a probe met the SLO) or hi
    while hi[0] / lo[0] - 1 > rel_tol:
        probes += 1
        mid = math.sqrt(lo[0] * hi[0])
        s_lo, s_hi = sc(lo[1]), sc(hi[1])
        guess = (None if probes % 3 == 0 or s_lo is None or s_hi is None
                 else _crossing(lo[0], s_lo, hi[0], s_hi))
        if guess is None:
            rate = mid
        else:
            # past the crossing on the side the last probe did not move, inside the bracket
            nudge = (1.0 + rel_tol / 3.0) ** (1 if last_ok else -1)
            edge = 1.0 + rel_tol / 4.0
            rate = min(max(guess * nudge, lo[0] * edge), hi[0] / edge)
        ok, s = run(rate)
        if ok:
            lo = (rate, s)
        else:
            hi = (rate, s)
        last_ok = ok
    return lo, hi


def timing(t0: float, c0: float) -> dict[str, float]:
    """Wall and CPU seconds of the task where it ran (their ratio: the CPU share it got)."""
    return {"elapsed_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}
