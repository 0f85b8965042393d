"""The batch a windowed model runs (issue 28, item 4): the blocks a sequence holds once vLLM
frees those behind its window, B_mem on them, and the simulator freeing them each step.

`blocks_held` is checked against a block table kept the way vLLM V1's
SingleTypeKVCacheManager keeps one (a list whose freed entries become the null block), so the
arithmetic is tested against the engine's procedure, not against itself."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from bstar import roofline as rl
from bstar.deployment import Deployment
from bstar.kv_pool import KvKind, KvLayout, blocks_held, kv_layout, steady_blocks
from bstar.plan import make_plan
from bstar.sim import SchedulerConfig, SimConfig, simulate
from bstar.sim.block_manager import engine_pool
from bstar.sim.traffic import Workload
from bstar.specs.gpu import get_gpu
from bstar.specs.presets import get_model


def _layout(kind: str, span: int, block: int) -> KvLayout:
    return KvLayout(block, 1, 1, (KvKind(kind, 1, 1, 0, 0, 0, 0, span),), 0)


class _BlockTable:
    """One request's block table in one KV cache group, as vLLM V1 keeps it: allocate_slots
    first frees the blocks no attention reads (`remove_skipped_blocks` with the computed
    tokens; a freed entry becomes the null block), then appends cdiv(slots, block) - len."""

    def __init__(self, kind: str, span: int, block: int) -> None:
        self.kind, self.span, self.block = kind, span, block
        self.table: list[bool] = []  # True: a real block, False: the null block

    def allocate_slots(self, computed: int, new: int) -> int:
        if self.kind == "sliding":  # SlidingWindowManager.get_num_skipped_tokens
            skipped = max(0, computed - self.span + 1)
        else:  # ChunkedLocalAttentionManager.get_num_skipped_tokens
            skipped = computed // self.span * self.span
        for i in range(min(skipped // self.block, len(self.table))):
            self.table[i] = False
        need = -(-(computed + new) // self.block)
        self.table += [True] * (need - len(self.table))
        return sum(self.table)


@pytest.mark.parametrize(("kind", "span", "block"), [
    ("sliding", 128, 16), ("sliding", 1024, 16), ("sliding", 100, 16), ("sliding", 128, 32),
    ("chunked", 64, 16), ("chunked", 72, 16)])
def test_blocks_held_is_vllms_block_table(kind: str, span: int, block: int) -> None:
    rng = np.random.default_rng(span + block)
    lay = _layout(kind, span, block)
    for _ in range(20):
        table, c = _BlockTable(kind, span, block), 0
        prompt = int(rng.integers(1, 700))
        while c < prompt + 300:  # prefill chunks of any size, then one token a step
            n = int(rng.integers(1, 300)) if c < prompt else 1
            assert table.allocate_slots(c, n) == blocks_held(lay, c + n, c), (c, n)
            c += n
    # element-wise on arrays, as the simulator's scheduler calls it
    c = np.arange(0, 2000, 7)
    got = blocks_held(lay, c + 3, c)
    assert list(got) == [blocks_held(lay, int(x) + 3, int(x)) for x in c]


@pytest.mark.parametrize(("kind", "span", "block"), [
    ("sliding", 128, 16), ("sliding", 1024, 16), ("sliding", 100, 16), ("sliding", 4096, 16),
    ("chunked", 8192, 16), ("chunked", 72, 16)])
def test_steady_blocks_is_the_most_a_decoding_sequence_holds(kind: str, span: int,
                                                             block: int) -> None:
    lay = _layout(kind, span, block)
    ctx = 3 * span + 5 * block
    most = max(blocks_held(lay, c + 1, c) for c in range(ctx))
    assert steady_blocks(kind, span, ctx, block, 10**9) == most
    small = span // 2  # a context inside the window keeps all its blocks
    assert steady_blocks(kind, span, small, block, 10**9) == -(-small // block)


def _dep(model: str, gpu: str = "h100-sxm") -> Deployment:
    return Deployment(model=get_model(model), gpu=get_gpu(gpu))


def test_gemma_3_27b_b_mem_is_steady_decode_with_one_prefill() -> None:
    """Issue 28's figures: Gemma-3-27B at 8k on one H100 holds 13-17 in steady decode where
    vLLM's start-up figure says 4; gpt-oss-120b about twice its start-up figure."""
    d = _dep("gemma-3-27b")
    cp = make_plan(d, (8192,)).contexts[0]
    assert cp.vllm_max_concurrency == 4
    assert 13 <= cp.b_mem <= 17
    assert cp.to_dict()["vllm_max_concurrency"] == 4
    lay = kv_layout(d, 8192)
    kinds = {k.kind: k for k in lay.kinds}
    assert (kinds["full"].pool_groups, kinds["sliding"].pool_groups) == (1, 6)
    assert kinds["sliding"].steady_blocks_per_seq == 1023 // 16 + 1 + 1  # cdiv(1023,16)+1
    pool = rl.kv_pool_bytes(d) // lay.bytes_per_block
    # the prefilling sequence and the decoding ones fit; one more decoding one does not
    assert lay.blocks_per_seq + (cp.b_mem - 1) * lay.steady_blocks_per_seq <= pool \
        < lay.blocks_per_seq + cp.b_mem * lay.steady_blocks_per_seq
    oss = make_plan(_dep("gpt-oss-120b"), (8192,)).contexts[0]
    assert oss.vllm_max_concurrency == 15 and 28 <= oss.b_mem <= 32


@pytest.mark.parametrize("model", ["llama-3-8b", "qwen3-next-80b-a3b"])
def test_b_mem_of_a_model_that_frees_nothing_is_vllms_figure(model: str) -> None:
    d = _dep(model, "h200")
    for ctx in (512, 8192):
        assert rl.b_mem(d, ctx) == rl.vllm_max_concurrency(d, ctx)


def _burst(n: int, prompt: int, output: int) -> Workload:
    return Workload(np.full(n, prompt), np.full(n, output), np.zeros(n))


def test_simulator_runs_b_mem_of_gemma_without_preemption() -> None:
    """At 8k context the simulator, freeing the blocks behind each window every step, runs
    B_mem Gemma-3-27B sequences at once on one H100 (four times vLLM's start-up figure)
    without preempting one; holding every layer's every token it could not."""
    d = _dep("gemma-3-27b")
    bm = rl.b_mem(d, 8192)
    cfg = SimConfig(SchedulerConfig(bm, 8192))
    run = simulate(d, cfg, _burst(2 * bm, 7168, 1025))
    assert run.requests.done.all()
    assert max(run.timeline.num_running) == bm > 3 * rl.vllm_max_concurrency(d, 8192)
    assert run.num_preemptions == 0
    assert run.timeline.kv_used_blocks[-1] == 0
    pool = engine_pool(d, 16)
    assert pool is not None and run.num_blocks == pool[0]


@pytest.mark.parametrize("fast_forward", [True, False])
def test_windowed_pool_conserves_blocks(fast_forward: bool) -> None:
    """A small pool and a burst past it: requests are preempted, every block comes back,
    and the multi-step jump changes nothing."""
    d = replace(_dep("gpt-oss-20b", "l4"), gpu_util=0.95)
    w = Workload(np.random.default_rng(3).integers(100, 3000, 60),
                 np.random.default_rng(4).integers(50, 900, 60),
                 np.sort(np.random.default_rng(5).uniform(0, 2, 60)))
    cfg = SimConfig(SchedulerConfig(64, 2048), fast_forward=fast_forward)
    a = simulate(d, cfg, w)
    b = simulate(d, replace(cfg, fast_forward=not fast_forward), w)
    for run in (a, b):
        assert run.requests.done.all()
        assert np.array_equal(run.requests.num_generated, w.output_tokens)
        assert run.timeline.kv_used_blocks[-1] == 0
    assert a.num_steps == b.num_steps and a.num_preemptions == b.num_preemptions
    np.testing.assert_allclose(a.requests.finish_s, b.requests.finish_s, rtol=1e-9)
