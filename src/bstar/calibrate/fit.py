"""The fit: cost model 2's parameters fitted to measured steps (`calibrate`, `fit_steps`)
or to any quantity the model predicts (`fit_efficiency`), robustly in log space within
bounds, with each parameter's uncertainty and identifiability; and the calibrated
prediction of other measured steps (`check`). The step's price is bstar.step's."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from bstar import step as st
from bstar.calibrate.params import (
    _BANDWIDTHS,
    _COMPUTES,
    _FOLLOWS,
    _LOWER,
    _SCALE,
    _UPPER,
    DEFAULT_FIT,
    MAX_EFF_MEASURED,
    MIXED_FIT,
    PARAMS,
    ROBUST_SCALE,
    _eff_dict,
    param_field,
    scaled,
)
from bstar.calibrate.results import Calibration, ParamFit, PointFit
from bstar.deployment import Deployment, Efficiency, EngineBehaviour, split_values
from bstar.errors import BstarError
from bstar.fit.steps import Point

# ---- the model as a function of its parameters ----------------------------------------------
# The step's price is bstar.step.price (the one price of a step, which the plan, the
# simulator and validation use too); here it is evaluated at trial parameters. What the
# points do (StepWork) is built once per fit and does not depend on the parameters.
# Efficiency 1 everywhere, no fixed costs: the starting point's scale.
_UNIT = Efficiency(bandwidth=1.0, compute=1.0, overhead_s=0.0, overhead_per_seq_s=0.0,
                      allreduce_latency_s=0.0, kv_bandwidth=1.0, attention_compute=1.0,
                      layer_s=0.0, decode_layer_s=0.0, chunk_layer_s=0.0, score_bytes=1.0,
                      roof_sharpness=math.inf, fp8_weight_stream=1.0, int4_weight_stream=1.0)


def _terms(d: Deployment, points: Sequence[Point]) -> st.StepWork:
    sh = st.shape(d)
    return st.concat([sh.scheduled(*p.scheduled()) for p in points])


def _with_shape(d: Deployment, v: Mapping[str, float]) -> dict[str, Any]:
    return {"grouped": d.eff.grouped, "roof_sharpness": d.eff.roof_sharpness, **v}


def _bound(t: st.StepWork, v: Mapping[str, Any]) -> np.ndarray:
    """Which resource sets most of each step: "compute" where the groups' compute times sum
    past their memory times, else "memory"."""
    parts = st.price_parts(t, v)
    return np.where(parts.compute_s > parts.memory_s, "compute", "memory")


def predict_step_s(d: Deployment, points: Sequence[Point]) -> np.ndarray:
    """The deployment's predicted step time at each point (its own efficiencies)."""
    return st.price(_terms(d, points), d.eff)


@dataclass(frozen=True, slots=True)
class EfficiencyFit:
    """The outcome of fitting efficiencies to any measured quantity the model predicts."""

    eff: Efficiency
    params: dict[str, ParamFit]
    correlation: dict[str, float]
    tied: tuple[str, ...]
    bandwidth_scale: float = 1.0
    compute_scale: float = 1.0
    behaviour: EngineBehaviour = field(default_factory=EngineBehaviour)


def fit_efficiency(predict: Callable[[Mapping[str, float]], np.ndarray],
                   measured: Sequence[float], prior: Efficiency,
                   fit: Sequence[str] = DEFAULT_FIT,
                   starts: Sequence[Mapping[str, float]] = (),
                   max_efficiency: float = 1.0,
                   behaviour: EngineBehaviour | None = None,
                   path_prior: Mapping[str, float] | None = None) -> EfficiencyFit:
    """Fit the parameters named in `fit` so that `predict(values)` (a positive array aligned
    with `measured`, values = every one of PARAMS) matches `measured` in log space, robustly,
    within bounds; the others stay at `prior` (and `behaviour`, default EngineBehaviour's
    defaults, for the engine's request overhead). Used for decode steps (`calibrate`) and
    for any other predicted metric (`bstar validate`). A name "FIELD@PATH" in `fit` is a
    kernel term of one kernel path (`param_field`), starting at `path_prior`'s value; it is
    in `values` beside PARAMS and in the result's `params`, not in its `eff`."""
    from scipy.optimize import least_squares

    fit = tuple(dict.fromkeys(fit))
    path_prior = dict(path_prior or {})
    bad = [k for k in fit if param_field(k) not in PARAMS
           or (k not in PARAMS and k not in path_prior)]
    if bad:
        raise BstarError(f"cannot fit {', '.join(bad)} (fit any of: {', '.join(PARAMS)})")
    if not fit:
        raise BstarError("nothing to fit")
    if len(measured) < len(fit):
        raise BstarError(f"{len(measured)} point(s) cannot determine {len(fit)} parameters "
                         f"({', '.join(fit)}); measure more batch sizes or fit fewer")
    log_measured = np.log(np.asarray(measured, dtype=np.float64))
    behaviour = EngineBehaviour() if behaviour is None else behaviour
    base = {**_eff_dict(prior, behaviour), **path_prior}
    scale = {k: _SCALE[param_field(k)] for k in base}

    follow = {k: lead for k, lead in _FOLLOWS.items() if lead in fit and k not in fit}

    def values(x: np.ndarray) -> dict[str, float]:
        v = {k: base[k] for k in PARAMS}
        for k, xi in zip(fit, x, strict=True):
            v[k] = float(xi) * scale[k]
        for k, lead in follow.items():  # keep the prior's ratio to the fitted lead
            v[k] = min(base[k] * v[lead] / base[lead], max_efficiency)
        return v

    def residuals(x: np.ndarray) -> np.ndarray:
        return np.log(predict(values(x))) - log_measured

    lo = np.array([_LOWER[param_field(k)] / scale[k] for k in fit])
    upper = {**_UPPER, **dict.fromkeys((*_BANDWIDTHS, *_COMPUTES), max_efficiency)}
    hi = np.array([upper[param_field(k)] / scale[k] for k in fit])
    best = None
    # The max() makes the problem piecewise smooth: start from a few corners and keep the
    # best, so the result does not depend on which roof the prior happened to favour.
    corners = [{"bandwidth": bw, "kv_bandwidth": bw, "compute": fl}
               for bw, fl in ((1.0, 1.0), (0.5, 0.5), (1.0, 0.2), (0.2, 1.0), (0.2, 0.2))]
    for start in [base, *starts, *({**base, **c} for c in corners)]:
        x0 = np.clip(np.array([start.get(k, base[k]) / scale[k] for k in fit]), lo + 1e-9,
                     np.where(np.isfinite(hi), hi - 1e-9, np.inf))
        r = least_squares(residuals, x0, bounds=(lo, hi), loss="soft_l1",
                          f_scale=ROBUST_SCALE, x_scale="jac", max_nfev=2000)
        if best is None or r.cost < best.cost:
            best = r
    assert best is not None
    jac = np.asarray(best.jac, dtype=np.float64)
    col = np.linalg.norm(jac, axis=0)
    unset = col <= 1e-9 * max(1.0, float(col.max(initial=0.0)))
    prior_x = np.array([base[k] / scale[k] for k in fit])
    x = _nearest_prior(best.x.copy(), prior_x, unset, residuals, float(best.cost))
    v = values(x)
    params, corr, tied = _uncertainty(fit, x, jac, np.asarray(best.fun), unset, v, base,
                                      lo, hi)
    for k, lead in follow.items():
        params[k] = ParamFit(k, v[k], None, f"follows {lead}", base[k])
    # Against a probed device an efficiency may pass 1: the excess becomes a scale on the
    # GPU's figure, shared by the efficiencies of that resource.
    bw_scale = max(1.0, *(v[k] for k in _BANDWIDTHS))
    fl_scale = max(1.0, *(v[k] for k in _COMPUTES))
    scaled_v = {k: v[k] / (bw_scale if k in _BANDWIDTHS else fl_scale if k in _COMPUTES
                           else 1.0) for k in PARAMS}
    eff_v, beh_v = split_values(scaled_v)
    return EfficiencyFit(replace(prior, **eff_v), params, corr, tuple(tied), bw_scale,
                         fl_scale, replace(behaviour, **beh_v))


def _nearest_prior(x: np.ndarray, prior_x: np.ndarray, unset: np.ndarray,
                   residuals: Callable[[np.ndarray], np.ndarray], cost: float) -> np.ndarray:
    """A parameter whose term sets no step time (`unset`) is free over a range: the value in
    that range closest to the prior (the prior itself when it fits as well), so an
    unmeasured roof does not come back as whatever corner the optimiser started from."""
    def same_fit(trial: np.ndarray) -> bool:
        return 0.5 * float(np.sum(_soft_l1(residuals(trial)))) <= cost * (1 + 1e-9) + 1e-15

    for i in np.flatnonzero(unset):
        trial = x.copy()
        trial[i] = prior_x[i]
        if same_fit(trial):
            x = trial
            continue
        inside, outside = float(x[i]), float(trial[i])  # bisect towards the prior
        for _ in range(50):
            mid = 0.5 * (inside + outside)
            trial[i] = mid
            if same_fit(trial):
                inside = mid
            else:
                outside = mid
        x[i] = inside
    return x


def fit_steps(groups: Sequence[tuple[Deployment, Sequence[Point]]],
              fit: Sequence[str], prior: Efficiency | None = None) -> EfficiencyFit:
    """One set of parameters for measured steps of several deployments (models, precisions)
    on one GPU x engine: what separates the weight stream from the KV stream and the fixed
    costs, which one model's points cannot (its weight read never changes). Each group's
    deployment supplies the model; `prior` (default: the first group's) the values not fitted."""
    if not groups:
        raise BstarError("no points to calibrate on")
    prior = prior or groups[0][0].eff
    shapes = [_unique_shapes(pts) for _, pts in groups]
    terms = [_terms(d.with_eff(prior), u) for (d, _), (u, _) in zip(groups, shapes,
                                                                      strict=True)]
    measured = np.concatenate([[p.step_s for p in pts] for _, pts in groups])
    cap = 1.0 if groups[0][0].gpu.provenance == "datasheet" else MAX_EFF_MEASURED
    shaped = [(t, d.with_eff(prior), inv) for t, (d, _), (_, inv)
              in zip(terms, groups, shapes, strict=True)]
    return fit_efficiency(lambda v: np.concatenate([st.price(t, _with_shape(d, v))[inv]
                                                    for t, d, inv in shaped]),
                          measured, prior, fit, max_efficiency=cap,
                          behaviour=groups[0][0].behaviour)


def _unique_shapes(points: Sequence[Point]) -> tuple[list[Point], np.ndarray]:
    """The distinct step shapes among `points` (batch, context, chunk) and, per point, the
    index of its shape: the step arithmetic runs once per shape and is gathered back, so
    20k repeated measurements cost what their few hundred shapes cost (issue 19). The fit
    still sees every point's residual: the result is the same."""
    index: dict[tuple[int, int, int, int], int] = {}
    uniq: list[Point] = []
    inverse = np.empty(len(points), dtype=np.int64)
    for i, p in enumerate(points):
        key = (p.batch, p.context_tokens, p.chunk_tokens, p.chunk_start)
        j = index.get(key)
        if j is None:
            j = index[key] = len(uniq)
            uniq.append(p)
        inverse[i] = j
    return uniq, inverse


def calibrate(d: Deployment, points: Sequence[Point],
              fit: Sequence[str] | None = None, *, engine: str = "", engine_version: str = "",
              source: str = "") -> Calibration:
    """Fit the parameters named in `fit` (a subset of PARAMS; default DEFAULT_FIT, plus
    MIXED_FIT when mixed steps are given) to measured steps; the others stay at `d.eff`'s
    values. Raises BstarError on input that cannot determine it."""
    if not points:
        raise BstarError("no points to calibrate on")
    if fit is None:
        fit = DEFAULT_FIT + (MIXED_FIT if any(p.mixed for p in points) else ())
    uniq, inv = _unique_shapes(points)
    terms = _terms(d, uniq)
    measured = np.array([p.step_s for p in points])
    # Efficiencies that would explain the most demanding point outright on each roof.
    unit = _with_shape(d, _eff_dict(_UNIT) | {"score_bytes": 0.0})
    at_unit = st.price_parts(terms, unit)
    mem_1, comp_1 = at_unit.memory_s[inv], at_unit.compute_s[inv]
    starts = [{"bandwidth": float(np.clip(np.max(mem_1 / measured), 0.01, 1.0)),
               "kv_bandwidth": float(np.clip(np.max(mem_1 / measured), 0.01, 1.0)),
               "compute": float(np.clip(np.max(comp_1 / measured), 0.01, 1.0))}]
    # A datasheet peak cannot be beaten; a probed figure can (the probe's kernels are not
    # the engine's, and caches serve part of a small model), so against a measured device
    # the efficiencies may reach MAX_EFF_MEASURED, the excess scaling the GPU's figures.
    cap = 1.0 if d.gpu.provenance == "datasheet" else MAX_EFF_MEASURED
    f = fit_efficiency(lambda v: st.price(terms, _with_shape(d, v))[inv], measured, d.eff,
                       fit, starts, cap, d.behaviour)
    eff, params, corr, tied = f.eff, f.params, f.correlation, list(f.tied)
    prior = _eff_dict(d.eff, d.behaviour)
    pfits = check(d, eff, points, f.bandwidth_scale, f.compute_scale)
    notes = []
    for k, pf in params.items():
        if pf.status == "unset" and k in MIXED_FIT:
            notes.append(f"{k} is not identified: no point runs its kernel group "
                         f"(it needs mixed prefill + decode steps); kept at {pf.value:.4g}")
        elif pf.status == "unset":
            notes.append(f"{k} is not identified: its term sets no point's step time; "
                         f"reported as {pf.value:.4g}" + (
                             " (the prior)" if pf.value == prior[k]
                             else f", the value nearest the prior {prior[k]:g} that fits"))
        elif pf.status == "at-bound" and k in (*_BANDWIDTHS, *_COMPUTES):
            notes.append(f"{k} efficiency sits at its bound ({pf.value:g}): the points are "
                         "faster than the GPU figure allows; check the figure (bstar probe)")
        elif pf.status == "at-bound":
            notes.append(f"{k} sits at zero: the points leave no room for it")
        if k in (*_BANDWIDTHS, *_COMPUTES) and pf.value > 1.0:
            notes.append(f"{k} efficiency {pf.value:.3g} beats the measured GPU figure: filed "
                         f"as efficiency 1 with the GPU's figure scaled by {pf.value:.3g}")
    if tied:
        notes.append(f"{', '.join(tied)} trade off exactly against each other in these points "
                     "(e.g. one model at one context on one roof): their split is arbitrary; add a "
                     "second context or model, or fix some with --fit")
    for pair, c in corr.items():
        if abs(c) > 0.95:
            notes.append(f"{pair} are {c:+.2f} correlated: the points barely separate them; "
                         "add other batch sizes, contexts or a second model")
    return Calibration(eff, params, pfits, corr, d.model.name, d.gpu.id,
                       d.weight.name, d.kv.name, d.num_gpus, engine, engine_version, source,
                       notes=tuple(notes), bandwidth_scale=f.bandwidth_scale,
                       compute_scale=f.compute_scale, behaviour=f.behaviour)


def _soft_l1(r: np.ndarray) -> np.ndarray:
    """least_squares' soft_l1 loss at f_scale ROBUST_SCALE (its cost is half the sum)."""
    z = (r / ROBUST_SCALE) ** 2
    return ROBUST_SCALE**2 * 2 * (np.sqrt(1 + z) - 1)


def _uncertainty(fit: Sequence[str], x: np.ndarray, jac: np.ndarray, resid: np.ndarray,
                 unset: np.ndarray, v: Mapping[str, float], prior: Mapping[str, float],
                 lo: np.ndarray, hi: np.ndarray
                 ) -> tuple[dict[str, ParamFit], dict[str, float], list[str]]:
    """Gauss-Newton covariance s^2 (J^T J)^-1 over the identified, interior parameters,
    with s^2 from the plain (non-robust) log residuals. No sigma where the linearisation
    says nothing: a parameter at a bound, one whose term sets no step time (zero column),
    or one in an exact trade-off with others (a null direction of J)."""
    n = len(resid)
    at_bound = (np.isclose(x, lo, rtol=1e-6, atol=1e-9)
                | (np.isfinite(hi) & np.isclose(x, hi, rtol=1e-6, atol=1e-9)))
    use = ~unset & ~at_bound
    tied_mask = np.zeros(len(fit), dtype=bool)
    sub = jac[:, use]
    if sub.size:
        _, sv, vt = np.linalg.svd(sub / np.linalg.norm(sub, axis=0), full_matrices=False)
        null = vt[sv < 1e-6 * sv[0]]
        if null.size:
            tied_mask[np.flatnonzero(use)[np.any(np.abs(null) > 0.01, axis=0)]] = True
            use &= ~tied_mask
    stds: dict[str, float | None] = {k: None for k in fit}
    corr: dict[str, float] = {}
    dof = n - int(use.sum())
    if use.any() and dof > 0:
        s2 = float(resid @ resid) / dof
        cov = np.linalg.pinv(jac[:, use].T @ jac[:, use]) * s2
        names = [k for k, u in zip(fit, use, strict=True) if u]
        sd = np.sqrt(np.clip(np.diag(cov), 0, None))
        for i, k in enumerate(names):
            stds[k] = float(sd[i]) * _SCALE[param_field(k)]
        for i in range(len(names)):
            for j in range(i + 1, len(names)):
                if sd[i] > 0 and sd[j] > 0:
                    corr[f"{names[i]}/{names[j]}"] = float(cov[i, j] / (sd[i] * sd[j]))
    out = {}
    for k in (*PARAMS, *(k for k in fit if k not in PARAMS)):
        if k not in fit:
            out[k] = ParamFit(k, v[k], None, "fixed", prior[k])
            continue
        i = fit.index(k)
        status = ("unset" if unset[i] else "tied" if tied_mask[i]
                  else "at-bound" if at_bound[i] else "fitted")
        out[k] = ParamFit(k, v[k], stds[k], status, prior[k])
    return out, corr, [k for k, t in zip(fit, tied_mask, strict=True) if t]


def check(d: Deployment, eff: Efficiency, points: Sequence[Point],
          bandwidth_scale: float = 1.0, compute_scale: float = 1.0) -> tuple[PointFit, ...]:
    """Predict measured points with efficiencies `eff` (and GPU scales) calibrated elsewhere
    (another context, another model on the same GPU x engine), and with `d`'s own."""
    cal_d = scaled(d, eff, bandwidth_scale, compute_scale)
    uniq, inv = _unique_shapes(points)
    pred = predict_step_s(cal_d, uniq)[inv]
    uncal = predict_step_s(d, uniq)[inv]
    bound = _bound(_terms(cal_d, uniq), _with_shape(cal_d, _eff_dict(cal_d.eff)))[inv]
    return tuple(PointFit(p.batch, p.context_tokens, p.step_s * 1e3, float(pred[i]) * 1e3,
                          float(uncal[i]) * 1e3, str(bound[i]), p.label,
                          p.chunk_tokens, p.chunk_start)
                 for i, p in enumerate(points))


def calibrate_own_levels(d: Deployment, points: Sequence[Point], source: str = ""
                         ) -> tuple[Calibration, float]:
    """`d` calibrated on a few levels of its own (`bstar demo`), from its priors: as many
    parameters as the levels carry (the weight stream and the per-step cost first: they
    set batch 1, then compute and the per-sequence cost), and of the roof's shapes, `d`'s
    and k = 1 (a CPU thread loads a weight tile, then multiplies it: memory and compute add,
    where a GPU overlaps them, docs/cost-model.md), the one that fits the levels better.
    Returns it and the uncalibrated median |error| (`d`'s own shape)."""
    fit = DEFAULT_FIT if len(points) > len(DEFAULT_FIT) else \
        ("bandwidth", "overhead_s", "overhead_per_seq_s")[:max(1, len(points) - 1)]
    tries = [calibrate(d.with_eff(replace(d.eff, roof_sharpness=k)), points, fit,
                       engine=d.engine, source=source)
             for k in dict.fromkeys((d.eff.roof_sharpness, 1.0))]
    return min(tries, key=lambda t: t.median_abs_error), tries[0].uncalibrated_median_abs_error

