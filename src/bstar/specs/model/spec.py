"""ModelSpec: the architecture facts a decode cost model needs (docs/models.md; its fields and
their checks: `fields.py`) and every figure computed from them. Its tensors (`tensors.py`),
their bytes under a precision and the checkpoint's quantization (`weights.py`) and what each
layer holds per sequence (`layers.py`) are computed from the fields; `config.py` builds one
from a Hugging Face config.json."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from bstar.specs.model import layers as _layers
from bstar.specs.model import tensors as _tensors
from bstar.specs.model import weights as _weights
from bstar.specs.model.fields import ModelFields, Tensor
from bstar.specs.model.layers import LayerGroup
from bstar.specs.precision import Precision, get_precision


@dataclass(frozen=True, slots=True)
class ModelSpec(ModelFields):
    """A model's architecture (its fields: `ModelFields`) and every figure computed from
    it: tensors, parameter counts, weight bytes, KV and attention per layer group."""

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

    @property
    def num_moe_layers(self) -> int:
        return sum(1 for k in self.mlps() if k == "moe") if self.is_moe else 0

    # ---- tensors ------------------------------------------------------------------------
    def tensors(self) -> tuple[Tensor, ...]:
        """Every tensor the served model holds (`tensors.model_tensors`); cached."""
        return _tensors.cached_model_tensors(self)

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
        return _weights.cached_weight_bytes_parts(self, weight)

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

    def state_bytes_per_seq_per_layer(self, kind: str) -> int:
        """Fixed bytes per sequence of one "linear_attention" or "mamba" layer (its
        convolution and recurrent states)."""
        return _layers.state_bytes_per_seq_per_layer(self, kind)

    def index_values_per_token(self) -> int:
        """DeepSeek-V3.2's indexer key per token per layer, in 16-bit values."""
        return _layers.index_values_per_token(self)

    def kv_bytes_per_token(self, kv: Precision, num_gpus: int = 1) -> int:
        """KV bytes per token of context over all layers that cache tokens (per GPU under
        tensor parallel); a fixed per-sequence state is not per token."""
        return sum(g.num_layers * g.kv_values_per_token_per_gpu(num_gpus) * kv.bits // 8
                   for g in self.layer_groups() if g.kind != "state")

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
def _cached_layer_groups(spec: ModelSpec) -> tuple[LayerGroup, ...]:
    return _layers.layer_groups(spec)
