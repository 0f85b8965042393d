"""Paged KV cache as vLLM allocates it: fixed blocks of `block_size` tokens from one pool, a
sequence of t computed tokens holding ceil(t / block_size) blocks.

The pool is sized by the cost model's memory accounting (the same as B_mem): per-GPU KV pool
bytes // bytes of one block per GPU. Without prefix caching, which physical blocks a sequence
holds does not change any step's time, so the pool is kept as counts, not block ids.

A model whose layers all attend fully takes ceil(t / block_size) blocks of every layer for t
tokens. For a hybrid one (sliding windows, chunked or state layers) vLLM V1 pools each kind
apart (`kv_layout`): `num_engine_blocks` sizes that pool and `seq_blocks` (passed as
`blocks_fn`) counts a sequence's blocks in it; without them a hybrid is counted as if every
layer held every token (conservative).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from bstar import roofline as rl
from bstar.deployment import Deployment
from bstar.errors import BstarError
from bstar.kv_pool import kv_layout


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


def seq_blocks(d: Deployment, block_size: int) -> Callable[[int], int]:
    """Blocks a sequence of t computed tokens holds, summed over the model's layer kinds as
    `kv_layout` counts them (non-decreasing in t)."""
    d = replace(d, block_size=block_size)
    kinds = kv_layout(d, block_size).kinds
    if len(kinds) == 1 and kinds[0].kind in ("full", "dsa"):
        return lambda t: -(-t // block_size)

    def blocks(t: int) -> int:
        return kv_layout(d, max(t, 1)).blocks_per_seq if t > 0 else 0

    return blocks




class BlockManager:
    __slots__ = ("block_size", "blocks_fn", "num_blocks", "num_free", "num_host_blocks",
                 "num_host_free")
    caching = False  # counts only; `prefix_cache.CachingBlockManager` keeps block ids

    def __init__(self, num_blocks: int, block_size: int, num_host_blocks: int = 0,
                 blocks_fn: Callable[[int], int] | None = None) -> None:
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

    def blocks_for(self, tokens: int) -> int:
        if self.blocks_fn is not None:
            return self.blocks_fn(tokens)
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
