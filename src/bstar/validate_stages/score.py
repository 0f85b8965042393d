"""Scoring simulated stages against the measured ones: per stage (`score_stage`), per way of
predicting (`summarize_scores`), per GPU x engine three ways (`score_stages`: generic,
profile, leave one model out through `fit_stages` and, with several GPUs, leave one GPU
out through `fit_stages_by_path`: bstar.validate_stages.fitting)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from bstar.deployment import (
    KERNEL_FIELDS,
    Deployment,
    Efficiency,
    EngineBehaviour,
)
from bstar.errors import BstarError
from bstar.stages_table import Stage
from bstar.validate_stages.fitting import (
    FIT_ITERATIONS,
    FIT_WINDOW_S,
    PathTerms,
    _value,
    _with_values,
    fit_stages,
    fit_stages_by_path,
    priced_by_path,
)
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
# What a stage's leave-one-model-out fit calibrates (and what bench/accuracy.py
# --fit-profiles fits the vllm profile's terms to): the KV stream of the engine's attention,
# its CPU time per step and its fixed work per request. The all-reduce latency and the time
# per running sequence stay stated guesses: one TP-1 and one TP-2 model cannot tell a
# per-step cost from a per-all-reduce one, nor the per-sequence cost from the KV stream
# (fitted with them, `--fit` drives terms to their bounds: docs/cost-model.md).
DEFAULT_FIT = ("kv_bandwidth", "overhead_s", "request_overhead_s")
# Fitted beside it by the leave-one-GPU-out fit, one value per kernel path of the other
# GPUs' stages (`_leave_gpu_out`).
LOGO_KERNEL_FIT = ("moe_compute", "moe_layer_s")


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
             behaviour: EngineBehaviour | None = None, kernel_path: str | None = None,
             path_terms: PathTerms | None = None) -> tuple[list[StageScore], Summary]:
    """Every stage simulated at `eff` and `behaviour` (None: the engine profile's, `engine`
    or the stage's) and scored: the call for a loop over candidate efficiencies. With
    `kernel_path`, `eff`'s kernel terms belong to that path (as in `fit_stages`); with
    `path_terms` (a `fit_stages_by_path` result's), each stage prices its own path's
    (`priced_by_path`)."""
    def deployment(s: Stage) -> Deployment | None:
        if path_terms is not None:
            d = stage_deployment(s, engine, eff, behaviour)
            return priced_by_path(d, graph_settings(s, eff if eff is not None else d.eff),
                                  path_terms)
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
    The fused-MoE terms are fitted too, per kernel path of `others` (`fit_stages_by_path`,
    from each path's generic values: the profile's were fitted on this GPU's rows too), as
    the profile holds them: a stage of `group` on a path some other GPU's stages take
    prices that path's, one on a path no other GPU takes its path's generic ones, as a GPU
    whose path has no entry is priced. Fitted as shared terms instead, the other paths'
    fused-MoE time would go into the shared ones (docs/transfer.md).
    None where the other GPUs' stages cannot determine `fit`."""
    if not others:
        eng = group[0].engine
        notes.append(f"{eng} on one GPU: no leave-one-GPU-out figure")
        return None
    generic = (Efficiency(), EngineBehaviour())
    terms = (*fit, *LOGO_KERNEL_FIT)
    start = _with_values(*prof_terms, {k: _value(*generic, k)
                                       for k in dict.fromkeys([*fit, *KERNEL_FIELDS])})
    fitted = fit_stages_by_path(others, start[0], terms, fit_window_s, kw.get("seed", 0),
                                behaviour=start[1])
    if fitted is None:
        notes.append(f"the other GPUs' ({', '.join(sorted({s.gpu for s in others}))}) "
                     f"steady stages cannot determine {', '.join(fit)}")
        return None
    scores["logo"] = [score_stage(s, simulate_stage(
        s, deployment=priced_by_path(stage_deployment(s, engine, fitted.eff, fitted.behaviour),
                                     graph_settings(s, fitted.eff), fitted.path_terms), **kw))
        for s in group]
    return fitted.values(terms)
