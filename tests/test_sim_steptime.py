"""The simulator's mixed-step pricing reduces exactly to the roofline's decode and prefill."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from bstar import roofline as rl
from bstar.deployment import IDEAL, Deployment
from bstar.sim.steptime import coefficients
from bstar.specs.gpu import get_gpu
from bstar.specs.presets import get_model

MODELS = ["llama-3-8b", "mixtral-8x7b", "gemma-2-9b", "deepseek-v3", "opt-1.3b"]


def dep(model: str, num_gpus: int = 1) -> Deployment:
    return Deployment(model=get_model(model), gpu=get_gpu("h100-sxm"), num_gpus=num_gpus)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("num_gpus", [1, 8])
@pytest.mark.parametrize("context", [1, 700, 5000])
def test_pure_decode_step_equals_roofline(model: str, num_gpus: int, context: int) -> None:
    d = dep(model, num_gpus)
    k = coefficients(d)
    for batch in (1, 7, 256):
        # Sequences holding context-1 tokens compute their next one: context tokens of KV.
        got = k.batch_step_s(np.full(batch, context - 1), np.ones(batch))
        want = float(rl.decode_step(d, [batch], context).step_s[0])
        assert got == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("model", ["llama-3-8b", "mixtral-8x7b", "gemma-2-9b", "opt-1.3b"])
@pytest.mark.parametrize("num_gpus", [1, 4])
@pytest.mark.parametrize("prompt", [2, 512, 9000])
def test_whole_prompt_prefill_equals_roofline(model: str, num_gpus: int, prompt: int) -> None:
    d = dep(model, num_gpus)
    k = coefficients(d)
    got = k.batch_step_s([0], [prompt])
    # One price of a step (bstar.step): a prefill is the step that runs the prompt.
    want = rl.prefill_s(d, prompt, 1)
    assert got == pytest.approx(want, rel=1e-12)


def test_chunked_prefill_costs_the_same_attention_as_whole() -> None:
    """Causal attention split into chunks sums to the whole triangle (full attention)."""
    d = replace(dep("llama-3-8b"), eff=IDEAL)
    k = coefficients(d)
    whole = k.shape.scheduled([0], [4096]).chunk_attention_at_gemm_rate_s[0]
    starts = np.arange(0, 4096, 512)
    parts = sum(k.shape.scheduled([s], [512]).chunk_attention_at_gemm_rate_s[0]
                for s in starts)
    assert whole > 0
    assert parts == pytest.approx(whole, rel=1e-12)


def test_mixed_step_is_dearer_than_either_part() -> None:
    d = dep("llama-3-8b")
    k = coefficients(d)
    dec = k.batch_step_s(np.full(64, 1000), np.ones(64))
    pre = k.batch_step_s([0], [2048])
    both = k.batch_step_s(np.r_[np.full(64, 1000), 0], np.r_[np.ones(64), 2048])
    assert both > max(dec, pre)
    assert both < dec + pre  # the weights are read once for both


@pytest.mark.parametrize("model", ["llama-3-8b", "gemma-2-9b", "mixtral-8x7b"])
def test_decode_run_matches_step_by_step(model: str) -> None:
    """The simulator's multi-step jump prices each step as a one-step call would."""
    k = coefficients(dep(model))
    rng = np.random.default_rng(3)
    start = rng.integers(1, 9000, size=37)
    run = k.decode_run_step_s(start, 50)
    for j in (0, 1, 17, 49):
        assert run[j] == pytest.approx(k.batch_step_s(start + j, np.ones(37)), rel=1e-12)
