"""ModelSpec's fields (`ModelFields`, validated at construction, with the per-layer facts
read straight off them), the token mixer of each layer kind (`MIXER`) and the tensor record
(`Tensor`). The lowest module of the package: tensors.py, weights.py and layers.py compute
from these, and spec.py's `ModelSpec` adds the figures, so none of them imports another in
a circle (docs/architecture.md)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bstar.errors import BstarError

# Each layer kind's token mixer: "attn", "gdn" (gated delta net), "mamba", "none".
MIXER = {"full": "attn", "sliding": "attn", "chunked": "attn", "dsa": "attn",
         "linear_attention": "gdn", "mamba": "mamba", "none": "none"}


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
class ModelFields:
    """The architecture facts a decode cost model needs (docs/models.md), validated at
    construction; `ModelSpec` adds every figure computed from them."""

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

    def mixers(self) -> tuple[str, ...]:
        """Each layer's token mixer: "attn", "gdn" (gated delta net), "mamba", "none"."""
        if not self.layer_kinds:
            return ("attn",) * self.num_layers
        return tuple(MIXER[k] for k in self.layer_kinds)

    def mlps(self) -> tuple[str, ...]:
        """Each layer's MLP: "dense", "moe" or "none"."""
        if self.mlp_kinds:
            return self.mlp_kinds
        if not self.is_moe:
            return ("dense",) * self.num_layers
        return ("dense",) * self.num_dense_layers \
            + ("moe",) * (self.num_layers - self.num_dense_layers)

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

    def kv_values_per_token_per_layer(self) -> int:
        if self.is_mla:
            # vLLM caches MLA's compressed latent plus the decoupled rope key, once per layer.
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.num_kv_heads * self.head_dim
