"""Continuous-batching simulator: a vLLM-V1-style scheduler with paged KV and preemption,
stepped by the roofline cost model. Pure: workload and deployment in, numbers out.

    from bstar.sim import simulate_levels, Poisson, Lengths
    rows = simulate_levels(d, [64, 256], Poisson(20), Lengths.fixed(512), Lengths.fixed(256),
                           num_requests=1000, seed=0)
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from bstar.deployment import Deployment
from bstar.engine_defaults import vllm_defaults
from bstar.sim.engine import SimConfig, SimRun, simulate
from bstar.sim.feasible import check_feasible
from bstar.sim.metrics import SimSummary, Slo, parse_slo, summarize
from bstar.sim.prefix import PromptShape, shape_workload
from bstar.sim.scheduler import SchedulerConfig
from bstar.sim.traffic import (
    Arrivals,
    ClosedLoop,
    Lengths,
    Poisson,
    Trace,
    Workload,
    make_workload,
    parse_lengths,
    parse_trace,
)

__all__ = [
    "Arrivals",
    "ClosedLoop",
    "Lengths",
    "Poisson",
    "PromptShape",
    "SchedulerConfig",
    "SimConfig",
    "SimRun",
    "SimSummary",
    "Slo",
    "Trace",
    "Workload",
    "check_feasible",
    "make_workload",
    "parse_lengths",
    "parse_slo",
    "parse_trace",
    "simulate",
    "simulate_levels",
    "summarize",
]


def simulate_levels(d: Deployment, max_num_seqs: list[int], arrivals: Arrivals,
                    input_len: Lengths, output_len: Lengths, num_requests: int, seed: int,
                    config: SimConfig | None = None, slo: Slo | None = None,
                    cached_prefix_tokens: int = 0,
                    prompts: PromptShape | None = None) -> list[SimSummary]:
    """The same requests (one draw from `seed`) under each max_num_seqs: the levels differ in
    the scheduler's cap only. Every level's settings are checked before any runs."""
    base = config or SimConfig(SchedulerConfig(
        max_num_seqs[0], vllm_defaults(d.gpu).max_num_batched_tokens))
    w = make_workload(arrivals, input_len, output_len, num_requests,
                      np.random.default_rng(seed))
    if cached_prefix_tokens:  # a shared prefix the prefix cache holds (whole blocks)
        w = replace(w, cached_tokens=np.minimum(w.prompt_tokens, cached_prefix_tokens))
    if prompts is not None:  # which prompts share which tokens (bstar.sim.prefix)
        w = shape_workload(w, prompts)
    cfgs = [replace(base, scheduler=replace(base.scheduler, max_num_seqs=m))
            for m in max_num_seqs]
    for c in cfgs:
        check_feasible(d, c, w)
    return [summarize(simulate(d, c, w), slo, energy=True) for c in cfgs]
