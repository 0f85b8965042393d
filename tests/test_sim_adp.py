"""TensorRT-LLM's attention-DP balance (bstar.sim.adp): new prompts wait until every rank has
one, at most timeout_iters iterations; each rank keeps its own line (the runs tables'
settings and the measured runs: tests/test_validate_runs.py)."""

from __future__ import annotations

import numpy as np
import pytest

from bstar.deployment import Deployment
from bstar.errors import BstarError
from bstar.sim import SchedulerConfig, SimConfig, simulate
from bstar.sim.adp import AdpBalance
from bstar.sim.block_manager import BlockManager
from bstar.sim.scheduler import Scheduler
from bstar.sim.sequence import Requests
from bstar.sim.traffic import Workload
from bstar.specs.gpu import get_gpu
from bstar.specs.presets import get_model

IDS = np.array([], dtype=np.int64)


def _gate(ranks: int = 2, timeout: int = 5, wait: int = 0) -> AdpBalance:
    g = AdpBalance(8, ranks, max_num_seqs=8 * ranks, timeout_iters=timeout,
                   batching_wait_iters=wait)
    g.rank_of[:] = np.arange(8) % ranks  # request i on rank i mod ranks
    return g


def test_prompts_wait_for_every_rank_or_the_timeout() -> None:
    g = _gate(timeout=5)
    decoding = np.array([0, 1])  # both ranks decode
    # rank 0 alone has a prompt: it waits; the counter reaches the timeout on the 5th
    # iteration, which lets it in and starts the count again
    assert [g.opens(np.array([2]), IDS, decoding) for _ in range(5)] == [False] * 4 + [True]
    assert g.wait_count == 0
    # a prompt on every rank (and room on every rank): in at once, the count reset
    g.wait_count = 3
    assert g.opens(np.array([2, 3]), IDS, decoding) and g.wait_count == 0
    # a rank still in its prompt counts as having one
    assert g.opens(np.array([2]), np.array([3]), decoding)
    # a rank with nothing to decode: nobody waits for it
    g.wait_count = 1
    assert g.opens(np.array([2]), IDS, np.array([0])) and g.wait_count == 0


def test_the_counter_runs_without_prompts_and_a_full_rank_holds_the_line() -> None:
    g = _gate(timeout=5)
    decoding = np.array([0, 1])
    for _ in range(3):  # no prompt anywhere: the count still goes up
        g.opens(IDS, IDS, decoding)
    assert g.wait_count == 3
    assert not g.opens(np.array([2]), IDS, decoding)  # 4
    assert g.opens(np.array([2]), IDS, decoding)  # 5: the timeout
    # every rank has a prompt but rank 1 decodes its max_batch_size: held
    g = AdpBalance(8, 2, max_num_seqs=4, timeout_iters=5)
    g.rank_of[:] = [0, 1, 0, 1, 0, 1, 0, 1]
    assert not g.opens(np.array([6, 7]), IDS, np.array([0, 1, 3]))  # rank 1: 2 of 2
    assert g.opens(np.array([6, 7]), IDS, np.array([0, 1]))


def test_batching_wait_holds_a_full_round_that_long() -> None:
    g = _gate(timeout=50, wait=2)
    both, decoding = np.array([2, 3]), np.array([0, 1])
    assert [g.opens(both, IDS, decoding) for _ in range(3)] == [False, False, True]


def test_a_multi_step_jump_moves_the_counter_as_its_iterations_would() -> None:
    g, h = _gate(timeout=7), _gate(timeout=7)
    decoding = np.array([0, 1])
    for _ in range(17):
        g.opens(IDS, IDS, decoding)
    h.jumped(17, IDS, decoding)
    assert g.wait_count == h.wait_count == 17 % 7
    h.jumped(4, IDS, np.array([0]))  # rank 1 idle: every iteration resets the count
    assert h.wait_count == 0


def _closed_loop(n: int, users: int, prompt: int) -> Workload:
    """Outputs of 32-160 tokens: requests finish one by one, on one rank at a time."""
    out = np.random.default_rng(0).integers(32, 161, n)
    return Workload(np.full(n, prompt), out, None, num_users=users, think_s=np.zeros(n))


def test_the_gate_delays_first_tokens() -> None:
    d = Deployment(model=get_model("deepseek-v3"), gpu=get_gpu("h200"), num_gpus=8,
                   expert_parallel=8, data_parallel=8)
    w = _closed_loop(96, 16, 512)

    def ttft_s(timeout: int) -> float:
        sc = SchedulerConfig(64, 8 * 1024, dp_ranks=8, adp_timeout_iters=timeout)
        r = simulate(d, SimConfig(sc), w).requests
        assert r.done.all()
        return float(np.mean(r.first_token_s - r.arrival_s))

    free, gated = ttft_s(0), ttft_s(60)
    assert gated > 3 * free


def test_each_rank_admits_from_its_own_line_within_its_share() -> None:
    """Three 500-token prompts, the first two on rank 0, a budget of 600 tokens a rank:
    rank 0 takes its first prompt and a 100-token chunk of its second, rank 1 its whole
    prompt (one line for the server would give the third prompt the last 200 tokens)."""
    reqs = Requests.new(np.full(3, 500), np.full(3, 10))
    s = Scheduler(SchedulerConfig(8, 1200, dp_ranks=2, adp_timeout_iters=60), reqs,
                  BlockManager(1000, 16))
    assert s.adp is not None
    s.adp.rank_of[:] = [0, 0, 1]
    for rid in range(3):
        s.add(rid)
    plan = s.schedule()
    assert dict(zip(plan.ids.tolist(), plan.new.tolist(), strict=True)) \
        == {0: 500, 1: 100, 2: 500}
    # without the balance: one line, FCFS
    s = Scheduler(SchedulerConfig(8, 1200), Requests.new(np.full(3, 500), np.full(3, 10)),
                  BlockManager(1000, 16))
    for rid in range(3):
        s.add(rid)
    assert s.schedule().new.tolist() == [500, 500, 200]


def test_settings_are_checked() -> None:
    with pytest.raises(BstarError, match="attention-dp-timeout"):
        SchedulerConfig(8, dp_ranks=2, adp_timeout_iters=-1)
    with pytest.raises(BstarError, match="ranks"):
        SchedulerConfig(8, dp_ranks=0)
