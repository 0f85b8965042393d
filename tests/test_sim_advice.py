"""The simulated sweep's recommendation: load-limited, knee, SLA."""

from __future__ import annotations

import pytest

from bstar.deployment import Deployment
from bstar.sim import Lengths, Poisson, Slo, parse_lengths, simulate_levels
from bstar.sim.advice import advise
from bstar.specs.gpu import get_gpu
from bstar.specs.presets import get_model

D = Deployment(model=get_model("llama-3-8b"), gpu=get_gpu("a100-80gb-sxm"))
LEVELS = [8, 32, 128, 512]


def test_light_load_picks_the_smallest_cap_that_never_binds() -> None:
    rows = simulate_levels(D, LEVELS, Poisson(4.0), Lengths.fixed(512), Lengths.fixed(128),
                           200, seed=0)
    a = advise(rows)
    assert a.bound == "load"
    chosen = next(r for r in rows if r.max_num_seqs == a.max_num_seqs)
    assert chosen.running_max < a.max_num_seqs
    # Every smaller level either bound its cap or served less.
    for r in rows:
        if r.max_num_seqs < a.max_num_seqs:
            assert r.running_max == r.max_num_seqs


def test_overload_uses_the_knee_rules() -> None:
    rows = simulate_levels(D, LEVELS, Poisson(40.0), Lengths.fixed(512), Lengths.fixed(256),
                           400, seed=0)
    a = advise(rows)
    assert a.bound == "knee"
    assert a.max_num_seqs in {k.batch for k in a.knees.values()}


def test_sla_caps_the_knee() -> None:
    rows = simulate_levels(D, LEVELS, Poisson(40.0), Lengths.fixed(512), Lengths.fixed(256),
                           400, seed=0)
    free = advise(rows)
    tpot_p99 = {r.max_num_seqs: r.tpot_ms["p99"] for r in rows}
    limit = (tpot_p99[8] + tpot_p99[32]) / 2  # only the smallest level meets it
    capped = advise(rows, Slo(tpot_ms=limit))
    assert capped.max_num_seqs == 8 < free.max_num_seqs and capped.bound == "sla"
    unmet = advise(rows, Slo(tpot_ms=tpot_p99[8] / 2))
    assert unmet.bound == "sla-unmet"


@pytest.mark.slow  # simulates a sweep past B_mem
def test_regime_3_regression_is_not_recommended() -> None:
    """Past the KV pool throughput falls; the recommendation stays below the fall."""
    rows = simulate_levels(Deployment(model=D.model, gpu=D.gpu, gpu_util=0.3),
                           [16, 32, 64, 128, 256], Poisson(60.0), parse_lengths("1024"),
                           parse_lengths("uniform:64:512"), 400, seed=1)
    a = advise(rows)
    best = max(rows, key=lambda r: r.throughput_tok_s)
    assert any(r.preemptions for r in rows)
    assert a.max_num_seqs <= best.max_num_seqs
