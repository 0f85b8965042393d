"""The tensors of a model, listed from its ModelSpec the way the Hugging Face modeling code of
each family builds them (Llama/Mistral/Qwen2, Mixtral, Qwen3-MoE, DeepSeek-V2/V3/V3.2 with
MLA, Gemma-2/3, OPT, gpt-oss, Llama-4, Qwen3-Next, Nemotron-H, Granite-4, Jamba): the
parameter counts and weight bytes are summed over these, never typed in."""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import TYPE_CHECKING

from bstar.specs.model.fields import Tensor as Tensor  # its home: fields.py

if TYPE_CHECKING:
    from bstar.specs.model.fields import ModelFields



def _t(name: str, rows: int, cols: int, layers: tuple[int, ...], kind: str, module: str,
       *, per_layer: int = 1, expert: bool = False, role: str = "") -> Tensor:
    """`per_layer` copies of a rows x cols tensor in each of `layers`; `module` is its path
    inside a decoder layer."""
    return Tensor(name, rows, cols, per_layer * len(layers), kind, expert,
                  module=f"model.layers.{{i}}.{module}", layers=layers, role=role)


def _mlp(name: str, h: int, inter: int, layers: tuple[int, ...], per_layer: int,
         gated: bool, bias: bool, expert: bool = False) -> list[Tensor]:
    path = {"mlp": "mlp", "experts": "mlp.experts", "shared_experts": "mlp.shared_expert"}[name]
    t = [_t(f"{name}.up", inter, h, layers, "linear", f"{path}.up_proj", per_layer=per_layer,
            expert=expert),
         _t(f"{name}.down", h, inter, layers, "linear", f"{path}.down_proj",
            per_layer=per_layer, expert=expert)]
    if gated:
        t.append(_t(f"{name}.gate", inter, h, layers, "linear", f"{path}.gate_proj",
                    per_layer=per_layer, expert=expert))
    if bias:
        t.append(_t(f"{name}.bias", inter * (2 if gated else 1) + h, 1, layers, "vector",
                    f"{path}.bias", per_layer=per_layer, expert=expert))
    return t



def model_tensors(m: ModelFields) -> tuple[Tensor, ...]:
    """Every tensor the served model holds: embeddings, the decoder layers, the final norm,
    the LM head (unless tied) and a vision tower."""
    h = m.hidden_size
    out: list[Tensor] = [Tensor("embed_tokens", m.vocab_size, h, 1, "embedding",
                                module="model.embed_tokens")]
    if m.learned_positions:
        out.append(Tensor("embed_positions", m.learned_positions, h, 1, "embedding",
                          module="model.embed_positions"))
    out += layer_tensors(m, tuple(range(m.num_layers)))
    norm_vectors = 2 if m.norm_bias else 1
    out.append(Tensor("final_norm", h, 1, norm_vectors, "vector", module="model.norm"))
    if not m.tie_word_embeddings:
        out.append(Tensor("lm_head", m.vocab_size, h, 1, "linear", module="lm_head",
                          role="lm_head"))
    out += m.vision
    return tuple(out)


def layer_tensors(m: ModelFields, index: tuple[int, ...]) -> list[Tensor]:
    """The decoder layers' tensors, each group over the layers (of `index`) it is in."""
    h = m.hidden_size
    mixers, mlps = m.mixers(), m.mlps()
    out: list[Tensor] = []

    def layers(kinds: tuple[str, ...], kind: str) -> tuple[int, ...]:
        return tuple(i for i, k in zip(index, kinds, strict=True) if k == kind)

    if attn := layers(mixers, "attn"):
        out += _attention(m, attn)
    if gdn := layers(mixers, "gdn"):
        out += _gdn(m, gdn)
    if mamba := layers(mixers, "mamba"):
        out += _mamba(m, mamba)
    if dense := layers(mlps, "dense"):
        out += _mlp("mlp", h, m.dense_intermediate_size or m.intermediate_size,
                    dense, 1, m.mlp_gated, m.mlp_bias)
    if m.is_moe and (moe := layers(mlps, "moe")):
        n_exp = m.num_experts
        out.append(_t("router", n_exp, h, moe, "linear", "mlp.gate", role="router"))
        if m.router_bias:
            out.append(_t("router.bias", n_exp, 1, moe, "vector", "mlp.gate.bias"))
        out += _mlp("experts", h, m.moe_intermediate_size, moe, n_exp, m.mlp_gated,
                    m.mlp_bias, expert=True)
        if m.shared_intermediate_size:
            out += _mlp("shared_experts", h, m.shared_intermediate_size, moe, 1,
                        m.mlp_gated, m.mlp_bias)
        if m.shared_expert_gate:
            out.append(_t("shared_expert_gate", 1, h, moe, "linear",
                          "mlp.shared_expert_gate", role="router"))
    norm_vectors = 2 if m.norm_bias else 1
    out.append(_t("layer_norms", h, 1, index, "vector", "norm",
                  per_layer=m.norms_per_layer * norm_vectors))
    return out


def _attention(m: ModelFields, lay: tuple[int, ...]) -> list[Tensor]:
    h, n_heads = m.hidden_size, m.num_heads
    if m.is_mla:
        qk_dim = m.qk_nope_head_dim + m.qk_rope_head_dim
        t: list[Tensor] = []
        if m.q_lora_rank:
            t += [_t("q_a_proj", m.q_lora_rank, h, lay, "linear", "self_attn.q_a_proj"),
                  _t("q_a_layernorm", m.q_lora_rank, 1, lay, "vector",
                     "self_attn.q_a_layernorm"),
                  _t("q_b_proj", n_heads * qk_dim, m.q_lora_rank, lay, "linear",
                     "self_attn.q_b_proj")]
        else:
            t.append(_t("q_proj", n_heads * qk_dim, h, lay, "linear", "self_attn.q_proj"))
        t += [_t("kv_a_proj_with_mqa", m.kv_lora_rank + m.qk_rope_head_dim, h, lay,
                 "linear", "self_attn.kv_a_proj_with_mqa"),
              _t("kv_a_layernorm", m.kv_lora_rank, 1, lay, "vector",
                 "self_attn.kv_a_layernorm"),
              _t("kv_b_proj", n_heads * (m.qk_nope_head_dim + m.v_head_dim),
                 m.kv_lora_rank, lay, "linear", "self_attn.kv_b_proj"),
              _t("o_proj", h, n_heads * m.v_head_dim, lay, "linear", "self_attn.o_proj")]
        if m.index_heads:
            # DeepSeek-V3.2's lightning indexer (HF modeling_deepseek_v32 Indexer).
            d, nh = m.index_head_dim, m.index_heads
            t += [_t("indexer.wq_b", nh * d, m.q_lora_rank or h, lay, "linear",
                     "self_attn.indexer.wq_b"),
                  _t("indexer.wk", d, h, lay, "linear", "self_attn.indexer.wk"),
                  _t("indexer.k_norm", d, 1, lay, "vector", "self_attn.indexer.k_norm",
                     per_layer=2),
                  _t("indexer.weights_proj", nh, h, lay, "linear",
                     "self_attn.indexer.weights_proj", role="router")]
        return t
    q_dim = n_heads * m.head_dim
    kv_dim = m.num_kv_heads * m.head_dim
    q_rows = 2 * q_dim if m.attn_output_gate else q_dim
    t = [_t("q_proj", q_rows, h, lay, "linear", "self_attn.q_proj"),
         _t("k_proj", kv_dim, h, lay, "linear", "self_attn.k_proj"),
         _t("v_proj", kv_dim, h, lay, "linear", "self_attn.v_proj"),
         _t("o_proj", h, q_dim, lay, "linear", "self_attn.o_proj")]
    if m.qkv_bias:
        t.append(_t("qkv.bias", q_dim + 2 * kv_dim, 1, lay, "vector", "self_attn.bias"))
    if m.o_bias:
        t.append(_t("o_proj.bias", h, 1, lay, "vector", "self_attn.o_proj.bias"))
    if m.qk_norm:
        t.append(_t("qk_norm", m.head_dim, 1, lay, "vector", "self_attn.q_norm",
                    per_layer=2))
    if m.attn_sinks:
        t.append(_t("sinks", n_heads, 1, lay, "vector", "self_attn.sinks"))
    return t


def _gdn(m: ModelFields, lay: tuple[int, ...]) -> list[Tensor]:
    """Qwen3-Next's gated delta net (HF Qwen3NextGatedDeltaNet)."""
    h = m.hidden_size
    nk, nv, dk, dv = m.linear_heads
    conv_dim = 2 * nk * dk + nv * dv
    return [_t("in_proj_qkvz", 2 * nk * dk + 2 * nv * dv, h, lay, "linear",
               "linear_attn.in_proj_qkvz"),
            _t("in_proj_ba", 2 * nv, h, lay, "linear", "linear_attn.in_proj_ba"),
            _t("conv1d", conv_dim, m.conv_kernel, lay, "linear", "linear_attn.conv1d",
               role="conv"),
            _t("dt_bias+A_log", nv, 1, lay, "vector", "linear_attn.A_log", per_layer=2),
            _t("gated_norm", dv, 1, lay, "vector", "linear_attn.norm"),
            _t("out_proj", h, nv * dv, lay, "linear", "linear_attn.out_proj")]


def _mamba(m: ModelFields, lay: tuple[int, ...]) -> list[Tensor]:
    """Mamba-2 mixers (HF NemotronHMamba2Mixer, GraniteMoeHybridMambaLayer) and Mamba-1
    (HF JambaMambaMixer)."""
    h = m.hidden_size
    version, nh, _hd, ng, ds, inner, dt_rank = m.mamba
    t: list[Tensor] = []
    if version == 2:
        conv_dim = inner + 2 * ng * ds
        t += [_t("mamba.in_proj", 2 * inner + 2 * ng * ds + nh, h, lay, "linear",
                 "mixer.in_proj"),
              _t("mamba.conv1d", conv_dim, m.conv_kernel, lay, "linear", "mixer.conv1d",
                 role="conv"),
              _t("mamba.A_log+D+dt_bias", nh, 1, lay, "vector", "mixer.A_log", per_layer=3),
              _t("mamba.norm", inner, 1, lay, "vector", "mixer.norm"),
              _t("mamba.out_proj", h, inner, lay, "linear", "mixer.out_proj")]
        if m.conv_bias:
            t.append(_t("mamba.conv1d.bias", conv_dim, 1, lay, "vector", "mixer.conv1d"))
        if m.ssm_proj_bias:
            t.append(_t("mamba.proj.bias", 2 * inner + 2 * ng * ds + nh + h, 1, lay,
                        "vector", "mixer.in_proj.bias"))
        return t
    t += [_t("mamba.in_proj", 2 * inner, h, lay, "linear", "mamba.in_proj"),
          _t("mamba.conv1d", inner, m.conv_kernel, lay, "linear", "mamba.conv1d",
             role="conv"),
          _t("mamba.x_proj", dt_rank + 2 * ds, inner, lay, "linear", "mamba.x_proj"),
          _t("mamba.dt_proj", inner, dt_rank, lay, "linear", "mamba.dt_proj"),
          _t("mamba.A_log", inner, ds, lay, "vector", "mamba.A_log"),
          _t("mamba.D+dt_bias", inner, 1, lay, "vector", "mamba.D", per_layer=2),
          _t("mamba.dt_b_c_norms", 2 * ds + dt_rank, 1, lay, "vector", "mamba.norms"),
          _t("mamba.out_proj", h, inner, lay, "linear", "mamba.out_proj")]
    if m.conv_bias:
        t.append(_t("mamba.conv1d.bias", inner, 1, lay, "vector", "mamba.conv1d"))
    if m.ssm_proj_bias:
        t.append(_t("mamba.proj.bias", 2 * inner + h, 1, lay, "vector", "mamba.in_proj"))
    return t


def mtp_tensors(m: ModelFields) -> tuple[Tensor, ...]:
    """Multi-token-prediction layers the checkpoint holds beside the model (DeepSeek's
    num_nextn_predict_layers, Qwen3-Next's mtp_num_hidden_layers): counted in the
    checkpoint's size, not in W (vLLM loads them only for speculative decoding)."""
    n = m.mtp_layers
    if not n:
        return ()
    h = m.hidden_size
    mtp = replace(m, num_layers=n, layer_kinds=("full",) * n if m.layer_kinds
                   else (), mlp_kinds=("moe" if m.is_moe else "dense",) * n,
                   num_dense_layers=0, sliding_layers=(), mtp_layers=0, vision=())
    index = tuple(range(m.num_layers, m.num_layers + n))
    out = [replace(t, layers=tuple(index[j] for j in t.layers))
           for t in layer_tensors(mtp, tuple(range(n)))]
    out.append(Tensor("mtp.eh_proj", h, 2 * h, n, "linear", module="mtp.fc"))
    out.append(Tensor("mtp.norms", h, 1, 3 * n, "vector", module="mtp.norm"))
    if m.model_type.startswith("deepseek"):
        # DeepSeek's checkpoint stores the MTP layer's own copies of the embedding and
        # the output head (model.layers.61.embed_tokens, .shared_head.head).
        out.append(Tensor("mtp.embed_tokens", m.vocab_size, h, n, "embedding",
                          module="mtp.embed_tokens"))
        out.append(Tensor("mtp.head", m.vocab_size, h, n, "linear", module="mtp.head",
                          role="lm_head"))
    return tuple(out)


@functools.lru_cache(maxsize=256)
def cached_model_tensors(m: ModelFields) -> tuple[Tensor, ...]:
    """`model_tensors(m)`, once per spec (keyed by its compared fields)."""
    return model_tensors(m)
