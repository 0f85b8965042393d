"""Expert parallel and attention data parallel in the step price (issue 38): each EP rank
reads its own experts and the step waits for the busiest one (an expected maximum, not the
mean); attention DP ranks hold their own sequences' KV, so MLA's unsplit latent KV fits DP x
the sequences; a runs row with EP / DP is scored, not skipped; the engines' spellings of the
flags lay out the same deployment."""

from __future__ import annotations

import argparse
import math
from dataclasses import replace

import numpy as np
import pytest

from bstar import roofline as rl
from bstar import step
from bstar.commands.common import parallel_layout
from bstar.errors import BstarError
from bstar.options import DeploymentOptions
from bstar.runs_table import runs_from_csv
from bstar.validate_runs import score_runs

DSV3 = DeploymentOptions(model="deepseek-v3", gpu="h200", num_gpus=8, weight_dtype="",
                         kv_dtype="fp8", gpu_util=0.9)


def _d(**kw):
    return replace(DSV3, **kw).build()


def test_ep_rank_holds_and_reads_its_experts_only() -> None:
    one = DeploymentOptions(model="qwen3-30b-a3b", gpu="h200", num_gpus=1).build()
    two = replace(one, num_gpus=2, expert_parallel=2, data_parallel=2)
    s1, s2 = step.shape(one), step.shape(two)
    # a GPU holds half the experts: half the expert bytes, read in full once all are touched
    assert s2.expert_weight_s == pytest.approx(s1.expert_weight_s / 2, rel=1e-12)
    many = 1e5
    assert float(s2.expert_read_fraction(many)) == pytest.approx(1.0)
    held = rl.weight_bytes_per_gpu(two)
    dense, expert, embed = one.model.weight_bytes_parts(one.weight)
    assert held == math.ceil(dense + embed + expert / 2)  # attention DP 2: dense in full
    # at a few tokens the busiest rank touches more of its experts than the mean rank
    few = 4
    assert float(s2.expert_read_fraction(few)) > float(
        step.expert_fraction_read(few, s2.top_k, s2.num_experts))


def test_routing_imbalance_is_an_expected_max_that_tends_to_the_mean() -> None:
    k, e, r = 8, 256, 8
    t = np.array([1, 4, 16, 64, 256, 1024, 4096, 65536], dtype=float)
    ratio = step.routed_tokens_max_ratio(t, k, e, r)
    assert np.all(ratio >= 1.0) and np.all(np.diff(ratio) < 0)
    assert ratio[-1] < 1.02 and ratio[0] > 1.5
    assert float(step.routed_tokens_max_ratio(64, k, e, 1)) == 1.0
    frac = step.experts_touched_max_fraction(t, k, e, r)
    mean = step.expert_fraction_read(t, k, e)
    assert np.all(frac >= mean - 1e-12) and np.all(frac <= 1.0)
    assert frac[-1] == pytest.approx(1.0)
    # the normal approximation against routing drawn at random (seeded): top-8 of 256
    # experts, 8 ranks of 32, 64 tokens; the mean over draws of the busiest rank's tokens
    rng = np.random.default_rng(7)
    trials, tokens = 400, 64
    picks = np.argsort(rng.random((trials, tokens, e)), axis=2)[:, :, :k]
    per_rank = np.stack([(picks // (e // r) == j).sum(axis=(1, 2)) for j in range(r)])
    drawn = per_rank.max(axis=0).mean() / (tokens * k / r)
    assert float(step.routed_tokens_max_ratio(tokens, k, e, r)) == pytest.approx(drawn,
                                                                                rel=0.05)


def test_ep_step_waits_for_the_busiest_rank() -> None:
    tp, ep = _d(), _d(expert_parallel=8)
    a, b = step.shape(tp), step.shape(ep)
    small = step.price(b.decode(8, 2048), ep.eff)[0] / step.price(a.decode(8, 2048), tp.eff)[0]
    large = step.price(b.decode(2048, 2048), ep.eff)[0] \
        / step.price(a.decode(2048, 2048), tp.eff)[0]
    assert small > large > 1.0 and large < 1.02


def test_attention_dp_multiplies_the_mla_batch_a_node_holds() -> None:
    tp, dp = _d(), _d(data_parallel=8, expert_parallel=8)
    ctx = 2048
    # MLA's latent KV is not split by TP: one GPU holds a sequence's whole latent either way
    assert rl.kv_bytes_per_seq_allocated(tp, ctx) == rl.kv_bytes_per_seq_allocated(
        replace(tp, num_gpus=1), ctx)
    one_gpu_pool = rl.kv_pool_bytes(dp) // 8
    assert one_gpu_pool < rl.kv_pool_bytes(tp)  # each rank holds the dense weights in full
    assert rl.b_mem(dp, ctx) == 8 * one_gpu_pool // rl.kv_bytes_per_seq_allocated(dp, ctx)
    assert rl.b_mem(dp, ctx) > 4 * rl.b_mem(tp, ctx)
    # a decode step reads 1/8 of the batch's KV on each GPU
    s_tp, s_dp = step.shape(tp), step.shape(dp)
    assert s_dp.groups[0].kv_s_per_token == pytest.approx(s_tp.groups[0].kv_s_per_token / 8)


def test_layout_must_divide_the_gpus() -> None:
    with pytest.raises(BstarError, match="divide"):
        _d(expert_parallel=3)
    with pytest.raises(BstarError, match="divide"):
        _d(data_parallel=16)


ROW = ("run,model,gpu,num_gpus,expert_parallel,dp_attention,data_parallel,engine,"
       "max_num_seqs,max_num_batched_tokens,concurrency,num_prompts,prompt_len_min,"
       "prompt_len_max,output_len_min,output_len_max,ttft_mean_ms,tpot_mean_ms,e2e_mean_ms,"
       "source\n"
       "dp,qwen3-30b-a3b,h200,2,2,true,2,vllm,8,8192,4,8,100,128,30,32,60,8,300,test\n"
       "tp,qwen3-30b-a3b,h200,2,1,false,,vllm,8,8192,4,8,100,128,30,32,60,8,300,test\n")


def test_a_runs_row_with_ep_and_dp_is_scored_not_skipped() -> None:
    runs = runs_from_csv(ROW, "t")
    assert (runs[0].expert_parallel, runs[0].dp_attention, runs[0].data_parallel) == \
        (2, True, 2)
    v = score_runs(runs, lomo=False, logo=False)
    d = v.to_dict()
    assert d["skipped"] == []
    (g,) = d["groups"]
    scored = {s["stage"]: s for s in g["stages"]}
    assert set(scored) == {"dp", "tp"}
    assert scored["dp"]["predicted"]["profile"]["tpot_mean_ms"] > 0
    # the layout reaches the simulated deployment: the two rows are priced apart
    assert scored["dp"]["predicted"]["profile"]["tpot_mean_ms"] != pytest.approx(
        scored["tp"]["predicted"]["profile"]["tpot_mean_ms"], rel=1e-6)


@pytest.mark.parametrize(("flags", "want"), [
    ({"num_gpus": 2, "data_parallel_size": 4}, (8, 1, 4)),  # vLLM: TP 2 x DP 4
    ({"num_gpus": 2, "data_parallel_size": 4, "enable_expert_parallel": True}, (8, 8, 4)),
    ({"num_gpus": 8, "enable_dp_attention": True}, (8, 1, 8)),  # SGLang --tp 8 --dp 8
    ({"num_gpus": 8, "data_parallel_size": 4, "enable_dp_attention": True,
      "expert_parallel_size": 8}, (8, 8, 4)),
    ({"num_gpus": 8}, (8, 1, 1)),
])
def test_engine_spellings_lay_out_one_deployment(flags: dict, want: tuple) -> None:
    ns = argparse.Namespace(**{"data_parallel_size": 1, "enable_dp_attention": False,
                               "expert_parallel_size": None, "enable_expert_parallel": False,
                               **flags})
    got = parallel_layout(ns)
    assert (got["num_gpus"], got["expert_parallel"], got["data_parallel"]) == want


def test_runs_table_refuses_a_layout_that_does_not_divide() -> None:
    bad = ROW.replace("dp,qwen3-30b-a3b,h200,2,2,true,2", "dp,qwen3-30b-a3b,h200,2,2,true,3")
    with pytest.raises(BstarError, match="data_parallel 3"):
        runs_from_csv(bad, "t")


def test_search_replicas_take_the_layout_where_it_divides() -> None:
    from bstar.search.candidates import layout_size

    assert layout_size(0, 8, 256) == 8  # --enable-expert-parallel: all the replica's GPUs
    assert layout_size(8, 4, 256) == 1  # does not divide a replica of 4: left at 1
    assert layout_size(4, 8, 256) == 4
    assert layout_size(3, 6, 256) == 1  # 256 experts do not split 3 ways
    assert layout_size(0, 8, 0) == 8  # attention DP: no experts to divide


SPEC = ("run,model,gpu,num_gpus,engine,max_num_seqs,max_num_batched_tokens,concurrency,"
        "num_prompts,prompt_len_min,prompt_len_max,output_len_min,output_len_max,"
        "ttft_mean_ms,tpot_mean_ms,e2e_mean_ms,spec_method,num_speculative_tokens,source\n"
        "a,qwen3-30b-a3b,h200,1,vllm,8,8192,4,8,100,128,60,64,60,8,300,eagle,2,test\n"
        "b,qwen3-30b-a3b,h200,1,vllm,8,8192,8,16,100,128,60,64,60,8,300,eagle,2,test\n")


def test_implied_acceptance_inverts_the_simulated_tpot_and_is_fitted_leave_one_out() -> None:
    from bstar.validate_runs import implied_acceptance, speculation
    from bstar.validate_stages import simulate_stage

    a, b = runs_from_csv(SPEC, "t")
    assert a.spec_method == "eagle" and a.num_speculative_tokens == 2
    # a run measured at what the simulator gives at acceptance 0.6 implies about 0.6
    tpot_a = simulate_stage(replace(a, acceptance_rate=0.6)).tpot_mean_ms
    tpot_b = simulate_stage(replace(b, acceptance_rate=0.3)).tpot_mean_ms
    a, b = replace(a, tpot_mean_ms=tpot_a), replace(b, tpot_mean_ms=tpot_b)
    assert implied_acceptance(a) == pytest.approx(0.6, abs=0.03)
    # each run is scored at the acceptance the OTHER run implies, never its own
    rows, _, skipped = speculation([a, b])
    used = {r["stage"]: r for r in rows}
    assert used["a"]["acceptance"] == pytest.approx(used["b"]["implied_acceptance"])
    assert used["b"]["acceptance"] == pytest.approx(used["a"]["implied_acceptance"])
    assert used["a"]["implied_acceptance"] > used["b"]["implied_acceptance"]
    assert used["a"]["predicted_speedup"] > 0 and skipped == []
    # a stated acceptance wins; a lone run with none is skipped, not given a constant
    rows, _, _ = speculation([a, b], acceptance=0.5)
    assert {r["acceptance"] for r in rows} == {0.5}
    _, _, skipped = speculation([a])
    assert [s["stage"] for s in skipped] == ["a"]
