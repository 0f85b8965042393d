"""ModelSpec: the architecture facts a decode cost model needs (docs/models.md), validated at
construction. Its tensors (`tensors.py`), their bytes under a precision and the checkpoint's
quantization (`weights.py`) and what each layer holds per sequence (`layers.py`) are
computed from these fields; `config.py` builds one from a Hugging Face config.json."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bstar.errors import BstarError
from bstar.specs.model import layers as _layers
from bstar.specs.model import tensors as _tensors
from bstar.specs.model import weights as _weights
from bstar.specs.model.layers import MIXER, LayerGroup
from bstar.specs.model.tensors import Tensor
from bstar.specs.precision import Precision, get_precision


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
        return tuple(MIXER[k] for k in self.layer_kinds)

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
        """Every tensor the served model holds (`tensors.model_tensors`); cached."""
        return _cached_tensors(self)

    def mtp_tensors(self) -> tuple[Tensor, ...]:
        """Multi-token-prediction layers the checkpoint holds beside the model (DeepSeek's
        num_nextn_predict_layers, Qwen3-Next's mtp_num_hidden_layers): counted in the
        checkpoint's size, not in W (vLLM loads them only for speculative decoding)."""
        return _tensors.mtp_tensors(self)

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

    @property
    def expert_matmul_params_per_token(self) -> int:
        """Of `matmul_params_per_token`, the routed experts' (top-k of E): what the fused-MoE
        kernels multiply (0 for a dense model)."""
        if not self.is_moe:
            return 0
        vision = {id(t) for t in self.vision}
        expert = sum(t.params for t in self.tensors() if t.expert and id(t) not in vision)
        return expert * self.num_experts_per_tok // self.num_experts

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
        return _cached_weight_bytes_parts(self, weight)

    def quantized_count(self, t: Tensor) -> int:
        """How many of `t`'s copies the checkpoint's quantization_config quantizes."""
        return _weights.quantized_count(self, t)

    def weight_bytes_16bit(self, weight: Precision) -> tuple[int, int]:
        """Of `weight_bytes_parts`' dense and routed-expert bytes, those kept in the 16-bit
        activation dtype under `weight` (norms, biases, routers, ignored modules, the LM head
        of a checkpoint that does not quantize it): a step streams them as 16-bit weights."""
        return _weights.weight_bytes_16bit(self, weight)

    def weight_bytes(self, weight: Precision) -> int:
        """Resident weight bytes W (all experts, quantization scales included)."""
        return sum(self.weight_bytes_parts(weight))

    def checkpoint_bytes(self, weight: Precision | None = None) -> int:
        """The checkpoint's weight bytes: W plus the multi-token-prediction layers it ships
        (docs/models.md compares this with each preset's published size)."""
        w = weight or get_precision(self.default_dtype)
        return self.weight_bytes(w) + sum(
            _weights.weight_bytes_parts(self, w, self.mtp_tensors()))

    # ---- KV cache -----------------------------------------------------------------------
    def layer_groups(self) -> tuple[LayerGroup, ...]:
        """The layers grouped by what they hold per sequence (LayerGroup); every KV and
        attention figure below and the step's price (bstar.step) sum over these."""
        return _cached_layer_groups(self)

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
        """Fixed bytes per sequence of one "linear_attention" or "mamba" layer (its
        convolution and recurrent states)."""
        return _layers.state_bytes_per_seq_per_layer(self, kind)

    def index_values_per_token(self) -> int:
        """DeepSeek-V3.2's indexer key per token per layer, in 16-bit values."""
        return _layers.index_values_per_token(self)

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
                         block_size: int = 1) -> int:
        """Exact KV bytes one sequence of `context_tokens` holds (per GPU), in blocks of
        `block_size` (vLLM allocates 16-token blocks: a partial block costs a full one),
        plus any fixed per-sequence state."""
        total = 0
        for g in self.layer_groups():
            held = g.held(context_tokens)
            per_layer = g.kv_values_per_token_per_gpu(num_gpus) * kv.bits // 8
            blocks = math.ceil(held / block_size) * block_size
            total += g.num_layers * (blocks * per_layer + g.state_bytes_per_seq_per_gpu(
                num_gpus if g.kv_heads else 1))
        return total

    def attention_flops_per_token(self, context_tokens: int) -> int:
        """Decode attention FLOPs for one new token against `context_tokens` of KV:
        QK^T and AV, 2 FLOPs per multiply-add each (MLA in its absorbed form)."""
        return sum(g.num_layers * g.decode_flops_per_pos * g.held(context_tokens)
                   for g in self.layer_groups())


@functools.lru_cache(maxsize=256)
def _cached_tensors(spec: ModelSpec) -> tuple[Tensor, ...]:
    return _tensors.model_tensors(spec)


@functools.lru_cache(maxsize=256)
def _cached_layer_groups(spec: ModelSpec) -> tuple[LayerGroup, ...]:
    return _layers.layer_groups(spec)


@functools.lru_cache(maxsize=256)
def _cached_weight_bytes_parts(spec: ModelSpec, weight: Precision) -> tuple[int, int, int]:
    # Keyed by the spec's compared fields (its raw config is not one) and the precision.
    return _weights.weight_bytes_parts(spec, weight)
