"""vLLM V1's automatic prefix cache over the paged KV pool (vllm/v1/core/kv_cache_manager.py,
block_pool.py, kv_cache_utils.py), with block ids where `BlockManager` keeps counts:

- a full block is keyed by the prefix that ends with it (`prefix.block_keys`, vLLM's hash
  chain); blocks are cached when they are allocated for tokens that fill them (prompt and
  generated tokens alike, as `allocate_slots` calls `cache_blocks`);
- a request not yet computed looks up the longest chain of cached blocks of its tokens,
  never covering its last token (max_cache_hit_length = num_tokens - 1): a prompt cached
  whole still computes its last block;
- blocks are reference-counted: requests sharing a prefix hold the same blocks once;
- a freed block (ref count 0) stays cached in the free queue and counts as free, as vLLM's
  get_num_free_blocks and get_usage count it; a request frees its blocks last-first, so its
  tail is evicted first; a new block comes from the head of the queue (least recently freed),
  and taking it evicts whatever it cached;
- admitting a request with hits on free blocks takes them off the free queue: they count
  against the free blocks like new ones (get_num_blocks_to_allocate).

Hits and queries are counted at admission, for requests never preempted, as vLLM's
`vllm:prefix_cache_hits` / `_queries` counters count them (PrefixCacheStats.record).
Two blocks with one key (computed apart) keep the first in the index: vLLM indexes both.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from bstar.sim.block_manager import BlockManager
from bstar.sim.prefix import PromptIds, block_keys
from bstar.sim.sequence import IntArray


class CachingBlockManager(BlockManager):
    caching = True

    def __init__(self, num_blocks: int, block_size: int, ids: PromptIds,
                 prompt_tokens: IntArray, output_tokens: IntArray,
                 num_host_blocks: int = 0) -> None:
        super().__init__(num_blocks, block_size, num_host_blocks)
        self.ids = ids
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.ref = [0] * num_blocks
        self.key_of: list[int | None] = [None] * num_blocks
        self.index: dict[int, int] = {}  # block key -> block id
        self.free_q: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.req_blocks: dict[int, list[int]] = {}
        # Per request: its leading blocks already keyed.
        self.req_cached = np.zeros(int(prompt_tokens.size), dtype=np.int64)
        self.req_keys: dict[int, list[int]] = {}
        self.hit_tokens = 0
        self.query_tokens = 0
        self.num_evicted = 0
        # Bumped by whatever can change a lookup or its free hits: a key indexed or evicted, a
        # cached block taken or freed; `admission` reuses its answer while it stands.
        self.epoch = 0
        self._memo: tuple[int, int, int, list[int], int] = (-1, -1, -1, [], 0)

    # ---- keys and lookups ---------------------------------------------------------------------
    def _keys(self, rid: int) -> list[int]:
        keys = self.req_keys.get(rid)
        if keys is None:
            p, o = int(self.prompt_tokens[rid]), int(self.output_tokens[rid])
            keys = self.req_keys[rid] = block_keys(self.ids.segments[rid], self.ids.output_ids[rid],
                                                   o, self.block_size, p + o - 1)
        return keys

    def lookup(self, rid: int, num_tokens: int) -> list[int]:
        """Blocks of the longest cached chain of the request's first num_tokens - 1 tokens."""
        hit: list[int] = []
        get = self.index.get
        keys = self._keys(rid)
        for j in range(min((num_tokens - 1) // self.block_size, len(keys))):
            b = get(keys[j])
            if b is None:
                break
            hit.append(b)
        return hit

    def admission(self, rid: int, computed: int, num_tokens: int,
                  budget: int) -> tuple[list[int], int, int, int]:
        """(hit blocks, computed tokens, tokens to schedule, blocks it takes from the free
        queue) for a waiting request: a lookup when nothing of it is computed."""
        m_rid, m_tokens, m_epoch, hit, free_hits = self._memo
        if (m_rid, m_tokens, m_epoch) != (rid, num_tokens, self.epoch) or computed:
            hit = self.lookup(rid, num_tokens) if computed == 0 else []
            ref = self.ref
            free_hits = sum([ref[b] == 0 for b in hit])
            self._memo = (rid, num_tokens, self.epoch, hit, free_hits)
        c = computed + len(hit) * self.block_size
        n = min(num_tokens - c, budget)
        return hit, c, n, -(-(c + n) // self.block_size) - len(hit) + free_hits

    # ---- allocation ---------------------------------------------------------------------------
    def admit(self, rid: int, hit: list[int], total_blocks: int, cached_upto: int) -> None:
        """Give a request its hit blocks and new ones up to `total_blocks`; key the full blocks
        of its first `cached_upto` tokens. The caller checked `admission`'s need fits."""
        ref, free_q = self.ref, self.free_q
        for b in hit:
            if ref[b] == 0:
                del free_q[b]
                self.epoch += 1
            ref[b] += 1
        self.num_free = len(free_q)
        self.req_blocks[rid] = list(hit)
        self.req_cached[rid] = len(hit)
        self.grow(rid, total_blocks - len(hit), cached_upto)

    def record(self, num_tokens: int, hit_tokens: int) -> None:
        self.query_tokens += num_tokens
        self.hit_tokens += hit_tokens

    def grow(self, rid: int, n: int, cached_upto: int) -> None:
        """`n` new blocks for a request (least recently freed first, evicting what they
        cached); then key its blocks that `cached_upto` tokens fill."""
        if n > self.num_free:  # the scheduler checks first; this is a bug, not user input
            raise RuntimeError(f"allocating {n} blocks with {self.num_free} free")
        blocks = self.req_blocks.setdefault(rid, [])
        if n > 0:
            free_q, key_of, ref, index = self.free_q, self.key_of, self.ref, self.index
            for _ in range(n):
                b = free_q.popitem(last=False)[0]
                key = key_of[b]
                if key is not None:
                    if index.get(key) == b:
                        del index[key]
                    key_of[b] = None
                    self.num_evicted += 1
                    self.epoch += 1
                ref[b] = 1
                blocks.append(b)
            self.num_free = len(free_q)
        self._cache(rid, cached_upto)

    def _cache(self, rid: int, upto: int) -> None:
        done = int(self.req_cached[rid])
        full = upto // self.block_size
        if full <= done:
            return
        keys = self._keys(rid)
        blocks = self.req_blocks[rid]
        full = min(full, len(keys), len(blocks))
        index, key_of = self.index, self.key_of
        for j in range(done, full):
            key = keys[j]
            if key not in index:
                b = blocks[j]
                index[key] = b
                key_of[b] = key
                self.epoch += 1
        self.req_cached[rid] = max(done, full)

    def grow_many(self, ids: IntArray, need: IntArray, upto: IntArray) -> None:
        """`grow` for each running request that takes a block or fills one this step."""
        bs = self.block_size
        touch = (need > 0) | (upto // bs > self.req_cached[ids])
        for rid, n, u in zip(ids[touch].tolist(), need[touch].tolist(), upto[touch].tolist(),
                             strict=True):
            self.grow(rid, n, u)

    def release(self, rid: int) -> int:
        """Free a request's blocks, tail first; those no one else holds join the free queue
        and stay cached until taken. Returns the blocks the request held."""
        blocks = self.req_blocks.pop(rid, [])
        self.req_cached[rid] = 0
        ref, free_q = self.ref, self.free_q
        for b in reversed(blocks):
            ref[b] -= 1
            if ref[b] == 0:
                free_q[b] = None
                if self.key_of[b] is not None:
                    self.epoch += 1
        self.num_free = len(free_q)
        return len(blocks)

    def forget(self, rid: int) -> None:
        """Drop a finished request's keys (a preempted one keeps them for its lookup)."""
        self.req_keys.pop(rid, None)
