"""Percentiles and SLO checks, written once (bstar.stats, bstar.slo.Slo.met) and used by the
sweep's levels and the simulator alike."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bstar.loadgen.client import RequestRecord
from bstar.loadgen.metrics import slo_met
from bstar.loadgen.metrics import summarize as level_stats
from bstar.slo import Slo, parse_slo
from bstar.stats import no_stats, percentile, percentiles, percentiles_ms, weighted_percentiles


def test_percentiles_are_numpys_linear_rule() -> None:
    rng = np.random.default_rng(3)
    for n in (1, 2, 7, 1000):
        x = rng.exponential(0.2, n)
        got = percentiles(x)
        for p in (50, 90, 99):
            assert got[f"p{p}"] == float(np.percentile(x, p))  # exactly: the same call
            assert percentile(x, p) == got[f"p{p}"]
        assert got["mean"] == float(x.mean())
        # Seconds in, ms out, the same from an array and from a generator.
        assert percentiles_ms(x) == percentiles(x * 1e3) == percentiles_ms(v for v in x)
    assert percentiles([]) == no_stats() == {"p50": None, "p90": None, "p99": None,
                                             "mean": None}
    assert math.isnan(percentile([], 50))


def test_weighted_percentiles_are_the_expanded_arrays() -> None:
    v, w = np.array([3.0, 1.0, 2.0, 5.0]), np.array([2, 0, 5, 1])
    got, full = weighted_percentiles(v, w), percentiles(np.repeat(v, w))
    assert got == pytest.approx(full, rel=1e-12)


def test_slo_met_is_at_most_each_objective_and_nan_fails() -> None:
    slo = parse_slo("ttft:500,tpot:50")
    ok = slo.met([0.5, 0.5001, 0.1, math.nan, 0.1], [0.05, 0.0, 0.0501, 0.0, math.nan],
                 [9.0, 9.0, 9.0, 9.0, 9.0])
    assert ok.tolist() == [True, False, False, False, False]
    assert Slo().met([math.nan], [math.nan], [math.nan]).tolist() == [True]  # none set
    assert Slo(e2e_ms=1000).met([], [], []).shape == (0,)


def _rec(i: int, ttft: float | None, e2e: float | None, out: int) -> RequestRecord:
    return RequestRecord(index=i, ok=True, start_s=0.0, ttft_s=ttft, e2e_s=e2e, itl_s=[],
                         prompt_tokens=10, output_tokens=out, token_source="usage")


def test_a_level_counts_goodput_with_the_same_check() -> None:
    # One token: no TPOT, the TTFT objective still applies; a TTFT not measured fails.
    recs = [_rec(0, 0.1, 1.1, 11), _rec(1, 0.1, 0.1, 1), _rec(2, 0.6, 0.6, 1),
            _rec(3, None, 1.0, 11), _rec(4, 0.1, 3.1, 11)]
    slo = parse_slo("ttft:500,tpot:150")
    assert slo_met(recs, slo) == 2  # 0 and 1
    assert level_stats(recs, 2.0, slo).goodput_req_s == pytest.approx(1.0)
    assert level_stats(recs, 2.0).ttft_ms == percentiles_ms([0.1, 0.1, 0.6, 0.1])
