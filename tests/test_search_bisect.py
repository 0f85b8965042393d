"""The rate search's contract (search/bisect.py): whatever the scores say, the answer is a
bracket whose low end met the SLO and whose high end missed it, within rel_tol; with
scores that follow the latency curve it takes fewer probes than plain bisection."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from bstar.search.bisect import bisect_rate


def _queue(crossing: float) -> tuple[Callable[[float], tuple[bool, float]],
                                     list[tuple[float, bool]]]:
    """A latency curve like a queue's near capacity: p99 / target = c / (cap - rate), met
    below `crossing`; every probe is logged."""
    cap = crossing * 1.25
    c = cap - crossing
    probes: list[tuple[float, bool]] = []

    def run(rate: float) -> tuple[bool, float]:
        s = c / (cap - rate) if rate < cap else math.inf
        probes.append((rate, s <= 1.0))
        return s <= 1.0, s

    return run, probes


@pytest.mark.parametrize("crossing", [0.3, 5.7, 10.6, 11.2])
@pytest.mark.parametrize("use_score", [True, False])
def test_the_bracket_holds_and_scores_save_probes(crossing: float, use_score: bool) -> None:
    run, probes = _queue(crossing)
    roof = 11.275
    lo, hi = bisect_rate(run, roof, 0.02, (lambda s: s) if use_score else None)
    assert lo is not None
    assert lo[0] <= crossing and lo[1] <= 1.0
    if hi[1] is not None:
        assert hi[0] > crossing and hi[1] > 1.0
    assert hi[0] / lo[0] - 1 <= 0.02
    if use_score:  # against plain bisection on the same curve, in simulations: a probe
        # that meets the SLO runs every draw (3), one that misses stops at the first
        run2, plain = _queue(crossing)
        bisect_rate(run2, roof, 0.02)

        def sims(p: list[tuple[float, bool]]) -> int:
            return sum(3 if ok else 1 for _, ok in p)

        assert sims(probes) < sims(plain), (probes, plain)


def test_scores_that_lie_still_converge() -> None:
    """Scores unrelated to the outcome (noise) cannot stall it: every third probe is the
    bracket's geometric midpoint."""
    rng = np.random.default_rng(0)
    probes = []

    def run(rate: float) -> tuple[bool, float]:
        probes.append(rate)
        return rate <= 3.0, float(rng.uniform(0.01, 100.0))

    lo, hi = bisect_rate(run, 100.0, 0.02, lambda s: s)
    assert lo is not None and lo[0] <= 3.0 < hi[0] and hi[0] / lo[0] - 1 <= 0.02
    assert len(probes) < 60


def test_unknown_scores_fall_back_to_halving() -> None:
    seen = []

    def run(rate: float) -> tuple[bool, None]:
        seen.append(rate)
        return rate <= 1.0, None

    lo, hi = bisect_rate(run, 8.0, 0.02, lambda s: None)
    assert seen[:4] == [8.0, 4.0, 2.0, 1.0]
    assert lo is not None and lo[0] == 1.0 and 1.0 < hi[0] <= 1.02


def test_no_rate_meets_it() -> None:
    lo, hi = bisect_rate(lambda r: (False, 5.0), 1.0, 0.02, lambda s: s)
    assert lo is None and hi[1] == 5.0
