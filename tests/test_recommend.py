"""One recommendation vocabulary: the curve policy and the SLO parser shared by the sweep,
the simulator and the fit."""

from __future__ import annotations

import pytest

from bstar.errors import BstarError
from bstar.knee import Knee
from bstar.recommend import Recommendation, SloBound, recommend
from bstar.slo import Slo, parse_slo

BATCHES = [1, 2, 4, 8, 16, 32]
KNEES = {"step": Knee("step", 16, "step reason"), "doubling": Knee("doubling", 8, "dbl"),
         "bca": Knee("bca", 2, "bca reason")}


def test_the_earliest_throughput_knee_of_the_sources_rules_wins() -> None:
    r = Recommendation.from_curve("measured", BATCHES, KNEES)
    assert (r.max_num_seqs, r.bound, r.rule) == (8, "knee", "doubling")  # bca not a rule
    assert r.reason == "measured knee (doubling rule): dbl"
    assert Recommendation.from_curve("simulated", BATCHES, KNEES).reason.startswith(
        "throughput knee (doubling rule)")
    only_step = {**KNEES, "doubling": Knee("doubling", None, "no")}
    assert Recommendation.from_curve("measured", BATCHES, only_step).max_num_seqs == 16
    # The fitted curve follows the doubling rule alone.
    assert Recommendation.from_curve("fitted", BATCHES, only_step).bound == "none"


def test_no_knee_gives_the_largest_batch_in_the_sources_words() -> None:
    none = {k: Knee(k, None, f"{k} never fires") for k in ("step", "doubling")}
    m = Recommendation.from_curve("measured", BATCHES, none)
    assert (m.max_num_seqs, m.bound) == (32, "sweep_end") and "step never fires" in m.reason
    s = Recommendation.from_curve("simulated", BATCHES, none)
    assert (s.max_num_seqs, s.bound) == (32, "max-level")


def test_the_tightest_slo_caps_and_an_unmet_one_gives_the_smallest_batch() -> None:
    loose, tight = SloBound(Knee("sla", 16, "loose")), SloBound(Knee("sla", 4, "tight"))
    r = Recommendation.from_curve("measured", BATCHES, KNEES, [loose, tight])
    assert (r.max_num_seqs, r.bound, r.reason) == (4, "sla", "SLO: tight (unconstrained: 8)")
    assert Recommendation.from_curve("measured", BATCHES, KNEES, [loose]).bound == "knee"
    unmet = SloBound(Knee("sla", None, "even 1 misses"), "p99 TPOT <= 5 ms")
    u = Recommendation.from_curve("simulated", BATCHES, KNEES, [loose, unmet])
    assert (u.max_num_seqs, u.bound) == (1, "sla-unmet")
    assert u.reason == "no level meets p99 TPOT <= 5 ms: even 1 misses"
    # With no throughput knee, the fit's SLA knee is its pick even at the grid's end.
    none = {"doubling": Knee("doubling", None, "")}
    f = Recommendation.from_curve("fitted", BATCHES, none, [SloBound(Knee("sla", 32, "ok"))])
    assert (f.max_num_seqs, f.rule) == (32, "sla")



def test_the_marked_knee_is_the_throughput_rules_pick_whatever_bound_the_recommendation(
        ) -> None:
    """`Recommendation.knee`, which every picture marks: the knee a knee-bound pick
    followed; under an SLO or the load, the one it would have followed; none when no
    throughput rule fired (and then no `knee` in `to_dict()`)."""
    r = Recommendation.from_curve("measured", BATCHES, KNEES)
    assert r.knee == KNEES["doubling"] and r.to_dict()["knee"] == KNEES["doubling"].to_dict()
    capped = Recommendation.from_curve("measured", BATCHES, KNEES,
                                       [SloBound(Knee("sla", 4, "tight"))])
    assert capped.bound == "sla" and capped.knee == KNEES["doubling"]
    loaded = Recommendation.from_curve("simulated", BATCHES, KNEES, load=(4, "load"))
    assert loaded.knee == KNEES["doubling"] and "knee" in loaded.to_dict(knees=True)
    none = {k: Knee(k, None, "") for k in ("step", "doubling")}
    end = Recommendation.from_curve("measured", BATCHES, none)
    assert end.knee is None and "knee" not in end.to_dict()
    # The cost model marks the doubling pick it started from, even when memory binds.
    mem = Recommendation.from_cost_model(10.0, 20, knees={"doubling": Knee("doubling", 64, "d")})
    assert mem.bound == "b_mem" and mem.knee == Knee("doubling", 64, "d")
    assert Recommendation.from_cost_model(40.0, 100).knee is None  # --ideal: no knees

def test_load_bound_pick_wins_over_knees() -> None:
    r = Recommendation.from_curve("simulated", BATCHES, KNEES, load=(4, "load words"))
    assert (r.max_num_seqs, r.bound, r.reason) == (4, "load", "load words")


def test_cost_model_constructor_is_recommend() -> None:
    assert recommend(40.0, 100) == Recommendation.from_cost_model(40.0, 100)
    assert recommend(90.0, 100).bound == "b_mem"
    assert Recommendation.from_cost_model(40.0, 100).to_dict() == {
        "max_num_seqs": 40, "reason": recommend(40.0, 100).reason, "bound": "b_star"}


@pytest.mark.parametrize("text", ["ttft:500,tpot:50,e2e:3000", "ttft_ms:500, tpot=50,E2E:3000"])
def test_one_slo_parser(text: str) -> None:
    s = parse_slo(text)
    assert s == Slo(ttft_ms=500, tpot_ms=50, e2e_ms=3000)
    assert s.by_metric() == {"ttft": 500, "tpot": 50, "e2e": 3000}
    assert Slo.coerce(s.by_metric()) == Slo.coerce(s.to_dict()) == s


def test_empty_slo_and_bad_items() -> None:
    assert parse_slo(None).empty and parse_slo("").empty and parse_slo(" , ").empty
    for bad in ("ttft", "itl:5", "tpot:x", "tpot:-1", "tbt:4", "e2e:0"):
        with pytest.raises(BstarError):
            parse_slo(bad)


# ---- the cost model's pick: the knee of the predicted curve -----------------------------------
def _plan(**kw: object) -> object:
    from bstar.deployment import Deployment
    from bstar.plan import make_plan
    from bstar.specs.gpu import get_gpu
    from bstar.specs.presets import get_model

    d = Deployment(get_model("llama-3-8b"), get_gpu(str(kw.pop("gpu", "h200"))),
                      engine="vllm", **kw)  # type: ignore[arg-type]
    return d, make_plan(d, (512, 2048, 8192))


def test_plan_recommends_the_predicted_knee_and_keeps_b_star() -> None:
    import numpy as np

    from bstar import roofline as rl

    d, plan = _plan()
    for c in plan.contexts:  # type: ignore[attr-defined]
        rec = c.recommendation
        k = rec.max_num_seqs
        if rec.bound != "knee":
            continue
        # Checked on the predicted curve itself: the doubling out of the knee gains < 15%,
        # and so does every later one up to twice B_mem; the one into it gained more.
        grid = np.array([k / 2, k, 2 * k, 4 * k, 8 * k])
        tput = np.interp(grid, *_throughput(d, c.context_tokens, c.b_mem))
        gains = tput[1:] / tput[:-1] - 1
        assert gains[1] < 0.15 and all(g < 0.15 for g in gains[1:]), (c.context_tokens, gains)
        assert gains[0] >= 0.15 * 0.9, (c.context_tokens, gains)  # grid interpolation slack
        assert k <= 0.85 * c.b_mem
        assert c.to_dict()["recommendation"]["b_star"] == pytest.approx(
            rl.b_star(d, c.context_tokens))
        assert set(rec.knees) == {"doubling", "step"}
    # The knee is past B* at every context of this plan: B* is only where saturation begins.
    assert all(c.recommendation.max_num_seqs > c.b_star  # type: ignore[attr-defined]
               for c in plan.contexts[1:])  # type: ignore[attr-defined]


def _throughput(d: object, ctx: int, b_mem: int) -> tuple[object, object]:
    import numpy as np

    from bstar import roofline as rl

    b = np.arange(1, 16 * b_mem + 1)
    return b, rl.curve(d, b, ctx).throughput_tok_s  # type: ignore[arg-type]


def test_a_knee_past_b_mem_band_is_capped_at_85_percent() -> None:
    # A100 with 50 GiB kept out of the pool: at 8192 tokens B_mem is 7, and throughput still
    # rises steeply through it (weight-dominated), so its knee lies at B_mem itself.
    _, plan = _plan(gpu="a100-80gb-sxm", reserve_bytes=50 * 2**30)
    c = plan.contexts[-1]  # type: ignore[attr-defined]
    assert c.recommendation.bound == "b_mem"
    assert c.recommendation.max_num_seqs == max(1, int(0.85 * c.b_mem))


def test_ideal_keeps_the_seeds_b_star_rule() -> None:
    from bstar.options import DeploymentOptions
    from bstar.plan import make_plan

    d = DeploymentOptions(ideal=True).build()
    for c in make_plan(d, (2048, 8192)).contexts:
        assert c.recommendation.bound in ("b_star", "b_mem", "compute")
        if c.recommendation.bound == "b_star":
            assert c.recommendation.max_num_seqs == int(c.b_star)
