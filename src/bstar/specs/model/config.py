"""A ModelSpec from a Hugging Face `config.json`: `from_hf_config` maps each family's keys to
the spec's fields; `load_config_file` reads one from disk, `fetch_hub_config` from the hub.

A layer kind, quantization method or memory-relevant key bstar does not model is refused
with a one-line error naming it, unless `assume_unmodeled` (BSTAR_ASSUME_UNMODELED=1) says
to proceed on the stated assumption.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bstar.errors import BstarError
from bstar.specs.model import layout
from bstar.specs.model.keys import ASSUME_HINT, MAX_LAYERS, integer, positive
from bstar.specs.model.quant import quantization
from bstar.specs.model.spec import ModelSpec
from bstar.specs.model.tensors import Tensor
from bstar.specs.precision import get_precision

# Keys that change what a sequence holds or what the weights are, in layouts bstar does not
# model: refused by name (docs/models.md), unless assume_unmodeled.
_UNMODELED = {
    "cross_attention_layers": "cross-attention layers",
    "num_kv_shared_layers": "layers that share another layer's KV cache",
    "layers_block_type": "a per-layer block list",
    "attn_layer_indices": "a per-layer block list",
    "mamba_d_ssm": "parallel attention and SSM in every block",
    "global_attn_every_n_layers": "alternating global/local attention",
    "altup_num_inputs": "per-layer embeddings and AltUp",
    "kv_lora_rank_per_layer": "per-layer latent ranks",
    "compress_ratios": "compressed attention",
}
# Families whose SSM / linear-attention keys bstar reads.
_STATE_FAMILIES = ("qwen3_next", "nemotron_h", "granitemoehybrid", "jamba", "bamba")


def from_hf_config(cfg: Mapping[str, Any], *, name: str = "model", source: str = "",
                   assume_unmodeled: bool = False) -> ModelSpec:
    """Build a ModelSpec from a parsed Hugging Face config.json. A layer kind, quantization
    method or memory-relevant key it does not model raises a one-line BstarError naming it;
    `assume_unmodeled` proceeds instead (unknown layer kinds as full attention, unknown
    quantization as the config's torch_dtype, unmodeled keys ignored)."""
    where = source or name
    if not isinstance(cfg, Mapping):
        raise BstarError(f"{where}: config must be a JSON object")
    cfg, vision = _text_config(cfg, where)
    mt = str(cfg.get("model_type", "llama"))
    _check_unmodeled(cfg, mt, where, assume_unmodeled)
    max_pos = _max_positions(cfg, where)
    if mt == "opt":
        return _from_opt(cfg, name, where, assume_unmodeled)
    h = integer(cfg, where, "hidden_size", "n_embd", "d_model")
    blocks = cfg.get("layers_block_type", cfg.get("hybrid_override_pattern"))
    n_layers = integer(cfg, where, "num_hidden_layers", "n_layer", "num_layers",
                       default=len(blocks) if mt == "nemotron_h"
                       and isinstance(blocks, list | str) else None)
    if n_layers > MAX_LAYERS:
        raise BstarError(f"{where}: num_hidden_layers = {n_layers} is out of range "
                         f"(1..{MAX_LAYERS:,})")
    n_heads = positive(cfg, where, "num_attention_heads", "n_head")
    n_kv = integer(cfg, where, "num_key_value_heads", "num_kv_heads", default=n_heads)
    head_dim = integer(cfg, where, "head_dim", "attention_head_dim", default=h // n_heads)
    kw: dict[str, Any] = {}
    if mt.startswith("deepseek") or cfg.get("kv_lora_rank"):
        kw |= _mla(cfg, where)
        head_dim = kw["qk_nope_head_dim"] + kw["qk_rope_head_dim"]
    kinds, window, chunk = layout.layer_kinds(cfg, mt, n_layers, max_pos, where,
                                              assume_unmodeled)
    mlp_kinds = layout.mlp_kinds(cfg, mt, n_layers, where)
    if all(k == "none" for k in kinds):
        raise BstarError(f"{where}: no layer attends or holds a state (every layer is an MLP)")
    n_exp = integer(cfg, where, "num_local_experts", "n_routed_experts", "num_experts",
                    default=0)
    if n_exp:
        kw |= _moe(cfg, mt, where, n_exp, mlp_kinds)
    elif mlp_kinds and "moe" in mlp_kinds:
        raise BstarError(f"{where}: MoE layers without an expert count (n_routed_experts)")
    inter = integer(cfg, where, "intermediate_size", "ffn_dim", "n_inner",
                    default=kw.get("moe_intermediate_size", 4 * h))
    inter = _family_widths(cfg, mt, where, inter, n_exp, kw)
    if "mamba" in kinds:
        kw |= layout.mamba_sizes(cfg, mt, h, where)
    act = _act_dtype(cfg)
    # vLLM keeps Nemotron-H's recurrent state in float32 unless the config says otherwise
    # (NemotronHForCausalLMConfig.DEFAULT_MAMBA_SSM_CACHE_DTYPE); others in the model dtype.
    ssm_default = "float32" if mt == "nemotron_h" else None
    kw["state_bits"] = (get_precision(act).bits, _dtype_bits(
        cfg.get("mamba_ssm_cache_dtype", ssm_default), act, where))
    quant = quantization(cfg, where, act, assume_unmodeled)
    qkv_bias = bool(cfg.get("attention_bias", False)) or mt in ("qwen2", "qwen2_moe")
    gemma = mt.startswith("gemma2") or mt.startswith("gemma3")
    act_fn = str(cfg.get("mlp_hidden_act") or cfg.get("hidden_act") or "silu")
    simple = all(k in ("full", "sliding") for k in kinds)
    return ModelSpec(
        name=name, model_type=mt, hidden_size=h, num_layers=n_layers, num_heads=n_heads,
        num_kv_heads=n_kv, head_dim=head_dim,
        vocab_size=integer(cfg, where, "vocab_size"), intermediate_size=inter,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", mt.startswith("gemma"))),
        mlp_gated=act_fn not in ("relu", "gelu_new_ungated", "relu2"),
        mlp_bias=bool(cfg.get("mlp_bias", False)) or mt == "gpt_oss",
        qkv_bias=qkv_bias, o_bias=bool(cfg.get("attention_bias", False)),
        norms_per_layer=4 if gemma else 1 if mt == "nemotron_h" else 2,
        qk_norm=mt in ("qwen3", "qwen3_moe", "gemma3", "gemma3_text", "qwen3_next"),
        sliding_window=window,
        sliding_layers=tuple(k == "sliding" for k in kinds) if simple and window else (),
        layer_kinds=() if simple else kinds, mlp_kinds=mlp_kinds, attention_chunk=chunk,
        attn_sinks=mt == "gpt_oss", vision=vision, act_dtype=act, **quant,
        source=source, config=dict(cfg), **kw)


def _text_config(cfg: Mapping[str, Any], where: str
                 ) -> tuple[Mapping[str, Any], tuple[Tensor, ...]]:
    """A multimodal wrapper's text config (its dtype and quantization_config carried over)
    and the vision tower's tensors; any other config as it is, with no vision tower."""
    if "text_config" not in cfg or "hidden_size" in cfg:
        return cfg, ()
    tc = cfg["text_config"]
    if not isinstance(tc, Mapping):
        raise BstarError(f"{where}: 'text_config' must be a JSON object, got "
                         f"{type(tc).__name__}")
    vision = layout.vision_tensors(cfg, where)
    return {**tc, "torch_dtype": tc.get("torch_dtype") or cfg.get("torch_dtype"),
            "quantization_config": cfg.get("quantization_config")
            or tc.get("quantization_config")}, vision


def _max_positions(cfg: Mapping[str, Any], where: str) -> int:
    max_pos = cfg.get("max_position_embeddings")
    if max_pos is not None and (isinstance(max_pos, bool) or not isinstance(max_pos, int | float)
                                or not math.isfinite(max_pos) or max_pos != int(max_pos)
                                or not 0 <= max_pos <= 1 << 40):
        raise BstarError(f"{where}: 'max_position_embeddings' must be a non-negative integer, "
                         f"got {max_pos!r}")
    return int(max_pos or 0)


def _mla(cfg: Mapping[str, Any], where: str) -> dict[str, Any]:
    """DeepSeek's multi-head latent attention, V3.2's sparse-attention indexer and the
    multi-token-prediction layers its checkpoint ships."""
    kw: dict[str, Any] = dict(
        kv_lora_rank=integer(cfg, where, "kv_lora_rank"),
        q_lora_rank=integer(cfg, where, "q_lora_rank", default=0),
        qk_nope_head_dim=integer(cfg, where, "qk_nope_head_dim"),
        qk_rope_head_dim=integer(cfg, where, "qk_rope_head_dim"),
        v_head_dim=integer(cfg, where, "v_head_dim"))
    if cfg.get("index_topk"):
        kw |= dict(index_heads=integer(cfg, where, "index_n_heads"),
                   index_head_dim=integer(cfg, where, "index_head_dim"),
                   index_topk=integer(cfg, where, "index_topk"))
    kw["mtp_layers"] = integer(cfg, where, "num_nextn_predict_layers", default=0)
    return kw


def _moe(cfg: Mapping[str, Any], mt: str, where: str, n_exp: int,
         mlp_kinds: tuple[str, ...]) -> dict[str, Any]:
    """The routed experts, shared experts and leading dense layers of a mixture of experts."""
    kw: dict[str, Any] = dict(
        num_experts=n_exp,
        num_experts_per_tok=integer(cfg, where, "num_experts_per_tok", "experts_per_token"),
        moe_intermediate_size=integer(cfg, where, "moe_intermediate_size",
                                      "intermediate_size"))
    n_shared = integer(cfg, where, "n_shared_experts", "num_shared_experts", default=0)
    if n_shared:
        kw["shared_intermediate_size"] = n_shared * kw["moe_intermediate_size"]
    shared = integer(cfg, where, "shared_expert_intermediate_size", default=0)
    if shared:
        kw["shared_intermediate_size"] = shared
        kw["shared_expert_gate"] = True
    kw["num_dense_layers"] = integer(cfg, where, "first_k_dense_replace", default=0)
    if not mlp_kinds and (cfg.get("mlp_only_layers")
                          or integer(cfg, where, "decoder_sparse_step", default=1) != 1):
        raise BstarError(f"{where}: interleaved dense/MoE layers (mlp_only_layers, "
                         "decoder_sparse_step) are not supported yet")
    kw["router_bias"] = cfg.get("topk_method") == "noaux_tc" or mt == "gpt_oss"
    return kw


def _family_widths(cfg: Mapping[str, Any], mt: str, where: str, inter: int, n_exp: int,
                   kw: dict[str, Any]) -> int:
    """Family keys for MLP widths and mixers (Llama-4, Granite-4, Qwen3-Next), set in `kw`;
    returns the dense MLP width."""
    if mt.startswith("llama4"):
        kw["dense_intermediate_size"] = integer(cfg, where, "intermediate_size_mlp", default=0)
        kw["shared_intermediate_size"] = inter  # one shared expert beside the routed ones
    if mt == "granitemoehybrid":
        shared = integer(cfg, where, "shared_intermediate_size", default=0)
        if n_exp:
            kw["shared_intermediate_size"] = shared
        else:
            inter = shared or inter
    if mt == "qwen3_next":
        kw |= dict(attn_output_gate=True, linear_heads=(
            integer(cfg, where, "linear_num_key_heads"),
            integer(cfg, where, "linear_num_value_heads"),
            integer(cfg, where, "linear_key_head_dim"),
            integer(cfg, where, "linear_value_head_dim")),
            conv_kernel=integer(cfg, where, "linear_conv_kernel_dim"),
            mtp_layers=integer(cfg, where, "mtp_num_hidden_layers", default=0))
    return inter


def _check_unmodeled(cfg: Mapping[str, Any], mt: str, where: str, assume: bool) -> None:
    if assume:
        return
    for key, what in _UNMODELED.items():
        if cfg.get(key) and not (mt == "nemotron_h" and key == "layers_block_type"):
            raise BstarError(f"{where}: {key!r} ({what}) changes what the model holds and "
                             f"bstar does not model it{ASSUME_HINT} ignoring it")
    if mt not in _STATE_FAMILIES:
        for key in cfg:
            if key.startswith(("mamba", "ssm_", "linear_num", "rwkv", "hybrid_override")):
                raise BstarError(f"{where}: {key!r}: state-space or linear-attention layers "
                                 f"of model_type {mt!r} are not modelled{ASSUME_HINT} "
                                 "ignoring them")


def _act_dtype(cfg: Mapping[str, Any]) -> str:
    dt = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    # float32 checkpoints (Gemma-2) are served in bf16: vLLM's dtype "auto" downcasts them.
    return "fp16" if dt == "float16" else "bf16"


def _dtype_bits(name: Any, default: str, where: str) -> int:
    if name in (None, "auto"):
        return get_precision(default).bits
    bits = {"float32": 32, "bfloat16": 16, "float16": 16}.get(str(name))
    if bits is None:
        raise BstarError(f"{where}: mamba_ssm_cache_dtype {name!r} is not a dtype bstar knows")
    return bits


def _from_opt(cfg: Mapping[str, Any], name: str, where: str, assume: bool) -> ModelSpec:
    h = integer(cfg, where, "hidden_size")
    if integer(cfg, where, "word_embed_proj_dim", default=h) != h:
        raise BstarError(f"{where}: OPT with word_embed_proj_dim != hidden_size (opt-350m) is "
                         "not supported")
    n_heads = positive(cfg, where, "num_attention_heads")
    bias = bool(cfg.get("enable_bias", True))
    act = _act_dtype(cfg)
    return ModelSpec(
        name=name, model_type="opt", hidden_size=h,
        num_layers=integer(cfg, where, "num_hidden_layers"), num_heads=n_heads,
        num_kv_heads=n_heads, head_dim=h // n_heads, vocab_size=integer(cfg, where, "vocab_size"),
        intermediate_size=integer(cfg, where, "ffn_dim"),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)),
        mlp_gated=False, mlp_bias=bias, qkv_bias=bias, o_bias=bias,
        norm_bias=bool(cfg.get("layer_norm_elementwise_affine", True)),
        # OPT's learned position table has 2 extra rows (its padding offset).
        learned_positions=integer(cfg, where, "max_position_embeddings") + 2,
        act_dtype=act, **quantization(cfg, where, act, assume), source=where,
        config=dict(cfg))


def load_config_file(path: Path) -> dict[str, Any]:
    from bstar import safeio

    p = path / "config.json" if path.is_dir() else path
    data = safeio.load_json(p, what="config.json")
    if not isinstance(data, dict):
        raise BstarError(f"{p}: config must be a JSON object")
    return data


HUB_CONFIG_MAX_BYTES = 16 * 1024 * 1024  # a config.json is kilobytes; more is not one


def fetch_hub_config(repo_id: str, timeout_s: float = 10.0) -> dict[str, Any]:
    """Hub ids work only when online; never used by tests (they run offline)."""
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        raise BstarError(f"{repo_id!r} is not a preset or a local path, and HF_HUB_OFFLINE=1")
    from bstar.redact import register_secret
    from bstar.safehttp import FetchError, fetch

    # HF_ENDPOINT: the Hub's address, as huggingface_hub reads it (a mirror, a local fake).
    hub = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    url = f"{hub}/{repo_id}/resolve/main/config.json"
    headers = {}
    if token := os.environ.get("HF_TOKEN"):
        register_secret(token)  # masked wherever an error quotes it
        # Sent to huggingface.co only: safehttp drops it on a redirect to another origin.
        headers["Authorization"] = f"Bearer {token}"
    try:
        got = fetch(url, headers=headers, max_bytes=HUB_CONFIG_MAX_BYTES, timeout_s=timeout_s)
        if got.status != 200:
            raise FetchError(f"HTTP {got.status}")
        data = json.loads(got.body)
    except (FetchError, ValueError, RecursionError) as e:
        raise BstarError(f"{repo_id!r} is not a preset or local path, and its config could not "
                         f"be fetched from the hub ({e})") from None
    if not isinstance(data, dict):
        raise BstarError(f"{url}: config must be a JSON object")
    return data
