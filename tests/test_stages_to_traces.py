"""bench/stages_to_traces.py: a load stage written as a Mooncake trace gives each distinct
prompt its own hash_ids, in turn, and the simulator reads back the hit structure the stage's
generator describes (less the system prompt a 512-token block cannot share)."""

from __future__ import annotations

import importlib.util
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from bstar.stages_table import load_stages

ROOT = Path(__file__).resolve().parents[1]
STAGES = ROOT / "data" / "vllm-h100" / "stages.csv"


def _bench() -> Any:
    spec = importlib.util.spec_from_file_location("bench_stages_to_traces",
                                                  ROOT / "bench" / "stages_to_traces.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _stage(name: str) -> Any:
    (st,) = [s for s in load_stages(str(STAGES)) if s.stage == name]
    return st


def test_each_distinct_prompt_has_its_own_hash_ids_sent_in_turn(tmp_path: Path) -> None:
    from bstar.validate_stages import stage_workload

    b = _bench()
    st = _stage("llama-2-7b-tp1-roleplay-0")  # 150-token system prompt, 50 prompts
    k, n = st.distinct_prompts, 300
    recs = b.stage_trace(st, n)
    w = stage_workload(st, n)
    assert [r["input_length"] for r in recs] == w.prompt_tokens.tolist()
    assert [r["output_length"] for r in recs] == w.output_tokens.tolist()
    # The generator's arrivals in ms: request i at a point of its own 1 / rate slot.
    assert [r["timestamp"] for r in recs] == [round(t * 1e3) for t in w.arrival_s.tolist()]
    slot_ms = 1e3 / st.rate_req_s
    assert all(i * slot_ms - 0.5 <= r["timestamp"] <= (i + 1) * slot_ms + 0.5
               for i, r in enumerate(recs))
    for i, r in enumerate(recs):
        assert len(r["hash_ids"]) == math.ceil(r["input_length"] / 512)
        if i >= k:
            assert r["hash_ids"] == recs[i - k]["hash_ids"]  # the same prompt again
    first = [set(r["hash_ids"]) for r in recs[:k]]
    # The system prompt lies inside block 0, which is partly each prompt's own: no id is
    # shared between distinct prompts.
    assert sum(len(s) for s in first) == len(set().union(*first))
    ids = [h for r in recs for h in r["hash_ids"]]
    assert sorted(set(ids)) == list(range(len(set(ids))))  # numbered in order of first use

    # Read back as `bstar simulate --trace` reads it: repeats have the same segments.
    path = tmp_path / "t.jsonl"
    b.write_trace(recs, path)
    tw = b.trace_workload(path)
    assert tw.prompt_tokens.tolist() == w.prompt_tokens.tolist()
    ms = np.round(w.arrival_s, 3)  # the reader starts the trace at its first timestamp
    np.testing.assert_allclose(tw.arrival_s, ms - ms[0], atol=1e-9)
    segs = tw.prompt_ids.segments
    assert all(segs[i] == segs[i - k] for i in range(k, n))
    assert len({segs[i][0] for i in range(k)}) == k


def test_blocks_wholly_inside_the_system_prompt_are_shared() -> None:
    b = _bench()
    st = replace(_stage("llama-2-7b-tp1-codegen-0"), shared_prefix_len=1100,
                 prompt_len=((0.0, 1500), (1.0, 1500)))
    recs = b.stage_trace(st, 100)
    k = st.distinct_prompts
    assert all(r["hash_ids"][:2] == [0, 1] for r in recs)  # blocks ending at 512 and 1024
    assert len({r["hash_ids"][2] for r in recs}) == k  # ends at 1500: past the system prompt


def test_the_trace_finds_the_generators_hits_less_the_system_prompt_first_sends(
        tmp_path: Path) -> None:
    """Engine counters, not time: the trace's simulated hits are the generator's, less at
    most the system prompt on each distinct prompt's first send."""
    from bstar.sim import SchedulerConfig, SimConfig, simulate
    from bstar.validate_stages import stage_deployment, stage_workload

    b = _bench()
    st = _stage("llama-2-7b-tp1-codegen-0")
    n = 200
    path = tmp_path / "t.jsonl"
    b.write_trace(b.stage_trace(st, n), path)
    d = stage_deployment(st)
    cfg = SimConfig(SchedulerConfig(st.max_num_seqs, st.max_num_batched_tokens))
    gen = simulate(d, cfg, stage_workload(st, n))
    tr = simulate(d, cfg, b.trace_workload(path))
    assert gen.prefix_query_tokens == tr.prefix_query_tokens
    lost = gen.prefix_hit_tokens - tr.prefix_hit_tokens
    assert 0 < lost <= st.distinct_prompts * st.shared_prefix_len
