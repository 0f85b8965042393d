"""Speculative decoding in the simulator (bstar.sim.speculative): the accepted-token draw,
the lookahead slots, and the plan's speedup reproduced by a closed loop (issue 31)."""

from __future__ import annotations

import numpy as np
import pytest

from bstar import specdec as sd
from bstar.options import DeploymentOptions
from bstar.sim import ClosedLoop, SchedulerConfig, SimConfig, Workload, simulate, simulate_levels
from bstar.sim.speculative import SpecSim, num_blocks
from bstar.sim.traffic import parse_lengths


@pytest.fixture(scope="module")
def d():  # type: ignore[no-untyped-def]
    return DeploymentOptions(model="llama-3.1-8b", gpu="h200").build()


def _closed(d, batch: int, spec: SpecSim | None, prompt: int, output: int,  # type: ignore[no-untyped-def]
            n: int):
    cfg = SimConfig(SchedulerConfig(batch, 8192), speculative=spec)
    return simulate_levels(d, [batch], ClosedLoop(batch), parse_lengths(str(prompt)),
                           parse_lengths(str(output)), n, 0, cfg)[0]


@pytest.mark.slow
def test_closed_loop_reproduces_the_plan_speedup(d) -> None:  # type: ignore[no-untyped-def]
    """issue 31's done-when: at a closed-loop load equal to the batch, the simulated
    throughput with speculation over without is the plan's speedup within 5% (long outputs
    on short prompts, so prefill is a small share; the plan at the mean context held; three
    waves of requests, so the last wave's drain and the draw's noise stay small). About
    10 s."""
    prompt, output = 32, 2048
    for drafter, batches in (("eagle", (1, 16, 128, 512)), ("ngram", (1, 128))):
        dr = sd.make_drafter(d, drafter)
        spec = SpecSim(sd.SpecConfig(3, 0.7, drafter), dr, seed=0)
        for b in batches:
            n = max(3, 3 * b)
            plain = _closed(d, b, None, prompt, output, n)
            with_spec = _closed(d, b, spec, prompt, output, n)
            simulated = with_spec.throughput_tok_s / plain.throughput_tok_s
            planned = float(sd.speedup(d, dr, [b], prompt + output // 2, 3, 0.7)[0][0])
            assert simulated == pytest.approx(planned, rel=0.05), (drafter, b)


def test_full_acceptance_steps_exactly(d) -> None:  # type: ignore[no-untyped-def]
    """a = 1: every step yields K + 1 tokens. 9 output tokens = the prefill's first, then
    two verify steps of 4."""
    dr = sd.make_drafter(d, "ngram")
    w = Workload(np.array([64]), np.array([9]), np.array([0.0]))
    run = simulate(d, SimConfig(SchedulerConfig(4), speculative=SpecSim(
        sd.SpecConfig(3, 1.0, "ngram"), dr)), w)
    assert run.num_steps == 3 and bool(run.requests.done.all())
    assert int(run.requests.num_generated[0]) == 9
    assert int(run.requests.num_blocks.sum()) == 0  # every block freed


def test_draws_are_seeded_and_lookahead_costs_blocks(d) -> None:  # type: ignore[no-untyped-def]
    dr = sd.make_drafter(d, "eagle")

    def run(seed: int):  # type: ignore[no-untyped-def]
        spec = SpecSim(sd.SpecConfig(4, 0.6, "eagle"), dr, seed=seed)
        w = Workload(np.full(8, 100), np.full(8, 200), np.zeros(8))
        return simulate(d, SimConfig(SchedulerConfig(8), speculative=spec), w)

    a, b, c = run(1), run(1), run(2)
    assert a.num_steps == b.num_steps and a.duration_s == b.duration_s
    assert a.num_steps != c.num_steps
    # K = 4 with an EAGLE head holds 2K lookahead slots; the drafter's KV and weights leave
    # fewer blocks than plain decode's pool.
    spec = SpecSim(sd.SpecConfig(4, 0.6, "eagle"), dr)
    assert spec.lookahead_tokens == 8
    from bstar.sim.block_manager import num_gpu_blocks

    assert num_blocks(d, spec, 16) < num_gpu_blocks(d, 16)
