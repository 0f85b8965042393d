"""The knee rules skip a blip: a step under the threshold counts only if no later step still
gains it. The demo's noisy curve (a busy machine: 36.8, 36.3, 40.3, 53.0, 57.3 tok/s over
concurrency 1-16) must not recommend 2, through the path the report's headline card takes."""

from __future__ import annotations

from bstar import knee
from bstar.loadgen.sweep import LevelResult, SweepResult, verdict
from bstar.report.build import sweep_report
from bstar.report.views import sweep_view

DEMO_BATCH = [1, 2, 4, 8, 16]
DEMO_TPUT = [36.8, 36.3, 40.3, 53.0, 57.3]


def _level(i: int, c: int, tput: float) -> LevelResult:
    tpot = 1e3 * c / tput  # ms between tokens per request at that throughput
    lat = {"p50": tpot, "p90": tpot, "p99": tpot, "mean": tpot}
    stats = {"completed": 20, "requests": 20, "errors": 0, "throughput_tok_s": tput,
             "tpot_ms": lat, "ttft_ms": lat, "e2e_ms": lat, "itl_ms": lat}
    return LevelResult(i, c, None, None, "done", None, 1, stats, None, None, None)


def test_step_rule_skips_the_blip_on_the_demo_curve() -> None:
    k = knee.step_knee(DEMO_BATCH, DEMO_TPUT)
    assert k.batch is None  # 1 -> 2 loses 1.4%, but 2 -> 4 gains 11%, 8 -> 16 gains 7.5%
    assert "B=2 (-1.4%)" in k.reason and "blip" in k.reason
    assert knee.doubling_knee(DEMO_BATCH, DEMO_TPUT).batch == 8


def test_a_step_under_the_threshold_with_no_later_gain_is_still_the_knee() -> None:
    # the same blip, then a true plateau: the knee is the first step of the plateau
    k = knee.step_knee([1, 2, 4, 8, 16, 32], [36.8, 36.3, 40.3, 53.0, 54.0, 54.5])
    assert k.batch == 16 and "blip" in k.reason


def test_bca_skips_a_flat_slope_followed_by_a_steep_one() -> None:
    b, t = [1, 2, 4, 8, 16], [10.0, 10.1, 20.0, 40.0, 41.0]
    tpot = [1e3 * x / y for x, y in zip(b, t, strict=True)]
    assert knee.bca_knee(b, t, tpot, latency_factor=100).batch == 8


def test_demo_curve_headline_card_is_the_real_knee() -> None:
    levels = [_level(i, c, t) for i, (c, t) in enumerate(zip(DEMO_BATCH, DEMO_TPUT,
                                                             strict=True))]
    knees, rec = verdict(levels, {})
    assert knees["rules"]["step"]["batch"] is None
    assert rec is not None and rec["max_num_seqs"] == 8 and rec["bound"] == "knee"
    run = {"id": "r1", "status": "done", "options": {}}
    s = SweepResult("r1", ":memory:", run, levels, knees, rec).to_dict()
    card = sweep_report(sweep_view(s)).cards[0]
    assert card.label.startswith("measured recommendation") and card.value == "8"


def test_bca_on_the_demo_curve_agrees_with_the_doubling_rule() -> None:
    # Issue 41: BCA put the demo curve's measured knee at 1 (epsilon 10% of T(1)/1 = 3.68
    # tok/s per sequence, over every slope of the curve, 4 -> 8's 31% gain included) while
    # the doubling rule and the fitted curve say 8. Epsilon is now 10% of T(B)/B at the
    # batch judged: B=1's flat slope is a blip (4 -> 8 still gains), 8 -> 16 is the plateau.
    tpot = [1e3 * x / y for x, y in zip(DEMO_BATCH, DEMO_TPUT, strict=True)]
    knees = knee.all_knees(DEMO_BATCH, DEMO_TPUT, tpot)
    assert knees["bca"].batch == knees["doubling"].batch == 8
    slope_8 = (DEMO_TPUT[4] - DEMO_TPUT[3]) / (DEMO_BATCH[4] - DEMO_BATCH[3])
    assert slope_8 < 0.1 * DEMO_TPUT[3] / DEMO_BATCH[3]  # under epsilon there
    assert slope_8 < 0.1 * DEMO_TPUT[0] / DEMO_BATCH[0]  # and under the old one too
