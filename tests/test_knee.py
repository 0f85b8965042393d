"""Knee rules. Each curve is built so that the expected answer follows from algebra done here,
not from running the rule."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bstar import knee as kn
from bstar.errors import BstarError


def roofline_curve(a_ms: float, b_ms: float, top: int) -> tuple[np.ndarray, np.ndarray]:
    """Memory-bound decode: step = a + b*B, throughput = B / step (tok/s with ms steps)."""
    batch = np.array(kn.pow2_grid(top), dtype=float)
    return batch, 1e3 * batch / (a_ms + b_ms * batch)


def first_pow2_above(x: float) -> int:
    return 2 ** (math.floor(math.log2(x)) + 1)


@pytest.mark.parametrize("threshold", [0.05, 0.2])
def test_step_rule_on_a_roofline_curve(threshold: float) -> None:
    # Amortized time A(B) = a/B + b. From B to 2B it improves by 1 - A(2B)/A(B)
    # = (a/2B) / (a/B + b) = a / (2(a + bB)), which is < t once B > a(1/(2t) - 1)/b.
    # The rule returns the later point of that step: 2B for the first such B.
    a, b = 10.0, 0.1
    batch, tput = roofline_curve(a, b, 1 << 14)
    prev = first_pow2_above(a * (1 / (2 * threshold) - 1) / b)
    k = kn.step_knee(batch, tput, threshold)
    assert k.batch == 2 * prev
    assert f"B={2 * prev}" in k.reason and "seed 000" in k.reason


def test_step_rule_does_not_fire_on_linear_throughput() -> None:
    batch = np.array([1, 2, 4, 8, 16], dtype=float)
    k = kn.step_knee(batch, 100 * batch)
    assert k.batch is None and "past the curve" in k.reason


def test_doubling_rule_on_a_roofline_curve() -> None:
    # Gain of the doubling h -> 2h: T(2h)/T(h) - 1 = a / (a + 2bh), < 15% once
    # h > 0.85 a / (0.3 b). The knee is that h (seed 004: "the point where the next doubling
    # gains under 15%").
    a, b = 10.0, 0.1
    batch, tput = roofline_curve(a, b, 1 << 14)
    expected = first_pow2_above(0.85 * a / (0.3 * b))
    k = kn.doubling_knee(batch, tput)
    assert k.batch == expected
    assert "interpolated" not in k.reason
    assert f"B={expected} -> {2 * expected}" in k.reason


def test_doubling_rule_interpolates_in_log2_batch_on_uneven_grids() -> None:
    # Throughput linear in log2(batch), so log2 interpolation is exact: T = 1000 (1 + log2 B).
    # Doubling h -> 2h gains 1 / (1 + log2 h): < 15% once log2 h > 1/0.15 - 1, h > 50.8.
    # On this grid the first B whose half is past that is B = 300 (half 150; B = 100 has
    # half 50, gain 15.06%).
    batch = np.array([1, 3, 10, 30, 100, 300, 1000], dtype=float)
    tput = 1000 * (1 + np.log2(batch))
    assert 1 / (1 + math.log2(50)) > 0.15 > 1 / (1 + math.log2(150))
    k = kn.doubling_knee(batch, tput)
    assert k.batch == 150
    assert "interpolated in log2(batch) between B=100 and B=300" in k.reason


def test_doubling_rule_threshold_is_an_option() -> None:
    a, b = 10.0, 0.1
    batch, tput = roofline_curve(a, b, 1 << 14)
    # gain a/(a + 2bh) < 0.5 once h > a / (2b)
    assert kn.doubling_knee(batch, tput, 0.5).batch == first_pow2_above(a / (2 * b))


def test_bca_rule_picks_the_last_batch_before_the_plateau() -> None:
    # Slopes to the next point: (800-100)/7 = 100, (3200-800)/24 = 100, (3300-3200)/32 = 3.1,
    # (3310-3300)/64 = 0.16 tok/s per added sequence. Default epsilon: 10% of T(1)/1 = 10.
    batch = [1, 8, 32, 64, 128]
    tput = [100, 800, 3200, 3300, 3310]
    tpot = [1e3 * b / t for b, t in zip(batch, tput, strict=True)]
    k = kn.bca_knee(batch, tput, tpot)
    assert k.batch == 32
    assert "Recasens" in k.reason
    # An absolute epsilon of 2 tok/s per sequence: the first slope under it is the last one.
    assert kn.bca_knee(batch, tput, tpot, epsilon_tok_s=2.0).batch == 64


def test_bca_latency_bound_against_the_reference_batch() -> None:
    batch = [1, 8, 32, 64, 128]
    tput = [100, 800, 3200, 3300, 3310]
    tpot = [10.0, 10.0, 10.0, 19.4, 38.7]
    # Reference B=8 (TPOT 10 ms), L = 1.5: only batches with TPOT <= 15 ms qualify. The
    # plateau starts at 32 (slope 3.1 < 10) and TPOT there is 10 ms: allowed.
    assert kn.bca_knee(batch, tput, tpot, latency_factor=1.5, reference_batch=8).batch == 32
    # With the plateau only past 64 (epsilon 1) and the bound at 15 ms, latency binds first:
    # the fallback is the largest batch within the bound, 32.
    k = kn.bca_knee(batch, tput, tpot, epsilon_tok_s=1.0, latency_factor=1.5,
                    reference_batch=8)
    assert k.batch == 32 and "latency binds" in k.reason
    # The reference is the point nearest in log2: 40 is nearest to 32 (log2 distance 0.32
    # against 0.68 to 64).
    k = kn.bca_knee(batch, tput, tpot, reference_batch=40)
    assert "reference B=32" in k.reason


def test_bca_no_plateau() -> None:
    batch = np.array([1, 2, 4, 8], dtype=float)
    k = kn.bca_knee(batch, 100 * batch, np.full(4, 10.0))
    assert k.batch is None and "plateau lies past" in k.reason


def test_sla_rule_on_a_linear_tpot() -> None:
    # TPOT = a + bB <= L  <=>  B <= (L - a)/b.
    a, b, limit = 12.0, 0.07, 30.0
    batch = np.arange(1, 1001, dtype=float)
    k = kn.slo_knee(batch, a + b * batch, limit)
    assert k.batch == math.floor((limit - a) / b)


def test_sla_rule_edges() -> None:
    batch = [1, 2, 4, 8, 16]
    # A noisy point meets the limit again after a violation: not trusted.
    k = kn.slo_knee(batch, [10, 11, 25, 19, 40], 20)
    assert k.batch == 2 and "B=8 meet it again" in k.reason
    assert kn.slo_knee(batch, [30, 31, 32, 33, 34], 20).batch is None
    k = kn.slo_knee(batch, [10, 10, 10, 10, 10], 20)
    assert k.batch == 16 and "may allow more" in k.reason
    k = kn.slo_knee(batch, [10, 10, 10, 10, 10], 20, what="p99 E2E")
    assert "p99 E2E" in k.reason


def test_all_knees_and_sorting() -> None:
    a, b = 10.0, 0.1
    batch, tput = roofline_curve(a, b, 4096)
    tpot = 1e3 * batch / tput
    order = np.argsort(-batch)  # unsorted input is sorted inside
    ks = kn.all_knees(batch[order], tput[order], tpot[order], max_tpot_ms=100.0)
    assert list(ks) == ["step", "doubling", "bca", "sla"]
    assert ks["doubling"].batch == kn.doubling_knee(batch, tput).batch
    assert ks["sla"].batch == 512  # 10 + 0.1 * 512 = 61.2 ms; at 1024: 112.4 ms
    assert set(ks["step"].to_dict()) == {"rule", "batch", "reason"}
    assert list(kn.all_knees(batch, tput)) == ["step", "doubling"]


@pytest.mark.parametrize(("batch", "tput", "msg"), [
    ([1, 2, 2], [1, 2, 3], "appears twice"),
    ([1, 2, 3], [1, 2], "differ in length"),
    ([0, 2, 3], [1, 2, 3], "positive"),
    ([1, 2, 3], [1, -2, 3], "positive"),
    ([1], [1], "at least 2"),
])
def test_bad_curves(batch: list[float], tput: list[float], msg: str) -> None:
    with pytest.raises(BstarError, match=msg):
        kn.step_knee(batch, tput)


def test_doubling_knee_skips_a_dip_followed_by_a_rise() -> None:
    from bstar.knee import doubling_knee

    # 1 -> 2 gains 10% (under 15%), but 2 -> 4 gains 50%: the curve has not flattened yet.
    batch = [1, 2, 4, 8, 16]
    tput = [100.0, 110.0, 165.0, 180.0, 185.0]
    k = doubling_knee(batch, tput)
    gains = [tput[i + 1] / tput[i] - 1 for i in range(4)]
    first_sustained = next(i for i in range(4) if all(g < 0.15 for g in gains[i:]))
    assert k.batch == batch[first_sustained] == 4
    assert "no later doubling" in k.reason
