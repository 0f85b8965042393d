"""ModelSpec: the architecture facts a decode cost model needs, read from a HF `config.json`.

Parameter counts are computed tensor by tensor from the config, never typed in, so that
the weight bytes (and hence B*) are exact for the precision chosen. The tensor list follows
the Hugging Face modeling code of each family (Llama/Mistral/Qwen2, Mixtral, Qwen3-MoE,
DeepSeek-V2/V3/V3.2 with MLA, Gemma-2/3, OPT, gpt-oss, Llama-4, Qwen3-Next, Nemotron-H,
Granite-4 and Jamba); unknown families that use Llama-style keys work too.

Each layer has a kind (docs/models.md): full attention, a sliding window, Llama-4's chunked
local attention, DeepSeek's sparse attention (MLA plus its indexer's keys), or a fixed state
(gated delta nets, Mamba). A checkpoint's `quantization_config` decides each tensor's bytes.
A layer kind, quantization method or memory-relevant key bstar does not model is refused
with a one-line error naming it, unless `assume_unmodeled` (BSTAR_ASSUME_UNMODELED=1) says
to proceed on the stated assumption.
"""

from __future__ import annotations

import fnmatch
import functools
import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bstar.errors import BstarError
from bstar.specs.precision import Precision, get_precision


@dataclass(frozen=True, slots=True)
class Tensor:
    """A group of identical tensors: `count` copies of a rows x cols matrix (cols=1: vector)."""

    name: str
    rows: int
    cols: int
    count: int
    kind: str  # "linear" (matmul weight), "embedding", "vector" (norm weight, bias, gate bias)
    expert: bool = False  # routed-expert weight (read only when its expert is chosen)
    # The checkpoint's module path ("{i}": the layer index) and the layers it repeats over:
    # what quantization_config's ignore lists are matched against.
    module: str = ""
    layers: tuple[int, ...] = ()
    role: str = ""  # "router", "lm_head", "conv": kept in the activation dtype when quantized

    @property
    def params(self) -> int:
        return self.rows * self.cols * self.count


@dataclass(frozen=True, slots=True)
class LayerGroup:
    """Layers that hold the same state per sequence and cost the same per step: the unit in
    which the step's KV bytes and attention FLOPs are priced (bstar.step) and the KV pool is
    sized. Values are per layer for the whole model (before tensor parallel sharding).

    - `kind`: "full" (the whole context; MHA/GQA/MQA, MLA), "sliding" (the last
      `window_tokens`), "chunked" (Llama-4's local attention: the tokens of the current
      chunk of `chunk_tokens`), "dsa" (DeepSeek sparse attention: holds every token's MLA
      latent and indexer key, reads the indexer keys of all and the latents of the top
      `topk_tokens`), "state" (a fixed state per sequence, independent of context).
    - `kv_values_per_token`: cached values per token per layer (K and V, or MLA's latent;
      for "dsa" also `index_values_per_token`, the indexer key's bytes in 16-bit values).
    - `kv_heads`: heads that tensor parallel splits the cache (or the state) by; 0 =
      replicated on every GPU (MLA's latent).
    - `state_bytes_per_seq`: fixed bytes per sequence per layer (linear attention, SSM).
    - `decode_flops_per_pos`: attention FLOPs of one new token per read token per layer.
    - `prefill_flops_per_pair`: attention FLOPs per unit of causal (query x key) area.
    """

    kind: str
    num_layers: int
    window_tokens: int = 0
    kv_values_per_token: int = 0
    kv_heads: int = 0
    state_bytes_per_seq: int = 0
    decode_flops_per_pos: int = 0
    prefill_flops_per_pair: int = 0
    query_heads: int = 0  # attention heads (scores of an unfused kernel; prefill tiles)
    chunk_tokens: int = 0  # "chunked": attention_chunk_size
    topk_tokens: int = 0  # "dsa": index_topk
    index_values_per_token: int = 0  # "dsa": part of kv_values_per_token read for all tokens
    mixer: str = ""  # "state": the layer that holds it, "gdn", "mamba1" or "mamba2"

    def held(self, tokens: Any) -> Any:
        """Tokens of KV one layer holds for a sequence of `tokens`; int or numpy array in,
        the same out."""
        if self.kind == "state":
            return tokens * 0
        if self.kind == "chunked":
            if isinstance(tokens, int):
                return (tokens - 1) % self.chunk_tokens + 1 if tokens > 0 else 0
            import numpy as np

            t = np.asarray(tokens)
            return np.where(t > 0, (t - 1) % self.chunk_tokens + 1, 0 * t)
        if self.window_tokens:
            if isinstance(tokens, int):
                return min(tokens, self.window_tokens)
            import numpy as np

            return np.minimum(tokens, self.window_tokens)
        return tokens

    def read(self, tokens: Any) -> Any:
        """Tokens of KV one decode step reads per layer for a sequence holding `tokens`
        (bstar.step prices this): what it holds, unless the kind reads a subset. "dsa"
        reads the indexer keys of every token and the latents of the top-k, expressed in
        tokens of the whole per-token entry."""
        held = self.held(tokens)
        if self.kind != "dsa" or not self.topk_tokens:
            return held
        idx, whole = self.index_values_per_token, self.kv_values_per_token
        latent = whole - idx
        if isinstance(held, int):
            return (min(held, self.topk_tokens) * latent + held * idx) / whole
        import numpy as np

        return (np.minimum(held, self.topk_tokens) * latent + held * idx) / whole

    def kv_values_per_token_per_gpu(self, num_gpus: int) -> int:
        """Cached values per token per layer on each GPU: KV heads shard across GPUs (with
        fewer heads than GPUs each GPU keeps one copy); a replicated latent does not."""
        if not self.kv_heads or num_gpus <= 1:
            return self.kv_values_per_token
        per_head = self.kv_values_per_token // self.kv_heads
        return max(1, math.ceil(self.kv_heads / num_gpus)) * per_head

    def state_bytes_per_seq_per_gpu(self, num_gpus: int) -> int:
        return math.ceil(self.state_bytes_per_seq / max(1, num_gpus))

    def shard_divisor(self, num_gpus: int) -> int:
        """What a whole-model per-token quantity of this group divides by per GPU."""
        return num_gpus if self.kv_heads else 1


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    intermediate_size: int
    tie_word_embeddings: bool = False
    mlp_gated: bool = True
    mlp_bias: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    norm_bias: bool = False  # LayerNorm (weight + bias) instead of RMSNorm (weight)
    norms_per_layer: int = 2
    qk_norm: bool = False  # per-head RMSNorm on q and k (Qwen3)
    learned_positions: int = 0  # rows of a learned position table (OPT: max_pos + 2)
    # Mixture of experts. Dense when num_experts == 0.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_intermediate_size: int = 0  # total width of shared expert(s); 0: none
    shared_expert_gate: bool = False  # Qwen2-MoE's sigmoid gate on the shared expert
    num_dense_layers: int = 0  # leading layers with a dense MLP (DeepSeek first_k_dense_replace)
    router_bias: bool = False  # DeepSeek-V3 e_score_correction_bias
    # Multi-head latent attention (DeepSeek-V2/V3). Off when kv_lora_rank == 0.
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # Sliding-window attention: window (tokens) and which layers use it.
    sliding_window: int = 0
    sliding_layers: tuple[bool, ...] = ()
    # Per-layer kinds when a model mixes more than full and sliding attention (docs/models.md):
    # "full", "sliding", "chunked", "dsa", "linear_attention", "mamba", "none" (an MLP-only
    # layer of Nemotron-H). Empty: every layer full, or `sliding_layers`.
    layer_kinds: tuple[str, ...] = ()
    mlp_kinds: tuple[str, ...] = ()  # per layer "dense", "moe", "none"; empty: dense then MoE
    attention_chunk: int = 0  # Llama-4 attention_chunk_size
    attn_sinks: bool = False  # gpt-oss: one learned sink logit per head and layer
    attn_output_gate: bool = False  # Qwen3-Next: q_proj also yields a sigmoid gate per head
    dense_intermediate_size: int = 0  # a dense layer's MLP width when it differs (Llama-4)
    # Gated delta net (Qwen3-Next): key heads, value heads, key head dim, value head dim.
    linear_heads: tuple[int, int, int, int] = ()
    # Mamba: (version 1 or 2, heads, head dim, groups, state size, inner width, dt rank).
    mamba: tuple[int, int, int, int, int, int, int] = ()
    conv_kernel: int = 0
    conv_bias: bool = False
    ssm_proj_bias: bool = False
    state_bits: tuple[int, int] = (16, 16)  # conv state, recurrent state
    # DeepSeek sparse attention (V3.2): the indexer's heads, head dim and top-k.
    index_heads: int = 0
    index_head_dim: int = 0
    index_topk: int = 0
    mtp_layers: int = 0  # multi-token-prediction layers in the checkpoint (not served)
    vision: tuple[Tensor, ...] = ()  # a multimodal checkpoint's vision tower and projector
    # The checkpoint's quantization: the precision `default_dtype` names applies to the
    # linears in `quant_scope` ("linear": all, "experts": routed experts only), except those
    # matching `quant_skip` (modules_to_not_convert / ignore), routers and the LM head
    # (unless `quant_lm_head`); the rest stays in `act_dtype`.
    act_dtype: str = "bf16"
    quant_scope: str = ""
    quant_skip: tuple[str, ...] = ()
    quant_lm_head: bool = False
    default_dtype: str = "bf16"
    source: str = ""
    config: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                     "vocab_size"):
            if getattr(self, name) <= 0:
                raise BstarError(f"{self.name}: {name} must be positive, got "
                                 f"{getattr(self, name)}")
        if not self.is_mla and self.num_heads % self.num_kv_heads:
            raise BstarError(f"{self.name}: num_attention_heads ({self.num_heads}) is not a "
                             f"multiple of num_key_value_heads ({self.num_kv_heads})")
        if self.num_experts and not 0 < self.num_experts_per_tok <= self.num_experts:
            raise BstarError(f"{self.name}: num_experts_per_tok must be in 1..{self.num_experts}")
        if not 0 <= self.num_dense_layers <= self.num_layers:
            raise BstarError(f"{self.name}: first_k_dense_replace ({self.num_dense_layers}) "
                             f"must be in 0..num_hidden_layers ({self.num_layers})")
        if self.num_experts and self.moe_intermediate_size <= 0:
            raise BstarError(f"{self.name}: moe_intermediate_size must be positive")
        if self.sliding_layers and len(self.sliding_layers) != self.num_layers:
            raise BstarError(f"{self.name}: {len(self.sliding_layers)} layer types for "
                             f"{self.num_layers} layers")
        for kinds in (self.layer_kinds, self.mlp_kinds):
            if kinds and len(kinds) != self.num_layers:
                raise BstarError(f"{self.name}: {len(kinds)} layer types for "
                                 f"{self.num_layers} layers")
        if "chunked" in self.layer_kinds and self.attention_chunk <= 0:
            raise BstarError(f"{self.name}: chunked attention layers need a positive "
                             "attention_chunk_size")

    # ---- architecture facts -------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def attention_kind(self) -> str:
        if self.is_mla:
            return "MLA"
        if self.num_kv_heads == self.num_heads:
            return "MHA"
        return "MQA" if self.num_kv_heads == 1 else f"GQA-{self.num_heads // self.num_kv_heads}"

    def tensor_parallel_problem(self, tp: int) -> str | None:
        """Why vLLM refuses `--tensor-parallel-size tp` for this model, or None when it
        shards: attention heads split evenly (num_attention_heads % tp == 0); KV heads split
        evenly or replicate evenly (num_kv_heads % tp == 0 or tp % num_kv_heads == 0; MLA's
        latent replicates); every MLP width, each expert's included, splits evenly."""
        if tp <= 1:
            return None
        if self.num_heads % tp:
            return f"its {self.num_heads} attention heads do not divide by {tp}"
        if not self.is_mla and self.num_kv_heads % tp and tp % self.num_kv_heads:
            return (f"its {self.num_kv_heads} KV heads do not divide by {tp}, and {tp} is "
                    f"not a multiple of {self.num_kv_heads}")
        dense_mlp = not self.is_moe or self.num_dense_layers > 0
        if dense_mlp and self.intermediate_size % tp:
            return f"its MLP width {self.intermediate_size} does not divide by {tp}"
        if self.linear_heads and (self.linear_heads[0] % tp or self.linear_heads[1] % tp):
            return (f"its {self.linear_heads[0]} key and {self.linear_heads[1]} value heads of "
                    f"linear attention do not divide by {tp}")
        if self.mamba and (self.mamba[1] or self.mamba[5]) % tp:
            return f"its Mamba heads ({self.mamba[1] or self.mamba[5]}) do not divide by {tp}"
        if self.is_moe and self.moe_intermediate_size % tp:
            return (f"each of its {self.num_experts} experts' MLP width "
                    f"{self.moe_intermediate_size} does not divide by {tp}")
        return None

    def tensor_parallel_sizes(self, limit: int = 64) -> list[int]:
        """The tensor-parallel sizes up to `limit` that `tensor_parallel_problem` accepts."""
        return [n for n in range(1, limit + 1) if self.tensor_parallel_problem(n) is None]

    def mixers(self) -> tuple[str, ...]:
        """Each layer's token mixer: "attn", "gdn" (gated delta net), "mamba", "none"."""
        if not self.layer_kinds:
            return ("attn",) * self.num_layers
        return tuple(_MIXER[k] for k in self.layer_kinds)

    def mlps(self) -> tuple[str, ...]:
        """Each layer's MLP: "dense", "moe" or "none"."""
        if self.mlp_kinds:
            return self.mlp_kinds
        if not self.is_moe:
            return ("dense",) * self.num_layers
        return ("dense",) * self.num_dense_layers \
            + ("moe",) * (self.num_layers - self.num_dense_layers)

    @property
    def num_moe_layers(self) -> int:
        return sum(1 for k in self.mlps() if k == "moe") if self.is_moe else 0

    # ---- tensors ------------------------------------------------------------------------
    def tensors(self) -> tuple[Tensor, ...]:
        return _tensors(self)

    def _tensors(self) -> tuple[Tensor, ...]:
        h = self.hidden_size
        out: list[Tensor] = [Tensor("embed_tokens", self.vocab_size, h, 1, "embedding",
                                    module="model.embed_tokens")]
        if self.learned_positions:
            out.append(Tensor("embed_positions", self.learned_positions, h, 1, "embedding",
                              module="model.embed_positions"))
        out += self._layer_tensors(tuple(range(self.num_layers)))
        norm_vectors = 2 if self.norm_bias else 1
        out.append(Tensor("final_norm", h, 1, norm_vectors, "vector", module="model.norm"))
        if not self.tie_word_embeddings:
            out.append(Tensor("lm_head", self.vocab_size, h, 1, "linear", module="lm_head",
                              role="lm_head"))
        out += self.vision
        return tuple(out)

    def _layer_tensors(self, index: tuple[int, ...]) -> list[Tensor]:
        """The decoder layers' tensors, each group over the layers (of `index`) it is in."""
        h = self.hidden_size
        mixers, mlps = self.mixers(), self.mlps()
        out: list[Tensor] = []

        def layers(kinds: tuple[str, ...], kind: str) -> tuple[int, ...]:
            return tuple(i for i, k in zip(index, kinds, strict=True) if k == kind)

        if attn := layers(mixers, "attn"):
            out += self._attention_tensors(attn)
        if gdn := layers(mixers, "gdn"):
            out += self._gdn_tensors(gdn)
        if mamba := layers(mixers, "mamba"):
            out += self._mamba_tensors(mamba)
        if dense := layers(mlps, "dense"):
            out += _mlp("mlp", h, self.dense_intermediate_size or self.intermediate_size,
                        dense, 1, self.mlp_gated, self.mlp_bias)
        if self.is_moe and (moe := layers(mlps, "moe")):
            n_exp = self.num_experts
            out.append(_t("router", n_exp, h, moe, "linear", "mlp.gate", role="router"))
            if self.router_bias:
                out.append(_t("router.bias", n_exp, 1, moe, "vector", "mlp.gate.bias"))
            out += _mlp("experts", h, self.moe_intermediate_size, moe, n_exp, self.mlp_gated,
                        self.mlp_bias, expert=True)
            if self.shared_intermediate_size:
                out += _mlp("shared_experts", h, self.shared_intermediate_size, moe, 1,
                            self.mlp_gated, self.mlp_bias)
            if self.shared_expert_gate:
                out.append(_t("shared_expert_gate", 1, h, moe, "linear",
                              "mlp.shared_expert_gate", role="router"))
        norm_vectors = 2 if self.norm_bias else 1
        out.append(_t("layer_norms", h, 1, index, "vector", "norm",
                      per_layer=self.norms_per_layer * norm_vectors))
        return out

    def _attention_tensors(self, lay: tuple[int, ...]) -> list[Tensor]:
        h, n_heads = self.hidden_size, self.num_heads
        if self.is_mla:
            qk_dim = self.qk_nope_head_dim + self.qk_rope_head_dim
            t: list[Tensor] = []
            if self.q_lora_rank:
                t += [_t("q_a_proj", self.q_lora_rank, h, lay, "linear", "self_attn.q_a_proj"),
                      _t("q_a_layernorm", self.q_lora_rank, 1, lay, "vector",
                         "self_attn.q_a_layernorm"),
                      _t("q_b_proj", n_heads * qk_dim, self.q_lora_rank, lay, "linear",
                         "self_attn.q_b_proj")]
            else:
                t.append(_t("q_proj", n_heads * qk_dim, h, lay, "linear", "self_attn.q_proj"))
            t += [_t("kv_a_proj_with_mqa", self.kv_lora_rank + self.qk_rope_head_dim, h, lay,
                     "linear", "self_attn.kv_a_proj_with_mqa"),
                  _t("kv_a_layernorm", self.kv_lora_rank, 1, lay, "vector",
                     "self_attn.kv_a_layernorm"),
                  _t("kv_b_proj", n_heads * (self.qk_nope_head_dim + self.v_head_dim),
                     self.kv_lora_rank, lay, "linear", "self_attn.kv_b_proj"),
                  _t("o_proj", h, n_heads * self.v_head_dim, lay, "linear", "self_attn.o_proj")]
            if self.index_heads:
                # DeepSeek-V3.2's lightning indexer (HF modeling_deepseek_v32 Indexer).
                d, nh = self.index_head_dim, self.index_heads
                t += [_t("indexer.wq_b", nh * d, self.q_lora_rank or h, lay, "linear",
                         "self_attn.indexer.wq_b"),
                      _t("indexer.wk", d, h, lay, "linear", "self_attn.indexer.wk"),
                      _t("indexer.k_norm", d, 1, lay, "vector", "self_attn.indexer.k_norm",
                         per_layer=2),
                      _t("indexer.weights_proj", nh, h, lay, "linear",
                         "self_attn.indexer.weights_proj", role="router")]
            return t
        q_dim = n_heads * self.head_dim
        kv_dim = self.num_kv_heads * self.head_dim
        q_rows = 2 * q_dim if self.attn_output_gate else q_dim
        t = [_t("q_proj", q_rows, h, lay, "linear", "self_attn.q_proj"),
             _t("k_proj", kv_dim, h, lay, "linear", "self_attn.k_proj"),
             _t("v_proj", kv_dim, h, lay, "linear", "self_attn.v_proj"),
             _t("o_proj", h, q_dim, lay, "linear", "self_attn.o_proj")]
        if self.qkv_bias:
            t.append(_t("qkv.bias", q_dim + 2 * kv_dim, 1, lay, "vector", "self_attn.bias"))
        if self.o_bias:
            t.append(_t("o_proj.bias", h, 1, lay, "vector", "self_attn.o_proj.bias"))
        if self.qk_norm:
            t.append(_t("qk_norm", self.head_dim, 1, lay, "vector", "self_attn.q_norm",
                        per_layer=2))
        if self.attn_sinks:
            t.append(_t("sinks", n_heads, 1, lay, "vector", "self_attn.sinks"))
        return t

    def _gdn_tensors(self, lay: tuple[int, ...]) -> list[Tensor]:
        """Qwen3-Next's gated delta net (HF Qwen3NextGatedDeltaNet)."""
        h = self.hidden_size
        nk, nv, dk, dv = self.linear_heads
        conv_dim = 2 * nk * dk + nv * dv
        return [_t("in_proj_qkvz", 2 * nk * dk + 2 * nv * dv, h, lay, "linear",
                   "linear_attn.in_proj_qkvz"),
                _t("in_proj_ba", 2 * nv, h, lay, "linear", "linear_attn.in_proj_ba"),
                _t("conv1d", conv_dim, self.conv_kernel, lay, "linear", "linear_attn.conv1d",
                   role="conv"),
                _t("dt_bias+A_log", nv, 1, lay, "vector", "linear_attn.A_log", per_layer=2),
                _t("gated_norm", dv, 1, lay, "vector", "linear_attn.norm"),
                _t("out_proj", h, nv * dv, lay, "linear", "linear_attn.out_proj")]

    def _mamba_tensors(self, lay: tuple[int, ...]) -> list[Tensor]:
        """Mamba-2 mixers (HF NemotronHMamba2Mixer, GraniteMoeHybridMambaLayer) and Mamba-1
        (HF JambaMambaMixer)."""
        h = self.hidden_size
        version, nh, _hd, ng, ds, inner, dt_rank = self.mamba
        t: list[Tensor] = []
        if version == 2:
            conv_dim = inner + 2 * ng * ds
            t += [_t("mamba.in_proj", 2 * inner + 2 * ng * ds + nh, h, lay, "linear",
                     "mixer.in_proj"),
                  _t("mamba.conv1d", conv_dim, self.conv_kernel, lay, "linear", "mixer.conv1d",
                     role="conv"),
                  _t("mamba.A_log+D+dt_bias", nh, 1, lay, "vector", "mixer.A_log", per_layer=3),
                  _t("mamba.norm", inner, 1, lay, "vector", "mixer.norm"),
                  _t("mamba.out_proj", h, inner, lay, "linear", "mixer.out_proj")]
            if self.conv_bias:
                t.append(_t("mamba.conv1d.bias", conv_dim, 1, lay, "vector", "mixer.conv1d"))
            if self.ssm_proj_bias:
                t.append(_t("mamba.proj.bias", 2 * inner + 2 * ng * ds + nh + h, 1, lay,
                            "vector", "mixer.in_proj.bias"))
            return t
        t += [_t("mamba.in_proj", 2 * inner, h, lay, "linear", "mamba.in_proj"),
              _t("mamba.conv1d", inner, self.conv_kernel, lay, "linear", "mamba.conv1d",
                 role="conv"),
              _t("mamba.x_proj", dt_rank + 2 * ds, inner, lay, "linear", "mamba.x_proj"),
              _t("mamba.dt_proj", inner, dt_rank, lay, "linear", "mamba.dt_proj"),
              _t("mamba.A_log", inner, ds, lay, "vector", "mamba.A_log"),
              _t("mamba.D+dt_bias", inner, 1, lay, "vector", "mamba.D", per_layer=2),
              _t("mamba.dt_b_c_norms", 2 * ds + dt_rank, 1, lay, "vector", "mamba.norms"),
              _t("mamba.out_proj", h, inner, lay, "linear", "mamba.out_proj")]
        if self.conv_bias:
            t.append(_t("mamba.conv1d.bias", inner, 1, lay, "vector", "mamba.conv1d"))
        if self.ssm_proj_bias:
            t.append(_t("mamba.proj.bias", 2 * inner + h, 1, lay, "vector", "mamba.in_proj"))
        return t

    def mtp_tensors(self) -> tuple[Tensor, ...]:
        """Multi-token-prediction layers the checkpoint holds beside the model (DeepSeek's
        num_nextn_predict_layers, Qwen3-Next's mtp_num_hidden_layers): counted in the
        checkpoint's size, not in W (vLLM loads them only for speculative decoding)."""
        n = self.mtp_layers
        if not n:
            return ()
        h = self.hidden_size
        mtp = replace(self, num_layers=n, layer_kinds=("full",) * n if self.layer_kinds
                       else (), mlp_kinds=("moe" if self.is_moe else "dense",) * n,
                       num_dense_layers=0, sliding_layers=(), mtp_layers=0, vision=())
        index = tuple(range(self.num_layers, self.num_layers + n))
        out = [replace(t, layers=tuple(index[j] for j in t.layers))
               for t in mtp._layer_tensors(tuple(range(n)))]
        out.append(Tensor("mtp.eh_proj", h, 2 * h, n, "linear", module="mtp.fc"))
        out.append(Tensor("mtp.norms", h, 1, 3 * n, "vector", module="mtp.norm"))
        if self.model_type.startswith("deepseek"):
            # DeepSeek's checkpoint stores the MTP layer's own copies of the embedding and
            # the output head (model.layers.61.embed_tokens, .shared_head.head).
            out.append(Tensor("mtp.embed_tokens", self.vocab_size, h, n, "embedding",
                              module="mtp.embed_tokens"))
            out.append(Tensor("mtp.head", self.vocab_size, h, n, "linear", module="mtp.head",
                              role="lm_head"))
        return tuple(out)

    # ---- counts -------------------------------------------------------------------------
    @property
    def num_params(self) -> int:
        """All parameters (what the checkpoint holds and the GPU keeps resident)."""
        return sum(t.params for t in self.tensors())

    @property
    def num_active_params(self) -> int:
        """Parameters one token uses: routed experts counted top-k of E, embeddings included
        (the convention behind published 'active' figures such as Mixtral's 12.9B); a
        multimodal MoE's vision tower is not among them (Llama-4's "17B active")."""
        if not self.is_moe:
            return self.num_params
        unused = (self.num_experts - self.num_experts_per_tok) / self.num_experts
        expert = sum(t.params for t in self.tensors() if t.expert)
        vision = sum(t.params for t in self.vision)
        return self.num_params - round(expert * unused) - vision

    @property
    def matmul_params_per_token(self) -> int:
        """Weights multiplied per token (2 FLOPs each): active linears, the LM head (tied or
        not), never the embedding lookups or a vision tower."""
        vision = {id(t) for t in self.vision}
        lin = sum(t.params for t in self.tensors()
                  if t.kind == "linear" and not t.expert and id(t) not in vision)
        expert = sum(t.params for t in self.tensors() if t.expert)
        if self.is_moe:
            expert = expert * self.num_experts_per_tok // self.num_experts
        lm_head = self.vocab_size * self.hidden_size if self.tie_word_embeddings else 0
        return lin + expert + lm_head

    def weight_bytes_parts(self, weight: Precision) -> tuple[int, int, int]:
        """(dense bytes, routed-expert bytes, input-embedding bytes), exact.

        With the checkpoint's own precision (`default_dtype`), each linear takes the bytes
        its `quantization_config` gives it (`quantized_count`): the quantized format for
        those in scope, the activation dtype for ignored modules, routers and the LM head.
        With another weight precision (--weight-dtype) every linear takes it. Embeddings,
        norms and biases stay in the 16-bit activation dtype, as quantized checkpoints keep
        them; a tied embedding is also the LM head, so it stays 16-bit too. Cached: every
        decode step of a curve asks (a plan asks a few hundred times).
        """
        return _weight_bytes_parts(self, weight)

    def quantized_count(self, t: Tensor) -> int:
        """How many of `t`'s copies the checkpoint's quantization_config quantizes."""
        if t.kind != "linear" or not self.quant_scope or t.role in ("router", "conv", "vision") \
                or (t.role == "lm_head" and not self.quant_lm_head) \
                or (self.quant_scope == "experts" and not t.expert):
            return 0
        if not self.quant_skip:
            return t.count
        if not t.layers:
            return 0 if _skipped(t.module, self.quant_skip) else t.count
        per = t.count // len(t.layers)
        return per * sum(1 for i in t.layers
                         if not _skipped(t.module.replace("{i}", str(i)), self.quant_skip))

    def _weight_bytes_parts(self, weight: Precision,
                            tensors: tuple[Tensor, ...] | None = None) -> tuple[int, int, int]:
        act = get_precision(self.act_dtype)
        native = bool(self.quant_scope) and weight.name == self.default_dtype
        dense = expert = embed = 0
        for t in self.tensors() if tensors is None else tensors:
            if t.kind == "linear" and native:
                q = self.quantized_count(t)
                b = weight.tensor_bytes(t.rows, t.cols) * q \
                    + act.value_bytes(t.rows * t.cols) * (t.count - q)
            elif t.kind == "linear" and t.role != "conv":
                b = weight.tensor_bytes(t.rows, t.cols) * t.count
            else:
                b = act.value_bytes(t.params)
            if t.expert:
                expert += b
            elif t.kind == "embedding":
                embed += b
            else:
                dense += b
        return dense, expert, embed

    def weight_bytes_16bit(self, weight: Precision) -> tuple[int, int]:
        """Of `weight_bytes_parts`' dense and routed-expert bytes, those kept in the 16-bit
        activation dtype under `weight` (norms, biases, routers, ignored modules, the LM head
        of a checkpoint that does not quantize it): a step streams them as 16-bit weights."""
        if weight.bits >= 16:
            dense, expert, _ = self.weight_bytes_parts(weight)
            return dense, expert
        act = get_precision(self.act_dtype)
        native = bool(self.quant_scope) and weight.name == self.default_dtype
        dense = expert = 0
        for t in self.tensors():
            if t.kind == "embedding":
                continue
            if t.kind == "linear" and native:
                b = act.value_bytes(t.rows * t.cols) * (t.count - self.quantized_count(t))
            elif t.kind == "linear" and t.role != "conv":
                b = 0
            else:
                b = act.value_bytes(t.params)
            if t.expert:
                expert += b
            else:
                dense += b
        return dense, expert

    def weight_bytes(self, weight: Precision) -> int:
        """Resident weight bytes W (all experts, quantization scales included)."""
        return sum(self.weight_bytes_parts(weight))

    def checkpoint_bytes(self, weight: Precision | None = None) -> int:
        """The checkpoint's weight bytes: W plus the multi-token-prediction layers it ships
        (docs/models.md compares this with each preset's published size)."""
        w = weight or get_precision(self.default_dtype)
        return self.weight_bytes(w) + sum(self._weight_bytes_parts(w, self.mtp_tensors()))

    # ---- KV cache -----------------------------------------------------------------------
    def layer_groups(self) -> tuple[LayerGroup, ...]:
        """The layers grouped by what they hold per sequence (LayerGroup); every KV and
        attention figure below and the step's price (bstar.step) sum over these."""
        return _layer_groups(self)

    def kinds(self) -> tuple[str, ...]:
        """Each layer's kind: "full", "sliding", "chunked", "dsa", "linear_attention",
        "mamba" or "none"."""
        if self.layer_kinds:
            kinds = self.layer_kinds
        elif self.sliding_layers and self.sliding_window:
            kinds = tuple("sliding" if s else "full" for s in self.sliding_layers)
        else:
            kinds = ("full",) * self.num_layers
        if self.index_topk:
            kinds = tuple("dsa" if k == "full" else k for k in kinds)
        return kinds

    def state_bytes_per_seq_per_layer(self, kind: str) -> int:
        """Fixed bytes per sequence of one "linear_attention" or "mamba" layer: its
        convolution state (kernel - 1 past inputs) and its recurrent state, at the
        checkpoint's dtypes (vLLM's MambaStateShapeCalculator, docs/models.md)."""
        conv_bits, ssm_bits = self.state_bits
        if kind == "linear_attention":
            nk, nv, dk, dv = self.linear_heads
            conv = (2 * nk * dk + nv * dv) * (self.conv_kernel - 1)
            ssm = nv * dk * dv
        else:
            version, nh, hd, ng, ds, inner, _ = self.mamba
            if version == 2:
                conv = (inner + 2 * ng * ds) * (self.conv_kernel - 1)
                ssm = nh * hd * ds
            else:
                conv = inner * (self.conv_kernel - 1)
                ssm = inner * ds
        return math.ceil(conv * conv_bits / 8) + math.ceil(ssm * ssm_bits / 8)

    def _layer_groups(self) -> tuple[LayerGroup, ...]:
        if self.is_mla:
            per_pos = 2 * self.num_heads * (self.kv_lora_rank + self.qk_rope_head_dim) \
                + 2 * self.num_heads * self.kv_lora_rank
        else:
            per_pos = 4 * self.num_heads * self.head_dim
        values = self.kv_values_per_token_per_layer()
        base = dict(kv_values_per_token=values,
                    kv_heads=0 if self.is_mla else self.num_kv_heads,
                    decode_flops_per_pos=per_pos,
                    prefill_flops_per_pair=2 * self.num_heads * self.head_dim,
                    query_heads=self.num_heads)
        kinds = self.kinds()
        count = {k: kinds.count(k) for k in dict.fromkeys(kinds)}
        out = []
        if count.get("full"):
            out.append(LayerGroup("full", count["full"], **base))
        if count.get("sliding"):
            out.append(LayerGroup("sliding", count["sliding"],
                                  window_tokens=self.sliding_window, **base))
        if count.get("chunked"):
            out.append(LayerGroup("chunked", count["chunked"],
                                  chunk_tokens=self.attention_chunk, **base))
        if count.get("dsa"):
            idx = self.index_values_per_token()
            out.append(LayerGroup("dsa", count["dsa"], topk_tokens=self.index_topk,
                                  index_values_per_token=idx,
                                  **{**base, "kv_values_per_token": values + idx}))
        for kind in ("linear_attention", "mamba"):
            if count.get(kind):
                heads = self.linear_heads[1] if kind == "linear_attention" \
                    else self.mamba[1] or self.mamba[5]
                mixer = "gdn" if kind == "linear_attention" else f"mamba{self.mamba[0]}"
                out.append(LayerGroup("state", count[kind], kv_heads=heads, mixer=mixer,
                                      state_bytes_per_seq=self.state_bytes_per_seq_per_layer(
                                          kind)))
        return tuple(out)

    def index_values_per_token(self) -> int:
        """DeepSeek-V3.2's indexer key per token per layer, in 16-bit values: vLLM caches it
        as fp8 with one fp32 scale per 128 values (index_head_dim + 4 bytes per 128)."""
        if not self.index_head_dim:
            return 0
        return math.ceil((self.index_head_dim + 4 * math.ceil(self.index_head_dim / 128)) / 2)

    def kv_values_per_token_per_layer(self) -> int:
        if self.is_mla:
            # vLLM caches MLA's compressed latent plus the decoupled rope key, once per layer.
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.num_kv_heads * self.head_dim

    def kv_bytes_per_token(self, kv: Precision, num_gpus: int = 1) -> int:
        """KV bytes per token of context over all layers that cache tokens (per GPU under
        tensor parallel); a fixed per-sequence state is not per token."""
        return sum(g.num_layers * g.kv_values_per_token_per_gpu(num_gpus) * kv.bits // 8
                   for g in self.layer_groups() if g.kind != "state")

    def kv_values_per_token_per_layer_per_gpu(self, num_gpus: int) -> int:
        if self.is_mla:
            return self.kv_values_per_token_per_layer()  # the latent is replicated
        # KV heads shard across GPUs; with fewer heads than GPUs each GPU keeps one copy.
        heads = max(1, math.ceil(self.num_kv_heads / num_gpus))
        return 2 * heads * self.head_dim

    def kv_tokens_held(self, context_tokens: int) -> tuple[int, ...]:
        """Tokens of KV each layer holds for a sequence of this context (group order)."""
        return tuple(t for g in self.layer_groups()
                     for t in (g.held(context_tokens),) * g.num_layers)

    def kv_bytes_per_seq(self, context_tokens: int, kv: Precision, *, num_gpus: int = 1,
                         block_tokens: int = 1) -> int:
        """Exact KV bytes one sequence of `context_tokens` holds (per GPU), in blocks of
        `block_tokens` (vLLM allocates 16-token blocks: a partial block costs a full one),
        plus any fixed per-sequence state."""
        total = 0
        for g in self.layer_groups():
            held = g.held(context_tokens)
            per_layer = g.kv_values_per_token_per_gpu(num_gpus) * kv.bits // 8
            blocks = math.ceil(held / block_tokens) * block_tokens
            total += g.num_layers * (blocks * per_layer + g.state_bytes_per_seq_per_gpu(
                num_gpus if g.kv_heads else 1))
        return total

    def attention_flops_per_token(self, context_tokens: int) -> int:
        """Decode attention FLOPs for one new token against `context_tokens` of KV:
        QK^T and AV, 2 FLOPs per multiply-add each (MLA in its absorbed form)."""
        return sum(g.num_layers * g.decode_flops_per_pos * g.held(context_tokens)
                   for g in self.layer_groups())


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


_MIXER = {"full": "attn", "sliding": "attn", "chunked": "attn", "dsa": "attn",
          "linear_attention": "gdn", "mamba": "mamba", "none": "none"}
# Module-path prefixes of multimodal and hybrid checkpoints, normalized before matching.
_PREFIXES = (("model.language_model.", "model."), ("language_model.model.", "model."),
             ("language_model.", ""), ("backbone.", "model."))


def _norm_path(path: str) -> str:
    for old, new in _PREFIXES:
        if path.startswith(old):
            return new + path[len(old):]
    return path


@functools.lru_cache(maxsize=65536)
def _skipped(module: str, patterns: tuple[str, ...]) -> bool:
    """Whether a module path matches a quantization_config ignore list the way the loaders
    read it: "re:<regex>" (compressed-tensors), globs ("model.layers.*.self_attn", gpt-oss),
    and plain names matching whole path components (transformers' modules_to_not_convert:
    "lm_head", "mlp.gate", "model.layers.0.self_attn")."""
    module = _norm_path(module)
    parts = module.split(".")
    ancestors = [".".join(parts[:k]) for k in range(1, len(parts) + 1)]
    for raw in patterns:
        if raw.startswith("re:"):
            try:
                rx = re.compile(raw[3:])
            except re.error:
                continue
            if any(rx.fullmatch(a) for a in ancestors) or rx.match(module):
                return True
            continue
        p = _norm_path(raw)
        if "*" in p or "?" in p or "[" in p:
            if any(fnmatch.fnmatchcase(a, p) for a in ancestors):
                return True
        elif f".{p}." in f".{module}.":
            return True
    return False


# ---- reading configs --------------------------------------------------------------------
# Bounds that no real model reaches (vocabularies are ~10^5-10^6, layers ~10^2): a larger
# value is a broken config, and accepting it would build absurd per-layer tuples.
_MAX_DIM = 1 << 24
_MAX_LAYERS = 10_000
def _req(cfg: Mapping[str, Any], where: str, *keys: str) -> Any:
    for k in keys:
        if k in cfg and cfg[k] is not None:
            return cfg[k]
    raise BstarError(f"{where}: config is missing {' or '.join(repr(k) for k in keys)}")


def _int(cfg: Mapping[str, Any], where: str, *keys: str, default: int | None = None) -> int:
    try:
        v = _req(cfg, where, *keys)
    except BstarError:
        if default is None:
            raise
        return default
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) \
            or v != int(v):
        raise BstarError(f"{where}: {keys[0]!r} must be an integer, got {v!r}")
    if not 0 <= v <= _MAX_DIM:
        raise BstarError(f"{where}: {keys[0]!r} = {v!r} is out of range (0..{_MAX_DIM:,})")
    return int(v)


ASSUME_ENV = "BSTAR_ASSUME_UNMODELED"
_ASSUME_HINT = f"; --assume-unmodeled (or {ASSUME_ENV}=1) proceeds"

# layer_types entries and the kind each is (docs/models.md).
_LAYER_TYPES = {"full_attention": "full", "attention": "full", "global_attention": "full",
                "sliding_attention": "sliding", "chunked_attention": "chunked",
                "linear_attention": "linear_attention", "mamba": "mamba"}
# Nemotron-H's hybrid_override_pattern: one character per layer.
_PATTERN = {"M": ("mamba", "none"), "*": ("full", "none"), "-": ("none", "dense"),
            "E": ("none", "moe")}
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
    vision: tuple[Tensor, ...] = ()
    if "text_config" in cfg and "hidden_size" not in cfg:  # multimodal wrappers
        tc = cfg["text_config"]
        if not isinstance(tc, Mapping):
            raise BstarError(f"{where}: 'text_config' must be a JSON object, got "
                             f"{type(tc).__name__}")
        vision = _vision_tensors(cfg, where)
        cfg = {**tc, "torch_dtype": tc.get("torch_dtype") or cfg.get("torch_dtype"),
               "quantization_config": cfg.get("quantization_config")
               or tc.get("quantization_config")}
    mt = str(cfg.get("model_type", "llama"))
    _check_unmodeled(cfg, mt, where, assume_unmodeled)
    max_pos = cfg.get("max_position_embeddings")
    if max_pos is not None and (isinstance(max_pos, bool) or not isinstance(max_pos, int | float)
                                or not math.isfinite(max_pos) or max_pos != int(max_pos)
                                or not 0 <= max_pos <= 1 << 40):
        raise BstarError(f"{where}: 'max_position_embeddings' must be a non-negative integer, "
                         f"got {max_pos!r}")
    max_pos = int(max_pos or 0)
    if mt == "opt":
        return _from_opt(cfg, name, where, assume_unmodeled)
    h = _int(cfg, where, "hidden_size", "n_embd", "d_model")
    blocks = cfg.get("layers_block_type", cfg.get("hybrid_override_pattern"))
    n_layers = _int(cfg, where, "num_hidden_layers", "n_layer", "num_layers",
                    default=len(blocks) if mt == "nemotron_h" and isinstance(blocks, list | str)
                    else None)
    if n_layers > _MAX_LAYERS:
        raise BstarError(f"{where}: num_hidden_layers = {n_layers} is out of range "
                         f"(1..{_MAX_LAYERS:,})")
    n_heads = _positive(cfg, where, "num_attention_heads", "n_head")
    n_kv = _int(cfg, where, "num_key_value_heads", "num_kv_heads", default=n_heads)
    head_dim = _int(cfg, where, "head_dim", "attention_head_dim", default=h // n_heads)
    kw: dict[str, Any] = {}
    if mt.startswith("deepseek") or cfg.get("kv_lora_rank"):
        kw |= dict(kv_lora_rank=_int(cfg, where, "kv_lora_rank"),
                   q_lora_rank=_int(cfg, where, "q_lora_rank", default=0),
                   qk_nope_head_dim=_int(cfg, where, "qk_nope_head_dim"),
                   qk_rope_head_dim=_int(cfg, where, "qk_rope_head_dim"),
                   v_head_dim=_int(cfg, where, "v_head_dim"))
        head_dim = kw["qk_nope_head_dim"] + kw["qk_rope_head_dim"]
        if cfg.get("index_topk"):
            kw |= dict(index_heads=_int(cfg, where, "index_n_heads"),
                       index_head_dim=_int(cfg, where, "index_head_dim"),
                       index_topk=_int(cfg, where, "index_topk"))
        kw["mtp_layers"] = _int(cfg, where, "num_nextn_predict_layers", default=0)
    kinds, window, chunk = _layer_kinds(cfg, mt, n_layers, max_pos, where, assume_unmodeled)
    mlp_kinds = _mlp_kinds(cfg, mt, n_layers, where)
    if all(k == "none" for k in kinds):
        raise BstarError(f"{where}: no layer attends or holds a state (every layer is an MLP)")
    n_exp = _int(cfg, where, "num_local_experts", "n_routed_experts", "num_experts", default=0)
    if n_exp:
        kw |= dict(num_experts=n_exp,
                   num_experts_per_tok=_int(cfg, where, "num_experts_per_tok",
                                            "experts_per_token"),
                   moe_intermediate_size=_int(cfg, where, "moe_intermediate_size",
                                              "intermediate_size"))
        n_shared = _int(cfg, where, "n_shared_experts", "num_shared_experts", default=0)
        if n_shared:
            kw["shared_intermediate_size"] = n_shared * kw["moe_intermediate_size"]
        shared = _int(cfg, where, "shared_expert_intermediate_size", default=0)
        if shared:
            kw["shared_intermediate_size"] = shared
            kw["shared_expert_gate"] = True
        kw["num_dense_layers"] = _int(cfg, where, "first_k_dense_replace", default=0)
        if not mlp_kinds and (cfg.get("mlp_only_layers")
                              or _int(cfg, where, "decoder_sparse_step", default=1) != 1):
            raise BstarError(f"{where}: interleaved dense/MoE layers (mlp_only_layers, "
                             "decoder_sparse_step) are not supported yet")
        kw["router_bias"] = cfg.get("topk_method") == "noaux_tc" or mt == "gpt_oss"
    elif mlp_kinds and "moe" in mlp_kinds:
        raise BstarError(f"{where}: MoE layers without an expert count (n_routed_experts)")
    inter = _int(cfg, where, "intermediate_size", "ffn_dim", "n_inner",
                 default=kw.get("moe_intermediate_size", 4 * h))
    if mt.startswith("llama4"):
        kw["dense_intermediate_size"] = _int(cfg, where, "intermediate_size_mlp", default=0)
        kw["shared_intermediate_size"] = inter  # one shared expert beside the routed ones
    if mt == "granitemoehybrid":
        shared = _int(cfg, where, "shared_intermediate_size", default=0)
        if n_exp:
            kw["shared_intermediate_size"] = shared
        else:
            inter = shared or inter
    if mt == "qwen3_next":
        kw |= dict(attn_output_gate=True, linear_heads=(
            _int(cfg, where, "linear_num_key_heads"), _int(cfg, where, "linear_num_value_heads"),
            _int(cfg, where, "linear_key_head_dim"), _int(cfg, where, "linear_value_head_dim")),
            conv_kernel=_int(cfg, where, "linear_conv_kernel_dim"),
            mtp_layers=_int(cfg, where, "mtp_num_hidden_layers", default=0))
    if "mamba" in kinds:
        kw |= _mamba(cfg, mt, h, where)
    act = _act_dtype(cfg)
    # vLLM keeps Nemotron-H's recurrent state in float32 unless the config says otherwise
    # (NemotronHForCausalLMConfig.DEFAULT_MAMBA_SSM_CACHE_DTYPE); others in the model dtype.
    ssm_default = "float32" if mt == "nemotron_h" else None
    kw["state_bits"] = (get_precision(act).bits, _dtype_bits(
        cfg.get("mamba_ssm_cache_dtype", ssm_default), act, where))
    quant = _quantization(cfg, where, act, assume_unmodeled)
    qkv_bias = bool(cfg.get("attention_bias", False)) or mt in ("qwen2", "qwen2_moe")
    gemma = mt.startswith("gemma2") or mt.startswith("gemma3")
    act_fn = str(cfg.get("mlp_hidden_act") or cfg.get("hidden_act") or "silu")
    simple = all(k in ("full", "sliding") for k in kinds)
    return ModelSpec(
        name=name, model_type=mt, hidden_size=h, num_layers=n_layers, num_heads=n_heads,
        num_kv_heads=n_kv, head_dim=head_dim,
        vocab_size=_int(cfg, where, "vocab_size"), intermediate_size=inter,
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


def _positive(cfg: Mapping[str, Any], where: str, *keys: str) -> int:
    v = _int(cfg, where, *keys)
    if v <= 0:
        raise BstarError(f"{where}: {keys[0]!r} must be positive, got {v}")
    return v


def _check_unmodeled(cfg: Mapping[str, Any], mt: str, where: str, assume: bool) -> None:
    if assume:
        return
    for key, what in _UNMODELED.items():
        if cfg.get(key) and not (mt == "nemotron_h" and key == "layers_block_type"):
            raise BstarError(f"{where}: {key!r} ({what}) changes what the model holds and "
                             f"bstar does not model it{_ASSUME_HINT} ignoring it")
    if mt not in _STATE_FAMILIES:
        for key in cfg:
            if key.startswith(("mamba", "ssm_", "linear_num", "rwkv", "hybrid_override")):
                raise BstarError(f"{where}: {key!r}: state-space or linear-attention layers "
                                 f"of model_type {mt!r} are not modelled{_ASSUME_HINT} "
                                 "ignoring them")


def _layer_kinds(cfg: Mapping[str, Any], mt: str, n_layers: int, max_pos: int, where: str,
                 assume: bool) -> tuple[tuple[str, ...], int, int]:
    """(each layer's kind, sliding window, attention chunk) from the config's keys."""
    window = 0
    if cfg.get("sliding_window") and cfg.get("use_sliding_window") is not False:
        window = _int(cfg, where, "sliding_window")
    chunk = _int(cfg, where, "attention_chunk_size", default=0) if mt.startswith("llama4") \
        else 0
    types = cfg.get("layer_types")
    if mt == "nemotron_h":
        return _nemotron_blocks(cfg, n_layers, where)[0], window, chunk
    if types is not None:
        if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
            raise BstarError(f"{where}: 'layer_types' must be a list of strings, got "
                             f"{type(types).__name__}")
        if len(types) != n_layers:
            raise BstarError(f"{where}: 'layer_types' has {len(types)} entries for "
                             f"{n_layers} layers")
        kinds = []
        for t in types:
            k = _LAYER_TYPES.get(t)
            if k is None:
                if not assume:
                    raise BstarError(f"{where}: layer_types has {t!r}, a layer kind bstar "
                                     f"does not model{_ASSUME_HINT} pricing it as full "
                                     "attention")
                k = "full"
            if (k == "sliding" and not window) or (k == "chunked" and not chunk):
                k = "full"
            kinds.append(k)
        return tuple(kinds), window, chunk
    if mt == "jamba":
        period = _positive(cfg, where, "attn_layer_period")
        offset = _int(cfg, where, "attn_layer_offset")
        return tuple("full" if i % period == offset else "mamba" for i in range(n_layers)), \
            window, chunk
    if mt == "qwen3_next":
        every = _positive(cfg, where, "full_attention_interval")
        return tuple("full" if (i + 1) % every == 0 else "linear_attention"
                     for i in range(n_layers)), window, chunk
    if chunk:
        nope = cfg.get("no_rope_layers")
        if not nope:
            every = _positive(cfg, where, "no_rope_layer_interval") \
                if "no_rope_layer_interval" in cfg else 4
            nope = [int((i + 1) % every != 0) for i in range(n_layers)]
        if not isinstance(nope, list) or len(nope) != n_layers:
            raise BstarError(f"{where}: 'no_rope_layers' must list one 0/1 per layer")
        # vLLM's Llama-4: RoPE layers use chunked local attention, NoPE layers attend fully.
        return tuple("chunked" if r else "full" for r in nope), window, chunk
    if not window:
        return ("full",) * n_layers, 0, chunk
    if mt.startswith("gemma2"):
        # Gemma-2 alternates: even layers slide, odd layers attend globally (HF Gemma2).
        return tuple("sliding" if i % 2 == 0 else "full" for i in range(n_layers)), window, 0
    if "sliding_window_pattern" in cfg:
        every = _positive(cfg, where, "sliding_window_pattern")
        return tuple("full" if (i + 1) % every == 0 else "sliding"
                     for i in range(n_layers)), window, 0
    if max_pos and window >= max_pos:
        return ("full",) * n_layers, 0, chunk
    return ("sliding",) * n_layers, window, chunk


def _nemotron_blocks(cfg: Mapping[str, Any], n_layers: int,
                     where: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Nemotron-H's layers (mixer kinds, MLP kinds): hybrid_override_pattern (M Mamba-2,
    * attention, - MLP, E MoE) or, as transformers 5 writes it, layers_block_type
    ("linear_attention" is its name for a Mamba-2 layer)."""
    pattern = cfg.get("hybrid_override_pattern")
    if pattern is None:
        blocks = cfg.get("layers_block_type", cfg.get("layer_types"))
        names = {"linear_attention": "M", "mamba": "M", "full_attention": "*",
                 "attention": "*", "mlp": "-", "moe": "E"}
        if not isinstance(blocks, list) or not all(isinstance(b, str) for b in blocks):
            raise BstarError(f"{where}: Nemotron-H needs 'hybrid_override_pattern' or "
                             "'layers_block_type' (a list of strings)")
        for b in blocks:
            if b not in names:
                raise BstarError(f"{where}: layers_block_type has {b!r}, a layer kind bstar "
                                 "does not model")
        pattern = "".join(names[b] for b in blocks)
    if not isinstance(pattern, str) or len(pattern) != n_layers:
        raise BstarError(f"{where}: 'hybrid_override_pattern' must be a string of one "
                         f"character per layer ({n_layers})")
    for c in pattern:
        if c not in _PATTERN:
            raise BstarError(f"{where}: hybrid_override_pattern has {c!r}, a layer kind "
                             "bstar does not model (M, *, - and E are)")
    return tuple(_PATTERN[c][0] for c in pattern), tuple(_PATTERN[c][1] for c in pattern)


def _mlp_kinds(cfg: Mapping[str, Any], mt: str, n_layers: int, where: str) -> tuple[str, ...]:
    if mt == "nemotron_h":
        return _nemotron_blocks(cfg, n_layers, where)[1]
    if mt.startswith("llama4"):
        moe = cfg.get("moe_layers")
        if moe is None:
            step = _positive(cfg, where, "interleave_moe_layer_step") \
                if "interleave_moe_layer_step" in cfg else 1
            moe = list(range(step - 1, n_layers, step))
        if not isinstance(moe, list) or not all(isinstance(i, int) for i in moe):
            raise BstarError(f"{where}: 'moe_layers' must be a list of layer indices")
        return tuple("moe" if i in set(moe) else "dense" for i in range(n_layers))
    if mt == "jamba" and _int(cfg, where, "num_experts", default=0) > 1:
        period = _positive(cfg, where, "expert_layer_period")
        offset = _int(cfg, where, "expert_layer_offset")
        return tuple("moe" if i % period == offset else "dense" for i in range(n_layers))
    return ()


def _mamba(cfg: Mapping[str, Any], mt: str, h: int, where: str) -> dict[str, Any]:
    """The Mamba mixer's sizes under each family's key spelling."""
    def get(*keys: str, default: int | None = None) -> int:
        return _int(cfg, where, *keys, default=default)

    kernel = get("conv_kernel", "mamba_d_conv")
    out = dict(conv_kernel=kernel,
               conv_bias=bool(cfg.get("use_conv_bias", cfg.get("mamba_conv_bias", True))),
               ssm_proj_bias=bool(cfg.get("use_bias", cfg.get("mamba_proj_bias", False))))
    if mt == "jamba":
        inner = get("mamba_expand") * h
        ds = get("mamba_d_state")
        rank = cfg.get("mamba_dt_rank", "auto")
        dt_rank = math.ceil(h / 16) if rank == "auto" else get("mamba_dt_rank")
        return out | dict(mamba=(1, 0, 0, 0, ds, inner, dt_rank))
    nh = get("mamba_num_heads", "mamba_n_heads")
    hd = get("mamba_head_dim", "mamba_d_head")
    ng = get("n_groups", "mamba_n_groups", default=1)
    ds = get("ssm_state_size", "mamba_d_state")
    inner = nh * hd
    if nh <= 0 or hd <= 0 or kernel < 1:
        raise BstarError(f"{where}: Mamba heads, head dim and conv kernel must be positive")
    return out | dict(mamba=(2, nh, hd, ng, ds, inner, 0))


def _vision_tensors(cfg: Mapping[str, Any], where: str) -> tuple[Tensor, ...]:
    """A multimodal checkpoint's vision encoder (a ViT: Gemma-3's SigLIP, Llama-4's) and its
    projector, from vision_config: the bytes vLLM loads beside the language model."""
    vc = cfg.get("vision_config")
    if not isinstance(vc, Mapping):
        return ()
    text = cfg["text_config"]
    vw = f"{where} vision_config"
    h = _int(vc, vw, "hidden_size")
    inter = _int(vc, vw, "intermediate_size")
    n = _int(vc, vw, "num_hidden_layers")
    patch = _int(vc, vw, "patch_size")
    image = _int(vc, vw, "image_size")
    channels = _int(vc, vw, "num_channels", default=3)
    th = _int(text, where, "hidden_size")
    if patch <= 0 or n > _MAX_LAYERS:
        raise BstarError(f"{vw}: patch_size must be positive")
    patches = (image // patch) ** 2

    def v(name: str, rows: int, cols: int, count: int, kind: str = "linear") -> Tensor:
        return Tensor(f"vision.{name}", rows, cols, count, kind, module=f"vision_tower.{name}",
                      role="vision")

    out = [v("attn", h, h, 4 * n), v("attn.bias", 4 * h, 1, n, "vector"),
           v("mlp.fc1", inter, h, n), v("mlp.fc2", h, inter, n),
           v("mlp.bias", inter + h, 1, n, "vector"), v("layer_norms", h, 1, 4 * n, "vector")]
    cls = 1 if str(vc.get("model_type", "")).startswith("llama4") else 0
    out += [v("patch_embedding", h, channels * patch * patch, 1),
            v("position_embedding", patches + cls, h, 1, "vector"),
            v("post_layernorm", h, 1, 2 * (1 + cls), "vector")]
    if cls:
        # Llama-4: a class token, the pixel-shuffle MLP and the projector into the text model.
        ratio = float(vc.get("pixel_shuffle_ratio", 0.5))
        shuffled = round(h / (ratio * ratio))
        proj_in = _int(vc, vw, "projector_input_dim")
        proj_out = _int(vc, vw, "projector_output_dim")
        out += [v("class_embedding", h, 1, 1, "vector"),
                v("adapter.fc1", proj_in, shuffled, 1), v("adapter.fc2", proj_out, proj_in, 1),
                v("projector", th, _int(vc, vw, "vision_output_dim"), 1)]
    else:
        # Gemma-3: the projection into the text model and its soft-embedding norm.
        out += [v("projector", th, h, 1), v("projector.norm", h, 1, 1, "vector")]
    return tuple(out)


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


def _quantization(cfg: Mapping[str, Any], where: str, act: str,
                  assume: bool) -> dict[str, Any]:
    """The checkpoint's weight precision and which linears it covers, from
    quantization_config (docs/models.md, one row per method)."""
    q = cfg.get("quantization_config")
    plain = dict(default_dtype=act)
    if q is None:
        return plain
    if not isinstance(q, Mapping):
        raise BstarError(f"{where}: 'quantization_config' must be a JSON object")
    method = str(q.get("quant_method", "")).lower()
    skip = _patterns(q, where, "modules_to_not_convert", "ignore", "ignored_layers",
                     "exclude_modules", "llm_int8_skip_modules")
    scope, lm_head = "linear", False
    bits = q.get("bits", q.get("w_bit"))
    if method == "mxfp4":
        name, scope = "mxfp4", "experts"  # vLLM's Mxfp4Config quantizes the MoE experts only
    elif method == "fp8":
        name = "fp8-block" if q.get("weight_block_size") else "fp8-tensor"
        if q.get("weight_block_size") not in (None, [128, 128]):
            raise BstarError(f"{where}: quantization_config weight_block_size "
                             f"{q.get('weight_block_size')!r} (bstar models [128, 128])")
    elif method == "fbgemm_fp8":
        name = "fp8"
    elif method in ("awq", "gptq", "awq_marlin", "gptq_marlin"):
        group = q.get("group_size", q.get("q_group_size", 128))
        if not isinstance(group, int) or isinstance(group, bool) or group == 0 or group < -1:
            raise BstarError(f"{where}: quantization_config group_size must be a positive "
                             f"integer or -1, got {group!r}")
        g = 0 if group == -1 else group
        if method.startswith("awq"):
            if bits != 4:
                raise BstarError(f"{where}: quantization_config bits {bits!r} with awq "
                                 "(bstar models 4)")
            name = f"int4-g{g}"
        else:
            if bits not in (4, 8):
                raise BstarError(f"{where}: quantization_config bits {bits!r} with gptq "
                                 "(bstar models 4 and 8)")
            name = f"gptq{bits}-g{g}"
            lm_head = bool(q.get("lm_head", False))
    elif method == "modelopt":
        algo = str(q.get("quant_algo", "")).upper()
        names = {"FP8": "fp8-tensor", "NVFP4": "nvfp4"}
        if algo not in names:
            return _unknown_quant(f"quant_algo {algo!r} of modelopt", where, act, assume)
        name = names[algo]
    elif method == "compressed-tensors":
        name = _compressed_tensors(q, where)
        if name is None:
            return _unknown_quant("config_groups of compressed-tensors", where, act, assume)
    elif method == "bitsandbytes":
        if q.get("load_in_4bit"):
            name = "bnb4-dq" if q.get("bnb_4bit_use_double_quant") else "bnb4"
        elif q.get("load_in_8bit"):
            name = "bnb8"
        else:
            return _unknown_quant("bitsandbytes without load_in_4bit/8bit", where, act, assume)
    else:
        return _unknown_quant(f"quant_method {method!r}", where, act, assume)
    name = get_precision(name).name  # int4-g128 is int4
    return dict(default_dtype=name, quant_scope=scope, quant_skip=skip, quant_lm_head=lm_head)


def _unknown_quant(what: str, where: str, act: str, assume: bool) -> dict[str, Any]:
    if not assume:
        raise BstarError(f"{where}: quantization_config {what} is not a method bstar models"
                         f"{_ASSUME_HINT} with the weights in {act}")
    return dict(default_dtype=act)


def _patterns(q: Mapping[str, Any], where: str, *keys: str) -> tuple[str, ...]:
    out: list[str] = []
    for k in keys:
        v = q.get(k)
        if v is None:
            continue
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise BstarError(f"{where}: quantization_config {k!r} must be a list of names")
        out += v
    return tuple(out)


def _compressed_tensors(q: Mapping[str, Any], where: str) -> str | None:
    """compressed-tensors' weight scheme (W4A16 / W8A16 pack-quantized, W8A8 int8, FP8,
    NVFP4) when every config group uses the same one; None otherwise."""
    groups = q.get("config_groups")
    if not isinstance(groups, Mapping) or not groups:
        return None
    names = set()
    for g in groups.values():
        w = g.get("weights") if isinstance(g, Mapping) else None
        if not isinstance(w, Mapping):
            return None
        nb, typ = w.get("num_bits"), str(w.get("type", "int"))
        strategy = str(w.get("strategy", "tensor"))
        gs = w.get("group_size") or 0
        if not isinstance(gs, int):
            raise BstarError(f"{where}: compressed-tensors group_size must be an integer")
        if typ == "float" and nb == 8:
            names.add({"tensor": "fp8-tensor", "channel": "fp8", "block": "fp8-block"}
                      .get(strategy, ""))
        elif typ == "float" and nb == 4:
            names.add("nvfp4" if strategy in ("tensor_group", "group") and gs == 16 else "")
        elif typ == "int" and nb in (4, 8):
            if strategy == "channel":
                names.add("int8" if nb == 8 else "w4a16-g0")
            elif strategy == "group" and gs > 0:
                names.add(f"w{nb}a16-g{gs}" + ("" if w.get("symmetric", True) else "-asym"))
            else:
                names.add("")
        else:
            names.add("")
    if len(names) != 1 or "" in names:
        return None
    return names.pop()


def _from_opt(cfg: Mapping[str, Any], name: str, where: str, assume: bool) -> ModelSpec:
    h = _int(cfg, where, "hidden_size")
    if _int(cfg, where, "word_embed_proj_dim", default=h) != h:
        raise BstarError(f"{where}: OPT with word_embed_proj_dim != hidden_size (opt-350m) is "
                         "not supported")
    n_heads = _positive(cfg, where, "num_attention_heads")
    bias = bool(cfg.get("enable_bias", True))
    act = _act_dtype(cfg)
    return ModelSpec(
        name=name, model_type="opt", hidden_size=h,
        num_layers=_int(cfg, where, "num_hidden_layers"), num_heads=n_heads,
        num_kv_heads=n_heads, head_dim=h // n_heads, vocab_size=_int(cfg, where, "vocab_size"),
        intermediate_size=_int(cfg, where, "ffn_dim"),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)),
        mlp_gated=False, mlp_bias=bias, qkv_bias=bias, o_bias=bias,
        norm_bias=bool(cfg.get("layer_norm_elementwise_affine", True)),
        # OPT's learned position table has 2 extra rows (its padding offset).
        learned_positions=_int(cfg, where, "max_position_embeddings") + 2,
        act_dtype=act, **_quantization(cfg, where, act, assume), source=where,
        config=dict(cfg))


def load_config_file(path: Path) -> dict[str, Any]:
    p = path / "config.json" if path.is_dir() else path
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise BstarError(f"{p}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BstarError(f"{p}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise BstarError(f"{p}: config must be a JSON object")
    return data


def fetch_hub_config(repo_id: str, timeout_s: float = 10.0) -> dict[str, Any]:
    """Hub ids work only when online; never used by tests (they run offline)."""
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        raise BstarError(f"{repo_id!r} is not a preset or a local path, and HF_HUB_OFFLINE=1")
    import urllib.error
    import urllib.request

    url = f"https://huggingface.co/{repo_id}/resolve/main/config.json"
    req = urllib.request.Request(url)
    if token := os.environ.get("HF_TOKEN"):
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            data = json.loads(r.read())
    except (urllib.error.URLError, TimeoutError, json.JSONDecodeError) as e:
        raise BstarError(f"{repo_id!r} is not a preset or local path, and its config could not "
                         f"be fetched from the hub ({e})") from None
    if not isinstance(data, dict):
        raise BstarError(f"{url}: config must be a JSON object")
    return data


@functools.lru_cache(maxsize=256)
def _tensors(spec: ModelSpec) -> tuple[Tensor, ...]:
    return spec._tensors()


@functools.lru_cache(maxsize=256)
def _layer_groups(spec: ModelSpec) -> tuple[LayerGroup, ...]:
    return spec._layer_groups()


@functools.lru_cache(maxsize=256)
def _weight_bytes_parts(spec: ModelSpec, weight: Precision) -> tuple[int, int, int]:
    # Keyed by the spec's compared fields (its raw config is not one) and the precision.
    return spec._weight_bytes_parts(weight)
