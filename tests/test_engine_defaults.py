"""The engines' defaults, one function each (bstar.engine_defaults): the token budget every
simulation of a `vllm serve` uses, and SGLang's default running-request cap (issue 41)."""

from __future__ import annotations

import pytest

from bstar.engine_defaults import vllm_defaults
from bstar.options import DeploymentOptions
from bstar.sim import ClosedLoop, SchedulerConfig, SimConfig, parse_lengths, simulate_levels


@pytest.fixture(scope="module")
def h200():  # type: ignore[no-untyped-def]
    return DeploymentOptions(model="llama-3.1-8b", gpu="h200").build()


def test_the_report_replays_a_sweep_under_the_gpus_budget(h200) -> None:  # type: ignore[no-untyped-def]
    # The replay used the scheduler's literal 2048 tokens; vllm serve on an H200 runs 8192,
    # so a 4000-token prompt is one prefill step there, two under 2048.
    from bstar.sim.study import replay_closed_loops

    budget = vllm_defaults(h200.gpu).max_num_batched_tokens
    assert budget > 4000 > SchedulerConfig(1).max_num_batched_tokens

    def steps(tokens: int) -> int:
        cfg = SimConfig(SchedulerConfig(1, tokens))
        return simulate_levels(h200, [1], ClosedLoop(1), parse_lengths("4000"),
                               parse_lengths("8"), 3, 0, cfg)[0].to_dict()["num_steps"]

    row = replay_closed_loops(h200, [(1, 1)], 4000, 8, 3)[0]
    assert row["num_steps"] == steps(budget) != steps(2048)
    # simulate_levels without a config takes the same budget.
    default = simulate_levels(h200, [1], ClosedLoop(1), parse_lengths("4000"),
                              parse_lengths("8"), 3, 0)[0].to_dict()["num_steps"]
    assert default == steps(budget)


def test_sglang_default_cap_is_bounded_by_its_request_pool(
        capsys: pytest.CaptureFixture[str]) -> None:
    # Issue 41: bstar plan printed SGLang's default --max-running-requests as ~225,453 (KV
    # tokens / 2) for Llama-3-8B on an A100; SGLang also caps it by its request-to-token
    # pool, min(max(KV tokens / context_len x 512, 2048), 4096).
    import json

    from bstar import roofline as rl
    from bstar.cli import main
    from bstar.engine_defaults import (
        SGLANG_REQ_POOL_MAX,
        SGLANG_REQ_POOL_MIN,
        sglang_max_running_requests,
    )
    from bstar.kv_pool import kv_bytes_per_seq_allocated

    assert sglang_max_running_requests(100, 8192) == 50  # a tiny pool: tokens // 2 binds
    assert sglang_max_running_requests(10**7, 8192) == SGLANG_REQ_POOL_MAX
    assert sglang_max_running_requests(8192 * 2, 8192) == SGLANG_REQ_POOL_MIN  # the floor
    assert main(["plan", "--context", "2048", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    sgl = next(e for e in out["contexts"][0]["engine_defaults"] if e["engine"] == "sglang")
    d = DeploymentOptions().build()
    tokens = rl.kv_pool_bytes(d) // (kv_bytes_per_seq_allocated(d, 1) // d.block_size)
    assert tokens // 2 > SGLANG_REQ_POOL_MAX  # the old answer, KV tokens / 2, is far above
    assert sgl["max_num_seqs"] == sglang_max_running_requests(
        tokens, d.model.config["max_position_embeddings"]) == SGLANG_REQ_POOL_MAX
