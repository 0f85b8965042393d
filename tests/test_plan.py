"""bstar.plan's decisions that the pictures read: the SLA batch for a TPOT bound and the knee
the recommendation marks (one meaning each, wherever they are shown)."""

from __future__ import annotations

import pytest

import bstar
from bstar import roofline as rl
from bstar.deployment import Deployment
from bstar.plan import make_plan


def _llama_a100() -> Deployment:
    return Deployment(bstar.get_model("llama-3-8b"), bstar.get_gpu("a100-80gb-sxm"))


def test_sla_batch_is_the_largest_that_meets_it() -> None:
    d = _llama_a100()
    c = make_plan(d, [2048], max_tpot_ms=15.0).contexts[0]
    b = c.sla_batch
    assert b is not None and 1 <= b < c.b_mem
    tpot_ms = rl.curve(d, [b, b + 1], 2048).tpot_s * 1e3
    assert tpot_ms[0] <= 15.0 < tpot_ms[1]
    assert c.recommendation.max_num_seqs <= b
    # No batch meets it: None, as without a bound; the recommendation says which.
    unmet = make_plan(d, [2048], max_tpot_ms=1.0).contexts[0]
    assert unmet.sla_batch is None and unmet.sla_unmet
    free = make_plan(d, [2048]).contexts[0]
    assert free.sla_batch is None and not free.sla_unmet


def test_plan_dict_carries_its_bound_sla_batch_and_knee() -> None:
    d = _llama_a100()
    plan = make_plan(d, [512, 8192], max_tpot_ms=15.0)
    out = plan.to_dict()
    assert out["max_tpot_ms"] == 15.0
    for cp, cd in zip(plan.contexts, out["contexts"], strict=True):
        assert cd["sla_batch"] == cp.sla_batch
        assert cd["sla_met"] == (cp.sla_batch is not None)
        knee = cd["recommendation"]["knee"]
        assert cp.knee is not None and knee == cp.knee.to_dict()
    assert make_plan(d, [512]).to_dict()["max_tpot_ms"] is None


@pytest.mark.parametrize(("model", "gpu", "ctx", "max_tpot_ms"), [
    ("llama-3-8b", "a100-80gb-sxm", 8192, None),  # a knee binds (B = 38)
    ("llama-3-8b", "a100-80gb-sxm", 512, None),
    ("llama-3-8b", "a100-80gb-sxm", 512, 12.0),  # the SLA binds: the knee is still marked
])
def test_the_plans_knee_is_the_doubling_pick_the_recommendation_started_from(
        model: str, gpu: str, ctx: int, max_tpot_ms: float | None) -> None:
    d = Deployment(bstar.get_model(model), bstar.get_gpu(gpu))
    c = make_plan(d, [ctx], max_tpot_ms=max_tpot_ms).contexts[0]
    doubling = c.recommendation.knees["doubling"]
    assert c.knee == (doubling if doubling.batch is not None else None)
    if c.recommendation.bound == "knee":
        assert c.knee is not None and c.knee.batch == c.recommendation.max_num_seqs


def test_ideal_plan_has_no_knee() -> None:
    d = Deployment(bstar.get_model("llama-3-8b"), bstar.get_gpu("a100-80gb-sxm"),
                      engine="ideal")
    c = make_plan(d, [512]).contexts[0]
    assert c.knee is None and c.to_dict()["recommendation"]["knee"] is None


def test_plan_and_simulate_price_a_b200_at_the_same_token_budget(
        capsys: pytest.CaptureFixture[str]) -> None:
    # vLLM's defaults are one table (bstar.engine_defaults): on a GPU of 160 GiB or more
    # `vllm serve` runs 16384 batched tokens, and the plan's KV pool, its engine defaults
    # and the simulator's scheduler all read that (the scheduler used to say 8192).
    import json

    from bstar.cli import main
    from bstar.kv_pool import default_max_num_batched_tokens
    from bstar.options import DeploymentOptions

    assert main(["plan", "--gpu", "b200", "--context", "2048", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    vllm = next(e for e in plan["contexts"][0]["engine_defaults"] if e["engine"] == "vllm")
    assert main(["simulate", "--gpu", "b200", "--rate", "1", "--num-requests", "20",
                 "--json"]) == 0
    sim = json.loads(capsys.readouterr().out)
    d = DeploymentOptions(gpu="b200").build()
    assert d.gpu.memory_bytes >= 160 * 2**30
    assert vllm["max_num_batched_tokens"] == sim["max_num_batched_tokens"] \
        == default_max_num_batched_tokens(d) == 16384
    assert vllm["max_num_seqs"] == sim["max_num_seqs"] == 1024
