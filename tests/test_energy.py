"""The power model (bstar.energy, docs/energy.md): every catalog GPU has one with its
sources; joules per output token fall with batch until the knee and flatten past it; a
power curve is recovered from (utilization, watts) pairs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bstar
from bstar import energy
from bstar.deployment import Deployment
from bstar.errors import BstarError
from bstar.knee import DEFAULT_DOUBLING
from bstar.plan import make_plan
from bstar.specs.gpu import gpu_catalog

CATALOG = sorted(gpu_catalog())


@pytest.mark.parametrize("gpu_id", CATALOG)
def test_every_catalog_gpu_has_a_power_model_with_its_basis(gpu_id: str) -> None:
    g = gpu_catalog()[gpu_id]
    pm = energy.power_model(g)
    assert pm is not None
    assert pm.tdp_basis == ("datasheet" if g.tdp_w else "guessed")
    assert pm.tdp_w == (g.tdp_w or g.power_limit_w)
    assert 0 < pm.idle_w < pm.tdp_w
    assert pm.source  # where the TDP (and any guess) comes from
    d = pm.to_dict()
    assert d["idle_basis"] in ("guessed", "catalog") and d["curve_basis"] in ("default",
                                                                              "catalog")
    # The curve's ends: idle at u = 0, the TDP at u = 1, monotone between.
    w = pm.power_w(np.linspace(0, 1, 11))
    assert w[0] == pytest.approx(pm.idle_w) and w[-1] == pytest.approx(pm.tdp_w)
    assert np.all(np.diff(w) > 0)


def test_a_gpu_without_power_figures_has_no_model() -> None:
    g = bstar.get_gpu("h100-sxm")
    from dataclasses import replace
    bare = replace(g, tdp_w=0.0, power_limit_w=0.0)
    assert energy.power_model(bare) is None
    assert energy.power_w(bare, 0.5) is None
    d = Deployment(bstar.get_model("llama-3-8b"), bare)
    assert energy.joules_per_output_token(d, 8, 1024) is None


def test_memory_bound_decode_draws_the_memory_share_and_compute_reaches_tdp() -> None:
    """The utilization rule: a decode step at batch 1 is bandwidth-bound, its u is about
    memory_fraction x its bandwidth use; a prefill-sized compute load caps at the TDP."""
    g = bstar.get_gpu("h100-sxm")
    pm = energy.power_model(g)
    assert pm is not None
    u_mem = energy.step_utilization(g, "bf16", 0.0, g.hbm_bandwidth_bytes_s, 1.0,
                                    pm.memory_fraction)
    assert u_mem[0] == pytest.approx(pm.memory_fraction)
    u_cmp = energy.step_utilization(g, "bf16", g.bf16_flops, g.hbm_bandwidth_bytes_s, 1.0,
                                    pm.memory_fraction)
    assert u_cmp[0] == 1.0
    d = Deployment(bstar.get_model("llama-3-8b"), g)
    e = energy.decode_energy(d, [1], 1024)
    assert e is not None
    assert pm.idle_w < e.power_w[0] < pm.idle_w + pm.memory_fraction * (pm.tdp_w - pm.idle_w)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gpu_id=st.sampled_from(CATALOG), context=st.integers(256, 16384),
       model=st.sampled_from(["llama-3-8b", "qwen2.5-7b"]))
def test_joules_per_token_fall_until_the_knee_and_flatten_past_it(
        gpu_id: str, context: int, model: str) -> None:
    d = Deployment(bstar.get_model(model), gpu_catalog()[gpu_id])
    try:
        plan = make_plan(d, (context,))
    except BstarError:
        return  # does not fit at this context: nothing to price
    c = plan.contexts[0]
    knee = c.knee
    assert knee is not None and knee.batch is not None
    top = 4 * max(c.b_mem, knee.batch)
    batches = np.arange(1, top + 1)
    e = energy.decode_energy(d, batches, context)
    assert e is not None
    j = e.joules_per_output_token
    k = knee.batch
    # Falls: every added sequence up to the knee lowers the energy of a token.
    assert np.all(np.diff(j[:k]) < 0)
    # Flattens: past the knee a doubling gains less than 15% throughput (the knee rule),
    # and the power moves by a few percent either way (the step turns compute-bound), so a
    # doubling saves less than 1 - 1/(1.15 x 1.1) of the energy per token...
    # "Past" starts one step of the plan's knee grid (four points per doubling) above the
    # knee's batch: the rule interpolates the doubling between grid points and rounds.
    past = batches[(batches >= k * 2 ** 0.25) & (2 * batches <= top)]
    ratio = j[2 * past - 1] / j[past - 1]
    assert np.all(ratio >= 1 / ((1 + DEFAULT_DOUBLING) * 1.1))
    # ...and less than the doubling into the knee saved.
    if k >= 2 and past.size:
        assert np.all(ratio > j[k - 1] / j[k // 2 - 1])
    # Past B_mem the running batch, and so the energy per token, no longer changes.
    assert np.allclose(j[c.b_mem - 1:], j[c.b_mem - 1], rtol=1e-12)


def test_energy_scales_with_the_gpus_of_the_deployment() -> None:
    m = bstar.get_model("llama-3-8b")
    one = Deployment(m, bstar.get_gpu("h100-sxm"))
    from dataclasses import replace
    two = replace(one, num_gpus=2)
    j1 = energy.joules_per_output_token(one, 16, 1024)
    j2 = energy.joules_per_output_token(two, 16, 1024)
    assert j1 is not None and j2 is not None
    # Two GPUs each read half the weights: the step is faster but two boards draw power.
    e2 = energy.decode_energy(two, [16], 1024)
    assert e2 is not None
    from bstar import roofline as rl
    step2 = float(rl.curve(two, [16], 1024).step_s[0])
    assert j2 == pytest.approx(2 * e2.power_w[0] * step2 / 16)


def test_energy_cost_per_million_tokens() -> None:
    # 3.6 J per token = 1 kWh per million tokens.
    assert energy.energy_usd_per_mtok(3.6, 0.10) == pytest.approx(0.10)
    with pytest.raises(BstarError):
        energy.check_electricity_price(-1.0)


@pytest.mark.parametrize(("idle_w", "k"), [(70.0, 1.0), (95.0, 1.6), (40.0, 0.7)])
def test_fit_power_curve_recovers_a_known_curve(idle_w: float, k: float) -> None:
    u = np.array([0.3, 0.42, 0.5, 0.61, 0.7, 0.85])
    watts = idle_w + (700.0 - idle_w) * u ** k
    fit = energy.fit_power_curve(u, watts, 700.0)
    assert fit.idle_w == pytest.approx(idle_w, rel=0.02)
    assert fit.exponent == pytest.approx(k, rel=0.02)


def test_fit_power_curve_needs_distinct_points() -> None:
    with pytest.raises(BstarError, match="at least 3"):
        energy.fit_power_curve([0.5, 0.5, 0.5], [300.0, 301.0, 299.0], 700.0)


def test_plan_json_carries_power_and_joules_with_its_basis(
        capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from bstar.cli import main

    assert main(["plan", "--model", "llama-3-8b", "--gpu", "h200", "--num-gpus", "2",
                 "--context", "2048", "--json", "--electricity-usd-per-kwh", "0.2"]) == 0
    out = json.loads(capsys.readouterr().out)
    basis = out["power_basis"]
    assert basis["tdp_w"] == 700.0 and basis["tdp_basis"] == "datasheet"
    assert basis["idle_basis"] == "guessed" and basis["curve_basis"] == "default"
    assert basis["electricity_usd_per_kwh"] == 0.2 and basis["num_gpus"] == 2
    curve = out["contexts"][0]["curve"]
    for p in curve:
        assert basis["idle_w"] < p["power_w"] <= basis["tdp_w"]
        # Two GPUs' power over the step, per token the running batch produces.
        want = 2 * p["power_w"] * p["step_ms"] / 1e3 / p["running_batch"]
        assert p["joules_per_output_token"] == pytest.approx(want, rel=1e-9)
        assert p["energy_usd_per_mtok"] == pytest.approx(
            p["joules_per_output_token"] * 1e6 / 3.6e6 * 0.2, rel=1e-9)
    j = [p["joules_per_output_token"] for p in curve]
    assert j[0] > 10 * j[-1]  # batch 1 against the curve's largest batch
    at = out["contexts"][0]["recommendation"]["at_batch"]
    assert at["joules_per_output_token"] < j[0]


def test_plan_without_power_figures_says_so(tmp_path: Any,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from bstar.cli import main

    gpu = tmp_path / "bare.toml"
    gpu.write_text('name = "bare"\nmemory_bytes = 85899345920\n'
                   'hbm_bandwidth_bytes_s = 2e12\nbf16_flops = 3e14\n')
    assert main(["plan", "--gpu", str(gpu), "--context", "1024", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["power_basis"] is None
    assert all(p["power_w"] is None and p["joules_per_output_token"] is None
               for p in out["contexts"][0]["curve"])
    assert main(["plan", "--gpu", str(gpu), "--context", "1024"]) == 0
    assert "J per output token" not in capsys.readouterr().out


def test_simulated_energy_matches_the_decode_price_where_decode_dominates() -> None:
    """A closed loop of 32 users with short prompts and long outputs runs a batch of 32
    almost all the time: its joules per output token are the plan's decode price at that
    batch and the tokens each sequence holds (prefill adds a little)."""
    from bstar.sim import ClosedLoop, parse_lengths, simulate_levels

    d = Deployment(bstar.get_model("llama-3-8b"), bstar.get_gpu("h100-sxm"))
    (row,) = simulate_levels(d, [32], ClosedLoop(32), parse_lengths("64"),
                             parse_lengths("1024"), 128, 0)
    assert row.joules_per_output_token is not None and row.power_w_mean is not None
    ctx = 64 + 1024 // 2  # what a sequence holds on average while it decodes
    want = energy.joules_per_output_token(d, 32, ctx)
    assert want is not None
    assert row.joules_per_output_token == pytest.approx(want, rel=0.10)
    pm = energy.power_model(d.gpu)
    assert pm is not None and pm.idle_w < row.power_w_mean < pm.tdp_w


def test_a_mostly_idle_simulation_draws_about_idle_power() -> None:
    from bstar.sim import Poisson, parse_lengths, simulate_levels

    d = Deployment(bstar.get_model("llama-3-8b"), bstar.get_gpu("l40s"))
    (row,) = simulate_levels(d, [8], Poisson(0.05), parse_lengths("16"), parse_lengths("4"),
                             20, 0)
    pm = energy.power_model(d.gpu)
    assert pm is not None and row.power_w_mean is not None
    assert pm.idle_w <= row.power_w_mean < pm.idle_w * 1.05
    # The idle time is charged to the few tokens made: about idle power x duration each.
    tokens = row.throughput_tok_s * row.duration_s
    assert row.joules_per_output_token == pytest.approx(
        pm.idle_w * row.duration_s / tokens, rel=0.05)
    busy = energy.joules_per_output_token(d, 1, 20)
    assert busy is not None and row.joules_per_output_token > 10 * busy


def test_simulate_json_costs_each_level_at_the_stated_price(
        capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from bstar.cli import main

    assert main(["simulate", "--model", "llama-3-8b", "--gpu", "a100-80gb-sxm", "--rate",
                 "4", "--num-requests", "60", "--max-num-seqs", "16", "--json",
                 "--electricity-usd-per-kwh", "0.3"]) == 0
    o = json.loads(capsys.readouterr().out)
    assert o["electricity_usd_per_kwh"] == 0.3
    assert o["energy_usd_per_mtok"] == pytest.approx(
        o["joules_per_output_token"] / 3.6 * 0.3, rel=1e-9)


def test_fleet_energy_charges_the_rounding_waste_at_idle_power() -> None:
    from bstar.search.rank import fleet_energy

    d = Deployment(bstar.get_model("llama-3-8b"), bstar.get_gpu("h100-sxm"))
    pm = energy.power_model(d.gpu)
    assert pm is not None
    # Two replicas each simulated at 10 req/s drawing 400 W; a demand of 10 req/s loads
    # each at half: idle + half the rise, over 2 replicas' tokens.
    got = fleet_energy(d, 400.0, 10.0, 10.0, 2, 100.0)
    assert got is not None
    watts, joules = got
    assert watts == pytest.approx(pm.idle_w + (400.0 - pm.idle_w) / 2)
    assert joules == pytest.approx(2 * watts / (10.0 * 100.0))
    # At full load it is the simulated power over the simulated tokens.
    full = fleet_energy(d, 400.0, 10.0, 20.0, 2, 100.0)
    assert full is not None and full[1] == pytest.approx(2 * 400.0 / (20.0 * 100.0))
    assert fleet_energy(d, None, 10.0, 20.0, 2, 100.0) is None  # a row stored before


def test_search_rows_carry_energy_at_the_stated_price(tmp_path: Any) -> None:
    from bstar.search import InProcess, SearchSpec, SearchStore, Traffic, run_search
    from bstar.sim import parse_lengths, parse_slo

    spec = SearchSpec(models=("llama-3-8b",), gpus=("h100-sxm",),
                      traffic=Traffic(6.0, parse_lengths("128"), parse_lengths("64"),
                                      num_requests=60),
                      slo=parse_slo("ttft:2000,tpot:60"), num_gpus=(1,), max_num_seqs=(32,))
    with InProcess() as b:
        res = run_search(spec, b, SearchStore(tmp_path / "s.db"), None,
                         electricity_usd_per_kwh=0.25)
    out = res.to_dict()
    assert out["electricity_usd_per_kwh"] == 0.25
    (row,) = [r for r in out["candidates"] if r["status"] == "ok"]
    pm = energy.power_model(bstar.get_gpu("h100-sxm"))
    assert pm is not None and pm.idle_w < row["power_w"] < pm.tdp_w
    assert row["energy_usd_per_mtok"] == pytest.approx(
        row["joules_per_output_token"] / 3.6 * 0.25, rel=1e-9)
    assert out["winners"]["llama-3-8b"]["joules_per_output_token"] == \
        row["joules_per_output_token"]
