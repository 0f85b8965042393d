"""Speculative decoding's cost model (bstar.specdec) and `bstar plan`'s speculative section."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from bstar import roofline as rl
from bstar import specdec as sd
from bstar import step as st
from bstar.cli import main
from bstar.errors import BstarError
from bstar.options import DeploymentOptions
from bstar.specs.presets import get_model


@pytest.fixture(scope="module")
def llama_h200():  # type: ignore[no-untyped-def]
    return DeploymentOptions(model="llama-3.1-8b", gpu="h200").build()


def test_expected_tokens_is_the_truncated_geometric_mean() -> None:
    assert sd.expected_tokens(0.7, 3) == pytest.approx((1 - 0.7 ** 4) / (1 - 0.7))
    assert sd.expected_tokens(0.7, 3) == pytest.approx(1 + 0.7 + 0.49 + 0.343)
    assert sd.expected_tokens(1.0, 5) == 6.0
    assert sd.expected_tokens(0.0, 5) == 1.0


def test_config_refuses_out_of_range() -> None:
    with pytest.raises(BstarError, match="num-speculative-tokens"):
        sd.SpecConfig(0, 0.7)
    with pytest.raises(BstarError, match="acceptance-rate"):
        sd.SpecConfig(3, 1.5)


def test_verify_of_one_token_is_a_decode_step(llama_h200) -> None:  # type: ignore[no-untyped-def]
    sh = st.shape(llama_h200)
    b = np.array([1.0, 64.0, 512.0])
    one = st.price(sh.verify(b, 2048, 1), llama_h200.eff)
    dec = st.price(sh.decode(b, 2048), llama_h200.eff)
    np.testing.assert_allclose(one, dec, rtol=1e-12)
    # k + 1 tokens: the weights and KV stream once, GEMM and attention FLOPs scale.
    w4 = sh.verify(b, 2048, 4)
    w1 = sh.verify(b, 2048, 1)
    np.testing.assert_allclose(w4.kv_s, w1.kv_s)
    np.testing.assert_allclose(w4.gemm_s, 4 * w1.gemm_s)
    np.testing.assert_allclose(w4.decode_attention_s, 4 * w1.decode_attention_s)


def test_issue_done_when_llama_h200(llama_h200) -> None:  # type: ignore[no-untyped-def]
    """issue 31's done-when: K = 3, a = 0.7, the default drafter (EAGLE for Llama)."""
    d = llama_h200
    dr = sd.make_drafter(d, sd.AUTO_DRAFTER)
    assert dr.kind == "eagle"
    grid = rl.default_batches(rl.b_mem(d, 512))
    s512, _ = sd.speedup(d, dr, grid, 512, 3, 0.7)
    assert s512[0] >= 1.8 and s512[-1] <= 1.0
    be = sd.break_even_batch(d, dr, 512, 3, 0.7)
    assert be is not None and 128 <= be <= 1024
    bm = rl.b_mem(d, 32768)
    s32k, _ = sd.speedup(d, dr, [bm], 32768, 3, 0.7)
    assert s32k[0] >= 1.5
    assert sd.break_even_batch(d, dr, 32768, 3, 0.7) is None


def test_break_even_falls_with_k_and_rises_with_context(llama_h200) -> None:  # type: ignore[no-untyped-def]
    d = llama_h200
    dr = sd.make_drafter(d, "eagle")
    by_k = [sd.break_even_batch(d, dr, 128, k, 0.7) for k in (1, 2, 3, 4, 6, 8)]
    assert all(b is not None for b in by_k)
    assert by_k == sorted(by_k, reverse=True) and by_k[0] > by_k[-1]
    big = rl.b_mem(d, 128) + 1
    by_ctx = [sd.break_even_batch(d, dr, c, 4, 0.7) or big for c in (128, 512, 2048, 8192)]
    assert by_ctx == sorted(by_ctx) and by_ctx[0] < by_ctx[-1]


def test_no_acceptance_never_pays(llama_h200) -> None:  # type: ignore[no-untyped-def]
    dr = sd.make_drafter(llama_h200, "eagle")
    s, _ = sd.speedup(llama_h200, dr, [1, 16, 256], 2048, 3, 0.0)
    assert np.all(s < 1.0)
    assert sd.break_even_batch(llama_h200, dr, 2048, 3, 0.0) == 1


def test_drafters_priced_from_their_own_shape(llama_h200) -> None:  # type: ignore[no-untyped-def]
    d = llama_h200
    ngram = sd.make_drafter(d, "ngram")
    assert not ngram.on_gpu and ngram.resident_bytes_per_gpu == 0
    assert np.all(sd.draft_s(ngram, [1, 64], 2048, 3) == 0.0)
    eagle = sd.make_drafter(d, "eagle")
    assert eagle.deployment is not None and eagle.deployment.model.num_layers == 1
    small = sd.make_drafter(d, "llama-3.2-1b", replace(get_model("llama-3.1-8b"), name="x"))
    # a whole 8B model as its own drafter costs more per pass than a one-layer head
    assert sd.draft_s(small, [1], 2048, 3)[0] > 5 * sd.draft_s(eagle, [1], 2048, 3)[0]
    assert sd.b_mem(d, small, 2048, 3) < sd.b_mem(d, eagle, 2048, 3) \
        <= sd.b_mem(d, ngram, 2048, 3) <= rl.b_mem(d, 2048)
    with pytest.raises(BstarError, match="multi-token-prediction"):
        sd.make_drafter(d, "mtp")
    with pytest.raises(BstarError, match="vocabulary"):
        sd.make_drafter(d, "opt", get_model("opt-1.3b"))
    ds = DeploymentOptions(model="deepseek-v3", gpu="h200", num_gpus=8).build()
    mtp = sd.make_drafter(ds, sd.AUTO_DRAFTER)
    assert mtp.kind == "mtp" and mtp.deployment is not None
    assert mtp.deployment.model.is_moe  # DeepSeek's MTP layer is an MoE layer


def test_plan_json_speculative_section(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "llama-3.1-8b", "--gpu", "h200", "--context",
                 "512,32768", "--num-speculative-tokens", "3", "--acceptance-rate", "0.7",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    c512, c32k = out["contexts"]
    s = c512["speculative"]
    assert s["num_speculative_tokens"] == 3 and s["acceptance_rate"] == 0.7
    assert s["drafter"] == "eagle"
    assert [r["batch"] for r in s["curve"]] == [r["batch"] for r in c512["curve"]]
    assert s["curve"][0]["speedup"] >= 1.8 and s["curve"][-1]["speedup"] <= 1.0
    assert 128 <= s["break_even_batch"] <= 1024
    assert "--speculative-config" in s["recommendation"]["flags"]["vllm"]
    assert "--speculative-num-steps 3" in s["recommendation"]["flags"]["sglang"]
    assert c32k["speculative"]["break_even_batch"] is None
    fits = [r for r in c32k["speculative"]["curve"] if r["batch"] <= c32k["b_mem"]]
    assert fits[-1]["speedup"] >= 1.5
    assert main(["plan", "--json"]) == 0
    assert all("speculative" not in c
               for c in json.loads(capsys.readouterr().out)["contexts"])


def test_plan_text_speculative_section(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "llama-3.1-8b", "--gpu", "h200", "--context", "512",
                 "--num-speculative-tokens", "3", "--drafter", "ngram"]) == 0
    text = capsys.readouterr().out
    assert "speculative decoding: K = 3" in text and "break-even batch" in text
    assert '"method": "ngram"' in text


def test_scheduled_step_equals_the_plan_step(llama_h200) -> None:  # type: ignore[no-untyped-def]
    d = llama_h200
    for drafter in ("eagle", "ngram"):
        dr = sd.make_drafter(d, drafter)
        for b, ctx in ((1, 512), (64, 2048), (300, 512)):
            sim = sd.scheduled_step_s(d, dr, np.full(b, ctx - 1), np.ones(b), 3)
            plan = float(sd.spec_step_s(d, dr, [b], ctx, 3)[0])
            assert sim == pytest.approx(plan, rel=1e-9)
    # a prompt chunk in the step adds its tokens to the GEMMs and the drafter's first pass
    dr = sd.make_drafter(d, "eagle")
    mixed = sd.scheduled_step_s(d, dr, [511, 511, 0], [1, 1, 256], 3)
    assert mixed > sd.scheduled_step_s(d, dr, [511, 511], [1, 1], 3)


def test_accepted_drafts_average_the_formula() -> None:
    rng = np.random.default_rng(0)
    for a, k in ((0.7, 3), (0.5, 5), (0.9, 2)):
        m = sd.accepted_drafts(rng, a, k, 200_000)
        assert m.min() >= 0 and m.max() <= k
        assert m.mean() + 1 == pytest.approx(sd.expected_tokens(a, k), rel=0.01)
    assert sd.accepted_drafts(rng, 1.0, 4, 3).tolist() == [4, 4, 4]
    assert sd.accepted_drafts(rng, 0.0, 4, 3).tolist() == [0, 0, 0]


def test_acceptance_for_inverts_expected_tokens() -> None:
    for a, k in ((0.3, 2), (0.523, 3), (0.9, 5)):
        assert sd.acceptance_for(sd.expected_tokens(a, k), k) == pytest.approx(a, abs=1e-9)
    assert sd.acceptance_for(1.0, 3) == 0.0 and sd.acceptance_for(4.0, 3) == 1.0


# vLLM 0.32.0 on CPU with n-gram speculation (K = 3), /metrics lines as served
_SPEC_METRICS = """\
vllm:generation_tokens_total{engine="0",model_name="tiny"} %d
vllm:spec_decode_num_drafts_total{engine="0",model_name="tiny"} %d
vllm:spec_decode_num_drafts_created{engine="0",model_name="tiny"} 1.7961965716630023e+09
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="tiny"} %d
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="tiny"} %d
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny",position="0"} 7.0
"""


def test_sweep_scrape_reads_the_acceptance_counters() -> None:
    from bstar.loadgen.scrape import LevelServerStats, parse_prometheus, snapshot, spec_counters

    first = snapshot(parse_prometheus(_SPEC_METRICS % (64, 14, 41, 17)))
    last = snapshot(parse_prometheus(_SPEC_METRICS % (64 + 194, 14 + 40, 41 + 120, 17 + 94)))
    assert first.spec_drafts_total == 14 and first.spec_accepted_tokens_total == 17
    st = LevelServerStats()
    spec_counters(st, first, last)
    assert (st.spec_num_drafts, st.spec_num_draft_tokens, st.spec_num_accepted_tokens) \
        == (40, 120, 94)
    assert st.spec_tokens_per_step == pytest.approx(194 / (194 - 94))
    plain = snapshot(parse_prometheus('vllm:generation_tokens_total{engine="0"} 5\n'))
    st2 = LevelServerStats()
    spec_counters(st2, plain, plain)
    assert st2.spec_tokens_per_step is None and st2.spec_num_drafts is None


def test_plan_report_refuses_speculation_by_name(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["report", "plan", "--num-speculative-tokens", "3", "-o",
                 str(tmp_path / "p.html")]) == 2
    assert "does not draw speculative decoding" in capsys.readouterr().err
    assert not (tmp_path / "p.html").exists()


def test_acceptance_from_a_sweep_run(capsys: pytest.CaptureFixture[str]) -> None:
    """`--acceptance-rate from:RUN`: the rate the sweep's /metrics counters give, pooled
    over the levels (a stored sweep --json fixture: 552 accepted of 1152 generated)."""
    path = str(Path(__file__).parent / "fixtures" / "sweep-specdec.json")
    levels = json.loads(Path(path).read_text())["levels"]
    want = sd.acceptance_for(1152 / (1152 - 552), 3)
    assert sd.acceptance_from_levels(levels, 3) == pytest.approx(want, rel=1e-9)
    assert sd.expected_tokens(want, 3) == pytest.approx(1152 / 600, rel=1e-9)
    with pytest.raises(BstarError):
        sd.acceptance_from_levels(levels[:1], 3)  # no counters: speculation was off
    assert main(["plan", "--model", "llama-3.1-8b", "--gpu", "h200", "--context", "512",
                 "--num-speculative-tokens", "3", "--acceptance-rate", f"from:{path}",
                 "--json"]) == 0
    s = json.loads(capsys.readouterr().out)["contexts"][0]["speculative"]
    assert s["acceptance_rate"] == pytest.approx(want, rel=1e-9)
    assert main(["plan", "--num-speculative-tokens", "3", "--acceptance-rate",
                 "from:no-such-run-xyz"]) != 0


def test_plan_with_a_drafter_respects_its_pool(capsys: pytest.CaptureFixture[str]) -> None:
    # Issue 41: Llama-3-70B on 4 A100s at 8k with a Llama-3-8B drafter recommended 45
    # sequences and a break-even of 51 where only B_mem with the drafter (38) fit.
    from bstar.recommend import MEMORY_HEADROOM

    assert main(["plan", "--model", "llama-3-70b", "--num-gpus", "4", "--context", "8192",
                 "--num-speculative-tokens", "4", "--drafter", "llama-3-8b", "--json"]) == 0
    c = json.loads(capsys.readouterr().out)["contexts"][0]
    s = c["speculative"]
    d = DeploymentOptions(model="llama-3-70b", num_gpus=4).build()
    dr = sd.make_drafter(d, "llama-3-8b", get_model("llama-3-8b"))
    with_drafter = sd.b_mem(d, dr, 8192, 4)
    assert s["b_mem"] == with_drafter < c["b_mem"] == rl.b_mem(d, 8192)
    assert s["recommendation"]["max_num_seqs"] <= int(MEMORY_HEADROOM * with_drafter)
    be = s["break_even_batch"]
    assert be is None or be <= with_drafter
