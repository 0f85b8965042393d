"""The engine terms the simulator adds around the step price: the server's per-request work,
the scheduling lag of an engine that schedules one step ahead, prefix-cache hits, and the one
definition of capacity that `bstar simulate` and `bstar search` share."""

from __future__ import annotations

import numpy as np
import pytest

from bstar import roofline as rl
from bstar import step as st
from bstar.deployment import Deployment
from bstar.errors import BstarError
from bstar.sim import Poisson, SchedulerConfig, SimConfig, Workload, simulate, summarize
from bstar.sim.capacity import capacity, queue_grows
from bstar.specs.gpu import get_gpu
from bstar.specs.presets import get_model

H100 = get_gpu("h100-sxm")


def dep(**values: float) -> Deployment:
    """Llama-2-7B on an H100 with `values` (fields of Efficiency or EngineBehaviour)."""
    return Deployment(model=get_model("llama-2-7b"), gpu=H100).with_values(values)


def cfg(max_num_seqs: int = 128) -> SimConfig:
    return SimConfig(SchedulerConfig(max_num_seqs, 2048))


def lone(arrival_s: float, prompt: int = 500, out: int = 20,
         cached: int | None = None) -> Workload:
    """One request at `arrival_s`."""
    return Workload(np.array([prompt]), np.array([out]), np.array([arrival_s]),
                    cached_tokens=None if cached is None else np.array([cached]))


def test_request_overhead_adds_to_ttft_and_e2e_exactly() -> None:
    base = summarize(simulate(dep(), cfg(), lone(0.0)))
    slow = summarize(simulate(dep(request_overhead_s=0.007), cfg(), lone(0.0)))
    assert slow.ttft_ms["p50"] - base.ttft_ms["p50"] == pytest.approx(7.0, abs=1e-9)
    assert slow.e2e_ms["p50"] - base.e2e_ms["p50"] == pytest.approx(7.0, abs=1e-9)
    assert slow.tpot_ms["p50"] == pytest.approx(base.tpot_ms["p50"], rel=1e-12)


def test_a_cold_start_holds_the_first_wave_only() -> None:
    # A server measured from a cold start (EngineBehaviour.cold_start_s: kernels compiled per
    # shape on first use, ROCm's) schedules nothing before it: a request at t = 0 waits for
    # it (its per-request work runs meanwhile), one that comes after it waits nothing.
    w = Workload(np.array([500, 500]), np.array([20, 20]), np.array([0.0, 5.0]))
    warm = simulate(dep(request_overhead_s=0.1), cfg(), w).requests
    cold_cfg = SimConfig(SchedulerConfig(128, 2048), cold_start_s=2.0)
    cold = simulate(dep(request_overhead_s=0.1), cold_cfg, w).requests
    assert cold.first_token_s[0] - warm.first_token_s[0] == pytest.approx(2.0 - 0.1, rel=1e-9)
    assert cold.finish_s[0] - cold.first_token_s[0] == pytest.approx(
        warm.finish_s[0] - warm.first_token_s[0], rel=1e-9)
    assert cold.first_token_s[1] == pytest.approx(warm.first_token_s[1], rel=1e-12)
    # through the front end's queue too
    front = simulate(dep(front_token_s=20e-6), cold_cfg, w).requests
    assert front.first_token_s[0] > 2.0 > front.arrival_s[0]
    with pytest.raises(BstarError, match="cold start"):
        SimConfig(SchedulerConfig(128, 2048), cold_start_s=-1.0)


def test_a_front_end_alone_is_a_delay_of_its_work() -> None:
    # Requests far enough apart never queue at the front end: each reaches the engine its
    # own tokenization later, exactly as a per-request overhead of that length would put
    # it (whether the engine is idle or mid decode, where the multi-step jump must stop).
    w = Workload(np.array([600, 600, 600]), np.array([300, 20, 20]),
                 np.array([0.0, 0.25, 2.0]))
    front = simulate(dep(front_token_s=20e-6, request_overhead_s=0.003), cfg(), w)
    delay = simulate(dep(request_overhead_s=0.003 + 600 * 20e-6), cfg(), w)
    assert np.array_equal(front.requests.first_token_s, delay.requests.first_token_s)
    assert np.array_equal(front.requests.finish_s, delay.requests.finish_s)


def test_a_burst_queues_at_the_front_end_first_come_first_served() -> None:
    # Four one-token requests at once, listed out of arrival order, each tokenized in 40 ms
    # (longer than its prefill): the front end's one thread takes them by arrival time (1 ms
    # apart: 3, 1, 2, 0), so the k-th reaches an idle engine k + 1 tokenizations after t = 0.
    prompt, work_s = 800, 800 * 50e-6
    arrive = np.array([0.003, 0.001, 0.002, 0.0])
    w = Workload(np.full(4, prompt), np.ones(4, dtype=np.int64), arrive)
    first = simulate(dep(front_token_s=50e-6), cfg(), w).requests.first_token_s
    alone_s = summarize(simulate(dep(), cfg(), lone(0.0, prompt=prompt, out=1))).ttft_ms[
        "p50"] / 1e3
    assert alone_s < work_s
    for k, i in enumerate((3, 1, 2, 0)):
        assert first[i] == pytest.approx((k + 1) * work_s + alone_s, rel=1e-9)
    # A delay of the same length each, with no queue, hands them to the engine 1 ms apart:
    # the last first token comes more than a tokenization sooner.
    spread = simulate(dep(request_overhead_s=work_s), cfg(), w).requests.first_token_s
    assert spread.max() < first.max() - work_s


def test_a_closed_loop_queues_its_users_at_the_front_end() -> None:
    # Eight users start at once: the k-th prompt (by request id, all arriving at t = 0) is
    # tokenized after k others, so its TTFT is at least k + 1 tokenizations; the engine alone
    # serves all eight sooner than that.
    n, prompt, work_s = 8, 1000, 1000 * 30e-6
    w = Workload(np.full(2 * n, prompt), np.full(2 * n, 16), num_users=n,
                 think_s=np.zeros(2 * n))
    queued = simulate(dep(front_token_s=30e-6), cfg(), w).requests
    base = simulate(dep(), cfg(), w).requests
    ttft = queued.first_token_s - queued.arrival_s
    assert all(ttft[k] >= (k + 1) * work_s for k in range(n))
    assert float(np.max(base.first_token_s[:n] - base.arrival_s[:n])) < n * work_s
    assert queued.done.all()


def test_front_token_s_must_not_be_negative() -> None:
    from bstar.errors import BstarError

    with pytest.raises(BstarError, match="front_token_s"):
        dep(front_token_s=-1e-6)


def _second_request_ttft_s(lag: int) -> float:
    """A long request decodes alone; a second arrives during its third step. TTFT of the
    second (its prompt is one token, so its own step is a decode-sized step)."""
    d = dep(scheduling_lag_steps=lag)
    step = float(rl.decode_step(d, [1], 600).step_s[0])
    first_prefill = rl.prefill_s(d, 500)
    arrive = first_prefill + 2.5 * step  # mid third decode step of the first request
    w = Workload(np.array([500, 1]), np.array([200, 5]), np.array([0.0, arrive]))
    run = simulate(d, cfg(), w)
    return float(run.requests.first_token_s[1] - arrive), step


def test_scheduling_lag_makes_a_new_request_wait_one_more_step() -> None:
    ttft0, step = _second_request_ttft_s(0)
    ttft1, _ = _second_request_ttft_s(1)
    # Without the lag it joins the next step (the rest of this one + one step); with it, the
    # step after next: one more step, whose batch of two costs about a decode step.
    assert ttft0 == pytest.approx(1.5 * step, rel=0.05)
    assert ttft1 - ttft0 == pytest.approx(step, rel=0.05)


def test_an_idle_engine_schedules_at_once_even_with_a_lag() -> None:
    a = summarize(simulate(dep(scheduling_lag_steps=0), cfg(), lone(1.0)))
    b = summarize(simulate(dep(scheduling_lag_steps=1), cfg(), lone(1.0)))
    assert b.ttft_ms["p50"] == pytest.approx(a.ttft_ms["p50"], rel=1e-12)


def test_prefix_cache_hit_computes_only_the_rest_in_whole_blocks() -> None:
    d = dep()
    miss = summarize(simulate(d, cfg(), lone(0.0, prompt=1000)))
    hit = summarize(simulate(d, cfg(), lone(0.0, prompt=1000, cached=1000)))
    # A hit covers whole 16-token blocks and never the last prompt token: 992 cached, 8
    # computed; the step that runs them is a chunk of 8 tokens on top of 992.
    want = st.price(st.shape(d).scheduled([992], [8]), d.eff)[0]
    assert hit.ttft_ms["p50"] == pytest.approx(want * 1e3, rel=1e-9)
    assert miss.ttft_ms["p50"] == pytest.approx(rl.prefill_s(d, 1000) * 1e3, rel=1e-9)
    assert hit.ttft_ms["p50"] < 0.5 * miss.ttft_ms["p50"]


@pytest.mark.slow  # over 1.4 s on the 2-core machine: the fast loop stays under a minute
def test_capacity_separates_steady_from_growing_queues() -> None:
    d = dep()
    rng = np.random.default_rng(7)
    unit = Workload(np.full(400, 575), np.full(400, 248), np.zeros(400))
    cap, _ = capacity(d, cfg(), unit)
    assert cap.running_max == 128 and not cap.kv_bound
    n = 2500  # long enough for the batch to fill and a queue to build past it
    for frac, grows in ((0.8, False), (1.25, True)):
        rate = frac * cap.capacity_req_s
        w = Workload(np.full(n, 575), np.full(n, 248), Poisson(rate).arrivals(rng, n))
        run = simulate(d, cfg(), w)
        r = run.requests
        ttft = r.first_token_s - r.arrival_s
        early, late = np.median(ttft[: n // 4]), np.median(ttft[-n // 10:])
        assert cap.sustains(rate) is not grows
        assert queue_grows(run) is grows
        # Past the capacity the waits of the last arrivals dwarf the first ones'.
        assert bool(late > 5 * early) is grows


@pytest.mark.slow  # a second or more on the 2-core machine; the fast loop stays under a minute
def test_prefix_cached_tokens_flag_shortens_ttft(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from bstar.cli import main

    base = ["simulate", "--model", "llama-2-7b", "--gpu", "h100-sxm", "--rate", "5",
            "--input-len", "575", "--output-len", "32", "--max-num-seqs", "64",
            "--num-requests", "80", "--json"]
    out = []
    for extra in ([], ["--prefix-cached-tokens", "560"]):
        assert main([*base, *extra]) == 0
        out.append(json.loads(capsys.readouterr().out))
    cold, warm = (o[0] if isinstance(o, list) else o for o in out)
    # The cached 560 tokens (whole blocks) are not computed: TTFT falls by most of their
    # prefill (the rest of the TTFT, request overhead and waiting for a step, stays).
    from bstar.options import DeploymentOptions

    d = DeploymentOptions(model="llama-2-7b", gpu="h100-sxm").build()
    saved_ms = (rl.prefill_s(d, 575) - rl.prefill_s(d, 15)) * 1e3
    assert cold["ttft_ms"]["p50"] - warm["ttft_ms"]["p50"] > 0.5 * saved_ms
    assert warm["capacity"]["capacity_req_s"] >= cold["capacity"]["capacity_req_s"]
    assert main([*base, "--prefix-cached-tokens", "-1"]) == 2


def test_search_traffic_carries_the_cached_prefix_to_every_rate() -> None:
    from bstar.search.spec import Traffic, at_rate
    from bstar.sim import Lengths

    t = Traffic(10.0, Lengths("uniform", low=50, high=900), Lengths.fixed(20),
                num_requests=50, prefix_cached_tokens=100)
    unit = t.unit_workload()
    assert unit.cached_tokens is not None
    assert np.array_equal(unit.cached_tokens, np.minimum(unit.prompt_tokens, 100))
    assert np.array_equal(at_rate(unit, 7.0).cached_tokens, unit.cached_tokens)
    assert t.to_dict()["prefix_cached_tokens"] == 100
