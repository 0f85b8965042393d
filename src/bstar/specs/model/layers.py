"""What each layer of a model holds per sequence and costs per step: its kind (docs/models.md:
full attention, a sliding window, Llama-4's chunked local attention, DeepSeek's sparse
attention, or a fixed state of a gated delta net or Mamba), grouped into LayerGroups, the
unit in which bstar.step prices KV bytes and attention FLOPs and the KV pool is sized."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bstar.specs.model.fields import MIXER as MIXER  # its home: fields.py

if TYPE_CHECKING:
    from bstar.specs.model.fields import ModelFields



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

    def prefill_pairs(self, start: Any, end: Any) -> Any:
        """The prefill price's (query, key) measure of a prompt chunk whose queries run from
        `start` to `end` tokens: end * read(end) - start * read(start) (a full layer's
        end^2 - start^2). A chunked layer attends within its chunk of `chunk_tokens`, so
        its measure restarts at each chunk boundary: whole chunks count chunk_tokens^2
        each, the last its part squared, and the difference never goes negative (the
        formula above did, for a chunk starting past the first boundary). numpy in, out."""
        import numpy as np

        if self.kind != "chunked":
            return end * self.read(end) - start * self.read(start)
        c = float(self.chunk_tokens)

        def measure(x: Any) -> Any:
            x = np.asarray(x, dtype=np.float64)
            whole = np.floor(x / c)
            return whole * c * c + (x - whole * c) ** 2

        return measure(end) - measure(start)

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


def layer_groups(m: ModelFields) -> tuple[LayerGroup, ...]:
    """The layers of `m` grouped by kind (`ModelSpec.kinds`), each with what it holds per
    sequence and what it costs per step."""
    if m.is_mla:
        per_pos = 2 * m.num_heads * (m.kv_lora_rank + m.qk_rope_head_dim) \
            + 2 * m.num_heads * m.kv_lora_rank
    else:
        per_pos = 4 * m.num_heads * m.head_dim
    values = m.kv_values_per_token_per_layer()
    # Per unit of causal area (2 per query x key pair): Q.K over head_dim and P.V over the
    # value width. MLA prefills in its decompressed (MHA) form: Q.K over the 192 nope + rope
    # dims, P.V over v_head_dim (128), not 2 x 192.
    pair = m.num_heads * (m.head_dim + m.v_head_dim) if m.is_mla and m.v_head_dim \
        else 2 * m.num_heads * m.head_dim
    base = dict(kv_values_per_token=values,
                kv_heads=0 if m.is_mla else m.num_kv_heads,
                decode_flops_per_pos=per_pos,
                prefill_flops_per_pair=pair,
                query_heads=m.num_heads)
    kinds = m.kinds()
    count = {k: kinds.count(k) for k in dict.fromkeys(kinds)}
    out = []
    if count.get("full"):
        out.append(LayerGroup("full", count["full"], **base))
    if count.get("sliding"):
        out.append(LayerGroup("sliding", count["sliding"],
                              window_tokens=m.sliding_window, **base))
    if count.get("chunked"):
        out.append(LayerGroup("chunked", count["chunked"],
                              chunk_tokens=m.attention_chunk, **base))
    if count.get("dsa"):
        idx = index_values_per_token(m)
        out.append(LayerGroup("dsa", count["dsa"], topk_tokens=m.index_topk,
                              index_values_per_token=idx,
                              **{**base, "kv_values_per_token": values + idx}))
    for kind in ("linear_attention", "mamba"):
        if count.get(kind):
            heads = m.linear_heads[1] if kind == "linear_attention" \
                else m.mamba[1] or m.mamba[5]
            mixer = "gdn" if kind == "linear_attention" else f"mamba{m.mamba[0]}"
            out.append(LayerGroup("state", count[kind], kv_heads=heads, mixer=mixer,
                                  state_bytes_per_seq=state_bytes_per_seq_per_layer(m, kind)))
    return tuple(out)


def state_bytes_per_seq_per_layer(m: ModelFields, kind: str) -> int:
    """Fixed bytes per sequence of one "linear_attention" or "mamba" layer: its
    convolution state (kernel - 1 past inputs) and its recurrent state, at the
    checkpoint's dtypes (vLLM's MambaStateShapeCalculator, docs/models.md)."""
    conv_bits, ssm_bits = m.state_bits
    if kind == "linear_attention":
        nk, nv, dk, dv = m.linear_heads
        conv = (2 * nk * dk + nv * dv) * (m.conv_kernel - 1)
        ssm = nv * dk * dv
    else:
        version, nh, hd, ng, ds, inner, _ = m.mamba
        if version == 2:
            conv = (inner + 2 * ng * ds) * (m.conv_kernel - 1)
            ssm = nh * hd * ds
        else:
            conv = inner * (m.conv_kernel - 1)
            ssm = inner * ds
    return math.ceil(conv * conv_bits / 8) + math.ceil(ssm * ssm_bits / 8)


def index_values_per_token(m: ModelFields) -> int:
    """DeepSeek-V3.2's indexer key per token per layer, in 16-bit values: vLLM caches it
    as fp8 with one fp32 scale per 128 values (index_head_dim + 4 bytes per 128)."""
    if not m.index_head_dim:
        return 0
    return math.ceil((m.index_head_dim + 4 * math.ceil(m.index_head_dim / 128)) / 2)
