"""`bstar capacity` (issue 39): demand curves, the three policies, cost, and the SLO
attainment through ramps replayed through the simulator."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bstar.capacity import (
    DemandCurve,
    Settings,
    diurnal,
    evaluate_replica,
    from_trace,
    parse_rate_csv,
    replica_for,
    required,
    scale,
    schedule,
)
from bstar.capacity.replay import draw_requests
from bstar.capacity.run import episode_bounds, episode_rng, ramp_episodes
from bstar.errors import BstarError
from bstar.options import DeploymentOptions
from bstar.search.spec import Traffic
from bstar.sim import Lengths, Slo, Workload, parse_slo, parse_trace, simulate

ROOT = Path(__file__).resolve().parent.parent
AZURE = ROOT / "examples" / "traces" / "azure-conv-2023-sample.csv"
PRICES = str(ROOT / "examples" / "gpu-prices-example.toml")
SLO = "ttft:500,tpot:30"
# A small, fast replica: llama-3.1-8b on one H100, max_num_seqs 64, 256/64-token requests.
MODEL, GPU, SEQS, BUDGET = "llama-3.1-8b", "h100-sxm", 64, 2048


@pytest.fixture(scope="module")
def replica() -> object:
    d = DeploymentOptions(model=MODEL, gpu=GPU).build()
    return replica_for(d, MODEL, SEQS, BUDGET)


@pytest.fixture(scope="module")
def traffic() -> Traffic:
    return Traffic(200.0, Lengths.fixed(256), Lengths.fixed(64), 200, draws=1)


@pytest.fixture(scope="module")
def evaluation(replica: object, traffic: Traffic) -> dict:
    return evaluate_replica(replica, traffic, parse_slo(SLO))  # type: ignore[arg-type]


def day(rate: float) -> DemandCurve:
    """Two hours of one-minute intervals between 1 and 3 replicas' rate, with a burst that
    doubles the rate for 5 minutes: ramps for a policy with a provisioning delay."""
    return diurnal(3 * rate, rate, interval_s=60, duration_s=2 * 3600, bursts=1,
                   burst_factor=2.0, burst_s=300, peak_hour=1.0, seed=3)


def short_ramp(rate: float) -> DemandCurve:
    """Five minutes in 30-second intervals: the demand of 0.8 replica, then of 1.6 for two
    minutes, then 0.8 again; with a 60-second provisioning delay the jump is a ramp."""
    return DemandCurve(30.0, tuple([0.8 * rate] * 4 + [1.6 * rate] * 4 + [0.8 * rate] * 2))


# ---- demand curves ---------------------------------------------------------------------------
def test_trace_binned_counts_every_request() -> None:
    trace = parse_trace(AZURE.read_bytes())
    c = from_trace(trace, 10.0)
    assert round(c.requests()) == len(trace.arrival_s) == 300
    a = np.sort(np.asarray(trace.arrival_s))
    assert len(c.rates_req_s) == int(a[-1] // 10) + 1
    assert c.rates_req_s[0] == pytest.approx(np.sum(a < 10) / 10)


def test_rate_csv_time_weighted_and_one_line_errors() -> None:
    c = parse_rate_csv("time_s,rate_req_s\n0,10\n90,40\n", 60.0)
    # 0..60: 10; 60..120: 30 s at 10 and 30 s at 40; 120..150 at 40, the last row one interval
    assert c.rates_req_s == pytest.approx((10.0, 25.0, 40.0))
    for text, needle in (("t,r\n0,1\n", "expected columns time_s and rate_req_s"),
                         ("time_s,rate_req_s\n0,1\n0,2\n", "does not follow"),
                         ("time_s,rate_req_s\n0,nan\n", "finite"),
                         ("time_s,rate_req_s\n0,x\n", "must be numbers"),
                         ("time_s,rate_req_s\n", "no rows")):
        with pytest.raises(BstarError) as e:
            parse_rate_csv(text, 60.0, "d.csv")
        assert needle in str(e.value) and "\n" not in str(e.value)


def test_diurnal_bounds_and_seed() -> None:
    a = diurnal(100, 20, bursts=3, burst_factor=1.5, seed=7)
    assert len(a.rates_req_s) == 1440
    assert min(a.rates_req_s) >= 20 - 1e-9
    assert max(a.rates_req_s) <= 150 + 1e-9
    assert max(a.rates_req_s) > 100  # a burst landed on the day's upper half
    assert a == diurnal(100, 20, bursts=3, burst_factor=1.5, seed=7)
    assert a != diurnal(100, 20, bursts=3, burst_factor=1.5, seed=8)
    plain = diurnal(100, 20)
    assert plain.rates[840] == pytest.approx(100, rel=1e-3)  # 14:00
    assert plain.rates[120] == pytest.approx(20, rel=1e-2)  # 02:00


# ---- policies --------------------------------------------------------------------------------
@pytest.mark.parametrize("delay_s", [0.0, 300.0])
def test_policies_on_a_generated_day(delay_s: float) -> None:
    rate = 10.0
    c = day(rate)
    need = required(c, rate)
    s = Settings(delay_s=delay_s, cooldown_s=600)
    st = schedule("static", c, rate, s)
    assert (st.provisioned(c.starts_s) == need.max()).all()
    re = schedule("reactive", c, rate, s)
    ready = re.min_ready(c.starts_s, c.interval_s)
    paid = re.provisioned(c.starts_s)
    assert (paid >= need).all()  # asked for at each interval's start
    if delay_s == 0:
        assert (ready >= need).all()  # never below the per-interval minimum
    else:
        assert (ready < need).any()  # the delay leaves ramps
    sc = schedule("scheduled", c, rate, s)
    ready_sc = sc.min_ready(c.starts_s, c.interval_s)
    assert (ready_sc >= need).all()  # in-sample history: each hour's most, ready on time
    # paid replica-seconds: static pays the peak all along; the others no more than it
    assert st.replica_seconds() == pytest.approx(need.max() * c.duration_s)
    assert re.replica_seconds() <= st.replica_seconds() + 1e-6
    assert sc.replica_seconds() <= st.replica_seconds() + 1e-6


def test_reactive_cooldown_holds_replicas() -> None:
    c = DemandCurve(60.0, (50.0, 5.0, 5.0, 5.0, 5.0, 5.0))
    s = Settings(delay_s=0, cooldown_s=180)
    re = schedule("reactive", c, 10.0, s)
    # 5 replicas for the first interval; the window [t - 180, t] still holds it until 240 s
    assert re.provisioned(c.starts_s).tolist() == [5, 5, 5, 5, 1, 1]


def test_scheduled_starts_ahead_of_the_hour() -> None:
    c = DemandCurve(600.0, tuple([10.0] * 6 + [40.0] * 6))  # two hours, 10-minute intervals
    sc = schedule("scheduled", c, 10.0, Settings(delay_s=300, period_s=3600))
    assert sc.ready([3599.0, 3600.0]).tolist() == [1, 4]
    assert sc.provisioned([3299.0, 3300.0]).tolist() == [1, 4]  # paid from 5 minutes before
    assert sc.replica_seconds() == pytest.approx(3600 + 3 * 3900 + 3600)


# ---- through the simulator -------------------------------------------------------------------
def test_static_reactive_scheduled_on_the_azure_sample(tmp_path: Path, capsys) -> None:
    from bstar.cli import main

    code = main(["capacity", "--model", MODEL, "--gpu", GPU, "--max-num-seqs", str(SEQS),
                 "--trace", str(AZURE), "--interval-s", "10", "--slo", SLO, "--draws", "1",
                 "--provision-delay-s", "0", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert [p["policy"] for p in out["policies"]] == ["static", "reactive", "scheduled"]
    for p in out["policies"]:
        assert len(p["intervals"]) == out["demand"]["intervals"] == 9
        for iv in p["intervals"]:
            assert {"start_s", "demand_req_s", "replicas", "slo_attainment"} <= iv.keys()
            assert iv["replicas"] >= iv["required_replicas"] >= 1
        assert p["gpu_hours"] > 0 and 0 <= p["slo_attainment"] <= 1
        assert p["cost_per_day"] is None  # no --price
    assert round(sum(iv["demand_req_s"] * 10 for iv in out["policies"][0]["intervals"])) == 300


HALF_HOUR = ["capacity", "--model", MODEL, "--gpu", GPU, "--max-num-seqs", str(SEQS),
             "--max-num-batched-tokens", str(BUDGET), "--input-len", "256", "--output-len",
             "64", "--diurnal", "400:100", "--duration-h", "0.5", "--interval-s", "60",
             "--bursts", "1", "--burst-s", "120", "--seed", "2", "--slo", SLO, "--draws", "1",
             "--provision-delay-s", "120", "--json"]


def _capacity_json(capsys, *extra: str) -> dict:
    from bstar.cli import main

    assert main([*HALF_HOUR, *extra]) == 0
    out = json.loads(capsys.readouterr().out)
    out.pop("timing")
    return out


def test_the_answer_does_not_depend_on_the_backend(capsys) -> None:
    """`--jobs 2` runs the evaluations, steady simulations and replays in two processes:
    the same JSON as in this process (timing aside), every replay included."""
    one = _capacity_json(capsys, "--jobs", "1")
    assert sum(p["simulations"] for p in one["policies"]) > 0  # replays ran
    assert _capacity_json(capsys, "--jobs", "2") == one


@pytest.mark.ray
def test_on_a_local_ray_cluster_the_answer_is_the_same(capsys) -> None:
    pytest.importorskip("ray")
    assert _capacity_json(capsys, "--ray", "--jobs", "2") == _capacity_json(capsys)


def test_progress_counts_every_simulation_task(replica: object, traffic: Traffic,
                                               evaluation: dict) -> None:
    """`tick(done, total)`: the evaluation, then the steady task and each replayed
    episode; it ends at done == total."""
    from bstar.capacity import plan_capacity

    c = short_ramp(evaluation["rate_per_replica_req_s"])
    ticks: list[tuple[int, int]] = []
    res = plan_capacity([replica], c, traffic, parse_slo(SLO),  # type: ignore[list-item]
                        Settings(delay_s=60.0), tick=lambda d, t: ticks.append((d, t)))
    replays = sum(len(ramp_episodes(np.array([iv["attainment_from"] == "replay"
                                              for iv in p.intervals])))
                  for p in res.deployments[0].policies)
    assert replays > 0
    assert ticks[0] == (0, 1) and ticks[-1] == (2 + replays, 2 + replays)
    assert [d for d, _ in ticks] == sorted(d for d, _ in ticks)


def test_static_is_the_peak_search_answer(tmp_path: Path, capsys) -> None:
    """The static policy's replicas equal `bstar search`'s instances at the curve's peak
    (one GPU per instance, the same replica), on a generated day."""
    from bstar.cli import main

    common = ["--model", MODEL, "--gpu", GPU, "--max-num-seqs", str(SEQS),
              "--max-num-batched-tokens", str(BUDGET), "--input-len", "256", "--output-len",
              "64", "--slo", SLO, "--draws", "1", "--json"]
    assert main(["capacity", *common, "--diurnal", "400:100", "--duration-h", "3",
                 "--interval-s", "300", "--bursts", "1", "--seed", "2", "--policies",
                 "static", "--price", PRICES]) == 0
    cap = json.loads(capsys.readouterr().out)
    peak = cap["demand"]["peak_req_s"]
    assert main(["search", *common, "--num-gpus", "1", "--rate", repr(peak), "--db",
                 str(tmp_path / "s.db"), "--num-requests", "400", "--price", PRICES]) == 0
    s = json.loads(capsys.readouterr().out)
    w = s["winners"][MODEL]
    st = cap["policies"][0]
    dep = cap["deployments"][0]
    assert dep["rate_per_replica_req_s"] == pytest.approx(w["rate_per_replica_req_s"])
    assert st["replicas_max"] == w["instances"] == w["gpus_total"]
    assert all(iv["replicas"] == w["instances"] for iv in st["intervals"])
    # $ per day: the peak's hourly cost x 24 (the curve is 3 h; per day scales it)
    assert st["cost_per_day"] == pytest.approx(w["cost_per_hour"] * 24)


@pytest.mark.parametrize("curve, delay_s", [
    pytest.param(short_ramp, 60.0, id="short-ramp"),
    pytest.param(day, 300.0, id="generated-day", marks=pytest.mark.slow)])
def test_reactive_delay_reports_attainment_lost_in_ramps(replica: object, traffic: Traffic,
                                                         evaluation: dict, curve,
                                                         delay_s: float) -> None:
    rate = evaluation["rate_per_replica_req_s"]
    c = curve(rate)
    slo = parse_slo(SLO)
    res = {}
    for delay in (0.0, delay_s):
        d = scale(replica, evaluation, c, traffic, slo,  # type: ignore[arg-type]
                  Settings(delay_s=delay), policies=("reactive",), seed=1)
        res[delay] = d.policies[0]
    zero, late = res[0.0], res[delay_s]
    assert zero.ramp["intervals"] == 0 and zero.ramp["attainment_lost"] == 0
    assert all(iv["ready_replicas"] >= iv["required_replicas"] for iv in zero.intervals)
    assert late.ramp["intervals"] > 0
    assert late.ramp["attainment_lost"] > 0
    assert late.ramp["slo_attainment"] < zero.slo_attainment
    assert late.slo_attainment < zero.slo_attainment
    ramps = [iv for iv in late.intervals if iv["ready_replicas"] < iv["required_replicas"]]
    assert all(iv["attainment_from"] == "replay" for iv in ramps)


def _replay_all(sched, reqs, d, cfg, slo: Slo) -> tuple[np.ndarray, np.ndarray]:
    """The test's own replay: every request routed round-robin over the replicas ready at
    its arrival, every replica simulated (no grouping), each request checked against every
    target of the SLO."""
    reps = sched.replicas
    where = np.empty(reqs.arrival_s.size, dtype=np.int64)
    for k, t in enumerate(reqs.arrival_s.tolist()):  # k: the requests routed before
        ready = [j for j, r in enumerate(reps) if r.ready_s <= t < r.removed_s]
        where[k] = ready[k % len(ready)]
    ok = np.zeros(reqs.arrival_s.size, dtype=bool)
    for j in np.unique(where):
        sel = np.flatnonzero(where == j)
        t0 = reqs.arrival_s[sel[0]]
        w = Workload(reqs.prompt_tokens[sel], reqs.output_tokens[sel],
                     reqs.arrival_s[sel] - t0)
        run = simulate(d, cfg, w)
        rq = run.requests
        for n, i in enumerate(sel):
            arrive = reqs.arrival_s[i] - t0
            ttft = (rq.first_token_s[n] - arrive) * 1e3
            e2e = (rq.finish_s[n] - arrive) * 1e3
            out = rq.output_tokens[n]
            tpot = (e2e - ttft) / (out - 1) if out > 1 else 0.0
            ok[i] = bool(rq.done[n]) and ttft <= slo.ttft_ms and tpot <= slo.tpot_ms
    return where, ok


@pytest.mark.parametrize("curve, delay_s", [
    pytest.param(short_ramp, 60.0, id="short-ramp"),
    pytest.param(day, 300.0, id="generated-day", marks=pytest.mark.slow)])
def test_replayed_ramp_matches_the_stated_attainment(replica: object, traffic: Traffic,
                                                     evaluation: dict, curve,
                                                     delay_s: float) -> None:
    """One ramp interval's stated attainment against the same requests replayed here on
    every replica (the stated figure simulates one replica per exchangeable group):
    within 2 points."""
    from bstar.search.candidates import sim_config

    rate = evaluation["rate_per_replica_req_s"]
    c = curve(rate)
    slo = parse_slo(SLO)
    s = Settings(delay_s=delay_s)
    res = scale(replica, evaluation, c, traffic, slo, s,  # type: ignore[arg-type]
                policies=("reactive",), seed=1).policies[0]
    sched = schedule("reactive", c, rate, s)
    need = required(c, rate)
    ramp = sched.min_ready(c.starts_s, c.interval_s) < need
    episodes = ramp_episodes(ramp)
    # the episode whose first interval loses the most (a real ramp, not a rounding blip)
    i, j = min(episodes, key=lambda e: res.intervals[e[0]]["slo_attainment"])
    lo, a, b = episode_bounds(c, i, j, 30.0)
    reqs = draw_requests(c, lo, b, traffic.unit_workload(), episode_rng(1, i))
    _, ok = _replay_all(sched, reqs, replica.deployment, sim_config(replica), slo)  # type: ignore[attr-defined]
    k = ((reqs.arrival_s - c.start_s) // c.interval_s).astype(int)
    counted = (reqs.arrival_s >= a) & (k == i)
    replayed = ok[counted].mean()
    stated = res.intervals[i]["slo_attainment"]
    assert counted.sum() > 100
    assert stated < 0.99  # a ramp that costs attainment
    assert abs(stated - replayed) <= 0.02, (stated, replayed)


def test_capacity_errors_are_one_line(tmp_path: Path, capsys) -> None:
    from bstar.cli import main

    bad = tmp_path / "d.csv"
    bad.write_text("when,how_many\n0,1\n")
    for argv, needle in (
            (["--demand-csv", str(bad)], "expected columns time_s and rate_req_s"),
            (["--demand-csv", str(tmp_path)], "is a folder"),
            (["--diurnal", "lots"], "expected PEAK:TROUGH"),
            ([], "give the demand"),
            (["--diurnal", "10:1", "--policies", "magic"], "unknown policy")):
        code = main(["capacity", "--slo", SLO, *argv])
        err = capsys.readouterr().err
        assert code != 0 and needle in err, (argv, err)
        assert len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_winners_of_a_search_are_scaled(tmp_path: Path, capsys) -> None:
    """--winners: the search at the curve's peak picks the replica; its static policy is
    the search's instances x data parallel replicas."""
    from bstar.cli import main

    assert main(["capacity", "--model", MODEL, "--gpu", GPU, "--winners", "--db",
                 str(tmp_path / "s.db"), "--input-len", "256", "--output-len", "64",
                 "--diurnal", "300:100", "--duration-h", "2", "--interval-s", "600",
                 "--slo", SLO, "--draws", "1", "--policies", "static", "--json"]) == 0
    cap = json.loads(capsys.readouterr().out)
    dep = cap["deployments"][0]
    assert dep["model"] == MODEL and dep["gpu"] == GPU
    peak = cap["demand"]["peak_req_s"]
    assert cap["policies"][0]["replicas_max"] == int(np.ceil(
        peak / dep["rate_per_replica_req_s"] * (1 - 1e-9)))


def test_replay_overloaded_replays_only_ramps_past_capacity(replica: object, traffic: Traffic,
                                                            evaluation: dict) -> None:
    """--replay overloaded: a ramp whose load per ready replica stays under the capacity is
    read from the steady simulations; one past the capacity is still replayed."""
    rate = evaluation["rate_per_replica_req_s"]
    cap = evaluation["capacity"]["capacity_req_s"]
    mild = min(1.02 * rate, 0.99 * cap)
    assert mild > rate  # the SLO rate sits below the capacity here
    c = DemandCurve(30.0, tuple([0.8 * rate] * 2 + [mild] * 2 + [0.8 * rate] + [1.6 * rate] * 2
                                + [0.8 * rate]))
    slo = parse_slo(SLO)
    got = {}
    for mode in ("all", "overloaded"):
        p = scale(replica, evaluation, c, traffic, slo,  # type: ignore[arg-type]
                  Settings(delay_s=60.0, cooldown_s=0.0, replay=mode),
                  policies=("reactive",), seed=1).policies[0]
        got[mode] = [iv["attainment_from"] for iv in p.intervals]
        ramps = [iv["ready_replicas"] < iv["required_replicas"] for iv in p.intervals]
    assert ramps[2] and ramps[5]
    assert got["all"][2] == "replay" and got["overloaded"][2] == "steady"
    assert got["all"][5] == got["overloaded"][5] == "replay"


def test_a_trace_as_the_demand_replays_its_own_requests(replica: object, traffic: Traffic,
                                                        evaluation: dict) -> None:
    """With the trace's arrivals as the demand, a ramp replays exactly the trace's
    requests of its intervals (one replica per group here, so each counts once)."""
    from bstar.capacity.replay import trace_workload

    rate = evaluation["rate_per_replica_req_s"]
    rng = np.random.default_rng(5)
    times = np.concatenate([np.sort(rng.uniform(0, 20, int(0.5 * rate * 20))),
                            np.sort(rng.uniform(20, 60, int(1.3 * rate * 40)))])
    rows = "\n".join(f"{t:.6f},256,64" for t in times)
    trace = parse_trace(f"arrival_s,prompt_tokens,output_tokens\n{rows}\n")
    c = from_trace(trace, 20.0)
    assert len(c.rates_req_s) == 3
    p = scale(replica, evaluation, c, traffic, parse_slo(SLO),  # type: ignore[arg-type]
              Settings(delay_s=20.0), policies=("reactive",), trace=trace_workload(trace),
              seed=1).policies[0]
    src = [iv["attainment_from"] for iv in p.intervals]
    assert src == ["steady", "replay", "replay"]
    in_episode = int(np.sum(times - times.min() >= 20.0))  # the curve starts at the first
    assert p.ramp["replayed_requests"] == in_episode


def test_each_policy_has_its_energy_bounded_by_idle_and_tdp(replica: object, traffic: Traffic,
                                                             evaluation: dict) -> None:
    """Issue 39: capacity gives joules per output token per policy (bstar.energy). Each
    interval's GPUs draw between idle and TDP, so a day's energy lies between the paid
    GPU-seconds at idle and at TDP; the static policy, which pays for the peak all day,
    spends more energy per token than reactive with no delay (its extra replicas idle)."""
    from bstar.energy import power_model

    rate = evaluation["rate_per_replica_req_s"]
    c = day(rate)
    pols = scale(replica, evaluation, c, traffic, parse_slo(SLO),  # type: ignore[arg-type]
                 Settings(delay_s=0.0), policies=("static", "reactive"), seed=1,
                 electricity_usd_per_kwh=0.2).policies
    pm = power_model(replica.deployment.gpu)  # type: ignore[attr-defined]
    assert pm is not None
    for p in pols:
        d = p.to_dict()
        gpu_s = sum(iv["replicas"] for iv in d["intervals"]) * c.interval_s \
            * replica.deployment.num_gpus  # type: ignore[attr-defined]
        assert pm.idle_w * gpu_s < d["energy_kwh"] * 3.6e6 < pm.tdp_w * gpu_s
        assert d["energy_cost"] == pytest.approx(0.2 * d["energy_kwh"])
        assert d["joules_per_output_token"] > 0
    static, reactive = (p.to_dict() for p in pols)
    assert static["joules_per_output_token"] > reactive["joules_per_output_token"]
