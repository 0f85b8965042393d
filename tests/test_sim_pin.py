"""The simulator's outputs on small fixed cases equal what the code before the speed work
(issue 41, item 5) gave: tests/data/sim_pin.json, written by `python tests/sim_pin_cases.py
--write` at the commit it names. Counts and per-request token counts must match exactly,
times to a relative 1e-12 (float noise from a reordered sum, not a changed rule). A key the
pin does not hold is an output added since (issue 39's energy per level: `power_w_mean`,
`joules_per_output_token`), listed in ADDED; any other new or missing key fails."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from sim_pin_cases import CASES, PIN

PINNED = json.loads(PIN.read_text())
# Summary keys added after the pin was written (issue 39, energy).
ADDED = {"power_w_mean", "joules_per_output_token"}


def _same(got: Any, want: Any, where: str) -> None:
    if isinstance(want, dict):
        assert isinstance(got, dict) and sorted(set(got) - ADDED) == sorted(want), where
        for k in want:
            _same(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _same(g, w, f"{where}[{i}]")
    elif isinstance(want, float) and not isinstance(got, bool):
        assert isinstance(got, int | float), where
        assert math.isclose(got, want, rel_tol=1e-12, abs_tol=1e-15), \
            f"{where}: {got!r} != {want!r}"
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


def test_every_case_is_pinned() -> None:
    assert sorted(PINNED["cases"]) == sorted(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_outputs_equal_the_pinned_ones(name: str) -> None:
    _same(CASES[name](), PINNED["cases"][name], name)


def test_the_comparison_can_fail() -> None:
    """A moved time or count is caught (the pin is not vacuous)."""
    want = PINNED["cases"]["poisson"]
    moved = json.loads(json.dumps(want))
    moved["finish_s"][3] *= 1 + 1e-9
    with pytest.raises(AssertionError):
        _same(moved, want, "poisson")
    moved = json.loads(json.dumps(want))
    moved["num_steps"] += 1
    with pytest.raises(AssertionError):
        _same(moved, want, "poisson")
