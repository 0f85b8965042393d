"""`fit_points`: the robust fit of step(B) = overhead + max(a + b*B, c*B) to measured points
(the model: bstar.fit.model), the roof settled from a known critical batch, the data or the
cost model, seeded bootstrap intervals, predictions and the knees on the fitted curve."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from bstar import knee as kn
from bstar.errors import BstarError
from bstar.fit.model import (
    LOSS_SCALE,
    FloatArray,
    Params,
    RoofCheck,
    _check_roof,
    _line_start,
    _Mode,
    _solve,
    summarize,
)
from bstar.fit.points import MIN_POINTS, Points
from bstar.fit.result import INTERVAL_PCT, FitResult, Prediction
from bstar.recommend import Recommendation, SloBound

DEFAULT_BOOTSTRAP = 200
MAX_SLA_GRID = 1 << 20


def _regime(p: Params, batch: float, roof_known: bool, past_data: bool) -> str:
    if p.c_ms is None:
        return "unknown" if (past_data and not roof_known) else "memory-bound"
    return "compute-bound" if p.c_ms * batch > p.a_ms + p.b_ms * batch else "memory-bound"


@dataclass(frozen=True, slots=True)
class KneeRules:
    """The knee rules' settings (`bstar.knee`): seed 000's step, seed 004's doubling, the
    BCA rule's epsilon, latency factor and reference batch, and a per-request TPOT SLA."""

    step: float = kn.DEFAULT_STEP
    doubling: float = kn.DEFAULT_DOUBLING
    max_tpot_ms: float | None = None
    bca_epsilon_tok_s: float | None = None
    bca_epsilon_fraction: float = kn.DEFAULT_BCA_EPSILON_FRACTION
    bca_latency_factor: float = kn.DEFAULT_BCA_LATENCY_FACTOR
    bca_reference_batch: float = kn.DEFAULT_BCA_REFERENCE_BATCH

    def knee_kwargs(self) -> dict[str, Any]:
        return {"step": self.step, "doubling": self.doubling,
                "bca_epsilon_tok_s": self.bca_epsilon_tok_s,
                "bca_epsilon_fraction": self.bca_epsilon_fraction,
                "bca_latency_factor": self.bca_latency_factor,
                "bca_reference_batch": self.bca_reference_batch}


_KNEE_KEYWORDS = {"knee_step": "step", "knee_doubling": "doubling",
                  "max_tpot_ms": "max_tpot_ms", "bca_epsilon_tok_s": "bca_epsilon_tok_s",
                  "bca_epsilon_fraction": "bca_epsilon_fraction",
                  "bca_latency_factor": "bca_latency_factor",
                  "bca_reference_batch": "bca_reference_batch"}


@dataclass(frozen=True, slots=True)
class _Roof:
    """How the roof was settled: the solver mode, the fitted parameters and the words."""

    mode: _Mode
    params: Params
    source: str  # one of ROOF_SOURCES
    note: str
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


def fit_points(points: Points, *, predict: Sequence[int] = (),
               critical_batch: float | None = None, compute_ms_per_seq: float | None = None,
               fit_overhead: bool = False, knees: KneeRules | None = None,
               n_bootstrap: int = DEFAULT_BOOTSTRAP, seed: int = 0,
               weight_bytes: int | None = None, kv_bytes_per_seq: int | None = None,
               flops_per_token: float | None = None, **knee_keywords: Any) -> FitResult:
    """Fit `points`, predict at `predict` (default: 2x and 4x the largest measured batch),
    find the knees with `knees` (KneeRules; the older keywords knee_step, knee_doubling,
    max_tpot_ms and bca_* set the same fields). The roof comes from, in order:
    `critical_batch` (a known roof: the batch where the memory line meets the compute
    line), the data (when they reach it), `compute_ms_per_seq` (the cost model's compute
    term, ms per sequence per step), or stays unknown. `weight_bytes`, `kv_bytes_per_seq`,
    `flops_per_token` (from --model) only turn a, b, c into bandwidths and FLOP/s."""
    rules = _knee_rules(knees, knee_keywords)
    if len(points) < MIN_POINTS:
        raise BstarError(f"need at least {MIN_POINTS} points, got {len(points)}")
    if critical_batch is not None and not critical_batch > 0:
        raise BstarError(f"--critical-batch must be positive, got {critical_batch}")
    if compute_ms_per_seq is not None and not compute_ms_per_seq > 0:
        raise BstarError("the compute term must be positive")
    if n_bootstrap < 0:
        raise BstarError("the number of bootstrap resamples must not be negative")
    for q in predict:
        if q < 1:
            raise BstarError(f"--predict batch sizes must be at least 1, got {q}")
    b = np.array(points.batch, dtype=np.float64)
    y = np.log(np.array(points.tpot_ms, dtype=np.float64))
    # Many points: the solver sees a summary of them (bstar.fit.model.summarize), so the fit
    # stays O(n log n); the residuals, outliers and measured knees below are of every point.
    bs, ys = summarize(b, y)
    roof = _settle_roof(bs, ys, critical_batch, compute_ms_per_seq, fit_overhead)
    params, roof_source = roof.params, roof.source
    notes = list(roof.notes)
    if bs.size < b.size:
        notes.append(f"{b.size:,} points fitted as {bs.size:,} bins of consecutive batches "
                     "(each its median batch and median step); residuals are per point")
    fitted = params.step_ms(b)
    resid = np.array(points.tpot_ms) / fitted - 1.0
    lr = np.log(np.array(points.tpot_ms)) - np.log(fitted)
    sigma = 1.4826 * float(np.median(np.abs(lr)))
    outliers = tuple(int(x) for x, r in zip(b, lr, strict=True)
                     if abs(r) > max(3 * sigma, LOSS_SCALE))
    if outliers:
        notes.append(f"down-weighted as outliers by the robust loss: B="
                     f"{', '.join(map(str, outliers))}")
    b_last = float(b[-1])
    if bs.size < b.size:
        fitted_s = params.step_ms(bs)
        boot = _bootstrap(roof.mode, params, bs, fitted_s, ys - np.log(fitted_s),
                          n_bootstrap, seed)
    else:
        boot = _bootstrap(roof.mode, params, b, fitted, lr, n_bootstrap, seed)
    queries = list(predict) if predict else [int(2 * b_last), int(4 * b_last)]
    preds = tuple(_predict(params, boot, q, b_last, roof_source) for q in queries)
    # Knees on the fitted curve (powers of two; only over the data when the roof is unknown)
    # and on the measured points.
    top = b_last if roof_source == "unknown" else max([b_last, *queries])
    knees_fitted, knees_measured, knee_batch, knee_rule = _knees(points, params, top, rules)
    if roof_source == "unknown":
        notes.append(f"knees on the fitted curve are searched up to the last point "
                     f"(B={b_last:g}); past it the curve is only a bound")
    return FitResult(
        points=points, params=params, roof_source=roof_source, roof_note=roof.note,
        critical_batch=critical_batch, fitted_tpot_ms=tuple(float(x) for x in fitted),
        residual_pct=tuple(float(x) * 100 for x in resid), outliers=outliers,
        regimes=tuple(_regime(params, x, roof_source != "unknown", False) for x in b),
        predictions=preds, knees_fitted=knees_fitted,
        knees_measured=knees_measured, knee_batch=knee_batch, knee_rule=knee_rule,
        param_intervals=_intervals(boot, roof.mode), warnings=(*points.warnings,
                                                               *roof.warnings),
        notes=tuple(notes), n_bootstrap=n_bootstrap, seed=seed,
        fit_overhead=fit_overhead and roof.mode.overhead,
        weight_bytes=weight_bytes, kv_bytes_per_seq=kv_bytes_per_seq,
        flops_per_token=flops_per_token, max_tpot_ms=rules.max_tpot_ms)


def _knee_rules(knees: KneeRules | None, keywords: dict[str, Any]) -> KneeRules:
    unknown = sorted(set(keywords) - _KNEE_KEYWORDS.keys())
    if unknown:
        raise TypeError(f"fit_points() got unexpected keyword argument(s) {unknown}")
    over = {_KNEE_KEYWORDS[k]: v for k, v in keywords.items()}
    rules = knees or KneeRules()
    return replace(rules, **over) if over else rules


def _settle_roof(b: FloatArray, y: FloatArray, critical_batch: float | None,
                 compute_ms_per_seq: float | None, fit_overhead: bool) -> _Roof:
    """The roof from, in order: a known critical batch, the data, the cost model's compute
    term; else unknown (the memory line alone)."""
    mem_fit, _ = _solve(_Mode("none", overhead=False), b, y, _line_start(b, np.exp(y)))
    check = _check_roof(b, y, mem_fit, fit_overhead)
    warnings: list[str] = []
    if critical_batch is not None:
        return _tied_roof(b, y, critical_batch, mem_fit, check, fit_overhead)
    if check.identified:
        assert check.params is not None
        params = check.params
        notes = ((f"the cost model's compute term is {compute_ms_per_seq:.4g} ms per "
                  f"sequence; the data say c = {params.c_ms:.4g} ms (the data win)",)
                 if compute_ms_per_seq is not None else ())
        return _Roof(_Mode("free", overhead=fit_overhead), params, "data",
                     f"roof fitted from the data: {check.reason}", (), notes)
    if fit_overhead:
        warnings.append("--fit-overhead needs points past the roof; overhead fixed at 0")
    if compute_ms_per_seq is None:
        return _Roof(_Mode("none"), mem_fit, "unknown",
                     f"the plateau cannot be determined from these points ({check.reason})"
                     "; past the data, predictions are a lower bound on TPOT and an upper "
                     "bound on throughput. Give --critical-batch N or --model/--gpu for a "
                     "roof", tuple(warnings))
    mode = _Mode("fixed", c_ms=compute_ms_per_seq)
    params, _ = _solve(mode, b, y, mem_fit)
    cross = params.crossover_batch
    note = (f"roof from the cost model's compute term (the data do not reach it: "
            f"{check.reason}): c = {compute_ms_per_seq:.4g} ms per sequence, "
            + (f"meeting the memory line at B={cross:.0f}" if cross is not None
               else f"below b = {params.b_ms:.4g} ms, so compute never binds: "
                    "memory-bound at any batch"))
    return _Roof(mode, params, "cost-model", note, tuple(warnings))


def _tied_roof(b: FloatArray, y: FloatArray, critical_batch: float, mem_fit: Params,
               check: RoofCheck, fit_overhead: bool) -> _Roof:
    mode = _Mode("tied", critical_batch=critical_batch)
    below = b <= critical_batch
    start = _line_start(b[below], np.exp(y[below])) if below.sum() >= 2 else mem_fit
    params, _ = _solve(mode, b, y, start)
    assert params.c_ms is not None
    note = (f"known roof at B={critical_batch:g}: c = (a + b*{critical_batch:g})/"
            f"{critical_batch:g} = step({critical_batch:g})/{critical_batch:g} = "
            f"{params.c_ms:.4g} ms per sequence; past it TPOT = c*B and throughput "
            f"stays at {1e3 / params.c_ms:,.0f} tok/s")
    warnings: list[str] = []
    if int((b < critical_batch).sum()) < 2:
        warnings.append(f"fewer than two points lie below --critical-batch "
                        f"{critical_batch:g}: a and b are not separately determined, only "
                        "step on the roof is")
    if check.identified and check.params is not None:
        seen = check.params.crossover_batch
        if seen is not None and abs(math.log(seen / critical_batch)) > math.log(1.25):
            warnings.append(f"the data put the roof near B={seen:.0f}, not at the given "
                            f"--critical-batch {critical_batch:g}; using the given one")
    if fit_overhead:
        warnings.append("--fit-overhead needs the roof fitted from the data; overhead "
                        "fixed at 0")
    return _Roof(mode, params, "critical-batch", note, tuple(warnings))


def _bootstrap(mode: _Mode, params: Params, b: FloatArray, fitted: FloatArray,
               lr: FloatArray, n_bootstrap: int, seed: int) -> list[Params]:
    """Resample the log residuals onto the fit and refit (seeded)."""
    rng = np.random.default_rng(seed)
    boot: list[Params] = []
    for _ in range(n_bootstrap):
        y_star = np.log(fitted) + rng.choice(lr, size=lr.size, replace=True)
        boot.append(_solve(mode, b, y_star, params)[0])
    return boot


def _intervals(boot: list[Params], mode: _Mode) -> dict[str, tuple[float, float] | None]:
    def interval(f: Callable[[Params], float]) -> tuple[float, float] | None:
        if not boot:
            return None
        vals = np.array([f(p) for p in boot])
        lo, hi = np.percentile(vals, INTERVAL_PCT)
        return float(lo), float(hi)

    out: dict[str, tuple[float, float] | None] = {
        "a_ms": interval(lambda p: p.a_ms), "b_ms": interval(lambda p: p.b_ms),
        "c_ms": (interval(lambda p: p.c_ms or math.nan) if mode.kind in ("free", "tied")
                 else None),
        "b_star": interval(lambda p: p.b_star)}
    if mode.overhead:
        out["overhead_ms"] = interval(lambda p: p.overhead_ms)
    return out


def _knees(points: Points, params: Params, top: float, rules: KneeRules
           ) -> tuple[dict[str, kn.Knee], dict[str, kn.Knee], int | None, str | None]:
    """Knees on the fitted curve up to `top` and on the measured points, and the fit's
    knee: the recommendation's pick on the fitted curve (bstar.recommend)."""
    grid = np.array(kn.pow2_grid(top), dtype=np.float64)
    step_grid = params.step_ms(grid)
    kw = rules.knee_kwargs()
    knees_fitted = kn.all_knees(grid, 1e3 * grid / step_grid, step_grid, **kw)
    sla: list[SloBound] = []
    if rules.max_tpot_ms is not None:
        dense = np.arange(1, min(int(top), MAX_SLA_GRID) + 1, dtype=np.float64)
        knees_fitted["sla"] = kn.slo_knee(dense, params.step_ms(dense), rules.max_tpot_ms,
                                          "fitted per-request TPOT")
        sla.append(SloBound(knees_fitted["sla"], f"TPOT <= {rules.max_tpot_ms:g} ms"))
    knees_measured = kn.all_knees(np.array(points.batch, dtype=np.float64),
                                  np.array(points.throughput_tok_s),
                                  np.array(points.tpot_ms), max_tpot_ms=rules.max_tpot_ms,
                                  **kw)
    rec = Recommendation.from_curve("fitted", [int(x) for x in grid], knees_fitted, sla)
    # No knee when no rule fired or no batch meets the SLA (then the rule is "sla").
    knee_batch = None if rec.bound in ("none", "sla-unmet") else rec.max_num_seqs
    return knees_fitted, knees_measured, knee_batch, rec.rule


def _predict(params: Params, boot: list[Params], batch: int, b_last: float,
             roof_source: str) -> Prediction:
    x = float(batch)
    tpot = float(params.step_ms(x))
    if boot:
        samples = np.array([float(p.step_ms(x)) for p in boot])
        lo, hi = (float(v) for v in np.percentile(samples, INTERVAL_PCT))
        last_hi = float(np.percentile([float(p.step_ms(b_last)) for p in boot],
                                      INTERVAL_PCT[1]))
    else:
        lo = hi = tpot
        last_hi = float(params.step_ms(b_last))
    past = x > b_last
    bound = None
    if past and roof_source == "unknown":
        # The roof is at or above the data: c <= step(B_last)/B_last, so the worst case
        # is the roof right at the last point, TPOT = step(B_last) * B / B_last.
        hi = max(hi, last_hi * x / b_last)
        bound = "tpot_lower_bound"
    lo, hi = min(lo, tpot), max(hi, tpot)
    return Prediction(batch=batch, tpot_ms=tpot, throughput_tok_s=1e3 * x / tpot,
                      tpot_low_ms=lo, tpot_high_ms=hi, throughput_low_tok_s=1e3 * x / hi,
                      throughput_high_tok_s=1e3 * x / lo,
                      regime=_regime(params, x, roof_source != "unknown", past),
                      extrapolated=past, bound=bound)

