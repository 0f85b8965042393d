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

Runs whose attention is data parallel (`dp_attention`) are skipped: bstar prices tensor
parallel attention only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bstar.stages_table import Stage
from bstar.validate_stages import DEFAULT_FIT, StagesValidation, score_stages

TOK_S = "output_tok_s_per_gpu"


def tok_s_error(stage: Stage, predicted_tok_s: float) -> float | None:
    """predicted / measured - 1 of the output tokens per second (per GPU or in all: the same
    ratio); None where the run has no measured figure."""
    if not stage.output_tok_s or predicted_tok_s <= 0:
        return None
    return predicted_tok_s / stage.output_tok_s - 1.0


@dataclass
class RunsValidation:
    """The load-stage validation of the runs, with output tok/s per GPU scored beside."""

    stages: StagesValidation
    runs: int

    def to_dict(self) -> dict[str, Any]:
        d = self.stages.to_dict()
        d["kind"] = "runs"
        d["settings"] = {k: v for k, v in d["settings"].items()
                         if k not in ("max_window_s", "warmup_fraction")}
        d["settings"].update({"warmup_fraction": 0.0, "runs": self.runs})
        for g, gd in zip(self.stages.groups, d["groups"], strict=True):
            _add_tok_s(g.scores, gd)
        return d


def _add_tok_s(scores: dict[str, Any], gd: dict[str, Any]) -> None:
    """Output tok/s per GPU into a group's dict: measured and predicted per run, the error,
    and each way's mean / median |error|."""
    errs: dict[str, list[float]] = {}
    for way, ss in scores.items():
        errs[way] = []
        by_id = {id(sc.stage): sc for sc in ss}
        for st, sd in zip(scores["generic"], gd["stages"], strict=True):
            s = st.stage
            sd["measured"][TOK_S] = (s.output_tok_s / s.num_gpus if s.output_tok_s
                                     else None)
            sc = by_id.get(id(s))
            if sc is None or sd["predicted"].get(way) is None:
                continue
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


def score_runs(runs: Sequence[Stage], fit: Sequence[str] = DEFAULT_FIT, *,
               engine: str | None = None, lomo: bool = True, logo: bool = True,
               seed: int = 0, progress: Callable[[str], None] | None = None
               ) -> RunsValidation:
    """Every run scored per GPU x engine: generic, profile (`engine`, else each run's own)
    and, with `lomo` and two models or more, leave one model out (fitting `fit`); with
    `logo` and the engine's runs on other GPUs, leave one GPU out (fitting `fit` on those)."""
    usable = [r for r in runs if not r.dp_attention]
    v = score_stages(usable, fit, engine=engine, lomo=lomo, logo=logo, seed=seed,
                     progress=progress)
    for r in runs:
        if r.dp_attention:
            v.skipped.append({"stage": r.stage, "model": r.model, "gpu": r.gpu,
                              "reason": "attention data parallel (dp_attention): bstar "
                                        "prices tensor-parallel attention only"})
    return RunsValidation(v, len(runs))
