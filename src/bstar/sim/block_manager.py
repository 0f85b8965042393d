"""Paged KV cache as vLLM allocates it: fixed blocks of `block_size` tokens from one pool, a
sequence of t computed tokens holding ceil(t / block_size) blocks.

The pool is sized by the cost model's memory accounting (the same as B_mem): per-GPU KV pool
bytes // bytes of one block per GPU. Without prefix caching, which physical blocks a sequence
holds does not change any step's time, so the pool is kept as counts, not block ids.

A model whose layers all attend fully takes ceil(t / block_size) blocks of every layer for t
tokens. For a hybrid one (sliding windows, chunked or state layers) vLLM V1 pools each kind
apart (`kv_layout`): `num_engine_blocks` sizes that pool and `seq_blocks` counts a
sequence's blocks in it. A sliding or chunked layer gives back the blocks behind its window
as the sequence advances (vLLM's `remove_skipped_blocks`): `window_blocks` (passed as
`blocks_fn`, which `simulate` does for such models: `engine_pool`) counts what a sequence
holds after that, from the tokens it has slots for and those already computed. A state
model is still counted as if every layer held every token (conservative).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from bstar import roofline as rl
from bstar.deployment import Deployment
from bstar.errors import BstarError
from bstar.kv_pool import blocks_held, kv_layout


def block_bytes_per_gpu(d: Deployment, block_size: int) -> int:
    """Bytes of one KV block on each GPU: block_size tokens over all layers (a block of
    every layer, as a model whose layers are all one kind lays out its pool)."""
    return d.model.kv_bytes_per_seq(block_size, d.kv, num_gpus=d.num_gpus,
                                    block_size=block_size)


def num_gpu_blocks(d: Deployment, block_size: int) -> int:
    return max(0, rl.kv_pool_bytes(d) // block_bytes_per_gpu(d, block_size))


def engine_block_bytes_per_gpu(d: Deployment, block_size: int) -> int:
    """Bytes of one block of vLLM V1's pool (`kv_layout`): a page for each layer of
    a KV cache group. With `seq_blocks` it sizes a hybrid model's pool as the engine does."""
    return kv_layout(replace(d, block_size=block_size), block_size).bytes_per_block


def num_engine_blocks(d: Deployment, block_size: int) -> int:
    """The pool in `engine_block_bytes_per_gpu` blocks (pair it with `seq_blocks`)."""
    return max(0, rl.kv_pool_bytes(d) // engine_block_bytes_per_gpu(d, block_size))


def seq_blocks(d: Deployment, block_size: int) -> Callable[..., int]:
    """Blocks a sequence of t computed tokens holds, summed over the model's layer kinds as
    `kv_layout` counts them (non-decreasing in t)."""
    d = replace(d, block_size=block_size)
    kinds = kv_layout(d, block_size).kinds
    if len(kinds) == 1 and kinds[0].kind in ("full", "dsa"):
        return lambda t, computed=None: -(-t // block_size)

    def blocks(t: int, computed: int | None = None) -> int:  # frees nothing: `computed` unused
        return kv_layout(d, max(t, 1)).blocks_per_seq if t > 0 else 0

    return blocks


BlocksFn = Callable[[Any, Any], Any]


def window_blocks(d: Deployment, block_size: int) -> BlocksFn:
    """blocks(slots, computed): the blocks one sequence holds with `slots` token slots once
    the blocks behind `computed` tokens are freed (`blocks_held`), ints or arrays."""
    layout = kv_layout(replace(d, block_size=block_size), block_size)

    def blocks(slots: Any, computed: Any = None) -> Any:
        return blocks_held(layout, slots, slots if computed is None else computed)

    return blocks


def engine_pool(d: Deployment, block_size: int) -> tuple[int, int, BlocksFn] | None:
    """The pool `simulate` gives a model with sliding or chunked layers and no state ones:
    (blocks, bytes per block, `window_blocks`); None for other models (the classic
    all-layers block, `num_gpu_blocks`)."""
    layout = kv_layout(replace(d, block_size=block_size), block_size)
    if not layout.recycles or any(k.kind == "state" for k in layout.kinds):
        return None
    return (num_engine_blocks(d, block_size), layout.bytes_per_block,
            window_blocks(d, block_size))


def peak_blocks(d: Deployment, block_size: int, tokens: int, max_num_batched_tokens: int
                ) -> int:
    """The most blocks a sequence of `tokens` holds in `engine_pool`'s pool: vLLM's
    per-request admission cap (`SlidingWindowSpec.max_admission_blocks_per_request`), the
    start-up share at max_model_len = `tokens`."""
    return kv_layout(replace(d, block_size=block_size), max(tokens, 1),
                     max_num_batched_tokens).blocks_per_seq


def change_blocks(bm: BlockManager, n: int) -> None:
    """Take `n` blocks from the pool, or give -n back (a windowed sequence's net change)."""
    if n >= 0:
        bm.allocate(n)
    else:
        bm.free(-n)


class BlockManager:
    __slots__ = ("block_size", "blocks_fn", "num_blocks", "num_free", "num_host_blocks",
                 "num_host_free")
    caching = False  # counts only; `prefix_cache.CachingBlockManager` keeps block ids

    def __init__(self, num_blocks: int, block_size: int, num_host_blocks: int = 0,
                 blocks_fn: Callable[..., Any] | None = None) -> None:
        if num_blocks < 1:
            raise BstarError("the KV cache has no blocks: the weights and the reserve leave no "
                             "GPU memory for KV (raise --gpu-util, --num-gpus or lower "
                             "--reserve-gib)")
        if block_size < 1:
            raise BstarError(f"--block-size must be at least 1, got {block_size}")
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.num_free = num_blocks
        self.num_host_blocks = num_host_blocks  # swap space in host memory
        self.num_host_free = num_host_blocks
        self.blocks_fn = blocks_fn

    def blocks_for(self, tokens: Any, computed: Any = None) -> Any:
        """Blocks a sequence holds with `tokens` slots, the blocks behind `computed` tokens
        (default: all of them) freed by a windowed `blocks_fn`; ints or arrays."""
        if self.blocks_fn is not None:
            return self.blocks_fn(tokens, computed)
        return -(-tokens // self.block_size)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    def allocate(self, n: int) -> None:
        if n > self.num_free:  # the scheduler checks first; this is a bug, not user input
            raise RuntimeError(f"allocating {n} blocks with {self.num_free} free")
        self.num_free -= n

    def free(self, n: int) -> None:
        self.num_free += n
        if self.num_free > self.num_blocks:
            raise RuntimeError("freed more KV blocks than were allocated")
