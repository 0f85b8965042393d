"""The simulator: conservation, determinism, queueing laws, regime 3, bad input."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bstar import roofline as rl
from bstar.deployment import Deployment
from bstar.errors import BstarError
from bstar.sim import (
    ClosedLoop,
    Lengths,
    Poisson,
    SchedulerConfig,
    SimConfig,
    Slo,
    make_workload,
    parse_lengths,
    parse_slo,
    parse_trace,
    simulate,
    simulate_levels,
    summarize,
)
from bstar.sim.block_manager import num_gpu_blocks
from bstar.specs.gpu import get_gpu
from bstar.specs.presets import get_model
from bstar.stats import weighted_percentiles

A100 = get_gpu("a100-80gb-sxm")


def dep(**kw: object) -> Deployment:
    return Deployment(model=get_model("llama-3-8b"), gpu=A100, **kw)  # type: ignore[arg-type]


def workload(arrivals: object, n: int = 300, inp: str = "uniform:16:700",
             out: str = "uniform:1:300", seed: int = 1):
    return make_workload(arrivals, parse_lengths(inp), parse_lengths(out), n,  # type: ignore[arg-type]
                         np.random.default_rng(seed))


def cfg(max_num_seqs: int, **kw: object) -> SimConfig:
    sk = {k: kw.pop(k) for k in ("max_num_batched_tokens", "preemption") if k in kw}
    return SimConfig(SchedulerConfig(max_num_seqs, **sk), **kw)  # type: ignore[arg-type]


# ---- conservation ----
@pytest.mark.parametrize("preemption", ["recompute", "swap"])
@pytest.mark.parametrize("gpu_util", [0.9, 0.235])
def test_every_request_finishes_with_exactly_its_tokens(preemption: str, gpu_util: float) -> None:
    d = dep(gpu_util=gpu_util)
    w = workload(Poisson(40.0))
    run = simulate(d, cfg(256, max_num_batched_tokens=512, preemption=preemption), w)
    r = run.requests
    assert r.done.all() and not run.truncated
    assert np.array_equal(r.num_generated, w.output_tokens)
    # The last token is sampled, never fed back: KV holds prompt + output - 1 when done.
    assert np.array_equal(r.num_computed, w.prompt_tokens + w.output_tokens - 1)
    assert (r.num_blocks == 0).all()
    assert run.timeline.kv_used_blocks[-1] == 0  # every block came back
    assert (r.first_token_s >= r.arrival_s).all() and (r.finish_s >= r.first_token_s).all()
    # ITL samples: one gap per token after each request's first.
    assert int(run.itl_weights.sum()) == int((w.output_tokens - 1).sum())
    if gpu_util < 0.5:
        assert run.num_preemptions > 0  # the small pool must exercise the preemption path


@pytest.mark.slow  # simulates every step twice
def test_fast_forward_matches_step_by_step() -> None:
    """The multi-step jump is an optimization only: same times, same tokens."""
    d = dep(gpu_util=0.235)
    for arrivals in (Poisson(3.0), Poisson(60.0), ClosedLoop(40, 0.2)):
        w = workload(arrivals, n=200)
        a = simulate(d, cfg(64, fast_forward=True), w)
        b = simulate(d, cfg(64, fast_forward=False), w)
        assert a.num_steps == b.num_steps
        assert a.num_preemptions == b.num_preemptions
        np.testing.assert_allclose(a.requests.finish_s, b.requests.finish_s, rtol=1e-9)
        np.testing.assert_allclose(a.requests.first_token_s, b.requests.first_token_s,
                                   rtol=1e-9)
        sa, sb = summarize(a), summarize(b)
        for k in ("p50", "p90", "p99"):
            assert sa.itl_ms[k] == pytest.approx(sb.itl_ms[k], rel=1e-9)


@pytest.mark.slow  # a second or more on the 2-core machine; the fast loop stays under a minute
def test_determinism_for_a_seed() -> None:
    d = dep()
    args = (d, [32, 128], Poisson(25.0), parse_lengths("lognormal:400:300"),
            parse_lengths("normal:200:80"), 300)
    one = [s.to_dict() for s in simulate_levels(*args, seed=7)]
    two = [s.to_dict() for s in simulate_levels(*args, seed=7)]
    other = [s.to_dict() for s in simulate_levels(*args, seed=8)]
    assert json.dumps(one) == json.dumps(two)
    assert json.dumps(one) != json.dumps(other)


# ---- queueing sanity ----
@pytest.mark.parametrize("users,think_s", [(8, 0.0), (32, 0.5)])
def test_littles_law_closed_loop(users: int, think_s: float) -> None:
    """N users, each with one request in flight or thinking: X (R + Z) = N."""
    d = dep()
    w = workload(ClosedLoop(users, think_s), n=1500, inp="256", out="64")
    s = summarize(simulate(d, cfg(256), w))
    x = s.request_throughput_req_s
    r = s.e2e_ms["mean"] / 1e3  # type: ignore[operator]
    assert x * (r + think_s) == pytest.approx(users, rel=0.03)
    assert s.running_max <= users


def test_light_load_latency_is_the_cost_model() -> None:
    """One request alone: TTFT = its prefill, TPOT = the batch-1 decode step."""
    d = dep()
    w = workload(ClosedLoop(1), n=3, inp="1024", out="129")
    s = summarize(simulate(d, cfg(8, max_num_batched_tokens=4096), w))
    assert s.ttft_ms["p50"] == pytest.approx(
        rl.prefill_s(d, 1024) * 1e3, rel=1e-9)
    # Contexts run 1025..1152 over the decode steps; TPOT lies between their step times.
    lo = rl.decode_step(d, [1], 1025).step_s[0] * 1e3
    hi = rl.decode_step(d, [1], 1153).step_s[0] * 1e3
    assert lo < s.tpot_ms["p50"] < hi  # type: ignore[operator]


def test_token_budget_chunks_long_prompts() -> None:
    d = dep()
    w = workload(ClosedLoop(1), n=1, inp="5000", out="2")
    big = summarize(simulate(d, cfg(8, max_num_batched_tokens=8192), w))
    small = summarize(simulate(d, cfg(8, max_num_batched_tokens=512), w))
    assert small.num_steps == big.num_steps + 9  # ceil(5000/512) = 10 prefill steps, not 1
    assert small.ttft_ms["p50"] > big.ttft_ms["p50"]  # type: ignore[operator]


# ---- regime 3 ----
def test_regime_3_preemptions_and_tails_past_the_kv_pool() -> None:
    """Same traffic, same max_num_seqs: with a KV pool too small for the batch, requests are
    preempted and recomputed and the TTFT and TPOT tails rise; with the pool large, none."""
    traffic = (ClosedLoop(128), parse_lengths("256"), parse_lengths("uniform:128:512"), 400)
    small_d, large_d = dep(gpu_util=0.25), dep(gpu_util=0.9)
    per_seq_blocks = -(-(256 + 512) // 16)
    b_mem_small = num_gpu_blocks(small_d, 16) // per_seq_blocks
    assert b_mem_small < 128 < num_gpu_blocks(large_d, 16) // per_seq_blocks
    below, past = simulate_levels(small_d, [b_mem_small, 128], *traffic, seed=3)
    roomy = simulate_levels(large_d, [128], *traffic, seed=3)[0]
    assert below.preemptions == 0  # at B_mem even the longest requests fit
    assert past.preemptions > 0 and roomy.preemptions == 0
    assert past.kv_utilization_max > 0.95
    assert past.ttft_ms["p99"] > roomy.ttft_ms["p99"]  # type: ignore[operator]
    assert past.tpot_ms["p99"] > roomy.tpot_ms["p99"]  # type: ignore[operator]
    assert past.itl_ms["p99"] > roomy.itl_ms["p99"]  # type: ignore[operator]


@pytest.mark.slow  # a second or more on the 2-core machine; the fast loop stays under a minute
def test_swap_preemption_keeps_kv_and_costs_transfer() -> None:
    d = dep(gpu_util=0.25)
    w = workload(ClosedLoop(128), n=300, inp="256", out="uniform:128:512")
    rec = simulate(d, cfg(128, preemption="recompute"), w)
    swp = simulate(d, cfg(128, preemption="swap"), w)
    assert rec.num_preemptions > 0 and swp.num_preemptions > 0
    assert swp.requests.done.all()
    no_space = simulate(d, cfg(128, preemption="swap", swap_space_bytes=0), w)
    # Without swap space every preemption falls back to recompute: the same run.
    np.testing.assert_allclose(no_space.requests.finish_s, rec.requests.finish_s)


def test_block_pool_has_b_mem_accounting() -> None:
    d = dep()
    for ctx in (512, 2048, 8000):
        assert num_gpu_blocks(d, 16) // -(-ctx // 16) == rl.b_mem(d, ctx)


# ---- bad input ----
def test_request_longer_than_the_pool_is_refused() -> None:
    d = dep(gpu_util=0.235)
    tokens = num_gpu_blocks(d, 16) * 16
    w = workload(Poisson(1.0), n=5, inp=str(tokens), out="10")
    with pytest.raises(BstarError, match="could never run"):
        simulate(d, cfg(8), w)


def test_zero_blocks_refused() -> None:
    d = dep(gpu_util=0.2)  # 80 GiB x 0.2 is less than the 16 GB of weights
    with pytest.raises(BstarError, match="no blocks"):
        simulate(d, cfg(8), workload(Poisson(1.0), n=2))


def test_budget_below_one_block_refused() -> None:
    with pytest.raises(BstarError, match="below one"):
        simulate(dep(), cfg(8, max_num_batched_tokens=8), workload(Poisson(1.0), n=2))


@pytest.mark.parametrize("bad", [lambda: Poisson(-1.0), lambda: Poisson(0.0),
                                 lambda: ClosedLoop(0), lambda: ClosedLoop(2, -1.0),
                                 lambda: SchedulerConfig(0), lambda: cfg(4, max_sim_time_s=0),
                                 lambda: parse_lengths("uniform:9:3"),
                                 lambda: parse_lengths("zipf:3"), lambda: parse_slo("tbt:4"),
                                 lambda: Slo(ttft_ms=-1)])
def test_bad_settings_raise_bstar_error(bad: object) -> None:
    with pytest.raises(BstarError):
        bad()  # type: ignore[operator]


def test_time_bound_truncates() -> None:
    d = dep()
    w = workload(Poisson(50.0), n=2000, inp="512", out="512")
    run = simulate(d, cfg(256, max_sim_time_s=5.0), w)
    assert run.truncated and not run.requests.done.all()
    assert run.duration_s < 5.0 + 1.0  # the last step started before the bound


# ---- outputs ----
def test_weighted_percentiles_equal_numpy_on_the_expanded_array() -> None:
    rng = np.random.default_rng(0)
    v = rng.random(40)
    w = rng.integers(0, 9, size=40)
    got = weighted_percentiles(v, w)
    full = np.repeat(v, w)
    for p in (50, 90, 99):
        assert got[f"p{p}"] == pytest.approx(float(np.percentile(full, p)), rel=1e-12)


def test_goodput_counts_requests_meeting_every_slo() -> None:
    d = dep()
    w = workload(Poisson(30.0), n=300, inp="512", out="128")
    run = simulate(d, cfg(64), w)
    loose = summarize(run, Slo(ttft_ms=1e9, tpot_ms=1e9))
    assert loose.goodput_req_s == pytest.approx(loose.request_throughput_req_s)
    r = run.requests
    ttft_ms = (r.first_token_s - r.arrival_s) * 1e3
    limit = float(np.median(ttft_ms))
    half = summarize(run, Slo(ttft_ms=limit))
    assert half.goodput_req_s == pytest.approx((ttft_ms <= limit).sum() / run.duration_s)


def test_trace_replay(tmp_path: object) -> None:
    text = "arrival_s,prompt_tokens,output_tokens\n0.0,100,10\n0.5,200,20\n0.1,50,5\n"
    tr = parse_trace(text)
    w = make_workload(tr, Lengths.fixed(1), Lengths.fixed(1), 10, np.random.default_rng(0))
    assert list(w.arrival_s) == [0.0, 0.1, 0.5]  # type: ignore[arg-type]
    assert list(w.output_tokens) == [10, 5, 20]
    run = simulate(dep(), cfg(8), w)
    assert np.array_equal(run.requests.num_generated, w.output_tokens)
    jl = "\n".join(json.dumps({"arrival_s": a, "prompt_tokens": 3, "output_tokens": 2})
                   for a in (0.0, 1.0))
    assert len(parse_trace(jl).arrival_s) == 2
    with pytest.raises(BstarError):
        parse_trace("a,b\n1,2\n")


def test_length_distributions_have_their_moments() -> None:
    rng = np.random.default_rng(0)
    for spec, mean, std in (("normal:500:100", 500, 100), ("lognormal:500:300", 500, 300),
                            ("uniform:100:300", 200, None)):
        x = parse_lengths(spec).sample(rng, 200_000)
        assert x.min() >= 1
        assert x.mean() == pytest.approx(mean, rel=0.02)
        if std:
            assert x.std() == pytest.approx(std, rel=0.03)
    emp = parse_lengths("empirical:7,9").sample(rng, 1000)
    assert set(emp.tolist()) == {7, 9}


def test_tensor_parallel_and_moe_run() -> None:
    d = replace(dep(), model=get_model("mixtral-8x7b"), gpu=get_gpu("h100-sxm"), num_gpus=2)
    s = simulate_levels(d, [32], Poisson(5.0), Lengths.fixed(300), Lengths.fixed(50), 50, 0)[0]
    assert s.requests == 50 and not s.truncated
    # Every request's 50 tokens come out, over the run's wall time.
    assert s.throughput_tok_s == pytest.approx(50 * 50 / s.duration_s)
    assert 1 <= s.running_max <= 32
    # No step is faster than one sequence's decode at the shortest context it holds (the
    # MoE reads its active experts' weights over both GPUs' bandwidth, plus the all-reduce).
    floor_ms = float(rl.curve(d, [1], 300).tpot_s[0]) * 1e3
    assert s.tpot_ms["p50"] >= floor_ms * 0.999
    assert s.itl_ms["p50"] >= floor_ms * 0.999
    # Four GPUs each read half the weights two do: the same requests decode faster.
    s4 = simulate_levels(replace(d, num_gpus=4), [32], Poisson(5.0), Lengths.fixed(300),
                         Lengths.fixed(50), 50, 0)[0]
    assert s4.tpot_ms["p50"] < s.tpot_ms["p50"]


# ---- property: any small setting conserves tokens, and the jump changes nothing ----


@pytest.mark.slow  # 25 simulations, twice each
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), max_num_seqs=st.integers(1, 40),
       budget=st.sampled_from([16, 48, 256, 2048]), users=st.integers(1, 30),
       rate=st.one_of(st.none(), st.floats(0.5, 200.0)),
       preemption=st.sampled_from(["recompute", "swap"]),
       gpu_util=st.sampled_from([0.2295, 0.232, 0.9]))
def test_property_conservation_and_jump(seed: int, max_num_seqs: int, budget: int,
                                        users: int, rate: float | None, preemption: str,
                                        gpu_util: float) -> None:
    d = dep(gpu_util=gpu_util)
    arrivals = Poisson(rate) if rate else ClosedLoop(users, 0.05, random_think=True)
    w = make_workload(arrivals, parse_lengths("uniform:1:400"), parse_lengths("uniform:1:200"),
                      60, np.random.default_rng(seed))
    c = cfg(max_num_seqs, max_num_batched_tokens=budget, preemption=preemption)
    a = simulate(d, c, w)
    b = simulate(d, replace(c, fast_forward=False), w)
    for run in (a, b):
        assert run.requests.done.all()
        assert np.array_equal(run.requests.num_generated, w.output_tokens)
        assert run.timeline.kv_used_blocks[-1] == 0
        assert max(run.timeline.num_running) <= max_num_seqs
    np.testing.assert_allclose(a.requests.finish_s, b.requests.finish_s, rtol=1e-9)
    assert a.num_preemptions == b.num_preemptions


def test_a_trace_may_still_name_its_prompt_column_input_tokens() -> None:
    from bstar.sim.traffic import parse_trace

    new = parse_trace("arrival_s,prompt_tokens,output_tokens\n0,10,5\n0.5,20,6\n")
    csv_old = parse_trace("arrival_s,input_tokens,output_tokens\n0,10,5\n0.5,20,6\n")
    jl_old = parse_trace('{"arrival_s": 0, "input_tokens": 10, "output_tokens": 5}\n'
                         '{"arrival_s": 0.5, "input_tokens": 20, "output_tokens": 6}\n')
    assert new == csv_old == jl_old
    assert new.prompt_tokens == (10, 20)
