"""The prefix cache on hand-sized cases, against vLLM V1's rules (kv_cache_manager.py,
block_pool.py): longest cached chain, last token always computed, shared blocks held once,
freed blocks cached and counted free until evicted least recently freed first."""

from __future__ import annotations

import numpy as np

from bstar.sim.prefix import PromptIds, PromptShape, block_keys, shape_workload
from bstar.sim.prefix_cache import CachingBlockManager
from bstar.sim.scheduler import Scheduler, SchedulerConfig
from bstar.sim.sequence import Requests
from bstar.sim.traffic import Workload

BS = 4


def make(segments: list[tuple[tuple[int, int], ...]], outputs: list[int], blocks: int,
         max_num_seqs: int = 8, budget: int = 64) -> Scheduler:
    prompts = [sum(n for _, n in s) for s in segments]
    reqs = Requests.new(np.array(prompts), np.array(outputs))
    ids = PromptIds(tuple(segments), tuple(1000 + i for i in range(len(segments))))
    bm = CachingBlockManager(blocks, BS, ids, reqs.prompt_tokens, reqs.output_tokens)
    return Scheduler(SchedulerConfig(max_num_seqs, budget), reqs, bm)


def step(s: Scheduler, t: float) -> tuple[list[int], list[int], list[int]]:
    plan = s.schedule()
    s.update(plan, t, t + 1.0)
    return plan.ids.tolist(), plan.start.tolist(), plan.new.tolist()


def test_block_keys_are_the_prefix_not_the_block() -> None:
    a = block_keys(((1, 8), (2, 8)), 9, 4, BS, 20)
    b = block_keys(((1, 8), (3, 8)), 9, 4, BS, 20)
    c = block_keys(((5, 8), (2, 8)), 9, 4, BS, 20)
    assert len(a) == 5  # 20 tokens: five full blocks, the answer's first block included
    assert a[:2] == b[:2] and a[2] != b[2]  # shared up to token 8, then apart
    assert a[0] != c[0] and a[2] != c[2]  # same second segment, other prefix: no match
    # A segment boundary inside a block: the same tokens give the same key.
    assert block_keys(((1, 6), (2, 6)), 9, 1, BS, 12)[1] == \
        block_keys(((1, 6), (2, 7)), 8, 1, BS, 12)[1]


def test_a_repeat_reuses_the_longest_chain_and_shares_its_blocks() -> None:
    s = make([((7, 10),), ((7, 10),)], [3, 3], blocks=20)
    s.add(0)
    assert step(s, 0.0) == ([0], [0], [10])  # a miss: 3 blocks, the 2 full ones cached
    s.add(1)
    # Running first: 0 decodes. Then 1: (10 - 1) // 4 = 2 blocks hit, 8 tokens; it computes
    # the other 2 in one new block.
    assert step(s, 1.0) == ([0, 1], [10, 8], [1, 2])
    bm = s.blocks
    assert (bm.hit_tokens, bm.query_tokens) == (8, 20)  # type: ignore[attr-defined]
    assert bm.num_used == 3 + 1  # the two shared blocks are held once


def test_a_prompt_cached_whole_still_computes_its_last_block() -> None:
    s = make([((7, 8),), ((7, 8),)], [1, 1], blocks=20)
    s.add(0)
    assert step(s, 0.0) == ([0], [0], [8])  # one output token: done, blocks freed
    assert s.blocks.num_free == 20  # freed blocks stay cached and count as free
    s.add(1)
    # Both blocks are cached, but the hit stops short of the last token: (8 - 1) // 4 = 1.
    assert step(s, 1.0) == ([1], [4], [4])


def test_freed_blocks_are_evicted_least_recently_freed_first() -> None:
    a, b, c = ((1, 8),), ((2, 8),), ((3, 8),)
    s = make([a, b, c, a, b], [1] * 5, blocks=4, max_num_seqs=1)
    for i in range(3):
        s.add(i)
        assert step(s, float(i)) == ([i], [0], [8])
    # The pool holds 4 blocks: A took 0-1, B 2-3, C the least recently freed: A's.
    bm = s.blocks
    assert bm.num_evicted == 2  # type: ignore[attr-defined]
    s.add(3)
    assert step(s, 3.0) == ([3], [0], [8])  # A was evicted: a miss
    s.add(4)
    # A's recompute took the least recently freed blocks again: B's. B misses as well.
    assert step(s, 4.0) == ([4], [0], [8])
    s2 = make([a, b, c, b], [1] * 4, blocks=6, max_num_seqs=1)
    for i in range(4):
        s2.add(i)
        plan = step(s2, float(i))
    assert plan == ([3], [4], [4])  # room for all three: B hits 1 block (its last computed)


def test_hits_on_free_blocks_count_against_the_free_pool() -> None:
    s = make([((1, 8),), ((1, 8), (2, 4))], [1, 1], blocks=3, max_num_seqs=1)
    s.add(0)
    step(s, 0.0)
    s.add(1)
    # 12 tokens: 2 blocks hit (both free, cached), 1 new: takes all 3 free blocks.
    assert step(s, 1.0) == ([1], [8], [4])


def test_multi_turn_hits_the_previous_prompt_and_answer() -> None:
    w = Workload(np.array([8, 8]), np.array([9, 9]), np.array([0.0, 100.0]))
    shaped = shape_workload(w, PromptShape(multi_turn=2))
    # Turn 2 = turn 1's 8 + its 9-token answer + an 8-token question.
    assert shaped.prompt_tokens.tolist() == [8, 25]
    ids = shaped.prompt_ids
    assert ids is not None
    reqs = Requests.new(shaped.prompt_tokens, shaped.output_tokens)
    bm = CachingBlockManager(50, BS, ids, reqs.prompt_tokens, reqs.output_tokens)
    s = Scheduler(SchedulerConfig(4, 64), reqs, bm)
    s.add(0)
    t = 0.0
    while not reqs.done[0]:
        step(s, t)
        t += 1
    s.add(1)
    # Turn 1 computed 8 + 8 = 16 tokens (its last answer token never is): 4 blocks, all
    # in turn 2's prefix.
    assert step(s, t)[1] == [16]


def test_generators_give_the_hits_their_shape_implies() -> None:
    w = Workload(np.full(6, 10), np.full(6, 2), np.arange(6.0))
    shaped = shape_workload(w, PromptShape(shared_prefix_tokens=8, prefix_groups=2))
    assert shaped.prompt_tokens.tolist() == [18] * 6
    ids = shaped.prompt_ids
    assert ids is not None
    # Requests 0, 2, 4 share group 0's system prompt; 1, 3, 5 group 1's.
    keys = [block_keys(ids.segments[i], ids.output_ids[i], 2, BS, 19) for i in range(6)]
    assert keys[0][:2] == keys[2][:2] == keys[4][:2] != keys[1][:2]
    assert keys[0][2] != keys[2][2]  # the rest is each prompt's own
    rep = shape_workload(w, PromptShape(distinct_prompts=2))
    assert rep.prompt_ids is not None
    assert rep.prompt_ids.segments[0] == rep.prompt_ids.segments[4]


def _engine_run(shape: PromptShape, fast_forward: bool = True, caching: bool = True,
                rate: float = 0.5, n: int = 60, gpu_util: float = 0.9, out: str = "50",
                seqs: int = 16):
    from dataclasses import replace

    from bstar.deployment import Deployment
    from bstar.sim import Poisson, SchedulerConfig, SimConfig, make_workload, parse_lengths
    from bstar.sim.engine import simulate
    from bstar.specs.gpu import get_gpu
    from bstar.specs.presets import get_model

    d = Deployment(model=get_model("llama-3-8b"), gpu=get_gpu("a100-80gb-sxm"),
                   gpu_util=gpu_util)
    w = make_workload(Poisson(rate), parse_lengths("uniform:100:400"), parse_lengths(out),
                      n, np.random.default_rng(3))
    w = shape_workload(w, shape)
    cfg = replace(SimConfig(SchedulerConfig(seqs, 2048)), fast_forward=fast_forward,
                  prefix_caching=caching)
    return w, simulate(d, cfg, w)


def test_engine_hits_match_the_generator_and_the_fast_path() -> None:
    # 5 distinct prompts sent in turn, far apart: every repeat hits all its full blocks
    # short of the last token, the first 5 miss.
    w, run = _engine_run(PromptShape(distinct_prompts=5))
    p = w.prompt_tokens
    expect = int(((p[5:] - 1) // 16 * 16).sum())
    assert run.prefix_hit_tokens == expect
    assert run.prefix_query_tokens == int(p.sum())
    _, slow = _engine_run(PromptShape(distinct_prompts=5), fast_forward=False)
    assert slow.prefix_hit_tokens == expect
    assert slow.num_steps == run.num_steps
    np.testing.assert_allclose(slow.requests.finish_s, run.requests.finish_s, rtol=1e-9)
    # The engine flag off: no cache, no counters, and the same requests take longer.
    _, off = _engine_run(PromptShape(distinct_prompts=5), caching=False)
    assert off.prefix_hit_tokens is None
    ttft = run.requests.first_token_s - run.requests.arrival_s
    ttft_off = off.requests.first_token_s - off.requests.arrival_s
    assert ttft[5:].mean() < ttft_off[5:].mean()


def test_shared_system_prompts_hit_once_per_group() -> None:
    _, run = _engine_run(PromptShape(shared_prefix_tokens=64, prefix_groups=3))
    # The first request of each group misses; the rest hit the 64 shared tokens (4 blocks).
    assert run.prefix_hit_tokens == (60 - 3) * 64


def test_under_kv_pressure_the_fast_path_still_matches_and_blocks_balance() -> None:
    """Preemption, eviction and shared blocks together: the multi-step jump changes nothing
    and every block comes back."""
    shape = PromptShape(shared_prefix_tokens=200, prefix_groups=4, distinct_prompts=40)
    kw = {"rate": 40.0, "n": 300, "gpu_util": 0.235, "out": "uniform:200:900", "seqs": 128}
    a = _engine_run(shape, **kw)[1]  # type: ignore[arg-type]
    b = _engine_run(shape, fast_forward=False, **kw)[1]  # type: ignore[arg-type]
    assert a.num_preemptions > 0 and a.prefix_hit_tokens
    assert (a.num_steps, a.num_preemptions, a.prefix_hit_tokens) == \
        (b.num_steps, b.num_preemptions, b.prefix_hit_tokens)
    np.testing.assert_allclose(a.requests.finish_s, b.requests.finish_s, rtol=1e-9)
    assert a.requests.done.all() and a.timeline.kv_used_blocks[-1] == 0


def test_a_longer_replay_shares_what_the_trace_shares_and_no_more() -> None:
    ids = PromptIds((((1, 8), (2, 4)), ((1, 8), (3, 4))), (10, 11))
    c = ids.cycle(4)
    assert c.segments[:2] == ids.segments  # the first pass is the trace itself
    assert c.segments[2][0] == (1, 8)  # the shared system prompt stays shared
    assert c.segments[2][1] != (2, 4) and c.segments[2][1][1] == 4  # its own part is new
    assert c.output_ids[2] not in ids.output_ids


def _mixed_ids(n: int, prompts: np.ndarray) -> PromptIds:
    """Every third prompt starts with one of two shared 48-token system prompts; a few quote
    an earlier prompt whole; the others are private (their first segment is theirs alone)."""
    segs: list[tuple[tuple[int, int], ...]] = []
    for i, p in enumerate(prompts.tolist()):
        if i % 3 == 0:
            segs.append(((10 + i % 2, 48), (1000 + i, p - 48)))
        elif i % 7 == 1 and i > 8 and p > prompts[i - 7]:  # quotes request i - 7's prompt
            segs.append(((1000 + i - 7, int(prompts[i - 7])), (2000 + i, p - prompts[i - 7])))
        else:
            segs.append(((1000 + i, p),))
    return PromptIds(tuple(segs), tuple(5000 + i for i in range(n)))


def test_private_requests_keyed_lazily_give_the_eager_run(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Issue 40: requests no other request can share (their first segment is theirs
    alone) are keyed only when a preemption releases them. A run with preemptions,
    evictions and shared prefixes is the same, to the bit, as keying every block at once."""
    from bstar.deployment import Deployment
    from bstar.sim import SimConfig, simulate
    from bstar.sim import prefix_cache as pc
    from bstar.specs.gpu import get_gpu
    from bstar.specs.presets import get_model

    d = Deployment(model=get_model("llama-3-8b"), gpu=get_gpu("a100-80gb-sxm"), gpu_util=0.22)
    rng = np.random.default_rng(3)
    n = 180
    prompts = rng.integers(60, 900, n)
    w = Workload(prompts, rng.integers(20, 400, n), np.cumsum(rng.exponential(0.05, n)),
                 prompt_ids=_mixed_ids(n, prompts))
    managers: list[CachingBlockManager] = []
    private: list[int] = []
    init = pc.CachingBlockManager.__init__

    def run(lazy: bool):  # type: ignore[no-untyped-def]
        def patched(self, *a, **k):  # type: ignore[no-untyped-def]
            init(self, *a, **k)
            private.append(int(self.lazy.sum()))
            if not lazy:
                self.lazy[:] = False
            managers.append(self)

        monkeypatch.setattr(pc.CachingBlockManager, "__init__", patched)
        return simulate(d, SimConfig(SchedulerConfig(64, 2048)), w)

    eager, lazy = run(False), run(True)
    assert n // 2 < private[1] < n  # most are private, not all
    assert managers[1].lazy.sum() < private[1]  # some were preempted and keyed
    assert eager.num_preemptions > 0 and managers[0].num_evicted > 0
    assert eager.prefix_hit_tokens and eager.prefix_hit_tokens > 0
    for f in ("first_token_s", "finish_s", "num_preemptions", "num_generated"):
        assert np.array_equal(getattr(eager.requests, f), getattr(lazy.requests, f),
                              equal_nan=True), f
    assert (eager.num_steps, eager.duration_s, eager.prefix_hit_tokens,
            eager.prefix_query_tokens) == (lazy.num_steps, lazy.duration_s,
                                           lazy.prefix_hit_tokens, lazy.prefix_query_tokens)
    assert managers[0].num_evicted == managers[1].num_evicted
    assert np.array_equal(eager.itl_values_s, lazy.itl_values_s)
