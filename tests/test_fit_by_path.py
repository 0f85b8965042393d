"""`fit_stages_by_path` (issue 37, item 0): the kernel terms are fitted once per kernel path,
each from its own path's rows, and a row on a path the fit never saw prices its path's
generic ones; the fit `bench/transfer.py` and validate's leave-one-GPU-out run."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bstar.deployment import generic_kernel_terms
from bstar.runs_table import runs_from_csv
from bstar.stages_table import Stage
from bstar.validate_stages import (
    fit_stages_by_path,
    priced_by_path,
    simulate_stage,
    stage_deployment,
)
from test_validate_logo import PICKS, _table

WINDOW_S = 5.0
TRUTH = {"hopper:fp4-dequant": {"moe_layer_s": 60e-6},
         "blackwell:fp4-native": {"moe_layer_s": 20e-6}}


def _synthetic(row: Stage) -> Stage:
    """The run with its means replaced by what the simulator predicts at TRUTH's terms."""
    d = stage_deployment(row)
    got = simulate_stage(row, deployment=priced_by_path(d, d.eff, TRUTH),
                         max_window_s=WINDOW_S).values()
    return replace(row, **got)


@pytest.fixture(scope="module")
def rows() -> list[Stage]:
    return [_synthetic(r) for r in runs_from_csv(_table(PICKS[:2]))]


def test_each_path_recovers_its_own_kernel_term(rows: list[Stage]) -> None:
    assert {stage_deployment(r).kernel_path for r in rows} == set(TRUTH)
    d = stage_deployment(rows[0])
    start = replace(d.eff, moe_layer_s=0.0)
    got = fit_stages_by_path(rows, start, ("moe_layer_s",), max_window_s=WINDOW_S,
                             iterations=3, behaviour=d.behaviour)
    assert got is not None
    assert set(got.path_terms) == set(TRUTH)
    for path, terms in TRUTH.items():
        assert got.path_terms[path]["moe_layer_s"] == pytest.approx(terms["moe_layer_s"],
                                                                    rel=0.15)
    assert set(got.values(("moe_layer_s",))) == {f"moe_layer_s@{p}" for p in TRUTH}


def test_a_path_not_fitted_prices_its_generic_terms(rows: list[Stage]) -> None:
    d = stage_deployment(rows[1])  # B200
    fitted = replace(d.eff, moe_layer_s=33e-6, moe_compute=0.5)
    own = priced_by_path(d, fitted, {"blackwell:fp4-native": {"moe_layer_s": 7e-6}})
    assert own.eff.moe_layer_s == 7e-6  # its path's fitted term
    # a kernel term its path's entry does not name: the path's generic value, not eff's
    assert own.eff.moe_compute == generic_kernel_terms("blackwell:fp4-native")["moe_compute"]
    assert own.eff.int4_weight_stream == 1.0  # native FP4: the 16-bit rate
    other = priced_by_path(d, fitted, {"hopper:fp4-dequant": {"moe_layer_s": 7e-6}})
    assert (other.eff.moe_layer_s, other.eff.moe_compute) == (0.0, 1.0)  # generic
    assert other.eff.overhead_s == fitted.overhead_s  # the shared terms are the fit's
