"""Engine terms fitted to measured stages and runs through the simulator: one set of terms
for every row (`fit_stages`), or one set plus each kernel path's own kernel terms
(`fit_stages_by_path`), as the engine profiles hold them: shared terms, and an entry per
kernel path for the fused-MoE kernels (docs/cost-model.md, "Kernel paths")."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from bstar.calibrate.params import param_field, param_path
from bstar.deployment import (
    BEHAVIOUR_FIELDS,
    GENERIC_PATH,
    KERNEL_FIELDS,
    Deployment,
    Efficiency,
    EngineBehaviour,
    fitted_kernel_fields,
    generic_kernel_terms,
    split_values,
)
from bstar.errors import BstarError
from bstar.stages_table import Stage
from bstar.validate_stages.simulate import (
    STEADY,
    StagePrediction,
    graph_settings,
    measured_state,
    simulate_stage,
    stage_deployment,
)

FIT_WINDOW_S = 40.0  # per stage and evaluation, inside a leave-one-model-out fit
FIT_ITERATIONS = 3

PathTerms = Mapping[str, Mapping[str, float]]  # kernel path -> its fitted kernel terms


def _with_values(prior: Efficiency, behaviour: EngineBehaviour, values: Mapping[str, float]
                 ) -> tuple[Efficiency, EngineBehaviour]:
    """`prior` and `behaviour` with `values` (fields of either); a stream or rate not given
    follows its lead at the prior's ratio, as in bstar.calibrate.fit_efficiency
    (kv_bandwidth follows bandwidth)."""
    from bstar.calibrate import _FOLLOWS

    out = dict(values)
    for k, lead in _FOLLOWS.items():
        if lead in values and k not in values:
            out[k] = min(getattr(prior, k) * values[lead] / getattr(prior, lead), 1.0)
    e, b = split_values(out)
    return replace(prior, **e), replace(behaviour, **b)


def _value(e: Efficiency, b: EngineBehaviour, k: str) -> float:
    return float(getattr(e if hasattr(e, k) else b, k))


TTFT_STATS = ("mean", "median")
TTFT_MEDIAN = "ttft_p50_ms"


def _monotone(slope: np.ndarray, pairs: Sequence[tuple[int, str, float]],
              request_term: bool = False) -> np.ndarray:
    """A parameter that makes a step cost more makes every latency of a stage longer: a
    mean moving against its stage's per-token time (E2E when there is none) moves by the
    phase of arrivals against step ends, not by the parameter, and its slope is set to 0
    (a 0.2 ms wobble of a 15 ms TTFT outweighed E2E's true slope in a robust fit).

    A request's own time outside the steps (`request_term`: an EngineBehaviour field such
    as request_overhead_s, front_token_s or cold_start_s) adds to its TTFT, and in a closed
    loop it shortens the per-token time: fewer requests are in the steps at once (in an
    open loop the batch, by Little's law, stays). There the reference is the TTFT (E2E
    when there is none): a per-token time moving against it is that smaller batch, kept,
    and one moving with it is the phase of arrivals, set to 0. Before, a TPOT that fell by
    1% zeroed every TTFT slope of request_overhead_s, and the fit could not move it
    (docs/transfer.md, "A request's time in the fit").

    `_gauss_newton` asks for that reference only in a fit of request terms alone (the step
    terms held). In a joint fit each request term's reference stays the per-token time, as
    for a step term: there the closed loops' TTFT, through the request terms, moved the
    CPU time per step (overhead_s 0.41 ms -> 0) and the left-out dense models' per-token
    time 6 points worse (docs/transfer.md, "A request's time in a joint fit")."""
    out = slope.copy()
    ref: dict[int, float] = {}
    if request_term:
        for j, (i, k, _) in enumerate(pairs):
            if k in ("ttft_mean_ms", TTFT_MEDIAN) or (k == "e2e_mean_ms" and i not in ref):
                ref[i] = float(slope[j])
        for j, (i, k, _) in enumerate(pairs):
            if (out[j] * ref.get(i, 0.0) > 0) if k == "tpot_mean_ms" \
                    else (out[j] * ref.get(i, 0.0) < 0):
                out[j] = 0.0
        return out
    for j, (i, k, _) in enumerate(pairs):
        if k == "tpot_mean_ms" or (k == "e2e_mean_ms" and i not in ref):
            ref[i] = float(slope[j])
    for j, (i, _, _) in enumerate(pairs):
        if out[j] * ref.get(i, 0.0) < 0:
            out[j] = 0.0
    return out


def _on_path(d: Deployment, kernel_path: str | None) -> Deployment:
    """`d`, its efficiencies' kernel terms taken as `kernel_path`'s (None: as built)."""
    return d if kernel_path is None else replace(d, kernel_terms_path=kernel_path)


def priced_by_path(d: Deployment, eff: Efficiency, path_terms: PathTerms) -> Deployment:
    """`d` priced with `eff` and, for its kernel terms, its own path's in `path_terms`
    (the others at that path's generic values), or its path's generic ones where
    `path_terms` has none: how a profile prices a GPU with and without an entry for it."""
    path = d.kernel_path
    own = path_terms.get(path)
    if own is None:
        return replace(d, eff=eff, kernel_terms_path=GENERIC_PATH)
    return replace(d, eff=replace(eff, **{**generic_kernel_terms(path), **own}),
                   kernel_terms_path=path)


@dataclass(frozen=True)
class PathFit:
    """Terms fitted by `fit_stages_by_path`: the shared ones, and each kernel path's."""

    eff: Efficiency
    behaviour: EngineBehaviour
    path_terms: dict[str, dict[str, float]]

    def values(self, fit: Sequence[str]) -> dict[str, float]:
        """The fitted values by parameter name ("FIELD@PATH" for a path's kernel term)."""
        out = {k: _value(self.eff, self.behaviour, k) for k in fit if k not in KERNEL_FIELDS}
        return out | {f"{k}@{p}": v for p, terms in self.path_terms.items()
                      for k, v in terms.items()}


def fit_stages(stages: Sequence[Stage], prior: Efficiency, fit: Sequence[str],
               max_window_s: float = FIT_WINDOW_S, seed: int = 0,
               iterations: int = FIT_ITERATIONS, behaviour: EngineBehaviour | None = None,
               kernel_path: str | None = None, ttft: str = "mean"
               ) -> tuple[Efficiency, EngineBehaviour] | None:
    """The parameters `fit` (fields of Efficiency or EngineBehaviour) fitted to the stages'
    measured E2E, TTFT and per-token means (the measured-steady stages), each stage simulated
    for at most `max_window_s`, starting from `prior` and `behaviour` (None: the first
    stage's engine profile's). None when they cannot determine them. With `kernel_path`, the
    kernel terms of `prior` belong to that path (an engine profile's entry for it): the
    stages' deployments price them as theirs (`Deployment.kernel_terms_path`).

    A simulation costs ~0.3 s a stage, too much for a least-squares fit that calls it a few
    hundred times, so the fit runs on a surrogate refreshed by simulation (Gauss-Newton with
    a line search): around the current values every predicted mean is log-linear in the
    parameters, with slopes from one simulation per parameter (a 10% step; a slope against
    the stage's per-token time is noise, set to 0: `_monotone`);
    bstar.calibrate.fit_efficiency (log space, robust, bounded) fits the parameters to the
    measurements through that surrogate; the simulation at the result is kept if its robust
    cost is lower (else the step is halved, twice at most); `iterations` times. About
    (len(fit) + 2) x iterations simulations of each stage. `ttft="median"` fits the
    measured TTFT medians in place of the means (a stage without one gives no TTFT): a run
    whose first requests meet a cold server carries their seconds in its mean, which no
    steady-state term should absorb (docs/transfer.md)."""
    got = _fit(stages, prior, fit, max_window_s, seed, iterations, behaviour,
               kernel_path, by_path=False, ttft=ttft)
    return None if got is None else (got.eff, got.behaviour)


def fit_stages_by_path(stages: Sequence[Stage], prior: Efficiency, fit: Sequence[str],
                       max_window_s: float = FIT_WINDOW_S, seed: int = 0,
                       iterations: int = FIT_ITERATIONS,
                       behaviour: EngineBehaviour | None = None) -> PathFit | None:
    """`fit_stages` with the kernel terms of `fit` (KERNEL_FIELDS) fitted once per kernel
    path of the stages, as the profiles' entries are (one entry per path, the other terms
    shared): `moe_compute@hopper:fp4-dequant`, `moe_layer_s@cdna3:fp4-dequant`, ... Each
    starts at its path's generic value (`generic_kernel_terms`), from the stages of that path
    only; a fused-MoE term only on a path with a mixture-of-experts model among them, and
    a weight stream only where `fitted_kernel_fields` says a fit determines it. A stage
    then prices its path's fitted terms, and a stage on a path not fitted (`priced_by_path`
    on a row the result never saw) its path's generic ones. Without this, a fit over
    several paths with shared generic kernel terms puts the fused-MoE time it cannot
    price into the shared terms (overhead_s, prompt_token_s), which then price dense models
    too (docs/transfer.md)."""
    return _fit(stages, prior, fit, max_window_s, seed, iterations, behaviour, None,
                by_path=True)


def _measured(stage: Stage, ttft: str) -> dict[str, float]:
    """The stage's measured means, with its TTFT median for the mean when `ttft` is
    "median" (none when the stage has no median)."""
    m = stage.measured()
    if ttft == "median":
        del m["ttft_mean_ms"]
        if stage.ttft_p50_ms:
            m[TTFT_MEDIAN] = stage.ttft_p50_ms
    return m


def _predicted(p: StagePrediction) -> dict[str, float]:
    """A StagePrediction's means and its TTFT median, keyed as `_measured` keys them."""
    return p.values() | {TTFT_MEDIAN: p.ttft_p50_ms}


def _path_params(built: Sequence[Deployment], fit: Sequence[str]) -> list[str]:
    """The "FIELD@PATH" parameters a by-path fit of `fit`'s kernel terms has over the
    stages' deployments `built`."""
    moe = {d.kernel_path for d in built if d.model.is_moe}
    return [f"{k}@{p}" for p in sorted({d.kernel_path for d in built})
            for k in fitted_kernel_fields(p)
            if k in fit and (p in moe or k.endswith("_weight_stream"))]


def _fit(stages: Sequence[Stage], prior: Efficiency, fit: Sequence[str], max_window_s: float,
         seed: int, iterations: int, behaviour: EngineBehaviour | None,
         kernel_path: str | None, by_path: bool, ttft: str = "mean") -> PathFit | None:
    if ttft not in TTFT_STATS:
        raise BstarError(f"ttft must be one of {', '.join(TTFT_STATS)}, got {ttft!r}")
    steady = [s for s in stages if measured_state(s) == STEADY]
    fit = tuple(k for k in dict.fromkeys(fit) if k != "allreduce_latency_s"
                or any(s.num_gpus > 1 for s in steady))
    built = [stage_deployment(s) for s in steady]
    paths = [d.kernel_path for d in built]
    shared = tuple(k for k in fit if not by_path or k not in KERNEL_FIELDS)
    names = (*shared, *(_path_params(built, fit) if by_path else ()))
    pairs = [(i, k, v) for i, s in enumerate(steady) for k, v in _measured(s, ttft).items()
             if v > 0]
    if not names or len(pairs) < len(names) + 1:
        return None
    fitted_paths = {param_path(n) for n in names} - {None}
    if by_path:
        base = {i: replace(d, kernel_terms_path=paths[i]
                           if paths[i] in fitted_paths else GENERIC_PATH)
                for i, d in enumerate(built)}
    else:
        base = {i: _on_path(d, kernel_path) for i, d in enumerate(built)}
    behaviour = base[0].behaviour if behaviour is None else behaviour
    log_meas = np.log([v for _, _, v in pairs])
    rows_of = {k: ({i for i, p in enumerate(paths) if p == param_path(k)} if param_path(k)
                   else set(range(len(steady)))) for k in names}

    def row_eff(e: Efficiency, values: Mapping[str, float], i: int) -> Efficiency:
        own = {param_field(n): v for n, v in values.items() if param_path(n) == paths[i]}
        return replace(e, **{**generic_kernel_terms(paths[i]), **own}) if own else e

    def simulate_at(values: Mapping[str, float], rows: set[int] | None = None,
                    y_old: np.ndarray | None = None) -> np.ndarray:
        """log of the predicted means, aligned with `pairs`: of the stages `rows` (None:
        all), the others' taken from `y_old`."""
        e, b = _with_values(prior, behaviour,
                            {k: v for k, v in values.items() if not param_path(k)})
        todo = range(len(steady)) if rows is None else sorted(rows)
        preds = {i: _predicted(simulate_stage(steady[i], deployment=base[i].with_eff(
            graph_settings(steady[i], row_eff(e, values, i))).with_behaviour(b),
            max_window_s=max_window_s, seed=seed)) for i in todo}
        y = np.array([preds[i][k] if i in preds else math.nan for i, k, _ in pairs])
        y = np.log(np.where(np.isfinite(y) & (y > 0), y, 1e9))
        if rows is not None and y_old is not None:
            keep = np.array([i not in preds for i, _, _ in pairs])
            y[keep] = y_old[keep]
        return y

    x = {k: _value(prior, behaviour, k) for k in shared}
    x |= {n: generic_kernel_terms(p)[param_field(n)] for n in names if (p := param_path(n))}
    x = _gauss_newton(x, simulate_at, rows_of, pairs, log_meas, prior, behaviour, iterations)
    e, b = _with_values(prior, behaviour, {k: x[k] for k in shared})
    terms: dict[str, dict[str, float]] = {}
    for n in names:
        if p := param_path(n):
            terms.setdefault(p, {})[param_field(n)] = x[n]
    return PathFit(e, b, terms)



def _gauss_newton(x: dict[str, float],
                  simulate_at: Callable[..., np.ndarray], rows_of: Mapping[str, set[int]],
                  pairs: Sequence[tuple[int, str, float]], log_meas: np.ndarray,
                  prior: Efficiency, behaviour: EngineBehaviour, iterations: int
                  ) -> dict[str, float]:
    """`fit_stages`' rounds from `x` (values by parameter name, "FIELD@PATH" for a path's
    kernel term): slopes by simulation (a parameter's stages only: `rows_of`), a robust
    bounded fit on the log-linear surrogate, and the step kept where the simulated cost
    falls."""
    from bstar.calibrate import _SCALE, _UPPER, ROBUST_SCALE, fit_efficiency

    names = tuple(x)
    shared = [k for k in names if not param_path(k)]

    def cost(log_y: np.ndarray) -> float:  # least_squares' soft_l1 at fit_efficiency's scale
        z = ((log_y - log_meas) / ROBUST_SCALE) ** 2
        return float(np.sum(2.0 * (np.sqrt(1.0 + z) - 1.0)))

    y = simulate_at(x)
    c = cost(y)
    # A request term judged against its TTFT only where nothing but request terms is fitted
    # (`_monotone`).
    request_only = all(param_field(k) in BEHAVIOUR_FIELDS for k in names)
    for _ in range(iterations):
        slopes = {}
        for k in names:
            field = param_field(k)
            h = 0.1 * x[k] if x[k] > 0 else 0.1 * _SCALE[field]
            if x[k] + h > _UPPER.get(field, math.inf):
                h = -h
            slopes[k] = _monotone((simulate_at({**x, k: x[k] + h}, rows_of[k], y) - y) / h,
                                  pairs, request_only)
        x0, y0 = dict(x), y

        def surrogate(v: Mapping[str, float], x0: dict[str, float] = x0,
                      y0: np.ndarray = y0,
                      slopes: dict[str, np.ndarray] = slopes) -> np.ndarray:
            return np.exp(y0 + sum(slopes[k] * (v[k] - x0[k]) for k in names))

        e0, b0 = _with_values(prior, behaviour, {k: x0[k] for k in shared})
        # A term at its lower bound of 0 stays there: least_squares' trust region scales
        # with the distance to the bound and stops at once on ftol. A second start lifts
        # it 1% of its fitting unit off the bound; the better of the starts is kept.
        lift = {k: 0.01 * _SCALE[param_field(k)] for k in names if x0[k] <= 0}
        new = fit_efficiency(surrogate, np.exp(log_meas), e0, names, behaviour=b0,
                             starts=[x0 | lift] if lift else (),
                             path_prior={k: x0[k] for k in names if param_path(k)})
        step = {k: (new.params[k].value if param_path(k) else _value(new.eff, new.behaviour, k))
                - x0[k] for k in names}
        for shrink in (1.0, 0.5, 0.25):
            trial = {k: x0[k] + shrink * step[k] for k in names}
            y_trial = simulate_at(trial)
            if cost(y_trial) < c:
                x, y, c = trial, y_trial, cost(y_trial)
                break
        else:
            break  # no step lowers the simulated cost: done
        if all(abs(step[k]) <= 0.01 * max(abs(x0[k]), 1e-12) for k in names):
            break
    return x
