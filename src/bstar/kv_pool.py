"""The KV pool as vLLM V1 lays it out (docs/models.md): how many blocks and bytes one sequence
takes of it per kind of layer, per GPU (`kv_layout`), what it holds beside what is allocated
(`kv_per_kind`), and vLLM's default max_num_batched_tokens, on which a sliding or chunked
layer's share depends. Pure, no I/O; `bstar.roofline` sizes the pool and B_mem with these."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bstar.engine_defaults import vllm_defaults

if TYPE_CHECKING:
    from bstar.deployment import Deployment


def default_max_num_batched_tokens(d: Deployment) -> int:
    """vLLM's default max_num_batched_tokens for `vllm serve` on `d`'s GPU (the table in
    bstar.engine_defaults). A sliding or chunked layer's pool share depends on it."""
    return vllm_defaults(d.gpu).max_num_batched_tokens


@dataclass(frozen=True, slots=True)
class KvKind:
    """One kind of layer in the engine's KV pool: what one sequence takes of it."""

    kind: str  # LayerGroup kind: "full", "sliding", "chunked", "dsa", "state"
    num_layers: int
    pool_groups: int  # vLLM KV cache groups these layers fill (the last one padded)
    blocks_per_seq: int  # blocks of each of those groups one sequence takes
    tokens_per_seq: int  # tokens each layer keeps for a sequence (0: a fixed state)
    bytes_per_seq: int  # per GPU, block rounding and group padding included
    # Blocks of each group a decoding sequence holds at most once the blocks behind its
    # window (or chunk) are freed (`steady_blocks`); = blocks_per_seq for other kinds.
    steady_blocks_per_seq: int = 0
    window_tokens: int = 0  # sliding: the window; chunked: the chunk; else 0


@dataclass(frozen=True, slots=True)
class KvLayout:
    """The KV pool as vLLM V1 lays it out (docs/models.md): one page per layer per block,
    layers in KV cache groups of `group_size` (each kind's layers split into groups, the
    last padded), a block holding one page of each layer of a group; a sequence takes
    each group's blocks from one shared pool."""

    block_size: int  # raised for a hybrid model until the attention page holds a state
    page_bytes: int  # one layer's block, per GPU (a state's page is padded to it)
    group_size: int
    kinds: tuple[KvKind, ...]
    max_in_flight_tokens: int

    @property
    def bytes_per_block(self) -> int:
        return self.page_bytes * self.group_size

    @property
    def blocks_per_seq(self) -> int:
        return sum(k.pool_groups * k.blocks_per_seq for k in self.kinds)

    @property
    def bytes_per_seq(self) -> int:
        return self.blocks_per_seq * self.bytes_per_block

    @property
    def steady_blocks_per_seq(self) -> int:
        """Blocks a sequence holds in decode once out-of-window blocks are freed."""
        return sum(k.pool_groups * k.steady_blocks_per_seq for k in self.kinds)

    @property
    def recycles(self) -> bool:
        """Whether a sequence gives blocks back as it decodes (sliding or chunked layers)."""
        return any(k.kind in ("sliding", "chunked") for k in self.kinds)


def kv_layout(d: Deployment, context_tokens: int,
              max_num_batched_tokens: int | None = None) -> KvLayout:
    """How vLLM V1 sizes one sequence of `context_tokens` (its max_model_len) in the KV pool,
    per GPU (vllm/v1/kv_cache_interface.py, vllm/v1/core/kv_cache_utils.py):

    - full (and DSA): cdiv(tokens, block) blocks (FullAttentionSpec);
    - sliding: cdiv(min(window - 1 + in-flight tokens, tokens), block) + 1 blocks
      (SlidingWindowSpec: the window, the tokens being computed, and a block the window may
      start inside); chunked: cdiv(min(chunk + in-flight, tokens), block)
      (ChunkedLocalAttentionSpec);
    - state: two pages (MambaSpec in mamba_cache_mode "align", the default with prefix
      caching: the running state and the last block-aligned one; a Mamba-2 mixer a third,
      its prefill checkpoint), padded to the attention
      page; the attention block grows until its page holds the largest state
      (Platform._align_hybrid_block_size);
    - layers of each kind are split into KV cache groups of `group_size` layers (the fewest
      layers of a kind, or the most when under 1.5x the fewest), the last group padded.

    In-flight tokens are max_num_batched_tokens (default: vLLM's for the GPU)."""
    m, n = d.model, d.attention_tp  # a sequence's KV lives on its attention rank's GPUs
    groups = m.layer_groups()
    in_flight = max_num_batched_tokens or default_max_num_batched_tokens(d)
    attn = [g for g in groups if g.kind != "state"]
    states = [g for g in groups if g.kind == "state"]
    per_token = max((g.kv_values_per_token_per_gpu(n) * d.kv.bits // 8 for g in attn),
                    default=0)
    state_page = max((g.state_bytes_per_seq_per_gpu(g.shard_divisor(n)) for g in states),
                     default=0)
    block = d.block_size
    if per_token and state_page:
        block *= -(-state_page // (block * per_token))
    page = block * per_token if per_token else state_page
    counts = [g.num_layers for g in groups]
    lo, hi = min(counts), max(counts)
    group_size = hi if len(groups) == 1 or hi < 1.5 * lo else lo
    kinds = []
    ctx = context_tokens
    for g in groups:
        if g.kind == "state":
            # MambaSpec under mamba_cache_mode "align", vLLM's default while prefix caching
            # is on (MambaModelConfig): the running state and the last block-aligned one,
            # and for a Mamba-2 mixer a prefill checkpoint (MambaMixer2.get_kv_cache_spec).
            tokens, blocks = 0, 3 if g.mixer == "mamba2" else 2
        elif g.kind == "sliding":
            tokens = min(g.window_tokens - 1 + in_flight, ctx)
            blocks = -(-tokens // block) + 1
        elif g.kind == "chunked":
            tokens = min(g.chunk_tokens + in_flight, ctx)
            blocks = -(-tokens // block)
        else:
            tokens = ctx
            blocks = -(-ctx // block)
        pool_groups = -(-g.num_layers // group_size)
        span = g.window_tokens if g.kind == "sliding" else \
            g.chunk_tokens if g.kind == "chunked" else 0
        kinds.append(KvKind(g.kind, g.num_layers, pool_groups, blocks, tokens,
                            pool_groups * blocks * page * group_size,
                            steady_blocks(g.kind, span, ctx, block, blocks), span))
    return KvLayout(block, page, group_size, tuple(kinds), in_flight)


def steady_blocks(kind: str, span_tokens: int, context_tokens: int, block: int,
                  admitted_blocks: int) -> int:
    """Blocks of one KV cache group a decoding sequence of up to `context_tokens` holds at
    most once vLLM V1 frees the blocks no attention reads any more
    (`SingleTypeKVCacheManager.remove_skipped_blocks`, run from `allocate_slots` before each
    step's blocks; vllm/v1/core/single_type_kv_cache_manager.py):

    - sliding (`SlidingWindowManager`): with c tokens computed the c - window + 1 oldest are
      skipped, so the window - 1 kept tokens and the one being computed span at most
      cdiv(window - 1, block) + 1 blocks;
    - chunked (`ChunkedLocalAttentionManager`): the tokens before the current chunk's start
      are skipped: (block - gcd(chunk, block) + chunk - 1) // block + 1 blocks (chunk /
      block when the chunk is whole blocks; else it may start inside a block);
    - other kinds free nothing: `admitted_blocks`.

    Never more than the sequence's own cdiv(context, block), nor `admitted_blocks` (the
    start-up figure's share: the window plus one budget of tokens in flight)."""
    if kind == "sliding":
        held = -(-(span_tokens - 1) // block) + 1
    elif kind == "chunked":
        # a chunk starts at most block - gcd(chunk, block) tokens into a block
        held = (block - math.gcd(span_tokens, block) + span_tokens - 1) // block + 1
    else:
        return admitted_blocks
    return min(held, -(-context_tokens // block), admitted_blocks)


def blocks_held(layout: KvLayout, slot_tokens: Any, computed_tokens: Any) -> Any:
    """Blocks one sequence holds in the pool (`layout`'s blocks, every group summed) with
    `slot_tokens` token slots allocated (tokens computed plus those being computed) after
    vLLM V1 freed the blocks behind `computed_tokens` (`remove_skipped_blocks` with the
    tokens already processed): a full group holds cdiv(slots, block); a sliding group frees
    floor((computed - window + 1) / block) blocks from the front, a chunked group
    floor(chunk start / block). Ints or NumPy integer arrays (element-wise); state kinds
    hold their fixed pages. The simulator's blocks function (bstar.sim.block_manager)."""
    bs = layout.block_size
    slots = -(-slot_tokens // bs)
    total = 0 * slots
    for k in layout.kinds:
        if k.kind == "state":
            held = k.blocks_per_seq + 0 * slots
        elif k.kind == "sliding":
            skipped = (computed_tokens - k.window_tokens + 1) // bs
            held = slots - (skipped > 0) * skipped
        elif k.kind == "chunked":
            held = slots - computed_tokens // k.window_tokens * k.window_tokens // bs
        else:
            held = slots
        total = total + k.pool_groups * held
    return total


def kv_bytes_per_seq_allocated(d: Deployment, context_tokens: int,
                               max_num_batched_tokens: int | None = None) -> int:
    """What the engine allocates per sequence on each GPU (`kv_layout`): whole blocks, KV
    heads sharded, each layer kind's pool share as vLLM V1 counts it."""
    return kv_layout(d, context_tokens, max_num_batched_tokens).bytes_per_seq


def kv_per_kind(d: Deployment, context_tokens: int,
                max_num_batched_tokens: int | None = None) -> list[dict[str, int | str]]:
    """What one sequence of `context_tokens` holds per kind of layer (whole model, exact
    tokens: windows and chunks capped, states fixed) beside what the engine allocates for
    it per GPU (`kv_layout`). The "bytes" sum to `kv_bytes_per_seq`."""
    layout = kv_layout(d, context_tokens, max_num_batched_tokens)
    out: list[dict[str, int | str]] = []
    for g, k in zip(d.model.layer_groups(), layout.kinds, strict=True):
        held = int(g.held(context_tokens))
        per_token = g.kv_values_per_token * d.kv.bits // 8
        row: dict[str, int | str] = {
            "kind": g.kind, "layers": g.num_layers, "tokens_per_layer": held,
            "kv_bytes_per_token_per_layer": per_token,
            "state_bytes_per_layer": g.state_bytes_per_seq,
            "bytes": g.num_layers * (held * per_token + g.state_bytes_per_seq),
            "allocated_tokens_per_layer": k.tokens_per_seq,
            "allocated_blocks": k.pool_groups * k.blocks_per_seq,
            "allocated_blocks_per_layer": k.blocks_per_seq,
            "allocated_bytes_per_gpu": k.bytes_per_seq,
            "steady_blocks": k.pool_groups * k.steady_blocks_per_seq,
            "steady_blocks_per_layer": k.steady_blocks_per_seq,
            "block_bytes_per_gpu": layout.bytes_per_block}
        if g.window_tokens:
            row["window_tokens"] = g.window_tokens
        if g.chunk_tokens:
            row["chunk_tokens"] = g.chunk_tokens
        if g.topk_tokens:
            row["topk_tokens"] = g.topk_tokens
        out.append(row)
    return out
