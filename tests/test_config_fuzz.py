"""The config parser never crashes: any JSON object gives a ModelSpec or a BstarError."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bstar.errors import BstarError
from bstar.specs.model import from_hf_config
from bstar.specs.precision import get_precision
from bstar.specs.presets import get_model

KEYS = ["model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size",
        "num_local_experts", "num_experts_per_tok", "kv_lora_rank", "q_lora_rank",
        "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "sliding_window",
        "tie_word_embeddings", "torch_dtype", "ffn_dim", "max_position_embeddings",
        "n_routed_experts", "moe_intermediate_size", "first_k_dense_replace", "layer_types"]
values = st.one_of(st.none(), st.booleans(), st.integers(-10, 1 << 20),
                   st.floats(allow_nan=True), st.text(max_size=8),
                   st.sampled_from(["llama", "opt", "mixtral", "deepseek_v3", "gemma2"]),
                   st.lists(st.sampled_from(["sliding_attention", "full_attention"]),
                            max_size=4))


def _check(cfg: object) -> None:
    try:
        m = from_hf_config(cfg, name="fuzz")  # type: ignore[arg-type]
    except BstarError:
        return
    bf16 = get_precision("bf16")
    assert m.num_params > 0
    # 16-bit weights: two bytes per parameter, whatever the architecture.
    assert m.weight_bytes(bf16) == 2 * m.num_params
    assert m.num_active_params <= m.num_params
    # A sequence holds a fixed state plus at most one token's KV per token of context
    # (sliding windows hold fewer): linear without windows, concave with them.
    state = m.kv_bytes_per_seq(0, bf16)
    per_token = m.kv_bytes_per_token(bf16)
    kv = {n: m.kv_bytes_per_seq(n, bf16) - state for n in (1, 128, 256)}
    assert 0 <= kv[1] <= per_token
    assert kv[128] <= 128 * per_token and kv[128] <= kv[256] <= 2 * kv[128]
    if m.config.get("sliding_window") is None and not m.config.get("layer_types"):
        assert kv[128] == 128 * kv[1]


@pytest.mark.slow  # a second or more on the 2-core machine; the fast loop stays under a minute
@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.sampled_from(KEYS), values, max_size=len(KEYS)))
def test_random_configs_never_crash(cfg: dict) -> None:
    _check(cfg)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["llama-3-8b", "mixtral-8x7b", "deepseek-v3", "gemma-2-9b", "opt-1.3b"]),
       st.sampled_from(KEYS), values)
def test_mutated_real_configs_never_crash(pid: str, key: str, value: object) -> None:
    cfg = dict(get_model(pid).config)
    cfg[key] = value
    _check(json.loads(json.dumps(cfg, default=str)))


@given(st.one_of(st.lists(st.integers()), st.text(), st.integers()))
def test_non_objects_are_rejected(cfg: object) -> None:
    try:
        from_hf_config(cfg, name="fuzz")  # type: ignore[arg-type]
    except BstarError:
        return
    raise AssertionError("accepted a non-object config")
