"""The simulator runs on the pool it checks (issue 41): `check_feasible` sizes the pool the
engine uses, the drafter's included; what cannot run is refused at once in one line naming
the request and the pool; what passes finishes within `max_steps`."""

from __future__ import annotations

import numpy as np
import pytest

from bstar import specdec as sd
from bstar.errors import BstarError
from bstar.options import DeploymentOptions
from bstar.sim import SchedulerConfig, SimConfig, Slo, Workload, check_feasible, simulate
from bstar.sim.feasible import max_steps, sim_pool
from bstar.sim.speculative import SpecSim

# The repro: the default deployment (Llama-3-8B on an A100) at
# --gpu-util 0.2245 holds a 7900 + 100 token request without a drafter, not with EAGLE.
UTIL = 0.2245
REPRO = ["simulate", "--gpu-util", str(UTIL), "--max-num-seqs", "4", "--concurrency", "1",
         "--input-len", "7900", "--output-len", "100", "--num-requests", "2",
         "--num-speculative-tokens", "4", "--drafter", "eagle"]


@pytest.fixture(scope="module")
def d():  # type: ignore[no-untyped-def]
    return DeploymentOptions(gpu_util=UTIL).build()


def _spec(d, k: int = 4):  # type: ignore[no-untyped-def]
    return SpecSim(sd.SpecConfig(k, 0.6, "eagle"), sd.make_drafter(d, "eagle"))


def test_repro_is_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from bstar.cli import main

    assert main(REPRO) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "request 1 (7900 + 100 tokens)" in err and "drafter eagle" in err


def test_check_sizes_the_pool_the_engine_runs(d) -> None:  # type: ignore[no-untyped-def]
    w = Workload(np.array([7900, 7900]), np.array([100, 100]), np.zeros(2))
    plain = SimConfig(SchedulerConfig(4))
    spec = SimConfig(SchedulerConfig(4), speculative=_spec(d))
    check_feasible(d, plain, w)  # fits without the drafter
    with pytest.raises(BstarError, match=r"request 1 .* holds"):
        check_feasible(d, spec, w)
    # A request that fits the speculative pool runs to completion on that very pool.
    pool = sim_pool(d, spec, w)
    fits = (pool.num_blocks * d.block_size - pool.lookahead_tokens) // 2
    w2 = Workload(np.array([fits, fits]), np.array([2, 40]), np.zeros(2))
    assert check_feasible(d, spec, w2) == pool
    run = simulate(d, spec, w2)
    assert run.num_blocks == pool.num_blocks and not run.truncated
    assert run.stop_reason == "done" and run.num_steps <= max_steps(w2)


def test_search_prunes_with_the_same_check(d) -> None:  # type: ignore[no-untyped-def]
    from bstar.search.candidates import Replica, prune

    w = Workload(np.array([7900, 7900]), np.array([100, 100]), np.zeros(2))
    base = Replica("llama-3-8b", d.gpu.id, 1, 4, 2048, d)
    slo = Slo(ttft_ms=1e9)
    assert prune(base, w, slo) is None
    from dataclasses import replace

    out = prune(replace(base, speculative=_spec(d)), w, slo)
    assert out is not None and out.limit == "memory" and "drafter eagle" in out.reason


@pytest.mark.parametrize("k", [1, 4])
def test_runs_that_pass_finish_within_the_step_bound(d, k: int) -> None:  # type: ignore[no-untyped-def]
    # Tight pools: preemption (recompute) happens, and each run still ends "done" within
    # sum(prompt + output) steps (check_feasible's argument).
    rng = np.random.default_rng(k)
    n = 8
    w = Workload(rng.integers(200, 3000, n), rng.integers(2, 60, n), np.zeros(n))
    for cfg in (SimConfig(SchedulerConfig(8, 512)),
                SimConfig(SchedulerConfig(8, 512), speculative=_spec(d, k))):
        run = simulate(d, cfg, w)
        assert run.num_preemptions > 0  # the pool is tight: recompute replays prompts
        assert run.stop_reason == "done" and run.num_steps <= max_steps(w)
