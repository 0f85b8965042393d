"""The simulator's prefix cache against vLLM's own (vLLM on this CPU, the tiny model): the same
small trace of shared system prompts and repeated prompts, sent as token ids so both see the
same tokens, gives the same prefix-cache hits as the engine's vllm:prefix_cache_hits counter,
within 5% of the tokens."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bstar.deployment import Deployment
from bstar.loadgen.scrape import parse_prometheus, snapshot
from bstar.servers import vllm_cpu_server
from bstar.sim import SchedulerConfig, SimConfig, simulate
from bstar.sim.prefix import PromptIds
from bstar.sim.traffic import Workload
from bstar.specs.gpu import get_gpu
from bstar.specs.presets import get_model
from test_servers_e2e import _conn, get_text

OUTPUT_TOKENS = 4


def trace(rng: np.random.Generator) -> tuple[list[list[int]], PromptIds]:
    """12 prompts: two 200-token system prompts, each followed by a question of its own
    (30-90 tokens); then 4 of them sent again whole. Token ids and the same identity."""
    systems = [rng.integers(3, 250, size=200).tolist() for _ in range(2)]
    prompts: list[list[int]] = []
    segments = []
    for i in range(12):
        q = rng.integers(3, 250, size=int(rng.integers(30, 91))).tolist()
        prompts.append(systems[i % 2] + q)
        segments.append(((1 + i % 2, 200), (100 + i, len(q))))
    for i in (0, 3, 5, 10):
        prompts.append(prompts[i])
        segments.append(segments[i])
    return prompts, PromptIds(tuple(segments), tuple(1000 + i for i in range(len(prompts))))


def complete(url: str, prompt: list[int]) -> dict[str, Any]:
    c = _conn(url)
    try:
        c.request("POST", "/v1/completions", json.dumps({
            "model": "tiny", "prompt": prompt, "max_tokens": OUTPUT_TOKENS, "temperature": 0,
            "ignore_eos": True}), {"Content-Type": "application/json"})
        r = c.getresponse()
        body = r.read()
        assert r.status == 200, body[:300]
        return json.loads(body)  # type: ignore[no-any-return]
    finally:
        c.close()


@pytest.mark.slow
@pytest.mark.vllm
def test_simulated_prefix_hits_match_vllms_counter(vllm_python: str, tiny_model: Any,
                                                    tmp_path: Path) -> None:
    prompts, ids = trace(np.random.default_rng(29))
    with vllm_cpu_server(vllm_python, tiny_model.hf_dir, max_num_seqs=4, timeout_s=300,
                         log_path=tmp_path / "vllm.log") as srv:
        before = snapshot(parse_prometheus(get_text(srv.url, "/metrics")))
        for p in prompts:  # one at a time: each finishes before the next arrives
            usage = complete(srv.url, p)["usage"]
            assert usage["prompt_tokens"] == len(p)
        after = snapshot(parse_prometheus(get_text(srv.url, "/metrics")))
    assert before.block_size and after.prefix_cache_hits_total is not None
    engine_hits = after.prefix_cache_hits_total - (before.prefix_cache_hits_total or 0)
    engine_queries = after.prefix_cache_queries_total - (before.prefix_cache_queries_total or 0)
    n = len(prompts)
    lens = np.array([len(p) for p in prompts], dtype=np.int64)
    w = Workload(lens, np.full(n, OUTPUT_TOKENS, dtype=np.int64),
                 np.arange(n, dtype=np.float64) * 100.0, prompt_ids=ids)
    d = Deployment(model=get_model("llama-3-8b"), gpu=get_gpu("h100-sxm"),
                   block_size=before.block_size)
    run = simulate(d, SimConfig(SchedulerConfig(4)), w)
    assert run.prefix_query_tokens == engine_queries == int(lens.sum())
    assert run.prefix_hit_tokens is not None and engine_hits > 0
    assert abs(run.prefix_hit_tokens - engine_hits) <= 0.05 * engine_hits, \
        (run.prefix_hit_tokens, engine_hits, before.block_size)
