"""Parameter counts computed from each bundled config.json against published figures."""

from __future__ import annotations

import pytest

from bstar.specs.presets import get_model, model_index

PRESETS = sorted(model_index())


@pytest.mark.parametrize("pid", PRESETS)
def test_total_params_match_published(pid: str) -> None:
    info = model_index()[pid]
    m = get_model(pid)
    # Exact published counts must match to 0.5%; rounded ones to the unit of their last digit.
    tol = max(0.005 * info.published_params, info.published_rounding)
    assert abs(m.num_params - info.published_params) <= tol, (m.num_params, info)


@pytest.mark.parametrize("pid", PRESETS)
def test_active_params_match_published(pid: str) -> None:
    info = model_index()[pid]
    m = get_model(pid)
    tol = max(0.005 * info.published_active_params, info.published_active_rounding)
    active = m.num_active_params
    if info.active_convention == "no-input-embedding":
        active -= sum(t.params for t in m.tensors() if t.name == "embed_tokens")
    assert abs(active - info.published_active_params) <= tol, (active, info)


def test_llama3_8b_is_exact() -> None:
    # HF safetensors metadata of Meta-Llama-3-8B: {"BF16": 8030261248}
    assert get_model("llama-3-8b").num_params == model_index()["llama-3-8b"].published_params


def test_architecture_kinds() -> None:
    assert get_model("llama-2-13b").attention_kind == "MHA"
    assert get_model("llama-3-8b").attention_kind == "GQA-4"
    assert get_model("deepseek-v3").attention_kind == "MLA"
    assert get_model("mixtral-8x7b").is_moe and get_model("mixtral-8x7b").num_experts == 8
    assert get_model("gemma-2-9b").tie_word_embeddings
    assert not get_model("opt-1.3b").mlp_gated


def test_aliases_and_hf_repo_resolve() -> None:
    assert get_model("meta-llama/Meta-Llama-3-8B").name == "llama-3-8b"
    assert get_model("LLAMA-3-8B").name == "llama-3-8b"
