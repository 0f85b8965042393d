"""bstar.fit: loading and validating points, the robust roofline fit, the roof's
identifiability, seed 001 both ways, recovery of known a, b, c."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bstar.errors import BstarError
from bstar.fit import Params, fit_points, load_points, make_points

ROOT = Path(__file__).resolve().parents[1]
SEED001 = ROOT / "examples" / "seed001.csv"


def within(x: float, target: float, rel: float) -> bool:
    return abs(x / target - 1) <= rel


# ---- seed 001 ---------------------------------------------------------------------------
def test_seed001_example_file_is_the_seed() -> None:
    p = load_points(SEED001)
    assert p.batch == (1, 8, 32, 128)
    assert p.throughput_tok_s == (80, 600, 2200, 6400)
    assert p.tpot_ms == (12.5, 13.3, 14.5, 20)
    assert p.derived == ("", "", "", "")
    # 600 tok/s at 8 is 13.33 ms against 13.3 given: inside the 5% tolerance, no warning.
    assert p.warnings == ()


def test_seed001_with_known_roof_reproduces_the_seed() -> None:
    r = fit_points(load_points(SEED001), critical_batch=128, predict=[256, 512])
    at = {pr.batch: pr for pr in r.predictions}
    # The seed's answer: throughput ~7,000 tok/s at 256 and 512, TPOT ~37 and ~73 ms.
    for b, tpot in ((256, 37.0), (512, 73.0)):
        assert within(at[b].throughput_tok_s, 7000, 0.10), at[b]
        assert within(at[b].tpot_ms, tpot, 0.10), at[b]
        assert at[b].regime == "compute-bound" and at[b].bound is None
        assert at[b].tpot_low_ms <= at[b].tpot_ms <= at[b].tpot_high_ms
    # Why: the roof at N = 128 means c = (a + b*128)/128 = step(128)/128, so past it
    # TPOT(B) = c*B = step(128) * B/128 and throughput = 1/c, flat.
    p = r.params
    step128 = p.a_ms + p.b_ms * 128
    assert p.c_ms == pytest.approx(step128 / 128)
    assert at[256].tpot_ms == pytest.approx(2 * step128)
    assert at[512].tpot_ms == pytest.approx(4 * step128)
    assert at[256].throughput_tok_s == pytest.approx(at[512].throughput_tok_s)
    assert p.crossover_batch == pytest.approx(128)
    assert r.roof_source == "critical-batch"
    # Naive linear extrapolation (12,800 tok/s at 256) is what the fit must not do.
    assert at[256].throughput_tok_s < 0.6 * 12_800
    assert r.knee_batch == 128 and r.knee_rule == "doubling"


@pytest.mark.slow  # a second or more on the 2-core machine; the fast loop stays under a minute
def test_seed001_without_roof_says_the_plateau_is_unknown() -> None:
    r = fit_points(load_points(SEED001), predict=[256, 512])
    assert r.roof_source == "unknown" and r.params.c_ms is None
    assert "plateau cannot be determined" in r.roof_note
    known = fit_points(load_points(SEED001), critical_batch=128, predict=[256, 512])
    for pr, kp in zip(r.predictions, known.predictions, strict=True):
        assert pr.bound == "tpot_lower_bound" and pr.regime == "unknown"
        # The memory line alone is the optimistic end ...
        assert pr.tpot_ms < kp.tpot_ms and pr.throughput_tok_s > kp.throughput_tok_s
        # ... and the worst case, a roof right at the last point, is the pessimistic end.
        assert pr.tpot_high_ms >= kp.tpot_ms
    assert r.knee_batch is None
    d = r.to_dict()
    assert d["params"]["c_ms"] is None and d["regime_at"]["512"] == "unknown"


# ---- recovery of a known roofline ----------------------------------------------------------
def synthetic(a: float, b: float, c: float, noise: float, seed: int,
              d: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    batch = np.array([1, 2, 4, 8, 16, 32, 64, 128, 256, 512], dtype=float)
    rng = np.random.default_rng(seed)
    step = (d + np.maximum(a + b * batch, c * batch)) * np.exp(rng.normal(0, noise, batch.size))
    return batch, step


def test_recovers_a_b_c_with_noise_and_an_outlier() -> None:
    # a = 10 ms, b = 0.05 ms, c = 0.2 ms: lines meet at B = 10/0.15 = 66.7, so 128..512 are
    # on the roof. 2% noise; B = 16 is 50% slow (an outlier).
    a, b, c = 10.0, 0.05, 0.2
    batch, step = synthetic(a, b, c, 0.02, seed=1)
    step[4] *= 1.5
    r = fit_points(make_points(batch.tolist(), tpot_ms=step.tolist()), predict=[1024])
    p = r.params
    assert r.roof_source == "data"
    # Tolerances: a and c are pinned by several points each (5%); b only by the few points
    # where the KV term shows before the roof (20%).
    assert within(p.a_ms, a, 0.05), p
    assert p.c_ms is not None and within(p.c_ms, c, 0.05), p
    assert within(p.b_ms, b, 0.20), p
    assert r.outliers == (16,)
    assert r.regimes[-3:] == ("compute-bound",) * 3 and r.regimes[0] == "memory-bound"
    pr = r.predictions[0]
    assert within(pr.throughput_tok_s, 1e3 / c, 0.05) and pr.regime == "compute-bound"
    # The outlier is down-weighted, not followed: its residual stays large.
    assert r.residual_pct[4] > 30


def test_a_least_squares_fit_would_follow_the_outlier() -> None:
    # The reason for the robust loss, shown: plain least squares on the same data moves a.
    from scipy.optimize import least_squares

    batch, step = synthetic(10.0, 0.05, 0.2, 0.0, seed=0)
    step[0] *= 2.0  # batch 1 twice as slow
    y = np.log(step)

    def resid(x: np.ndarray) -> np.ndarray:
        return np.log(Params(*np.exp(x)).step_ms(batch)) - y

    plain = least_squares(resid, np.log([10.0, 0.05, 0.2]))
    robust = fit_points(make_points(batch.tolist(), tpot_ms=step.tolist()), n_bootstrap=0)
    assert abs(np.exp(plain.x[0]) / 10 - 1) > 0.05
    assert within(robust.params.a_ms, 10.0, 0.02)


def test_fit_overhead_recovers_d() -> None:
    # d is the intercept of the compute line, read off three points at B = 128..512 where
    # c*B is 13-50x larger: it needs quiet data (0.2% noise here) to come out within 25%.
    batch, step = synthetic(10.0, 0.05, 0.2, 0.002, seed=3, d=2.0)
    r = fit_points(make_points(batch.tolist(), tpot_ms=step.tolist()), fit_overhead=True)
    assert r.roof_source == "data" and r.fit_overhead
    assert within(r.params.overhead_ms, 2.0, 0.25), r.params
    assert r.param_intervals["overhead_ms"] is not None
    assert r.params.c_ms is not None and within(r.params.c_ms, 0.2, 0.03)


def test_memory_bound_noisy_non_monotonic_data_is_fitted_without_a_roof() -> None:
    # Pure memory line with 3% noise; throughput even dips between two points.
    batch = [1, 2, 4, 8, 16, 32, 64]
    step = [12.0, 12.5, 11.9, 13.0, 12.2, 15.0, 16.0]
    tput = [1e3 * b / s for b, s in zip(batch, step, strict=True)]
    r = fit_points(make_points(batch, throughput_tok_s=tput))
    assert r.roof_source == "unknown"
    assert len(r.residual_pct) == len(batch)
    assert r.points.derived == ("tpot_ms",) * len(batch)


def test_bootstrap_is_seeded_and_brackets_the_estimate() -> None:
    pts = load_points(SEED001)
    r1 = fit_points(pts, critical_batch=128, seed=7, n_bootstrap=50)
    r2 = fit_points(pts, critical_batch=128, seed=7, n_bootstrap=50)
    r3 = fit_points(pts, critical_batch=128, seed=8, n_bootstrap=50)
    assert r1.param_intervals == r2.param_intervals
    assert r1.param_intervals != r3.param_intervals
    lo, hi = r1.param_intervals["a_ms"] or (0, 0)
    assert lo <= r1.params.a_ms <= hi


@pytest.mark.slow  # bootstraps several fits
def test_roof_from_the_cost_model() -> None:
    pts = load_points(SEED001)
    # A compute term below b never binds.
    r = fit_points(pts, compute_ms_per_seq=0.02)
    assert r.roof_source == "cost-model" and r.params.crossover_batch is None
    assert "never binds" in r.roof_note
    assert all(pr.regime == "memory-bound" and pr.bound is None for pr in r.predictions)
    # One above b meets the memory line at a/(c - b).
    r = fit_points(pts, compute_ms_per_seq=0.2, predict=[1000])
    p = r.params
    assert p.crossover_batch == pytest.approx(p.a_ms / (0.2 - p.b_ms))
    assert r.predictions[0].tpot_ms == pytest.approx(0.2 * 1000)


def test_given_critical_batch_against_a_roof_seen_in_the_data() -> None:
    batch, step = synthetic(10.0, 0.05, 0.2, 0.01, seed=2)
    r = fit_points(make_points(batch.tolist(), tpot_ms=step.tolist()), critical_batch=300)
    assert r.roof_source == "critical-batch"
    assert any("not at the given --critical-batch 300" in w for w in r.warnings)


@pytest.mark.slow  # bootstraps several fits
def test_critical_batch_below_the_data_warns() -> None:
    r = fit_points(load_points(SEED001), critical_batch=4)
    assert any("not separately determined" in w for w in r.warnings)
    # Whatever the split of a and b, the roof line goes through the points past N.
    assert r.params.c_ms is not None


def test_to_dict_is_json() -> None:
    r = fit_points(load_points(SEED001), critical_batch=128, max_tpot_ms=30)
    d = json.loads(json.dumps(r.to_dict()))
    assert set(d) >= {"params", "knee_batch", "predictions", "regime_at"}
    assert d["knees"]["fitted"]["sla"]["batch"] is not None


# ---- input ----------------------------------------------------------------------------------
def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_derived_columns(tmp_path: Path) -> None:
    p = load_points(write(tmp_path, "t.csv", "batch,throughput_tok_s\n1,100\n2,190\n4,350\n"))
    assert p.tpot_ms == pytest.approx((10.0, 1e3 * 2 / 190, 1e3 * 4 / 350))
    p = load_points(write(tmp_path, "p.csv", "tpot_ms,batch\n10,1\n10.5,2\n11,4\n"))
    assert p.throughput_tok_s == pytest.approx((100.0, 1e3 * 2 / 10.5, 1e3 * 4 / 11))
    # A row may give only one column when the file has both.
    p = load_points(write(tmp_path, "m.csv", "batch,throughput_tok_s,tpot_ms\n1,100,\n2,,10.5\n"
                                             "4,350,11.4\n"))
    assert p.derived == ("tpot_ms", "throughput_tok_s", "")


def test_conflicting_columns_warn_and_name_the_row(tmp_path: Path) -> None:
    p = load_points(write(tmp_path, "c.csv",
                          "batch,throughput_tok_s,tpot_ms\n1,80,12.5\n8,600,20\n32,2200,14.5\n"))
    assert len(p.warnings) == 1
    assert "line 3" in p.warnings[0] and "batch 8" in p.warnings[0]
    assert p.tpot_ms[1] == 20  # the fit uses the per-request TPOT, and says so
    assert "uses tpot_ms" in p.warnings[0]


def test_json_inputs(tmp_path: Path) -> None:
    rows = [{"batch": 1, "tpot_ms": 10}, {"batch": 2, "tpot_ms": 10.4},
            {"batch": 4, "throughput_tok_s": 370}]
    a = load_points(write(tmp_path, "a.json", json.dumps(rows)))
    b = load_points(write(tmp_path, "b.json", json.dumps({"points": rows})))
    assert a.batch == b.batch == (1, 2, 4) and a.tpot_ms == b.tpot_ms
    sweep = {"run_id": "x", "levels": [
        {"concurrency": 1, "throughput_tok_s": 99, "tpot_ms": {"mean": 10.0, "p99": 12}},
        {"concurrency": 2, "throughput_tok_s": 190, "tpot_ms": {"mean": 10.4}},
        {"concurrency": 4, "throughput_tok_s": 370, "tpot_ms": {"mean": 10.9}}]}
    s = load_points(write(tmp_path, "s.json", json.dumps(sweep)))
    assert s.batch == (1, 2, 4) and s.tpot_ms == (10.0, 10.4, 10.9)


def test_identical_repeats_are_used_once(tmp_path: Path) -> None:
    p = load_points(write(tmp_path, "r.csv", "batch,tpot_ms\n1,10\n2,11\n2,11\n4,12\n"))
    assert p.batch == (1, 2, 4)
    assert "line 4" in p.warnings[0] and "used once" in p.warnings[0]


@pytest.mark.parametrize(("text", "message"), [
    ("batch,tpot_ms\n1,10\n2,11\n", "need at least 3 distinct batch sizes"),
    ("batch,tpot_ms\n1,10\n2,11\n2,12\n4,13\n", "line 5: batch 2 is listed twice"),
    ("batch,tpot_ms\n1,10\n2,-11\n4,12\n", "line 4: tpot_ms must be positive"),
    ("batch,tpot_ms\n1,10\n0,11\n4,12\n", "line 4: batch must be positive"),
    ("batch,tpot_ms\n1,10\n2,fast\n4,12\n", "line 4: tpot_ms is 'fast', not a number"),
    ("batch,tpot_ms\n1,10\n2.5,11\n4,12\n", "line 4: batch must be a whole number"),
    ("batch,tpot_ms,gpu\n1,10,a\n2,11,a\n4,12,a\n", "line 2: unknown column 'gpu'"),
    ("batch,tpot\n1,10\n2,11\n4,12\n", "unknown column 'tpot'.*did you mean: tpot_ms"),
    ("tpot_ms\n10\n11\n12\n", "no 'batch' column"),
    ("batch\n1\n2\n4\n", "need a 'throughput_tok_s' or 'tpot_ms' column"),
    ("batch,tpot_ms\n1,10\n2,11,3\n4,12\n", "line 4: 3 cells for 2 columns"),
    ("batch,throughput_tok_s,tpot_ms\n1,100,10\n2,,\n4,350,11\n",
     "line 4: batch 2 has neither"),
    ("batch,tpot_ms\n1,10\n2,nan\n4,12\n", "line 4: tpot_ms is 'nan', not a finite"),
])
def test_bad_csv(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, "bad.csv", "# a comment line\n" + text)
    with pytest.raises(BstarError, match=message) as e:
        load_points(path)
    assert "\n" not in str(e.value)
    if "line" in message:  # the comment counts: the row is named by its line in the file
        assert str(path) in str(e.value)


@pytest.mark.parametrize(("data", "message"), [
    ('[{"batch": 1, "tpot_ms": 10}, {"batch": 2, "tpot_ms": true}, {"batch": 4, "tpot_ms": 1}]',
     "point 2: tpot_ms is True, not a number"),
    ('[{"batch": 1, "tpot_ms": 10}, 5, {"batch": 4, "tpot_ms": 1}]', "point 2: expected an"),
    ('{"batch": 1}', "expected a list of points"),
    ('[{"batch": 1, "tpot_ms": 10}', "not valid JSON"),
])
def test_bad_json(tmp_path: Path, data: str, message: str) -> None:
    with pytest.raises(BstarError, match=message):
        load_points(write(tmp_path, "bad.json", data))


def test_missing_file() -> None:
    with pytest.raises(BstarError, match="no such file"):
        load_points("/nonexistent/points.csv")


def test_make_points_and_fit_arguments() -> None:
    with pytest.raises(BstarError, match="need throughput_tok_s or tpot_ms"):
        make_points([1, 2, 4])
    with pytest.raises(BstarError, match="point 2: batch 2 is listed twice"):
        make_points([2, 2, 4], tpot_ms=[10, 11, 12])
    pts = make_points([1, 2, 4], tpot_ms=[10, 10.5, 11])
    with pytest.raises(BstarError, match="critical-batch"):
        fit_points(pts, critical_batch=0)
    with pytest.raises(BstarError, match="at least 1"):
        fit_points(pts, predict=[0])


def test_knee_rules_object_matches_the_keywords() -> None:
    from bstar.fit import KneeRules

    pts = load_points(SEED001)
    by_obj = fit_points(pts, critical_batch=128, n_bootstrap=20,
                        knees=KneeRules(doubling=0.2, max_tpot_ms=30))
    by_kw = fit_points(pts, critical_batch=128, n_bootstrap=20, knee_doubling=0.2,
                       max_tpot_ms=30)
    assert by_obj.to_dict() == by_kw.to_dict()
    # The fit's knee: the earlier of the doubling rule's and the SLA's on the fitted curve.
    fired = [k for name, k in by_obj.knees_fitted.items()
             if name in ("doubling", "sla") and k.batch is not None]
    assert fired and by_obj.knee_batch == min(k.batch for k in fired)
    with pytest.raises(TypeError, match="knee_stepp"):
        fit_points(pts, knee_stepp=0.1)


def test_with_prefill_predicts_the_closed_loop_output_throughput() -> None:
    # A closed loop of B streams: each request waits TTFT(B) = 40 + 30 B ms, then O - 1
    # steps of the fitted TPOT; its output throughput is B x O / (TTFT + (O - 1) TPOT).
    from bstar.fit import with_prefill

    batch = [1, 2, 4, 8]
    tpot = [10.0, 10.5, 11.5, 13.5]
    base = fit_points(make_points(batch, tpot_ms=tpot), predict=[16, 32])
    out_len = 32
    ttft = [40 + 30 * b for b in batch]
    fit = with_prefill(base, batch, ttft, out_len)
    for p in fit.predictions:
        want = 1e3 * p.batch * out_len / (40 + 30 * p.batch + (out_len - 1) * p.tpot_ms)
        assert p.throughput_tok_s == pytest.approx(want, rel=1e-9)
        # Prefill makes it smaller than the decode-only B / TPOT the plain fit reports.
        assert p.throughput_tok_s < 1e3 * p.batch / p.tpot_ms
    assert fit.throughput_kind.startswith("output, prefill included")
    assert base.throughput_kind == "decode only (B / TPOT)"


def test_the_fit_returns_its_sla_batch_and_its_curve() -> None:
    """What the report draws from a fit is the fit's own: the SLA batch is the fitted
    curve's "sla" knee (None without a bound or when no batch meets it), and the dense curve
    is step_ms / throughput_at on a log grid to 1.25x the last prediction."""
    pts = make_points([1, 2, 4, 8, 16], tpot_ms=[10.0, 10.4, 11.2, 12.8, 16.0])
    free = fit_points(pts, n_bootstrap=0, predict=[64])
    assert free.sla_batch is None and free.to_dict()["sla_batch"] is None
    bound = fit_points(pts, n_bootstrap=0, predict=[64], max_tpot_ms=14.0)
    b = bound.sla_batch
    assert b is not None and b == bound.knees_fitted["sla"].batch
    assert bound.step_ms(b) <= 14.0 < bound.step_ms(b + 1)
    assert bound.to_dict()["sla_batch"] == b and bound.to_dict()["max_tpot_ms"] == 14.0
    assert fit_points(pts, n_bootstrap=0, max_tpot_ms=1.0).sla_batch is None
    c = bound.curve(50)
    assert c["batch"][0] == 1.0 and c["batch"][-1] == pytest.approx(64 * 1.25)
    assert c["last_measured_batch"] == 16.0
    assert c["tpot_ms"] == pytest.approx(list(bound.step_ms(c["batch"])))
    assert c["throughput_tok_s"] == pytest.approx(
        [1e3 * x / t for x, t in zip(c["batch"], c["tpot_ms"], strict=True)])
    json.dumps(c)
