"""A speculative run's acceptance rate read back from its measured TPOT, and fitted for one
run from the others: the one rule `bstar validate` applies to aggregated runs
(bstar.validate_runs, through the simulator) and `bench/disagg_validate.py` to
disaggregated ones (bstar.disagg_runs, through the plan). Pure: the predicted TPOT at an
acceptance is the caller's function.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping

import numpy as np


def implied_acceptance(tpot_ms: Callable[[float], float], measured_tpot_ms: float,
                       tol: float, rtol: float) -> float:
    """The acceptance rate a in [0, 1] at which a predicted mean TPOT `tpot_ms(a)` (falling
    as a rises) equals the measured one; 0 or 1 where even those miss it. The root is
    bracketed by false position with the Illinois halving, to a bracket of `tol` or a TPOT
    within `rtol` of the measured (`bstar.validate_runs` over simulated stages,
    `bstar.disagg_runs` over disaggregated plans)."""
    target = measured_tpot_ms
    lo, hi = 0.0, 1.0
    f_lo = tpot_ms(lo) - target
    if f_lo < 0:
        return 0.0
    f_hi = tpot_ms(hi) - target
    if f_hi > 0:
        return 1.0
    side = 0
    while hi - lo > tol:
        a = (lo * f_hi - hi * f_lo) / (f_hi - f_lo) if f_hi != f_lo else 0.5 * (lo + hi)
        a = min(max(a, lo + 0.1 * tol), hi - 0.1 * tol)
        f = tpot_ms(a) - target
        if abs(f) <= rtol * target:
            return a
        if f > 0:  # too slow: the root is above a
            lo, f_lo = a, f
            if side == 1:
                f_hi /= 2
            side = 1
        else:
            hi, f_hi = a, f
            if side == -1:
                f_lo /= 2
            side = -1
    return 0.5 * (lo + hi)


def leave_one_out_acceptance(name: str, implied: Mapping[str, float | None],
                             group: Mapping[str, Hashable]) -> tuple[float | None, int]:
    """The acceptance fitted for run `name` without it: the median of what the OTHER runs
    of its group (engine and draft tokens) imply (`implied`; None: gave none), and how
    many there were (None, 0 when none)."""
    others = [a for o, a in implied.items()
              if o != name and a is not None and group[o] == group[name]]
    return (float(np.median(others)) if others else None), len(others)
