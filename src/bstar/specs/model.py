"""ModelSpec: the architecture facts a decode cost model needs, read from a HF `config.json`.

Parameter counts are computed tensor by tensor from the config, never typed in, so that
the weight bytes (and hence B*) are exact for the precision chosen. The tensor list follows
the Hugging Face modeling code of each family (Llama/Mistral/Qwen2, Mixtral, Qwen3-MoE,
DeepSeek-V2/V3 with MLA, Gemma-2, OPT); unknown families that use Llama-style keys work too.
"""

from __future__ import annotations

import functools
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
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

    @property
    def params(self) -> int:
        return self.rows * self.cols * self.count


@dataclass(frozen=True, slots=True)
class LayerGroup:
    """Layers that hold the same state per sequence and cost the same per step: the unit in
    which the step's KV bytes and attention FLOPs are priced (bstar.step) and the KV pool is
    sized. Values are per layer for the whole model (before tensor parallel sharding).

    - `kind`: "full" (the whole context; MHA/GQA/MQA, MLA), "sliding" (the last
      `window_tokens`), "state" (a fixed state per sequence, independent of context).
    - `kv_values_per_token`: cached values per token per layer (K and V, or MLA's latent).
    - `kv_heads`: heads that tensor parallel splits the cache by; 0 = replicated on every GPU
      (MLA's latent).
    - `state_bytes_per_seq`: fixed bytes per sequence per layer (linear attention, SSM).
    - `decode_flops_per_pos`: attention FLOPs of one new token per held token per layer.
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

    def held(self, tokens: Any) -> Any:
        """Tokens of KV one layer holds (and decode reads) for a sequence of `tokens`;
        int or numpy array in, the same out."""
        if self.kind == "state":
            return tokens * 0
        if self.window_tokens:
            if isinstance(tokens, int):
                return min(tokens, self.window_tokens)
            import numpy as np

            return np.minimum(tokens, self.window_tokens)
        return tokens

    def read(self, tokens: Any) -> Any:
        """Tokens of KV one decode step reads per layer for a sequence holding `tokens`
        (bstar.step prices this): what it holds, unless the kind reads a subset."""
        return self.held(tokens)

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
        if self.is_moe and self.moe_intermediate_size % tp:
            return (f"each of its {self.num_experts} experts' MLP width "
                    f"{self.moe_intermediate_size} does not divide by {tp}")
        return None

    def tensor_parallel_sizes(self, limit: int = 64) -> list[int]:
        """The tensor-parallel sizes up to `limit` that `tensor_parallel_problem` accepts."""
        return [n for n in range(1, limit + 1) if self.tensor_parallel_problem(n) is None]

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers if self.is_moe else 0

    # ---- tensors ------------------------------------------------------------------------
    def tensors(self) -> tuple[Tensor, ...]:
        h, n_layers = self.hidden_size, self.num_layers
        out: list[Tensor] = [Tensor("embed_tokens", self.vocab_size, h, 1, "embedding")]
        if self.learned_positions:
            out.append(Tensor("embed_positions", self.learned_positions, h, 1, "embedding"))
        out += self._attention_tensors()
        n_dense = n_layers - self.num_moe_layers
        if n_dense:
            out += _mlp("mlp", h, self.intermediate_size, n_dense, self.mlp_gated, self.mlp_bias)
        if self.is_moe:
            n_moe, n_exp = self.num_moe_layers, self.num_experts
            out.append(Tensor("router", n_exp, h, n_moe, "linear"))
            if self.router_bias:
                out.append(Tensor("router.bias", n_exp, 1, n_moe, "vector"))
            out += _mlp("experts", h, self.moe_intermediate_size, n_moe * n_exp, True,
                        self.mlp_bias, expert=True)
            if self.shared_intermediate_size:
                out += _mlp("shared_experts", h, self.shared_intermediate_size, n_moe, True,
                            self.mlp_bias)
            if self.shared_expert_gate:
                out.append(Tensor("shared_expert_gate", 1, h, n_moe, "linear"))
        norm_vectors = 2 if self.norm_bias else 1
        out.append(Tensor("layer_norms", h, 1, n_layers * self.norms_per_layer * norm_vectors,
                          "vector"))
        out.append(Tensor("final_norm", h, 1, norm_vectors, "vector"))
        if not self.tie_word_embeddings:
            out.append(Tensor("lm_head", self.vocab_size, h, 1, "linear"))
        return tuple(out)

    def _attention_tensors(self) -> list[Tensor]:
        h, n_layers, n_heads = self.hidden_size, self.num_layers, self.num_heads
        if self.is_mla:
            qk_dim = self.qk_nope_head_dim + self.qk_rope_head_dim
            t: list[Tensor] = []
            if self.q_lora_rank:
                t += [Tensor("q_a_proj", self.q_lora_rank, h, n_layers, "linear"),
                      Tensor("q_a_layernorm", self.q_lora_rank, 1, n_layers, "vector"),
                      Tensor("q_b_proj", n_heads * qk_dim, self.q_lora_rank, n_layers, "linear")]
            else:
                t.append(Tensor("q_proj", n_heads * qk_dim, h, n_layers, "linear"))
            t += [Tensor("kv_a_proj_with_mqa", self.kv_lora_rank + self.qk_rope_head_dim, h,
                         n_layers, "linear"),
                  Tensor("kv_a_layernorm", self.kv_lora_rank, 1, n_layers, "vector"),
                  Tensor("kv_b_proj", n_heads * (self.qk_nope_head_dim + self.v_head_dim),
                         self.kv_lora_rank, n_layers, "linear"),
                  Tensor("o_proj", h, n_heads * self.v_head_dim, n_layers, "linear")]
            return t
        q_dim = n_heads * self.head_dim
        kv_dim = self.num_kv_heads * self.head_dim
        t = [Tensor("q_proj", q_dim, h, n_layers, "linear"),
             Tensor("k_proj", kv_dim, h, n_layers, "linear"),
             Tensor("v_proj", kv_dim, h, n_layers, "linear"),
             Tensor("o_proj", h, q_dim, n_layers, "linear")]
        if self.qkv_bias:
            t.append(Tensor("qkv.bias", q_dim + 2 * kv_dim, 1, n_layers, "vector"))
        if self.o_bias:
            t.append(Tensor("o_proj.bias", h, 1, n_layers, "vector"))
        if self.qk_norm:
            t.append(Tensor("qk_norm", self.head_dim, 1, 2 * n_layers, "vector"))
        return t

    # ---- counts -------------------------------------------------------------------------
    @property
    def num_params(self) -> int:
        """All parameters (what the checkpoint holds and the GPU keeps resident)."""
        return sum(t.params for t in self.tensors())

    @property
    def num_active_params(self) -> int:
        """Parameters one token uses: routed experts counted top-k of E, embeddings included
        (the convention behind published 'active' figures such as Mixtral's 12.9B)."""
        if not self.is_moe:
            return self.num_params
        unused = (self.num_experts - self.num_experts_per_tok) / self.num_experts
        expert = sum(t.params for t in self.tensors() if t.expert)
        return self.num_params - round(expert * unused)

    @property
    def matmul_params_per_token(self) -> int:
        """Weights multiplied per token (2 FLOPs each): active linears, the LM head (tied or
        not), never the embedding lookups."""
        lin = sum(t.params for t in self.tensors() if t.kind == "linear" and not t.expert)
        expert = sum(t.params for t in self.tensors() if t.expert)
        if self.is_moe:
            expert = expert * self.num_experts_per_tok // self.num_experts
        lm_head = self.vocab_size * self.hidden_size if self.tie_word_embeddings else 0
        return lin + expert + lm_head

    def weight_bytes_parts(self, weight: Precision) -> tuple[int, int, int]:
        """(dense bytes, routed-expert bytes, input-embedding bytes), exact.

        Linear weights take the weight precision; embeddings, norms and biases stay in the
        16-bit activation dtype, as AWQ/GPTQ/fp8 checkpoints keep them. A tied embedding is
        also the LM head, so under quantization it stays 16-bit too. Cached: every decode
        step of a curve asks (a plan asks a few hundred times).
        """
        return _weight_bytes_parts(self, weight)

    def _weight_bytes_parts(self, weight: Precision) -> tuple[int, int, int]:
        act = get_precision("fp16" if self.default_dtype == "fp16" else "bf16")
        dense = expert = embed = 0
        for t in self.tensors():
            if t.kind == "linear":
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

    def weight_bytes(self, weight: Precision) -> int:
        """Resident weight bytes W (all experts, quantization scales included)."""
        return sum(self.weight_bytes_parts(weight))

    # ---- KV cache -----------------------------------------------------------------------
    def layer_groups(self) -> tuple[LayerGroup, ...]:
        """The layers grouped by what they hold per sequence (LayerGroup); every KV and
        attention figure below and the step's price (bstar.step) sum over these."""
        return _layer_groups(self)

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
        layers = self.sliding_layers or (False,) * self.num_layers
        n_win = sum(1 for s in layers if s) if self.sliding_window else 0
        out = []
        if self.num_layers - n_win:
            out.append(LayerGroup("full", self.num_layers - n_win, **base))
        if n_win:
            out.append(LayerGroup("sliding", n_win, window_tokens=self.sliding_window, **base))
        return tuple(out)

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


def _mlp(name: str, h: int, inter: int, count: int, gated: bool, bias: bool,
         expert: bool = False) -> list[Tensor]:
    t = [Tensor(f"{name}.up", inter, h, count, "linear", expert),
         Tensor(f"{name}.down", h, inter, count, "linear", expert)]
    if gated:
        t.append(Tensor(f"{name}.gate", inter, h, count, "linear", expert))
    if bias:
        t.append(Tensor(f"{name}.bias", inter * (2 if gated else 1) + h, 1, count, "vector",
                        expert))
    return t


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


def from_hf_config(cfg: Mapping[str, Any], *, name: str = "model",
                   source: str = "") -> ModelSpec:
    """Build a ModelSpec from a parsed Hugging Face config.json."""
    where = source or name
    if not isinstance(cfg, Mapping):
        raise BstarError(f"{where}: config must be a JSON object")
    if "text_config" in cfg and "hidden_size" not in cfg:  # multimodal wrappers
        cfg = {**cfg["text_config"], "torch_dtype": cfg.get("torch_dtype")}
    mt = str(cfg.get("model_type", "llama"))
    if mt == "opt":
        return _from_opt(cfg, name, where)
    h = _int(cfg, where, "hidden_size", "n_embd", "d_model")
    n_layers = _int(cfg, where, "num_hidden_layers", "n_layer", "num_layers")
    if n_layers > _MAX_LAYERS:
        raise BstarError(f"{where}: num_hidden_layers = {n_layers} is out of range "
                         f"(1..{_MAX_LAYERS:,})")
    n_heads = _int(cfg, where, "num_attention_heads", "n_head")
    n_kv = _int(cfg, where, "num_key_value_heads", "num_kv_heads", default=n_heads)
    head_dim = _int(cfg, where, "head_dim", default=h // n_heads if n_heads else 0)
    kw: dict[str, Any] = {}
    if mt in ("deepseek_v2", "deepseek_v3") or cfg.get("kv_lora_rank"):
        kw |= dict(kv_lora_rank=_int(cfg, where, "kv_lora_rank"),
                   q_lora_rank=_int(cfg, where, "q_lora_rank", default=0),
                   qk_nope_head_dim=_int(cfg, where, "qk_nope_head_dim"),
                   qk_rope_head_dim=_int(cfg, where, "qk_rope_head_dim"),
                   v_head_dim=_int(cfg, where, "v_head_dim"))
        head_dim = kw["qk_nope_head_dim"] + kw["qk_rope_head_dim"]
    n_exp = _int(cfg, where, "num_local_experts", "n_routed_experts", "num_experts", default=0)
    if n_exp:
        kw |= dict(num_experts=n_exp,
                   num_experts_per_tok=_int(cfg, where, "num_experts_per_tok"),
                   moe_intermediate_size=_int(cfg, where, "moe_intermediate_size",
                                              "intermediate_size"))
        n_shared = _int(cfg, where, "n_shared_experts", default=0)
        if n_shared:
            kw["shared_intermediate_size"] = n_shared * kw["moe_intermediate_size"]
        shared = _int(cfg, where, "shared_expert_intermediate_size", default=0)
        if shared:
            kw["shared_intermediate_size"] = shared
            kw["shared_expert_gate"] = True
        kw["num_dense_layers"] = _int(cfg, where, "first_k_dense_replace", default=0)
        if cfg.get("mlp_only_layers") or _int(cfg, where, "decoder_sparse_step", default=1) != 1:
            raise BstarError(f"{where}: interleaved dense/MoE layers (mlp_only_layers, "
                             "decoder_sparse_step) are not supported yet")
        kw["router_bias"] = cfg.get("topk_method") == "noaux_tc"
    inter = _int(cfg, where, "intermediate_size", "ffn_dim", "n_inner",
                 default=kw.get("moe_intermediate_size", 4 * h))
    qkv_bias = bool(cfg.get("attention_bias", False)) or mt in ("qwen2", "qwen2_moe")
    sliding = _sliding(cfg, mt, n_layers, where)
    gemma2 = mt.startswith("gemma2") or mt.startswith("gemma3")
    return ModelSpec(
        name=name, model_type=mt, hidden_size=h, num_layers=n_layers, num_heads=n_heads,
        num_kv_heads=n_kv, head_dim=head_dim,
        vocab_size=_int(cfg, where, "vocab_size"), intermediate_size=inter,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", mt.startswith("gemma"))),
        mlp_gated=str(cfg.get("hidden_act", "silu")) not in ("relu", "gelu_new_ungated"),
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        qkv_bias=qkv_bias, o_bias=bool(cfg.get("attention_bias", False)),
        norms_per_layer=4 if gemma2 else 2,
        qk_norm=mt in ("qwen3", "qwen3_moe", "gemma3", "gemma3_text"),
        sliding_window=sliding[0], sliding_layers=sliding[1],
        default_dtype=_default_dtype(cfg), source=source, config=dict(cfg), **kw)


def _sliding(cfg: Mapping[str, Any], mt: str, n_layers: int,
             where: str) -> tuple[int, tuple[bool, ...]]:
    window = cfg.get("sliding_window")
    if not window or cfg.get("use_sliding_window") is False:
        return 0, ()
    window = _int(cfg, where, "sliding_window")
    if isinstance(cfg.get("layer_types"), list):
        types = cfg["layer_types"]
        return window, tuple(t == "sliding_attention" for t in types)
    if mt.startswith("gemma2"):
        # Gemma-2 alternates: even layers slide, odd layers attend globally (HF Gemma2).
        return window, tuple(i % 2 == 0 for i in range(n_layers))
    if window >= int(cfg.get("max_position_embeddings", 1 << 62)):
        return 0, ()
    return window, (True,) * n_layers


def _default_dtype(cfg: Mapping[str, Any]) -> str:
    q = cfg.get("quantization_config")
    if isinstance(q, Mapping):
        method = str(q.get("quant_method", "")).lower()
        bits = q.get("bits")
        if method == "fp8":
            return "fp8-block" if q.get("weight_block_size") else "fp8"
        if method in ("awq", "gptq") and bits == 4:
            return "int4"
    dt = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    # float32 checkpoints (Gemma-2) are served in bf16: vLLM's dtype "auto" downcasts them.
    return "fp16" if dt == "float16" else "bf16"


def _from_opt(cfg: Mapping[str, Any], name: str, where: str) -> ModelSpec:
    h = _int(cfg, where, "hidden_size")
    if _int(cfg, where, "word_embed_proj_dim", default=h) != h:
        raise BstarError(f"{where}: OPT with word_embed_proj_dim != hidden_size (opt-350m) is "
                         "not supported")
    n_heads = _int(cfg, where, "num_attention_heads")
    bias = bool(cfg.get("enable_bias", True))
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
        default_dtype=_default_dtype(cfg), source=where, config=dict(cfg))


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
def _layer_groups(spec: ModelSpec) -> tuple[LayerGroup, ...]:
    return spec._layer_groups()


@functools.lru_cache(maxsize=256)
def _weight_bytes_parts(spec: ModelSpec, weight: Precision) -> tuple[int, int, int]:
    # Keyed by the spec's compared fields (its raw config is not one) and the precision.
    return spec._weight_bytes_parts(weight)
