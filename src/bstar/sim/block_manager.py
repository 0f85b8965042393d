"""Paged KV cache as vLLM allocates it: fixed blocks of `block_size` tokens from one pool, a
sequence of t computed tokens holding ceil(t / block_size) blocks.

The pool is sized by the cost model's memory accounting (the same as B_mem): per-GPU KV pool
bytes // bytes of one block per GPU. Without prefix caching, which physical blocks a sequence
holds does not change any step's time, so the pool is kept as counts, not block ids.
"""

from __future__ import annotations

from bstar import roofline as rl
from bstar.errors import BstarError


def block_bytes_per_gpu(d: rl.Deployment, block_size: int) -> int:
    """Bytes of one KV block on each GPU: block_size tokens over all layers."""
    return d.model.kv_bytes_per_seq(block_size, d.kv, num_gpus=d.num_gpus,
                                    block_tokens=block_size)


def num_gpu_blocks(d: rl.Deployment, block_size: int) -> int:
    return max(0, rl.kv_pool_bytes(d) // block_bytes_per_gpu(d, block_size))


class BlockManager:
    __slots__ = ("block_size", "num_blocks", "num_free", "num_host_blocks", "num_host_free")

    def __init__(self, num_blocks: int, block_size: int, num_host_blocks: int = 0) -> None:
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

    def blocks_for(self, tokens: int) -> int:
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
