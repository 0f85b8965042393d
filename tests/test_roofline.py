"""The cost model against hand derivations from the architecture (not the seeds' rounding)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from bstar import roofline as rl
from bstar.deployment import IDEAL, Deployment, Efficiency
from bstar.errors import BstarError
from bstar.kv_pool import kv_bytes_per_seq_allocated
from bstar.specs.gpu import get_gpu
from bstar.specs.precision import get_precision
from bstar.specs.presets import get_model
from bstar.step import allreduce_rounds, expert_fraction_read

A100 = get_gpu("a100-80gb-sxm")


def dep(model: str = "llama-3-8b", **kw: object) -> Deployment:
    return Deployment(model=get_model(model), gpu=kw.pop("gpu", A100), **kw)  # type: ignore[arg-type]


def test_llama3_8b_sizes() -> None:
    d = dep()
    m = d.model
    kv_per_token = 2 * m.num_kv_heads * m.head_dim * m.num_layers * 2  # K and V, bf16
    assert (m.num_kv_heads, m.head_dim, m.num_layers) == (8, 128, 32)
    assert rl.kv_bytes_per_token(d) == kv_per_token == 128 * 1024
    assert rl.kv_bytes_per_seq(d, 512) == 512 * kv_per_token
    assert rl.weight_bytes(d) == 2 * m.num_params
    assert rl.b_star(d, 512) == pytest.approx(2 * m.num_params / (512 * kv_per_token))


def test_b_mem_follows_vllm_accounting() -> None:
    d = dep()
    pool = math.floor(A100.memory_bytes * 0.9) - rl.weight_bytes(d) - 2 * 2**30
    assert rl.kv_pool_bytes(d) == pool
    assert rl.b_mem(d, 512) == pool // (512 * rl.kv_bytes_per_token(d))
    # Blocks of 16 tokens: a 500-token sequence costs 32 blocks, like 512 tokens.
    assert rl.b_mem(d, 500) == rl.b_mem(d, 512)


def test_seed_000_function_reproduced_exactly() -> None:
    """Seed 000's own bstar(16e9, 8, 128, 32, 512) says '-> 256'; its arithmetic gives 238."""
    kv_per_seq = 2 * 8 * 128 * 32 * 512 * 2
    assert int(16e9 / kv_per_seq) == 238
    # and its b_mem(80, 16e9, ...) says '-> 900'; with 80e9 bytes it is 834.
    assert int((80e9 * 0.9 - 16e9) / kv_per_seq) == 834


def test_ideal_batch1_step_is_weights_over_bandwidth() -> None:
    d = dep(eff=IDEAL)
    c = rl.decode_step(d, [1], 512)
    expected = (c.weight_bytes_read[0] + c.kv_bytes_read[0]) / A100.hbm_bandwidth_bytes_s
    assert c.step_s[0] == pytest.approx(expected)
    # Untied input embedding: only the looked-up row is read, the LM head in full.
    dense, _, _embed = d.model.weight_bytes_parts(d.weight)
    assert c.weight_bytes_read[0] == pytest.approx(dense + d.model.hidden_size * 2)


def test_tpot_amortized_and_throughput_are_consistent() -> None:
    d = dep()
    cv = rl.curve(d, [1, 8, 64, 200], 2048)
    np.testing.assert_allclose(cv.amortized_s_per_token * cv.batch, cv.step_s)
    np.testing.assert_allclose(cv.throughput_tok_s, cv.batch / cv.step_s)
    np.testing.assert_allclose(cv.tpot_s, cv.step_s)  # below B_mem, per-request = step


def test_past_b_mem_throughput_is_capped_and_regime_says_so() -> None:
    d = dep()
    bm = rl.b_mem(d, 8192)
    cv = rl.curve(d, [bm, bm + 1, 4 * bm], 8192)
    assert cv.regime[1:] == ("memory-exhausted", "memory-exhausted")
    assert cv.throughput_tok_s[2] == pytest.approx(cv.throughput_tok_s[0])
    assert cv.tpot_s[2] == pytest.approx(4 * cv.tpot_s[0])


def test_compute_crossover_matches_the_closed_form_for_dense() -> None:
    d = dep(eff=IDEAL)
    ctx = 512
    one = rl.decode_step(d, [1], ctx)
    f = float(one.flops[0]) / A100.bf16_flops  # s per sequence of compute
    kv = float(one.kv_bytes_read[0]) / A100.hbm_bandwidth_bytes_s
    # weight read grows by one embedding row per sequence: fold it into the per-seq term
    w0 = float(rl.weight_bytes_read(d, np.array([0.0]))[0]) / A100.hbm_bandwidth_bytes_s
    row = d.model.hidden_size * 2 / A100.hbm_bandwidth_bytes_s
    closed = w0 / (f - kv - row)
    assert rl.compute_crossover(d, ctx) == pytest.approx(closed, rel=1e-6)
    cv = rl.curve(d, [math.floor(closed), math.ceil(closed) + 1], ctx)
    assert cv.regime == ("kv-dominated", "compute-bound") or cv.regime[1] == "compute-bound"


def test_long_context_never_turns_compute_bound() -> None:
    assert rl.compute_crossover(dep(), 8192) is None


def test_moe_reads_fewer_weights_at_small_batch() -> None:
    d = dep("mixtral-8x7b", num_gpus=2)
    m = d.model
    frac = expert_fraction_read(np.array([1, 1000]), m.num_experts_per_tok, m.num_experts)
    assert frac[0] == pytest.approx(2 / 8)
    assert frac[1] == pytest.approx(1.0)
    r = rl.weight_bytes_read(d, np.array([1.0, 1000.0]))
    assert r[0] < 0.45 * rl.weight_bytes_per_gpu(d) < r[1]
    assert rl.b_star_read(d, 512) < rl.b_star(d, 512)


def test_tensor_parallel_splits_weights_and_kv_and_adds_allreduce() -> None:
    d1, d4 = dep("llama-3-70b", num_gpus=4), dep("llama-3-70b", num_gpus=8)
    assert rl.weight_bytes_per_gpu(d1) == math.ceil(rl.weight_bytes(d1) / 4)
    assert kv_bytes_per_seq_allocated(d4, 2048) * 2 == kv_bytes_per_seq_allocated(d1, 2048)
    assert rl.decode_step(d1, [8], 2048).comm_s[0] > 0
    # 16 GPUs > 8 KV heads: each GPU keeps one head, KV no longer shrinks.
    d16 = dep("llama-3-70b", num_gpus=16)
    assert kv_bytes_per_seq_allocated(d16, 2048) == kv_bytes_per_seq_allocated(d4, 2048)


def test_allreduce_latency_grows_with_log2_of_the_tp_size() -> None:
    """A decode all-reduce is latency: log2(N) rounds, so the per-call latency doubles
    from TP=2 to TP=4 and triples at TP=8; the bandwidth part is the ring's 2(N-1)/N."""
    # The step's communication term, decode_step's comm_s: per_token x B + calls x latency
    # (a batch of 0 runs no step, so the latency is what is left at B = 1).
    def comm_s(d: Deployment, batch: float) -> float:
        return float(rl.decode_step(d, np.array([batch]), 512).comm_s[0])

    def latency_s(d: Deployment) -> float:
        return comm_s(d, 1.0) - (comm_s(d, 17.0) - comm_s(d, 1.0)) / 16

    calls = {n: latency_s(dep("llama-3-70b", num_gpus=n))
             / (2 * 80 * Efficiency().allreduce_latency_s) for n in (2, 4, 8)}
    assert calls == pytest.approx({2: 1.0, 4: 2.0, 8: 3.0})
    assert allreduce_rounds(1) == 0.0
    d = dep("llama-3-70b", num_gpus=4)
    msg = 16 * 8192 * 2
    extra = comm_s(d, 17.0) - comm_s(d, 1.0)
    assert extra == pytest.approx(2 * 80 * 1.5 * msg / (d.gpu.interconnect_bytes_s / 2))


def test_sliding_window_caps_kv() -> None:
    d = dep("mistral-7b")
    assert rl.kv_bytes_per_seq(d, 8192) == rl.kv_bytes_per_seq(d, 4096)
    g = dep("gemma-2-9b")  # half the layers slide over 4096 tokens
    per_layer = 2 * g.model.num_kv_heads * g.model.head_dim * 2
    expected = per_layer * (21 * 8192 + 21 * 4096)
    assert rl.kv_bytes_per_seq(g, 8192) == expected


def test_mla_caches_the_latent() -> None:
    d = dep("deepseek-v3", num_gpus=8, gpu=get_gpu("h200"))
    m = d.model
    assert rl.kv_bytes_per_token(d) == m.num_layers * (m.kv_lora_rank + m.qk_rope_head_dim) * 2


def test_int4_counts_group_scales() -> None:
    d = dep(weight_dtype="int4")
    p = get_precision("int4")
    # 4 bits per weight plus (16-bit scale + 4-bit zero) per 128 inputs of each row
    assert p.tensor_bytes(4096, 4096) == 4096 * 4096 // 2 + 4096 * 32 * 20 // 8
    assert rl.weight_bytes(d) < rl.weight_bytes(dep()) * 0.35
    assert rl.b_star(d, 512) < rl.b_star(dep(), 512) / 2.5


def test_fp8_kv_doubles_b_star() -> None:
    assert rl.b_star(dep(kv_dtype="fp8"), 512) == pytest.approx(2 * rl.b_star(dep(), 512))


def test_bad_settings_are_user_errors() -> None:
    with pytest.raises(BstarError):
        dep(num_gpus=0)
    with pytest.raises(BstarError):
        dep(gpu_util=1.5)
    with pytest.raises(BstarError):
        dep(kv_dtype="int3")
    with pytest.raises(BstarError):
        rl.curve(dep(), [0, 4], 512)
    with pytest.raises(BstarError):
        replace(Efficiency(), bandwidth=0)


@pytest.mark.parametrize("model", ["gemma-2-9b", "opt-1.3b", "qwen3-30b-a3b", "deepseek-v3"])
def test_every_family_plans_on_arrays(model: str) -> None:
    # In bf16 every parameter is 2 bytes (a quantized checkpoint keeps routers and the LM
    # head 16-bit beside its 8-bit experts), so bytes follow parameters exactly.
    d = dep(model, num_gpus=8, gpu=get_gpu("h200"), weight_dtype="bf16")
    r = rl.weight_bytes_read(d, np.array([1.0, 64.0]))
    per_gpu = rl.weight_bytes_per_gpu(d)
    m, cfg = d.model, d.model.config
    if m.num_active_params == m.num_params:
        # Dense: every step streams every weight, at any batch.
        assert r == pytest.approx([per_gpu, per_gpu], rel=1e-6)
    else:
        # MoE at batch 1: the active parameters (the routed top-k experts, the shared part)
        # less the input embedding table, which a step looks up a row of, not streams.
        emb = 0 if cfg.get("tie_word_embeddings") else cfg["vocab_size"] * cfg["hidden_size"]
        active = (m.num_active_params - emb) * rl.weight_bytes(d) / m.num_params / 8
        assert r[0] == pytest.approx(active, rel=0.005)
        # 64 sequences route to more experts, never to more than all of them.
        assert r[0] < r[1] < per_gpu
    # A prefill can beat neither the GPUs' peak FLOP/s over its 2 x active params x tokens,
    # nor the bandwidth over the weights each GPU reads once.
    flops_s = 2 * m.num_active_params * 1024 / (8 * d.gpu.peak_flops(d.weight.compute))
    assert rl.prefill_s(d, 1024) >= max(flops_s, r[0] / d.gpu.hbm_bandwidth_bytes_s)
    assert rl.prefill_s(d, 2048) > rl.prefill_s(d, 1024)
    cv = rl.curve(d, [1, 16, 256], 2048)
    assert np.all(np.diff(cv.throughput_tok_s) >= 0)
