"""Seed 000's tables recomputed exactly. Each assertion derives its expected value from the
architecture (config values, exact bytes); where the seed's rounded figure differs, the test
pins the seed's own arithmetic slip, so docs/seeds.md stays true."""

from __future__ import annotations

import math

import pytest

from bstar import roofline as rl
from bstar.deployment import IDEAL, Deployment
from bstar.specs.gpu import get_gpu
from bstar.specs.presets import get_model

A100 = get_gpu("a100-80gb-sxm")


def dep(model: str, n: int = 1, **kw: object) -> Deployment:
    return Deployment(model=get_model(model), gpu=A100, num_gpus=n, **kw)  # type: ignore[arg-type]


def test_ridge_uses_the_pcie_bandwidth_in_the_seed() -> None:
    # Seed: 312 TFLOPS / 1.94 TB/s = 161. 1.935 TB/s is the A100 80GB *PCIe*; the SXM is 2.039.
    assert get_gpu("a100-80gb-pcie").ridge_flops_per_byte == pytest.approx(312e12 / 1.935e12)
    assert A100.ridge_flops_per_byte == pytest.approx(312e12 / 2.039e12)
    assert round(A100.ridge_flops_per_byte) == 153


def test_seed_kv_units_are_kib_and_mib() -> None:
    d = dep("llama-3-8b")
    assert rl.kv_bytes_per_token(d) == 128 * 2**10  # the seed's "128 KB" is KiB
    assert rl.kv_bytes_per_seq(d, 512) == 64 * 2**20  # "64 MB" is MiB


def test_b_star_llama3_8b_is_239_not_256() -> None:
    d = dep("llama-3-8b")
    w = 2 * get_model("llama-3-8b").num_params  # 8,030,261,248 params in bf16
    for ctx in (512, 2048, 8192):
        assert rl.b_star(d, ctx) == pytest.approx(w / (ctx * 128 * 2**10))
    # The seed divides "16 GB" by "64 MB" as if both were the same kind of unit.
    assert math.floor(rl.b_star(d, 512)) == 239


def test_mha_13b_and_70b_ratios() -> None:
    b8, b13 = rl.b_star(dep("llama-3-8b"), 512), rl.b_star(dep("llama-2-13b"), 512)
    b70 = rl.b_star(dep("llama-3-70b", 4), 512)
    m13, m70 = get_model("llama-2-13b"), get_model("llama-3-70b")
    assert b13 == pytest.approx(2 * m13.num_params / (512 * 2 * 40 * 128 * 40 * 2))
    assert b70 == pytest.approx(2 * m70.num_params / (512 * 2 * 8 * 128 * 80 * 2))
    assert 3.4 < b70 / b8 < 3.6  # the seed's 3.4x survives exact counts
    assert b8 / b13 == pytest.approx(3.86, abs=0.01)  # the seed's "4x"


def test_arithmetic_intensity_limit_is_not_30() -> None:
    """Seed: AI(inf) = 2P / kv_per_seq 'roughly 30' for Llama-3-8B. At 512 tokens it is ~228,
    above the A100 ridge (153): short-context decode *can* turn compute-bound."""
    d = dep("llama-3-8b", eff=IDEAL)
    m = d.model
    per_seq_flops = 2 * m.matmul_params_per_token + m.attention_flops_per_token(512)
    ai_inf = per_seq_flops / rl.kv_bytes_per_seq(d, 512)
    big = rl.decode_step(d, [10**7], 512).arithmetic_intensity[0]
    assert big == pytest.approx(ai_inf, rel=1e-3)
    assert ai_inf > A100.ridge_flops_per_byte
    assert rl.compute_crossover(d, 512) is not None
    assert rl.compute_crossover(d, 8192) is None  # long context: memory-bound at any batch


def test_b_mem_three_ways() -> None:
    d = dep("llama-3-8b")
    kv = 64 * 2**20
    # The seed's own function: 80e9 bytes x 0.9 - 16e9 -> 834 (it comments "-> 900").
    assert int((80e9 * 0.9 - 16e9) / kv) == 834
    # Device memory 80 GiB, exact weights, no reserve:
    no_reserve = Deployment(model=d.model, gpu=A100, reserve_bytes=0)
    assert rl.b_mem(no_reserve, 512) == (math.floor(A100.memory_bytes * 0.9)
                                         - rl.weight_bytes(d)) // kv
    # bstar's default keeps 2 GiB for activations/graphs/context:
    assert rl.b_mem(d, 512) == (math.floor(A100.memory_bytes * 0.9) - rl.weight_bytes(d)
                                - 2 * 2**30) // kv
    assert rl.b_mem(no_reserve, 512) - rl.b_mem(d, 512) == 2 * 2**30 // kv


def test_70b_on_4_gpus_b_star_meets_b_mem() -> None:
    d = dep("llama-3-70b", 4)
    for ctx in (2048, 8192):
        assert 0.85 < rl.b_star(d, ctx) / rl.b_mem(d, ctx) < 0.95


def test_w4a16_moves_b_star_down_by_less_than_4x() -> None:
    bf16, int4 = dep("llama-3-8b"), dep("llama-3-8b", weight_dtype="int4")
    # 4-bit linears + group scales, but embeddings/LM head stay 16-bit: W shrinks ~3.2x.
    assert 3.0 < rl.weight_bytes(bf16) / rl.weight_bytes(int4) < 3.4
    assert 3.0 < rl.b_star(bf16, 512) / rl.b_star(int4, 512) < 3.4
