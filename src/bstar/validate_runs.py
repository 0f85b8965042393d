"""`bstar validate RUNS.csv`: the simulator against closed-loop benchmark runs
(`bstar.runs_table`; data/inferencemax/runs.csv).

Each run is simulated like for like by the load-stage machinery (`bstar.validate_stages`):
its deployment (model, GPU, TP, dtype, the engine's profile), its scheduler (max_num_seqs,
max_num_batched_tokens), a closed loop of `concurrency` users that all start at t = 0 and
send `num_prompts` requests in all, prompt and output lengths drawn uniformly from the run's
ranges, every output generated in full (ignore_eos), and every request scored (the client
leaves none out as warm-up). Every step is priced by `bstar.step.price`.

Scored per run: the means of TPOT, TTFT and E2E (`bstar.validate_stages.score_stage`) and the
output tokens per second per GPU (the run's output tokens over its span, from the first
request's start to the last one's end, divided by its GPUs: the client's definition),
|predicted / measured - 1|. Per GPU x engine four ways, as for load stages
(`bstar.validate_stages.score_stages`): generic, profile, leave one model out, and leave one
GPU out (where the group's engine has runs on other GPUs of the table: the same terms as
leave one model out, fitted from the same generic start on that engine's runs of the OTHER
GPUs only, then predicting this GPU's runs: how the engine's terms transfer to a chip whose
runs they never saw).

Runs with expert parallel or attention data parallel (`expert_parallel`, `data_parallel`)
are scored like the others: their deployment carries the layout and `bstar.step` prices it
(the busiest EP rank, each DP rank's own KV, the MoE all-to-all).

Speculative runs (`spec_method`, e.g. InferenceX's MTP runs) are simulated with their draft
tokens (`bstar.sim.speculative`) at an acceptance rate that is an input, never a constant:
the one `acceptance` given (`bstar validate --acceptance-rate`), else the row's stated
`acceptance_rate`, else fitted leave one run out: the median of the acceptances the OTHER
speculative runs of the same engine and draft-token count imply. A run's implied acceptance
is the one at which its simulated TPOT equals the measured (bisection; the simulated TPOT
falls as acceptance rises); it is printed beside each run with the acceptance used and the
speedup bstar predicts (simulated TPOT without speculation / with it). A measured speedup
needs a run of the same configuration without speculation (`speculative_pairs`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from bstar.acceptance import implied_acceptance as implied_from_tpot
from bstar.acceptance import leave_one_out_acceptance
from bstar.stages_table import Stage
from bstar.validate_stages import DEFAULT_FIT, StagesValidation, score_stages
from bstar.validate_stages.simulate import simulate_stage

TOK_S = "output_tok_s_per_gpu"
# The median TTFT, scored beside the means where the table gives it: a closed loop's mean
# TTFT carries the engine's rare long first tokens (a TensorRT-LLM run's mean can be 5x its
# median) that no steady-state step price holds.
TTFT_MEDIAN = "ttft_median_ms"


def tok_s_error(stage: Stage, predicted_tok_s: float) -> float | None:
    """predicted / measured - 1 of the output tokens per second (per GPU or in all: the same
    ratio); None where the run has no measured figure."""
    if not stage.output_tok_s or predicted_tok_s <= 0:
        return None
    return predicted_tok_s / stage.output_tok_s - 1.0


def ttft_median_error(score: Any) -> float | None:
    """predicted / measured - 1 of a scored run's median TTFT (a `StageScore`); None where
    the run states no median or the simulation gives none."""
    measured, predicted = score.stage.ttft_p50_ms, score.prediction.ttft_p50_ms
    if not measured or predicted is None:
        return None
    return predicted / measured - 1.0


def ttft_median_abs_error(scores: Sequence[Any]) -> float | None:
    """The median over the runs that state a median TTFT of |`ttft_median_error`| (None: no
    run states one)."""
    errs = [abs(e) for s in scores if (e := ttft_median_error(s)) is not None]
    return float(np.median(errs)) if errs else None


@dataclass
class RunsValidation:
    """The load-stage validation of the runs, with output tok/s per GPU scored beside."""

    stages: StagesValidation
    runs: int
    speculative: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = self.stages.to_dict()
        d["kind"] = "runs"
        d["settings"] = {k: v for k, v in d["settings"].items()
                         if k not in ("max_window_s", "warmup_fraction")}
        d["settings"].update({"warmup_fraction": 0.0, "runs": self.runs})
        for g, gd in zip(self.stages.groups, d["groups"], strict=True):
            _add_tok_s(g.scores, gd)
        d["speculative"] = self.speculative
        return d


def _add_tok_s(scores: dict[str, Any], gd: dict[str, Any]) -> None:
    """Output tok/s per GPU into a group's dict: measured and predicted per run, the error,
    and each way's mean / median |error|."""
    errs: dict[str, list[float]] = {}
    med: dict[str, list[float]] = {}
    for way, ss in scores.items():
        errs[way] = []
        med[way] = []
        by_id = {id(sc.stage): sc for sc in ss}
        for st, sd in zip(scores["generic"], gd["stages"], strict=True):
            s = st.stage
            sd["measured"][TOK_S] = (s.output_tok_s / s.num_gpus if s.output_tok_s
                                     else None)
            sc = by_id.get(id(s))
            if sc is None or sd["predicted"].get(way) is None:
                continue
            if (e50 := ttft_median_error(sc)) is not None:
                sd["measured"][TTFT_MEDIAN] = s.ttft_p50_ms
                sd["predicted"][way][TTFT_MEDIAN] = sc.prediction.ttft_p50_ms
                sd["predicted"][way]["errors"][TTFT_MEDIAN] = e50
                med[way].append(abs(e50))
            tok = sc.prediction.output_tok_s / s.num_gpus
            e = tok_s_error(s, sc.prediction.output_tok_s)
            sd["predicted"][way][TOK_S] = tok
            if e is not None:
                sd["predicted"][way]["errors"][TOK_S] = e
                errs[way].append(abs(e))
    for way, v in errs.items():
        gd["summary"][way][TOK_S] = {
            "mean": float(np.mean(v)) if v else None,
            "median": float(np.median(v)) if v else None}
        m = med[way]
        if m:
            gd["summary"][way][TTFT_MEDIAN] = {"mean": float(np.mean(m)),
                                               "median": float(np.median(m))}


def score_runs(runs: Sequence[Stage], fit: Sequence[str] = DEFAULT_FIT, *,
               engine: str | None = None, lomo: bool = True, logo: bool = True,
               seed: int = 0, progress: Callable[[str], None] | None = None,
               acceptance: float | None = None) -> RunsValidation:
    """Every run scored per GPU x engine: generic, profile (`engine`, else each run's own)
    and, with `lomo` and two models or more, leave one model out (fitting `fit`); with
    `logo` and the engine's runs on other GPUs, leave one GPU out (fitting `fit` on those).
    Speculative runs at `acceptance` if given, else as `speculation` says."""
    spec, filled, skipped = speculation(runs, engine=engine, acceptance=acceptance,
                                        seed=seed, progress=progress)
    v = score_stages(filled, fit, engine=engine, lomo=lomo, logo=logo, seed=seed,
                     progress=progress)
    v.skipped.extend(skipped)
    return RunsValidation(v, len(runs), spec)


ACCEPTANCE_TOL = 0.005  # the implied acceptance's bracket width
TPOT_RTOL = 0.002  # ... or simulated TPOT within 0.2% of the measured


def _spec_tpot_ms(run: Stage, a: float, engine: str | None, seed: int) -> float:
    return simulate_stage(replace(run, acceptance_rate=a), engine=engine,
                          seed=seed).tpot_mean_ms


def implied_acceptance(run: Stage, engine: str | None = None, seed: int = 0
                       ) -> float:
    """The acceptance rate at which the simulated mean TPOT of the speculative `run` equals
    the measured one (`bstar.acceptance.implied_acceptance`: a handful of simulations), to
    ACCEPTANCE_TOL or TPOT_RTOL."""
    return implied_from_tpot(lambda a: _spec_tpot_ms(run, a, engine, seed),
                                 run.tpot_mean_ms, ACCEPTANCE_TOL, TPOT_RTOL)


def speculative_pairs(runs: Sequence[Stage]) -> dict[str, Stage]:
    """Each speculative run's measured twin without speculation: the same model, GPU,
    engine, layout, lengths and concurrency (run name -> twin)."""
    def key(r: Stage) -> tuple[Any, ...]:
        return (r.model, r.gpu, r.num_gpus, r.engine, r.expert_parallel, r.data_parallel,
                r.prompt_len, r.output_len, r.output_len_min, r.concurrency)
    plain = {key(r): r for r in runs if not r.spec_method}
    return {r.stage: plain[key(r)] for r in runs if r.spec_method and key(r) in plain}


def speculation(runs: Sequence[Stage], *, engine: str | None = None,
                acceptance: float | None = None, seed: int = 0,
                progress: Callable[[str], None] | None = None
                ) -> tuple[list[dict[str, Any]], list[Stage], list[dict[str, Any]]]:
    """The speculative runs' acceptance (module docstring): per run its implied acceptance,
    the one used and how it was had, the predicted speedup and, where a twin without
    speculation was measured, the measured one. Returns those rows, the runs with the
    acceptance filled in, and the runs that could not be given one (skipped)."""
    spec_runs = [r for r in runs if r.spec_method]
    if not spec_runs:
        return [], list(runs), []
    implied: dict[str, float] = {}
    for r in spec_runs:
        if progress is not None:
            progress(f"implied acceptance of {r.stage}")
        implied[r.stage] = implied_acceptance(r, engine, seed)
    groups = {r.stage: (r.engine, r.num_speculative_tokens) for r in spec_runs}
    twins = speculative_pairs(runs)
    rows, filled, skipped = [], [], []
    for r in runs:
        if not r.spec_method:
            filled.append(r)
            continue
        if acceptance is not None:
            a, how = acceptance, "stated (--acceptance-rate)"
        elif r.acceptance_rate is not None:
            a, how = r.acceptance_rate, "stated (acceptance_rate column)"
        else:
            fitted, n = leave_one_out_acceptance(r.stage, implied, groups)
            if fitted is None:
                skipped.append({"stage": r.stage, "model": r.model, "gpu": r.gpu,
                                "reason": "speculative run with no stated acceptance and "
                                          "no other run of its engine and draft tokens "
                                          "to fit one on"})
                continue
            a = fitted
            how = f"fitted: median implied by {n} other run(s), leave one out"
        run = replace(r, acceptance_rate=a)
        filled.append(run)
        with_spec = simulate_stage(run, engine=engine, seed=seed).tpot_mean_ms
        without = simulate_stage(replace(run, spec_method="", num_speculative_tokens=0),
                                 engine=engine, seed=seed).tpot_mean_ms
        twin = twins.get(r.stage)
        rows.append({
            "stage": r.stage, "engine": r.engine, "method": r.spec_method,
            "num_speculative_tokens": r.num_speculative_tokens,
            "implied_acceptance": implied[r.stage], "acceptance": a, "acceptance_basis": how,
            "measured_tpot_ms": r.tpot_mean_ms, "predicted_tpot_ms": with_spec,
            "predicted_plain_tpot_ms": without,
            "predicted_speedup": without / with_spec if with_spec > 0 else None,
            "measured_speedup": twin.tpot_mean_ms / r.tpot_mean_ms if twin else None,
            "twin": twin.stage if twin else None})
    return rows, filled, skipped
