"""bstar validate on load stages: the table reader, like-for-like workloads, the saturation
state, scores against the measured columns, the leave-one-model-out fit and the command."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from bstar import validate_stages as vs
from bstar.cli import main
from bstar.deployment import Efficiency, EngineBehaviour
from bstar.errors import BstarError
from bstar.validate_stages.fitting import _gauss_newton

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "data" / "vllm-h100" / "stages.csv"
# A light and a heavy stage of the same small deployment, in the shipped table's columns.
BASE = {"stage": "light", "model": "llama-2-7b", "gpu": "h100-sxm", "num_gpus": 1,
        "engine": "vllm", "dtype": "fp16", "max_num_seqs": 128,
        "max_num_batched_tokens": 2048, "arrival": "constant", "rate_req_s": 2,
        "duration_s": 600, "prompt_len_min": 480, "prompt_len_p10": 490,
        "prompt_len_p25": 495, "prompt_len_p50": 500, "prompt_len_p75": 505,
        "prompt_len_p90": 510, "prompt_len_p99": 520, "prompt_len_max": 530,
        "output_len": 100, "requests_sent": 1200, "requests_ok": 1200, "requests_failed": 0,
        "ttft_mean_ms": 30, "ttft_p50_ms": 29, "ttft_p90_ms": 35, "e2e_mean_ms": 800,
        "source": "synthetic"}


def table(rows: list[dict[str, object]]) -> str:
    out = io.StringIO()
    w = csv.DictWriter(out, list(vs.COLUMNS), lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return out.getvalue()


def stage(**over: object) -> vs.Stage:
    return vs.stages_from_csv(table([{**BASE, **over}]))[0]


# ---- the table -----------------------------------------------------------------------------
def test_reader_round_trips_the_shipped_table() -> None:
    stages = vs.load_stages(SHIPPED)
    rows = list(csv.DictReader(io.StringIO(SHIPPED.read_text())))
    assert len(stages) == len(rows) == 12
    assert list(rows[0]) == list(vs.COLUMNS)  # bench/to_stages.py writes every column
    for s, r in zip(stages, rows, strict=True):
        assert s.stage == r["stage"] and s.model == r["model"] and s.gpu == "h100-sxm"
        assert s.num_gpus == int(r["num_gpus"]) and s.arrival == "constant"
        assert s.rate_req_s == float(r["rate_req_s"])
        assert s.duration_s == float(r["duration_s"])
        assert (s.max_num_seqs, s.max_num_batched_tokens) == (128, 2048)
        assert s.output_len == int(r["output_len"]) and s.ignore_eos
        assert s.ttft_mean_ms == float(r["ttft_mean_ms"])
        assert s.e2e_mean_ms == float(r["e2e_mean_ms"])
        assert s.ttft_p90_ms == float(r["ttft_p90_ms"])
        assert s.requests_failed == int(r["requests_failed"])
        assert dict(s.prompt_len)[0.5] == float(r["prompt_len_p50"])
        assert dict(s.prompt_len)[0.0] == float(r["prompt_len_min"])
        # The per-token time is the README's: (E2E mean - TTFT mean) / (output_len - 1).
        assert s.tpot_mean_ms == pytest.approx(
            (s.e2e_mean_ms - s.ttft_mean_ms) / (s.output_len - 1), abs=1e-3)
    assert {s.model for s in stages} == {"llama-2-7b", "codellama-34b"}
    for s in stages:  # the models are bundled presets: nothing to fetch
        assert vs.stage_deployment(s).model.name == s.model


def test_reader_refuses_what_it_cannot_simulate() -> None:
    with pytest.raises(BstarError, match="arrival"):
        stage(arrival="bursty")
    with pytest.raises(BstarError, match="rate_req_s"):
        stage(rate_req_s="")
    with pytest.raises(BstarError, match="concurrency"):
        stage(arrival="concurrency", rate_req_s="")
    with pytest.raises(BstarError, match="must not decrease"):
        stage(prompt_len_p90=400)
    bad = table([BASE]).replace("prompt_len_min", "prompt_len_p05")
    with pytest.raises(BstarError, match="unknown column"):
        vs.stages_from_csv(bad)
    assert vs.is_stages_table(list(vs.COLUMNS))
    assert not vs.is_stages_table(["model", "gpu", "batch_kind"])


def test_derived_per_token_time_when_the_column_is_empty() -> None:
    s = stage(e2e_mean_ms=1020, ttft_mean_ms=30, output_len=100)
    assert s.tpot_mean_ms == pytest.approx(990 / 99)


# ---- the workload --------------------------------------------------------------------------
def test_prompt_lengths_are_drawn_within_the_percentiles() -> None:
    for s in vs.load_stages(SHIPPED)[:3]:
        q = dict(s.prompt_len)
        x = vs.draw_prompt_lengths(s, np.random.default_rng(1), 20_000)
        assert x.min() >= q[0.0] and x.max() <= q[1.0]
        for p in (0.10, 0.25, 0.50, 0.75, 0.90):
            assert np.quantile(x, p) == pytest.approx(q[p], abs=1.0)
    # Without min and max the draws stay between p10 and p99.
    s = stage(prompt_len_min="", prompt_len_max="")
    x = vs.draw_prompt_lengths(s, np.random.default_rng(2), 5000)
    assert x.min() == 490 and x.max() == 520


def test_workload_follows_the_arrival_process() -> None:
    s = stage(rate_req_s=4)
    w = vs.stage_workload(s, 100)
    # constant: one request in each 1 / rate slot, at a uniform point of it (the phase
    # against the engine's steps is random; the rate is exact)
    slot = np.floor(w.arrival_s / 0.25)
    assert (slot == np.arange(100)).all()
    phase = w.arrival_s / 0.25 - slot
    assert 0.35 < phase.mean() < 0.65 and phase.std() > 0.2
    assert (w.output_tokens == 100).all()
    p = vs.stage_workload(stage(arrival="poisson", rate_req_s=4), 4000)
    gaps = np.diff(p.arrival_s)
    assert gaps.std() > 0.5 * gaps.mean() and gaps.mean() == pytest.approx(0.25, rel=0.1)
    c = vs.stage_workload(stage(arrival="concurrency", rate_req_s="", concurrency=8), 50)
    assert c.closed_loop and c.num_users == 8
    # The cap: at most MAX_WINDOW_S of arrivals.
    assert vs.stage_requests(s) == round(4 * vs.MAX_WINDOW_S)
    assert vs.stage_requests(s, max_window_s=1000, max_requests=300) == 300


# ---- saturation ------------------------------------------------------------------------------
def test_overloaded_stage_is_queue_growing_and_light_one_steady() -> None:
    light = vs.simulate_stage(stage(rate_req_s=1), max_window_s=30)
    assert light.state == vs.STEADY and light.ttft_growth < 0.005
    heavy = vs.simulate_stage(stage(stage="heavy", rate_req_s=80), max_window_s=20)
    assert heavy.state == vs.GROWING and heavy.ttft_growth > 0.1
    assert heavy.ttft_mean_ms > 20 * light.ttft_mean_ms


def test_measured_state_from_the_rows() -> None:
    states = {s.stage: vs.measured_state(s) for s in vs.load_stages(SHIPPED)}
    growing = {k for k, v in states.items() if v == vs.GROWING}
    assert growing == {"llama-2-7b-tp1-reasoning-0", "codellama-34b-tp2-reasoning-0"}
    # Either sign alone: failures, or TTFT that grows through the stage.
    assert vs.measured_state(stage(requests_failed=100)) == vs.GROWING
    assert vs.measured_state(stage(ttft_p50_ms=30_000, ttft_p90_ms=60_000)) == vs.GROWING
    assert vs.ttft_growth(10.0, 34.0, 600.0) == pytest.approx(0.1)
    assert vs.saturation_state(0.01) == vs.STEADY
    assert vs.saturation_state(0.01, failed_fraction=0.05) == vs.GROWING


# ---- scores --------------------------------------------------------------------------------
def test_scores_are_against_the_measured_columns() -> None:
    s = vs.load_stages(SHIPPED)[0]
    p = vs.simulate_stage(s, max_window_s=30)
    sc = vs.score_stage(s, p)
    assert sc.errors["e2e_mean_ms"] == pytest.approx(p.e2e_mean_ms / s.e2e_mean_ms - 1)
    assert sc.errors["ttft_mean_ms"] == pytest.approx(p.ttft_mean_ms / s.ttft_mean_ms - 1)
    assert sc.errors["tpot_mean_ms"] == pytest.approx(p.tpot_mean_ms / s.tpot_mean_ms - 1)
    assert all(e != 0 for e in sc.errors.values())
    # A stage whose measurements are the prediction scores zero; others do not.
    same = replace(s, e2e_mean_ms=p.e2e_mean_ms, ttft_mean_ms=p.ttft_mean_ms,
                   tpot_mean_ms=p.tpot_mean_ms)
    summary = vs.summarize_scores([vs.score_stage(same, p)])
    assert summary.mean_abs["e2e_mean_ms"] == pytest.approx(0.0)
    assert summary.states_right == 1


def test_overloaded_stages_count_for_state_only() -> None:
    s = stage(requests_failed=600)
    p = vs.simulate_stage(s, max_window_s=20)
    sc = vs.score_stage(s, p)
    assert not sc.latency_scored and not sc.state_right
    summary = vs.summarize_scores([sc])
    assert summary.latency_stages == 0 and summary.mean_abs["e2e_mean_ms"] is None
    assert summary.wrong_states == ("light",)


def test_evaluate_takes_efficiencies_to_try() -> None:
    stages = [stage(rate_req_s=2)]
    slow = replace(Efficiency(), bandwidth=0.4)
    (fast_score,), _ = vs.evaluate(stages, max_window_s=20)
    (slow_score,), summary = vs.evaluate(stages, slow, max_window_s=20)
    assert slow_score.prediction.tpot_mean_ms > 1.5 * fast_score.prediction.tpot_mean_ms
    assert summary.stages == 1


@pytest.mark.slow  # a second or more on the 2-core machine; the fast loop stays under a minute
def test_fit_recovers_an_engine_overhead() -> None:
    # Measurements the simulator makes at 2 ms of CPU per step: the fit from 0.3 ms finds it.
    truth = replace(Efficiency(), overhead_s=2e-3)
    rows = []
    for rate in (2, 6):
        s = stage(stage=f"r{rate}", rate_req_s=rate)
        p = vs.simulate_stage(s, truth, max_window_s=15)
        rows.append(replace(s, e2e_mean_ms=p.e2e_mean_ms, ttft_mean_ms=p.ttft_mean_ms,
                            tpot_mean_ms=p.tpot_mean_ms))
    fitted = vs.fit_stages(rows, Efficiency(), ("overhead_s",), max_window_s=15)
    assert fitted is not None and fitted[0].overhead_s == pytest.approx(2e-3, rel=0.05)
    assert vs.fit_stages(rows[:1], Efficiency(), ("overhead_s", "bandwidth", "compute",
                                                     "decode_layer_s")) is None


@pytest.mark.slow  # a few seconds on the 2-core machine
def test_a_median_ttft_fit_is_not_pulled_by_cold_first_requests() -> None:
    # The simulator at 50 ms a request beyond the steps makes the measurements; the mean TTFT
    # then gains what cold first requests add (twice the steady mean), the median does not.
    truth = EngineBehaviour(request_overhead_s=0.05)
    rows = []
    for rate in (2, 6):
        s = stage(stage=f"r{rate}", rate_req_s=rate)
        p = vs.simulate_stage(s, deployment=vs.stage_deployment(s).with_behaviour(truth),
                              max_window_s=15)
        rows.append(replace(s, e2e_mean_ms=p.e2e_mean_ms, ttft_mean_ms=2 * p.ttft_mean_ms,
                            ttft_p50_ms=p.ttft_p50_ms, tpot_mean_ms=p.tpot_mean_ms))
    clean = [replace(r, ttft_mean_ms=r.ttft_mean_ms / 2) for r in rows]

    def fitted(data: list, ttft: str) -> float:
        got = vs.fit_stages(data, Efficiency(), ("request_overhead_s",), max_window_s=15,
                            behaviour=EngineBehaviour(request_overhead_s=0.01), ttft=ttft)
        assert got is not None
        return got[1].request_overhead_s

    on_clean, on_median = fitted(clean, "mean"), fitted(rows, "median")
    assert on_clean == pytest.approx(0.05, rel=0.15)
    assert on_median == pytest.approx(on_clean, rel=0.02)  # the median: as if never cold
    assert fitted(rows, "mean") > 2 * on_clean  # the cold requests' time on every request
    with pytest.raises(BstarError, match="ttft must be one of mean, median"):
        vs.fit_stages(rows, Efficiency(), ("overhead_s",), ttft="p90")


# ---- the command ---------------------------------------------------------------------------
@pytest.mark.slow  # over 1.4 s on the 2-core machine: the fast loop stays under a minute
def test_cli_prints_and_json_parses(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                    ) -> None:
    f = tmp_path / "stages.csv"
    f.write_text(table([BASE, {**BASE, "stage": "overloaded", "rate_req_s": 80,
                               "requests_failed": 600}]))
    assert main(["validate", str(f), "--no-lomo", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["kind"] == "stages"
    (g,) = d["groups"]
    assert (g["gpu"], g["engine"], g["profile"]) == ("h100-sxm", "vllm", "vllm")
    assert set(g["summary"]) == {"generic", "profile"}
    assert g["summary"]["profile"]["states_total"] == 2
    assert g["summary"]["profile"]["latency_stages"] == 1
    light, over = g["stages"]
    assert over["measured"]["state"] == "queue growing" and not over["latency_scored"]
    assert over["predicted"]["profile"]["state"] == "queue growing"
    assert light["predicted"]["profile"]["errors"]["e2e_mean_ms"] == pytest.approx(
        light["predicted"]["profile"]["e2e_mean_ms"] / 800 - 1)
    assert main(["validate", str(f), "--no-lomo"]) == 0
    out = capsys.readouterr().out
    assert "load stages" in out and "overloaded" in out and "states 2/2" in out
    assert "(overloaded: state only)" in out


def test_leave_one_model_out_fits_the_other_model() -> None:
    stages = vs.stages_from_csv(table([
        {**BASE, "stage": "a", "e2e_mean_ms": 900},
        {**BASE, "stage": "b", "model": "mistral-7b", "dtype": "bf16", "e2e_mean_ms": 900}]))
    v = vs.score_stages(stages, ("overhead_s",), max_window_s=10, fit_window_s=10)
    (g,) = v.groups
    assert set(g.summaries) == {"generic", "profile", "lomo"}
    assert set(g.lomo_eff) == {"llama-2-7b", "mistral-7b"}
    assert [sc.stage.stage for sc in g.scores["lomo"]] == ["a", "b"]
    # Each model's stage is predicted with what the other model's stage fitted.
    for lomo, prof in zip(g.scores["lomo"], g.scores["profile"], strict=True):
        assert lomo.prediction.e2e_mean_ms != prof.prediction.e2e_mean_ms
    d = v.to_dict()
    assert d["groups"][0]["stages"][1]["predicted"]["lomo"]["state"] == vs.STEADY
    one = vs.score_stages(stages[:1], lomo=True, max_window_s=10)
    assert "one model" in one.groups[0].notes[0] and "lomo" not in one.groups[0].summaries


def test_capacity_of_a_growing_stage() -> None:
    assert vs.growing_stage_capacity_req_s(4.0, 0.25, vs.GROWING) == pytest.approx(3.2)
    assert vs.growing_stage_capacity_req_s(4.0, 0.001, vs.STEADY) is None
    (s,) = [s for s in vs.load_stages(SHIPPED) if s.stage == "codellama-34b-tp2-reasoning-0"]
    # The measured reasoning stage served ~3.2 req/s of the 4 sent (4,672 output tok/s).
    cap = vs.growing_stage_capacity_req_s(s.rate_req_s, vs.measured_growth(s),
                                          vs.measured_state(s))
    assert cap == pytest.approx(3.16, abs=0.02)
    assert cap * s.output_len == pytest.approx(s.output_tok_s, rel=0.03)


def test_shared_prefix_is_a_prefix_cache_hit() -> None:
    s = stage(shared_prefix_len=100)
    ids = vs.stage_workload(s, 20).prompt_ids
    assert ids is not None and {seg[0] for seg in ids.segments} == {(1, 100)}
    assert vs.stage_workload(s, 20, prefix_cache=False).prompt_ids is None
    assert vs.stage_workload(stage(), 20).prompt_ids is None  # no column, no hits
    hit = vs.simulate_stage(s, max_window_s=20)
    cold = vs.simulate_stage(s, max_window_s=20, prefix_cache=False)
    assert hit.ttft_mean_ms < cold.ttft_mean_ms


def test_constant_rate_ttft_does_not_lock_onto_the_step_time() -> None:
    """At 20 req/s one arrival comes every 50 ms, about three 17-ms steps of Llama-2-7B: a
    lattice of arrivals against the simulated steps locked: on that lattice (4653193) this
    test reads 49.3 and 52.9 ms, 7% apart for a 3% change of the CPU time per step. With
    each request at a uniform point of its slot, TTFT follows the step time smoothly."""
    from bstar.engines import get_engine

    s = next(x for x in vs.load_stages(SHIPPED) if x.stage == "llama-2-7b-tp1-general-1")
    v = get_engine("vllm")
    ttft = [vs.simulate_stage(s, replace(v.efficiency(), overhead_s=ov), behaviour=v.behaviour(),
                              max_window_s=60).values()["ttft_mean_ms"]
            for ov in (0.800e-3, 0.825e-3)]
    assert abs(ttft[1] / ttft[0] - 1) < 0.03, ttft


def test_a_request_term_is_fitted_on_its_ttft_when_the_closed_loop_thins_the_batch() -> None:
    # A closed loop: a request's time outside the steps adds to its TTFT and thins the batch
    # (the per-token time falls a little). The model's per-token time is 5% slower than
    # measured, as a real profile's can be. Judged against that falling per-token time, the
    # TTFT slopes were zeroed and the fit stayed at its start, 157 ms.
    def means(overhead_s: float, users: int) -> dict[str, float]:
        tpot = 10.0 * (1 - 0.02 * overhead_s * users / 16)
        ttft = 30.0 + 1e3 * overhead_s
        return {"ttft_mean_ms": ttft, "tpot_mean_ms": tpot, "e2e_mean_ms": ttft + 999 * tpot}

    users = (4, 16, 64)
    pairs = [(i, k, v * (0.95 if k == "tpot_mean_ms" else 1.0)) for i, c in enumerate(users)
             for k, v in means(0.06, c).items()]

    def simulate_at(values: dict[str, float], rows: object = None,
                    y_old: object = None) -> np.ndarray:
        return np.log([means(values["request_overhead_s"], users[i])[k] for i, k, _ in pairs])

    start = EngineBehaviour(request_overhead_s=0.157)
    got = _gauss_newton({"request_overhead_s": 0.157}, simulate_at,
                        {"request_overhead_s": {0, 1, 2}}, pairs,
                        np.log([v for *_, v in pairs]), Efficiency(), start, 4)
    assert got["request_overhead_s"] == pytest.approx(0.06, rel=0.01)


def test_a_joint_fit_judges_its_request_terms_against_the_per_token_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The TTFT reference is for a fit of request terms alone. Fitted beside a step term, a
    # request term is judged against the per-token time like the step terms: there the
    # closed loops' TTFT moved the CPU time per step and worsened the left-out dense
    # models (docs/transfer.md, "A request's time in a joint fit").
    from bstar.validate_stages import fitting

    seen: list[bool] = []
    real = fitting._monotone

    def spy(slope: np.ndarray, pairs: object, request_term: bool = False) -> np.ndarray:
        seen.append(request_term)
        return real(slope, pairs, request_term)  # type: ignore[arg-type]

    monkeypatch.setattr(fitting, "_monotone", spy)
    pairs = [(0, "ttft_mean_ms", 40.0), (0, "tpot_mean_ms", 10.0), (0, "e2e_mean_ms", 1e4)]

    def simulate_at(values: dict[str, float], rows: object = None,
                    y_old: object = None) -> np.ndarray:
        ttft = 30.0 + 1e3 * values["request_overhead_s"] + 1e3 * values.get("overhead_s", 0)
        tpot = 10.0 + 1e3 * values.get("overhead_s", 0)
        return np.log([ttft, tpot, ttft + 999 * tpot])

    for x, expect in (({"request_overhead_s": 0.02}, [True]),
                      ({"request_overhead_s": 0.02, "overhead_s": 1e-3}, [False, False])):
        seen.clear()
        fitting._gauss_newton(x, simulate_at, {k: {0} for k in x}, pairs,
                              np.log([v for *_, v in pairs]), Efficiency(), EngineBehaviour(), 1)
        assert seen == expect, (x, seen)
