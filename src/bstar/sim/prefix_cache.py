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

Cost (issue 40): a request whose first segment no other request of the workload starts
with is *private*: a block's key is the whole prefix that ends with it, so no other request
can ever hold one of its keys (short of a 64-bit hash collision, which the keys already
accept), and only the request itself, readmitted after a preemption, can hit its blocks.
Its blocks are keyed lazily: counted (`req_cached`) while it runs, put in the index when a
preemption releases them (its first chance to be looked up), and marked `_PRIVATE` when it
finishes (never looked up again; evicting one still counts in `num_evicted`). Its admission
skips the lookup (nothing of it can be cached yet) and its keys are never hashed. The hits,
evictions and free queue are the ones eager keying gives (tests/test_sim_prefix_cache.py
holds a run equal with and without the private path); what is left per block is the free
queue's O(1) moves. A workload of distinct prompts (100,000 distinct hash chains) costs
that, not a lookup and a key per block.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from itertools import islice
from typing import Any

import numpy as np

from bstar.sim.block_manager import BlockManager
from bstar.sim.prefix import PromptIds, block_keys
from bstar.sim.sequence import IntArray

# key_of's mark for a finished private request's keyed block: cached (evicting it counts)
# but in no index (nobody can look it up).
_PRIVATE: Any = object()


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
        self.key_of: list[Any] = [None] * num_blocks  # a key, None, or _PRIVATE
        self.index: dict[int, int] = {}  # block key -> block id
        self.free_q: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.req_blocks: dict[int, list[int]] = {}
        # Per request: its leading blocks already keyed.
        self.req_cached = np.zeros(int(prompt_tokens.size), dtype=np.int64)
        self.req_keys: dict[int, list[int]] = {}
        # Private requests (module docstring), lazy until a preemption keys their blocks.
        firsts = Counter(seg[0][0] if seg else None for seg in ids.segments)
        self.lazy = np.fromiter((firsts[seg[0][0] if seg else None] == 1
                                 for seg in ids.segments), dtype=bool, count=len(ids))
        # Full blocks among a request's first prompt + output - 1 tokens: len(_keys(rid)).
        self.num_keys = (prompt_tokens + output_tokens - 1) // block_size
        self.hit_tokens = 0
        self.query_tokens = 0
        self.num_evicted = 0
        # The last lookup (a blocked head is looked up every step), kept up to date from the
        # blocks taken or freed since (`touched`) instead of walked again.
        self._memo: _Lookup | None = None
        self.touched: list[int] = []

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
        keys = self._keys(rid)
        m = (num_tokens - 1) // self.block_size
        found = list(map(self.index.get, keys[:m] if m < len(keys) else keys))
        try:
            return found[:found.index(None)]  # type: ignore[return-value]
        except ValueError:
            return found  # type: ignore[return-value]

    def admission(self, rid: int, computed: int, num_tokens: int,
                  budget: int) -> tuple[list[int], int, int, int]:
        """(hit blocks, computed tokens, tokens to schedule, blocks it takes from the free
        queue) for a waiting request: a lookup when nothing of it is computed."""
        if computed or self.lazy[rid]:  # a private request's blocks are not cached yet
            hit, free_hits = [], 0
        else:
            hit, free_hits = self._lookup(rid, num_tokens)
        c = computed + len(hit) * self.block_size
        n = min(num_tokens - c, budget)
        return hit, c, n, -(-(c + n) // self.block_size) - len(hit) + free_hits

    def _touch(self, blocks: list[int]) -> None:
        self.touched += blocks
        if len(self.touched) > self.num_blocks:  # cheaper to look up again
            self.touched.clear()
            self._memo = None

    def _lookup(self, rid: int, num_tokens: int) -> tuple[list[int], int]:
        """`lookup` and how many of the hit blocks are free, from the memo where it holds."""
        memo, ref = self._memo, self.ref
        if memo is None or memo.rid != rid or memo.num_tokens != num_tokens:
            hit = self.lookup(rid, num_tokens)
            memo = self._memo = _Lookup(rid, num_tokens, hit, {b: j for j, b in enumerate(hit)},
                                        {b for b in hit if ref[b] == 0})
        else:
            keys, key_of, pos, free = self._keys(rid), self.key_of, memo.pos, memo.free
            cut = len(memo.hit)
            for b in set(self.touched):
                j = pos.get(b)
                if j is None:
                    continue
                if key_of[b] != keys[j]:  # evicted since
                    cut = min(cut, j)
                elif ref[b] == 0:
                    free.add(b)
                else:
                    free.discard(b)
            for b in memo.hit[cut:]:
                del pos[b]
                free.discard(b)
            del memo.hit[cut:]
            m = min((num_tokens - 1) // self.block_size, len(keys))
            get = self.index.get
            while len(memo.hit) < m:  # blocks cached since
                b = get(keys[len(memo.hit)])
                if b is None:
                    break
                pos[b] = len(memo.hit)
                memo.hit.append(b)
                if ref[b] == 0:
                    free.add(b)
        self.touched.clear()
        return memo.hit, len(memo.free)  # read at once: the next lookup changes it

    # ---- allocation ---------------------------------------------------------------------------
    def admit(self, rid: int, hit: list[int], total_blocks: int, cached_upto: int) -> None:
        """Give a request its hit blocks and new ones up to `total_blocks`; key the full blocks
        of its first `cached_upto` tokens. The caller checked `admission`'s need fits."""
        ref, free_q = self.ref, self.free_q
        for b in hit:
            if ref[b] == 0:
                del free_q[b]
                self.touched.append(b)
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
            free_q, key_of, ref = self.free_q, self.key_of, self.ref
            taken = list(islice(free_q, n))
            for b in taken:
                del free_q[b]
                ref[b] = 1
            keyed = [b for b in taken if key_of[b] is not None]
            if keyed:  # evict what they cached
                index = self.index
                for b in keyed:
                    key = key_of[b]
                    if index.get(key) == b:  # type: ignore[arg-type]
                        del index[key]  # type: ignore[arg-type]
                    key_of[b] = None
                self.num_evicted += len(keyed)
            self._touch(taken)
            blocks.extend(taken)
            self.num_free = len(free_q)
        self._cache(rid, cached_upto)

    def _cache(self, rid: int, upto: int) -> None:
        done = int(self.req_cached[rid])
        full = upto // self.block_size
        if full <= done:
            return
        blocks = self.req_blocks[rid]
        if self.lazy[rid]:  # counted now, keyed when released
            self.req_cached[rid] = max(done, min(full, int(self.num_keys[rid]), len(blocks)))
            return
        keys = self._keys(rid)
        full = min(full, len(keys), len(blocks))
        index, key_of = self.index, self.key_of
        for key, b in zip(keys[done:full], blocks[done:full], strict=True):
            if key not in index:
                index[key] = b
                key_of[b] = key
        self.req_cached[rid] = max(done, full)

    def grow_many(self, ids: IntArray, need: IntArray, upto: IntArray,
                  num_blocks: IntArray) -> None:
        """`grow` for each running request that takes a block or fills one this step
        (`num_blocks`: what each holds after it); a private request that only fills one is
        counted here at once, as `_cache` would count it."""
        full = upto // self.block_size
        done = self.req_cached[ids]
        fills = full > done
        count = fills & (need == 0) & self.lazy[ids]
        if count.any():
            sel = ids[count]
            self.req_cached[sel] = np.maximum(done[count], np.minimum(
                np.minimum(full[count], self.num_keys[sel]), num_blocks[count]))
        touch = (need > 0) | (fills & ~count)
        for rid, n, u in zip(ids[touch].tolist(), need[touch].tolist(), upto[touch].tolist(),
                             strict=True):
            self.grow(rid, n, u)

    def release(self, rid: int, finished: bool = False) -> int:
        """Free a request's blocks, tail first; those no one else holds join the free queue
        and stay cached until taken. Returns the blocks the request held. A private
        request's blocks are keyed here (`finished`: marked, as nobody will look them up)."""
        if self.lazy[rid]:
            done = int(self.req_cached[rid])
            if finished:
                key_of = self.key_of
                for b in self.req_blocks.get(rid, [])[:done]:
                    key_of[b] = _PRIVATE
            else:  # preempted: its blocks can be hit when it comes back, so key them
                self.lazy[rid] = False
                if done:
                    self.req_cached[rid] = 0
                    self._cache(rid, done * self.block_size)
        blocks = self.req_blocks.pop(rid, [])
        self.req_cached[rid] = 0
        ref = self.ref
        for b in blocks:
            ref[b] -= 1
        freed = [b for b in reversed(blocks) if ref[b] == 0]
        if freed:
            free_q = self.free_q
            for b in freed:  # at the tail, in order (2x faster than update(dict.fromkeys))
                free_q[b] = None
            self._touch(freed)
        self.num_free = len(self.free_q)
        return len(blocks)

    def forget(self, rid: int) -> None:
        """Drop a finished request's keys (a preempted one keeps them for its lookup)."""
        self.req_keys.pop(rid, None)


class _Lookup:
    """One request's last lookup: its hit blocks, their positions, those free."""

    __slots__ = ("free", "hit", "num_tokens", "pos", "rid")

    def __init__(self, rid: int, num_tokens: int, hit: list[int], pos: dict[int, int],
                 free: set[int]) -> None:
        self.rid, self.num_tokens, self.hit, self.pos, self.free = rid, num_tokens, hit, pos, free
