"""The speculative simulator's step price in Python floats (`sim.speculative.SpecStep.step_s`)
is `specdec.scheduled_step_s`, the reference on StepWork arrays: equal over random scheduled
steps (decodes and prompt chunks), every drafter kind, dense, MoE and tensor-parallel targets
and random efficiencies (issue 40: the arrays' cost per call was 80% of a speculative run).
Equal to 1e-12: the floats add the same terms in another order than NumPy's reductions,
whose order depends on the NumPy build and the CPU's vector width."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from bstar import specdec as sd
from bstar.deployment import Deployment, Efficiency
from bstar.sim.scheduler import StepPlan
from bstar.sim.speculative import SpecSim, SpecStep
from bstar.specs.gpu import get_gpu
from bstar.specs.presets import get_model
from test_sim_onestep import random_params, random_step

CASES = [("llama-3-8b", 1, "eagle"), ("llama-3-8b", 1, "ngram"), ("llama-3-70b", 4, "eagle"),
         ("mixtral-8x7b", 2, "eagle"), ("deepseek-v3", 8, "mtp"), ("gemma-3-27b", 1, "eagle"),
         ("llama-3-70b", 4, "model")]


_RATES = ("bandwidth", "compute", "kv_bandwidth", "attention_compute", "fp8_weight_stream",
          "int4_weight_stream", "moe_compute")


def random_eff(rng: np.random.Generator) -> Efficiency:
    """`random_params` as an Efficiency (its rates within (0, 1] and score_bytes within
    [0, 1024], as Efficiency's FIELD_RANGES require)."""
    p = random_params(rng)
    return Efficiency(**{**p, **{f: min(p[f], 1.0) for f in _RATES},
                         "score_bytes": min(p["score_bytes"], 1024.0)})


@pytest.mark.parametrize("model,num_gpus,drafter", CASES)
def test_fast_step_equals_scheduled_step_s(model: str, num_gpus: int, drafter: str) -> None:
    d = Deployment(model=get_model(model), gpu=get_gpu("h100-sxm"), num_gpus=num_gpus)
    rng = np.random.default_rng(sum(map(ord, model + drafter)) + num_gpus)
    checked = 0
    for _ in range(6):
        eff = random_eff(rng)
        de = replace(d, eff=eff)
        draft_model = get_model("llama-3-8b") if drafter == "model" else None
        dr = sd.make_drafter(de, drafter, draft_model)
        if dr.deployment is not None:  # the drafter at efficiencies of its own
            dr = replace(dr, deployment=replace(dr.deployment,
                                                eff=random_eff(rng)))
        for k in (1, 3, 7):
            fast = SpecStep(de, SpecSim(sd.SpecConfig(k, 0.7, drafter), dr))
            for _ in range(6):
                start, new = random_step(rng)
                plan = StepPlan(np.arange(start.size), start, new, 0, 0, 0)
                want = sd.scheduled_step_s(de, dr, start, new, k)
                got = fast.step_s(plan)
                if math.isnan(want):
                    assert math.isnan(got)
                else:  # the same sums in another order: equal to the last bits or so
                    assert math.isclose(got, want, rel_tol=1e-12, abs_tol=0.0), (start, new, k)
                checked += 1
    assert checked == 6 * 3 * 6


def test_speculative_run_prices_no_step_arrays(monkeypatch: pytest.MonkeyPatch) -> None:
    """The speculative loop prices its steps in floats: a run calls `step.price_parts` (the
    arrays' pricer, ~80% of a run before, issue 40) only outside its steps, a fixed count
    that does not grow with the requests."""
    from bstar import step as st
    from bstar.sim import Lengths, Poisson, SchedulerConfig, SimConfig, make_workload, simulate

    d = Deployment(model=get_model("llama-3-8b"), gpu=get_gpu("h100-sxm"))
    spec = SpecSim(sd.SpecConfig(3, 0.7, "eagle"), sd.make_drafter(d, "eagle"))
    cfg = SimConfig(SchedulerConfig(32, 2048), speculative=spec)
    calls = []
    real = st.price_parts

    def counted(*a, **k):  # type: ignore[no-untyped-def]
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(st, "price_parts", counted)
    counts = []
    for n in (4, 16):
        calls.clear()
        w = make_workload(Poisson(5.0), Lengths.fixed(64), Lengths.fixed(32), n,
                          np.random.default_rng(0))
        run = simulate(d, cfg, w)
        assert run.num_steps > 2 * n
        counts.append(len(calls))
    assert counts[0] == counts[1]
