"""Scoring simulated stages against the measured ones: per stage (`score_stage`), per way of
predicting (`summarize_scores`), per GPU x engine three ways (`score_stages`: generic,
profile, leave one model out through `fit_stages` and, with several GPUs, leave one GPU
out)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from bstar.deployment import (
    GENERIC_PATH,
    KERNEL_FIELDS,
    Deployment,
    Efficiency,
    EngineBehaviour,
    split_values,
)
from bstar.errors import BstarError
from bstar.stages_table import Stage
from bstar.validate_stages.simulate import (
    FAILED_LIMIT,
    GROWTH_LIMIT,
    MAX_REQUESTS,
    MAX_WINDOW_S,
    STEADY,
    WARMUP_FRACTION,
    StagePrediction,
    graph_settings,
    growing_stage_capacity_req_s,
    measured_growth,
    measured_state,
    simulate_stage,
    stage_deployment,
)

METRICS = ("e2e_mean_ms", "ttft_mean_ms", "tpot_mean_ms")
FIT_WINDOW_S = 40.0  # per stage and evaluation, inside a leave-one-model-out fit
FIT_ITERATIONS = 3
# What a stage's leave-one-model-out fit calibrates (and what bench/accuracy.py
# --fit-profiles fits the vllm profile's terms to): the KV stream of the engine's attention,
# its CPU time per step and its fixed work per request. The all-reduce latency and the time
# per running sequence stay stated guesses: one TP-1 and one TP-2 model cannot tell a
# per-step cost from a per-all-reduce one, nor the per-sequence cost from the KV stream
# (fitted with them, `--fit` drives terms to their bounds: docs/cost-model.md).
DEFAULT_FIT = ("kv_bandwidth", "overhead_s", "request_overhead_s")


@dataclass(frozen=True, slots=True)
class StageScore:
    """One stage under one set of efficiencies: its prediction and errors."""

    stage: Stage
    prediction: StagePrediction
    errors: dict[str, float]  # metric -> predicted / measured - 1
    measured_state: str

    @property
    def state_right(self) -> bool:
        return self.prediction.state == self.measured_state

    @property
    def latency_scored(self) -> bool:
        """Whether its latency errors count in the aggregates: measured steady."""
        return self.measured_state == STEADY

    def to_dict(self) -> dict[str, Any]:
        p = self.prediction
        return {**p.to_dict(), "errors": self.errors, "state_right": self.state_right,
                "capacity_req_s": growing_stage_capacity_req_s(
                    self.stage.rate_req_s, p.ttft_growth, p.state)}


def score_stage(stage: Stage, prediction: StagePrediction) -> StageScore:
    meas = stage.measured()
    pv = prediction.values()
    errors = {k: pv[k] / v - 1.0 for k, v in meas.items()
              if v > 0 and math.isfinite(pv[k])}
    return StageScore(stage, prediction, errors, measured_state(stage))


def _mean(x: Sequence[float]) -> float | None:
    return float(np.mean(np.abs(x))) if len(x) else None


def _median(x: Sequence[float]) -> float | None:
    return float(np.median(np.abs(x))) if len(x) else None


@dataclass(frozen=True, slots=True)
class Summary:
    """Aggregates of one way of predicting over a set of stages: mean and median of
    |predicted / measured - 1| per metric over the measured-steady stages, and how many
    saturation states the prediction got right (of all stages)."""

    stages: int
    latency_stages: int
    mean_abs: dict[str, float | None]
    median_abs: dict[str, float | None]
    states_right: int
    wrong_states: tuple[str, ...]  # stage names

    def to_dict(self) -> dict[str, Any]:
        return {"stages": self.stages, "latency_stages": self.latency_stages,
                **{k: {"mean": self.mean_abs[k], "median": self.median_abs[k]}
                   for k in METRICS},
                "states_right": self.states_right, "states_total": self.stages,
                "wrong_states": list(self.wrong_states)}


def summarize_scores(scores: Sequence[StageScore]) -> Summary:
    errs: dict[str, list[float]] = {k: [] for k in METRICS}
    lat = [s for s in scores if s.latency_scored]
    for s in lat:
        for k, v in s.errors.items():
            errs[k].append(v)
    return Summary(len(scores), len(lat), {k: _mean(v) for k, v in errs.items()},
                   {k: _median(v) for k, v in errs.items()},
                   sum(s.state_right for s in scores),
                   tuple(s.stage.stage for s in scores if not s.state_right))


def evaluate(stages: Sequence[Stage], eff: Efficiency | None = None, *,
             engine: str | None = None, max_window_s: float = MAX_WINDOW_S,
             max_requests: int = MAX_REQUESTS, seed: int = 0,
             behaviour: EngineBehaviour | None = None, kernel_path: str | None = None
             ) -> tuple[list[StageScore], Summary]:
    """Every stage simulated at `eff` and `behaviour` (None: the engine profile's, `engine`
    or the stage's) and scored: the call for a loop over candidate efficiencies. With
    `kernel_path`, `eff`'s kernel terms belong to that path (as in `fit_stages`)."""
    def deployment(s: Stage) -> Deployment | None:
        if kernel_path is None:
            return None
        d = stage_deployment(s, engine, eff, behaviour)
        # eff anew: built under the profile's path, its kernel terms were set aside
        return replace(d, kernel_terms_path=kernel_path,
                       eff=graph_settings(s, eff if eff is not None else d.eff))

    scores = [score_stage(s, simulate_stage(s, eff, engine=engine, max_window_s=max_window_s,
                                            max_requests=max_requests, seed=seed,
                                            behaviour=behaviour, deployment=deployment(s)))
              for s in stages]
    return scores, summarize_scores(scores)


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


def _monotone(slope: np.ndarray, pairs: Sequence[tuple[int, str, float]]) -> np.ndarray:
    """A parameter that makes a step cost more makes every latency of a stage longer: a
    mean moving against its stage's per-token time (E2E when there is none) moves by the
    phase of arrivals against step ends, not by the parameter, and its slope is set to 0
    (a 0.2 ms wobble of a 15 ms TTFT outweighed E2E's true slope in a robust fit)."""
    out = slope.copy()
    ref: dict[int, float] = {}
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


def fit_stages(stages: Sequence[Stage], prior: Efficiency, fit: Sequence[str],
               max_window_s: float = FIT_WINDOW_S, seed: int = 0,
               iterations: int = FIT_ITERATIONS, behaviour: EngineBehaviour | None = None,
               kernel_path: str | None = None
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
    (len(fit) + 2) x iterations simulations of each stage."""
    from bstar.calibrate import _SCALE, _UPPER, ROBUST_SCALE, fit_efficiency

    steady = [s for s in stages if measured_state(s) == STEADY]
    fit = tuple(k for k in dict.fromkeys(fit) if k != "allreduce_latency_s"
                or any(s.num_gpus > 1 for s in steady))
    pairs = [(i, k, v) for i, s in enumerate(steady) for k, v in s.measured().items()
             if v > 0]
    if not fit or len(pairs) < len(fit) + 1:
        return None
    base = {i: _on_path(stage_deployment(s), kernel_path) for i, s in enumerate(steady)}
    behaviour = base[0].behaviour if behaviour is None else behaviour
    log_meas = np.log([v for _, _, v in pairs])

    def simulate_at(values: Mapping[str, float]) -> np.ndarray:
        """log of the predicted means, aligned with `pairs`."""
        e, b = _with_values(prior, behaviour, values)
        preds = {i: simulate_stage(s, deployment=base[i].with_eff(graph_settings(s, e))
                                   .with_behaviour(b),
                                   max_window_s=max_window_s, seed=seed).values()
                 for i, s in enumerate(steady)}
        y = np.array([preds[i][k] for i, k, _ in pairs])
        return np.log(np.where(np.isfinite(y) & (y > 0), y, 1e9))

    def cost(log_y: np.ndarray) -> float:  # least_squares' soft_l1 at fit_efficiency's scale
        z = ((log_y - log_meas) / ROBUST_SCALE) ** 2
        return float(np.sum(2.0 * (np.sqrt(1.0 + z) - 1.0)))

    x = {k: _value(prior, behaviour, k) for k in fit}
    y = simulate_at(x)
    c = cost(y)
    for _ in range(iterations):
        slopes = {}
        for k in fit:
            h = 0.1 * x[k] if x[k] > 0 else 0.1 * _SCALE[k]
            if x[k] + h > _UPPER.get(k, math.inf):
                h = -h
            slopes[k] = _monotone((simulate_at({**x, k: x[k] + h}) - y) / h, pairs)
        x0, y0 = dict(x), y

        def surrogate(v: Mapping[str, float], x0: dict[str, float] = x0,
                      y0: np.ndarray = y0,
                      slopes: dict[str, np.ndarray] = slopes) -> np.ndarray:
            return np.exp(y0 + sum(slopes[k] * (v[k] - x0[k]) for k in fit))

        e0, b0 = _with_values(prior, behaviour, x0)
        new = fit_efficiency(surrogate, np.exp(log_meas), e0, fit, behaviour=b0)
        step = {k: _value(new.eff, new.behaviour, k) - x0[k] for k in fit}
        for shrink in (1.0, 0.5, 0.25):
            trial = {k: x0[k] + shrink * step[k] for k in fit}
            y_trial = simulate_at(trial)
            if cost(y_trial) < c:
                x, y, c = trial, y_trial, cost(y_trial)
                break
        else:
            break  # no step lowers the simulated cost: done
        if all(abs(step[k]) <= 0.01 * max(abs(x0[k]), 1e-12) for k in fit):
            break
    return _with_values(prior, behaviour, x)


@dataclass
class StagesGroup:
    """One GPU x engine: per-stage scores and summaries, generic / profile / LOMO / LOGO."""

    gpu: str
    engine: str
    profile: str | None
    profile_basis: str | None
    fit: tuple[str, ...]
    models: list[str]
    # "generic", "profile", "lomo", "logo" -> one per stage
    scores: dict[str, list[StageScore]]
    summaries: dict[str, Summary]
    lomo_eff: dict[str, dict[str, float]]
    notes: list[str] = field(default_factory=list)
    logo_eff: dict[str, float] | None = None  # the terms fitted on the other GPUs' rows
    logo_gpus: list[str] | None = None  # those GPUs

    def to_dict(self) -> dict[str, Any]:
        stages = []
        by_way = {way: {id(sc.stage): sc for sc in ss} for way, ss in self.scores.items()}
        for sc in self.scores["generic"]:
            s = sc.stage
            stages.append({
                "stage": s.stage, "model": s.model, "num_gpus": s.num_gpus,
                "arrival": s.arrival, "rate_req_s": s.rate_req_s,
                "concurrency": s.concurrency, "duration_s": s.duration_s,
                "output_len": s.output_len,
                "measured": {**s.measured(), "ttft_p90_ms": s.ttft_p90_ms,
                             "e2e_p90_ms": s.e2e_p90_ms, "requests_failed": s.requests_failed,
                             "ttft_growth": measured_growth(s), "state": sc.measured_state,
                             "capacity_req_s": growing_stage_capacity_req_s(
                                 s.rate_req_s, measured_growth(s), sc.measured_state)},
                "latency_scored": sc.latency_scored,
                "predicted": {way: (m[id(s)].to_dict() if id(s) in m else None)
                              for way, m in by_way.items()}})
        return {"gpu": self.gpu, "engine": self.engine, "profile": self.profile,
                "profile_basis": self.profile_basis, "fit": list(self.fit),
                "models": self.models,
                "summary": {k: v.to_dict() for k, v in self.summaries.items()},
                "stages": stages, "lomo_eff": self.lomo_eff, "notes": self.notes,
                **({"logo_eff": self.logo_eff, "logo_gpus": self.logo_gpus}
                   if self.logo_gpus is not None else {})}


@dataclass
class StagesValidation:
    groups: list[StagesGroup]
    skipped: list[dict[str, str]]
    settings: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "stages", "settings": self.settings,
                "groups": [g.to_dict() for g in self.groups], "skipped": self.skipped}


def _usable(stages: Sequence[Stage], engine: str | None
            ) -> tuple[list[Stage], list[dict[str, str]]]:
    """The stages whose deployment builds, and one skip record per model, GPU and reason
    for the others."""
    usable, skipped, seen = [], [], set()
    for s in stages:
        try:
            stage_deployment(s, engine)
        except BstarError as e:
            if (s.model, s.gpu, str(e)) not in seen:
                skipped.append({"stage": s.stage, "model": s.model, "gpu": s.gpu,
                                "reason": str(e)})
                seen.add((s.model, s.gpu, str(e)))
            continue
        usable.append(s)
    return usable, skipped


def score_stages(stages: Sequence[Stage], fit: Sequence[str] = DEFAULT_FIT, *,
                 engine: str | None = None, lomo: bool = True, logo: bool = False,
                 max_window_s: float = MAX_WINDOW_S, max_requests: int = MAX_REQUESTS,
                 fit_window_s: float = FIT_WINDOW_S, seed: int = 0,
                 progress: Callable[[str], None] | None = None) -> StagesValidation:
    """Every stage scored per GPU x engine: generic, profile (`engine`, else each group's own)
    and, with `lomo` and two models or more, leave one model out (fitting `fit`); with
    `logo`, where the group's engine has stages on other GPUs, leave one GPU out: `fit`
    fitted from the same generic start on the engine's stages of the OTHER GPUs only, then
    predicting this group's (`_leave_gpu_out`)."""
    from bstar.engines import get_engine

    generic = (Efficiency(), EngineBehaviour())
    usable, skipped = _usable(stages, engine)
    by_group: dict[tuple[str, str], list[Stage]] = defaultdict(list)
    for s in usable:
        by_group[s.group].append(s)
    kw = {"max_window_s": max_window_s, "max_requests": max_requests, "seed": seed}
    groups = []
    for (gpu, eng), ss in by_group.items():
        notes: list[str] = []
        prof = get_engine(engine or eng)
        prof_terms = (prof.efficiency(), prof.behaviour())
        if progress:
            progress(f"{gpu} x {eng}: generic and {prof.name} profile, {len(ss)} stages")
        scores: dict[str, list[StageScore]] = {
            "generic": [score_stage(s, simulate_stage(s, generic[0], engine=engine,
                                                      behaviour=generic[1], **kw))
                        for s in ss]}
        if prof_terms == generic:  # a profile equal to the generic defaults: simulated once
            scores["profile"] = scores["generic"]
        else:  # each stage's deployment with the profile's terms for its kernel path
            scores["profile"] = [score_stage(s, simulate_stage(s, engine=engine, **kw))
                                 for s in ss]
        models = sorted({s.model for s in ss})
        lomo_eff: dict[str, dict[str, float]] = {}
        if lomo and len(models) > 1:
            held: list[StageScore] = []
            # The engine's structure (its scheduling lag, per-layer costs) is kept; the terms
            # fitted start from the generic defaults, so the held-out model's data are in none.
            start = _with_values(*prof_terms, {k: _value(*generic, k) for k in fit})
            for m in models:
                if progress:
                    progress(f"{gpu} x {eng}: fitting {', '.join(fit)} without {m}")
                train = [s for s in ss if s.model != m]
                fitted = fit_stages(train, start[0], fit, fit_window_s, seed,
                                    behaviour=start[1])
                if fitted is None:
                    notes.append(f"{m}: the other models' steady stages cannot determine "
                                 f"{', '.join(fit)}")
                    continue
                lomo_eff[m] = {k: _value(*fitted, k) for k in fit}
                held += [score_stage(s, simulate_stage(s, fitted[0], engine=engine,
                                                       behaviour=fitted[1], **kw))
                         for s in ss if s.model == m]
            order = {id(s): i for i, s in enumerate(ss)}
            scores["lomo"] = sorted(held, key=lambda sc: order[id(sc.stage)])
        elif lomo:
            notes.append("one model: no leave-one-model-out figure")
        logo_eff = logo_gpus = None
        if logo:
            others = [s for s in usable if s.engine == eng and s.gpu != gpu]
            logo_gpus = sorted({s.gpu for s in others}) or None
            if progress and others:
                progress(f"{gpu} x {eng}: fitting {', '.join(fit)} on {', '.join(logo_gpus)}")
            logo_eff = _leave_gpu_out(ss, others, prof_terms, fit, fit_window_s, engine,
                                      scores, notes, **kw)
        if prof.basis == "fitted":
            notes.append(f"the {prof.name} profile is fitted: where it was fitted to these "
                         "stages, its figure is in-sample")
        groups.append(StagesGroup(gpu, eng, prof.name, prof.basis, tuple(fit), models, scores,
                                  {k: summarize_scores(v) for k, v in scores.items()},
                                  lomo_eff, notes, logo_eff, logo_gpus))
    settings = {"max_window_s": max_window_s, "max_requests": max_requests,
                "warmup_fraction": WARMUP_FRACTION, "fit_window_s": fit_window_s,
                "fit_iterations": FIT_ITERATIONS,
                "seed": seed, "growth_limit": GROWTH_LIMIT, "failed_limit": FAILED_LIMIT}
    return StagesValidation(groups, skipped, settings)


def _leave_gpu_out(group: Sequence[Stage], others: Sequence[Stage],
                   prof_terms: tuple[Efficiency, EngineBehaviour], fit: Sequence[str],
                   fit_window_s: float, engine: str | None,
                   scores: dict[str, list[StageScore]], notes: list[str], **kw: Any
                   ) -> dict[str, float] | None:
    """The leave-one-GPU-out way of one GPU x engine: `fit` fitted on `others` (the same
    engine's stages on the other GPUs: none of `group`'s) from the generic start the
    leave-one-model-out fit takes, then each stage of `group` predicted with the result
    (into `scores["logo"]`; the fitted terms returned), or a note why not.
    The kernel terms (KERNEL_FIELDS) too start generic where no other GPU's stage takes a
    kernel path of `group`'s: the profile's were fitted on this GPU's own rows (its home
    path or its entry), and a GPU whose path has no entry is priced with generic ones.
    None where the other GPUs' stages cannot determine `fit`."""
    if not others:
        eng = group[0].engine
        notes.append(f"{eng} on one GPU: no leave-one-GPU-out figure")
        return None
    generic = (Efficiency(), EngineBehaviour())
    paths = {stage_deployment(s).kernel_path for s in group}
    reset = ([] if paths & {stage_deployment(s).kernel_path for s in others}
             else list(KERNEL_FIELDS))
    start = _with_values(*prof_terms, {k: _value(*generic, k)
                                       for k in dict.fromkeys([*fit, *reset])})
    path = GENERIC_PATH if reset else None  # no other GPU's path: each its generic ones
    fitted = fit_stages(others, start[0], fit, fit_window_s, kw.get("seed", 0),
                        behaviour=start[1], kernel_path=path)
    if fitted is None:
        notes.append(f"the other GPUs' ({', '.join(sorted({s.gpu for s in others}))}) "
                     f"steady stages cannot determine {', '.join(fit)}")
        return None
    scores["logo"] = [score_stage(s, simulate_stage(
        s, deployment=_on_path(stage_deployment(s, engine, fitted[0], fitted[1]), path), **kw))
        for s in group]
    return {k: _value(*fitted, k) for k in fit}
