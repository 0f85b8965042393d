"""The scheduler step by step on hand-sized cases, against vLLM V1's rules."""

from __future__ import annotations

import numpy as np
import pytest

from bstar.sim.block_manager import BlockManager
from bstar.sim.scheduler import Scheduler, SchedulerConfig
from bstar.sim.sequence import Requests


def make(prompts: list[int], outputs: list[int], blocks: int, max_num_seqs: int = 8,
         budget: int = 64, preemption: str = "recompute") -> Scheduler:
    reqs = Requests.new(np.array(prompts), np.array(outputs))
    s = Scheduler(SchedulerConfig(max_num_seqs, budget, preemption), reqs,
                  BlockManager(blocks, 4, num_host_blocks=100))
    for i in range(len(prompts)):
        s.add(i)
    return s


def step(s: Scheduler, t: float) -> tuple[list[int], list[int], int]:
    plan = s.schedule()
    s.update(plan, t, t + 1.0)
    return plan.ids.tolist(), plan.new.tolist(), plan.num_preempted


def test_fcfs_admission_chunking_and_max_num_seqs() -> None:
    s = make([10, 50, 3], [5, 5, 5], blocks=100, max_num_seqs=2, budget=40)
    # Request 0 whole (10), request 1 gets the 30 tokens left; 2 waits: two are running.
    assert step(s, 0.0) == ([0, 1], [10, 30], 0)
    assert list(s.waiting) == [2]
    # Running first: 0 decodes one token, 1 finishes its prompt (20); 2 still waits.
    assert step(s, 1.0) == ([0, 1], [1, 20], 0)
    assert s.reqs.num_generated.tolist() == [2, 1, 0]


def test_preemption_takes_the_last_admitted_and_requeues_it_first() -> None:
    # Block size 4; each prompt of 4 tokens fills one block; 3 blocks in all.
    s = make([4, 4, 4, 4], [9, 9, 9, 9], blocks=3)
    assert step(s, 0.0) == ([0, 1, 2], [4, 4, 4], 0)  # 3 waits: no block left
    # Each now needs a second block for its 5th token; none is free. Request 0 preempts the
    # last admitted (2) and takes its block; request 1 is then the last running, so it
    # preempts itself and the running pass ends:
    ids, new, preempted = step(s, 1.0)
    assert (ids, new) == ([0], [1]) and preempted == 2
    assert s.reqs.num_preemptions.tolist() == [0, 1, 1, 0]
    # Requeued at the front in admission order, ahead of the never-admitted 3.
    assert list(s.waiting) == [1, 2, 3]
    # Recompute: their KV is gone; resumed, they prefill prompt + the token they generated.
    assert s.reqs.num_computed.tolist() == [5, 0, 0, 0]
    assert s.blocks.num_free == 1
    # Next step: 0 decodes; the head, 1, needs 2 blocks for its 5 tokens and 1 is free, so it
    # blocks the queue (FCFS: 2 and 3 do not skip ahead).
    assert step(s, 2.0) == ([0], [1], 0)
    assert list(s.waiting) == [1, 2, 3]


def test_swap_keeps_computed_tokens() -> None:
    s = make([4, 4], [9, 9], blocks=2, preemption="swap")
    step(s, 0.0)
    ids, _, preempted = step(s, 1.0)  # both need a 2nd block: 0 preempts 1 (swapped out)
    assert ids == [0] and preempted == 1
    assert s.reqs.swapped.tolist() == [False, True]
    assert s.reqs.num_computed.tolist() == [5, 4]  # 1 keeps its 4 tokens on the host
    assert s.blocks.num_host_free == 99


def _admitted_at(cfg: SchedulerConfig, arrive_after: int) -> int:
    """The decode step at which request 1, queued after step `arrive_after` while request 0
    decodes alone, gets in."""
    reqs = Requests.new(np.array([4, 4]), np.array([80, 5]))
    s = Scheduler(cfg, reqs, BlockManager(100, 4))
    s.add(0)
    step(s, 0.0)  # request 0's prompt
    for k in range(1, 80):
        if k == arrive_after:
            s.add(1)
        ids, _, _ = step(s, float(k))
        if 1 in ids:
            return k
    raise AssertionError("never admitted")


def test_continuous_decode_steps_open_the_queue_once_a_round() -> None:
    """SGLang's --num-continuous-decode-steps N: a batch that only decodes looks at the queue
    on the first step of each round of N, so a request that arrives mid-round waits for the
    round's end; N = 1 admits it at the next step."""
    for arrive in range(1, 9):
        assert _admitted_at(SchedulerConfig(8, 64), arrive) == arrive
        at = _admitted_at(SchedulerConfig(8, 64, decode_steps_per_schedule=4), arrive)
        # decode steps 1, 5, 9, ... open the queue (the first decode step opens a round)
        assert at >= arrive and (at - 1) % 4 == 0 and at - arrive < 4


def test_sglangs_receive_interval_opens_the_queue_every_n_decode_rounds() -> None:
    """SGLang's --scheduler-recv-interval R (SchedulerRecvSkipper): a batch that only decodes
    receives new requests every R rounds, and at once after any other step. With N continuous
    decode steps a round, the queue opens every N x R decode steps."""
    assert SchedulerConfig(8, 64, decode_steps_per_schedule=2,
                           recv_interval=3).queue_interval_steps == 6
    for arrive in range(1, 25):
        at = _admitted_at(SchedulerConfig(8, 64, recv_interval=10), arrive)
        assert at >= arrive and (at - 1) % 10 == 0 and at - arrive < 10
        at = _admitted_at(SchedulerConfig(8, 64, decode_steps_per_schedule=2, recv_interval=3),
                         arrive)
        assert at >= arrive and (at - 1) % 6 == 0 and at - arrive < 6
    from bstar.errors import BstarError

    with pytest.raises(BstarError, match="scheduler-recv-interval"):
        SchedulerConfig(8, 64, recv_interval=0)


def test_decode_steps_per_schedule_is_checked() -> None:
    from bstar.errors import BstarError

    with pytest.raises(BstarError, match="continuous-decode-steps"):
        SchedulerConfig(8, 64, decode_steps_per_schedule=0)


@pytest.mark.parametrize("flag, n", [("--num-continuous-decode-steps", 4),
                                     ("--scheduler-recv-interval", 30)])
def test_simulate_takes_sglangs_queue_flags(capsys, flag: str, n: int) -> None:  # type: ignore[no-untyped-def]
    """Both SGLang flags make a request that arrives mid-decode wait for the scheduler:
    the round's end, or its next receive."""
    import json

    from bstar.cli import main

    ttft = {}
    for k in (1, n):
        assert main(["simulate", "--model", "llama-3-8b", "--gpu", "h100-sxm", "--rate", "5",
                     "--num-requests", "60", flag, str(k), "--json"]) == 0
        ttft[k] = json.loads(capsys.readouterr().out)["ttft_ms"]["mean"]
    assert ttft[n] > ttft[1]
    with pytest.raises(SystemExit):
        main(["simulate", "--model", "llama-3-8b", flag, "0"])
