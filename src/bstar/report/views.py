"""What the pictures need, as plain JSON-able dicts built from the result objects.

The plots and the HTML report draw from these dicts only, never from live objects, so that a
plan, a fit, a sweep run or a simulation (each a `.to_dict()` or a contract JSON) plugs in
the same way. A plan's `to_dict()` lacks a few things a picture wants (the roofs, a dense
curve to draw smoothly, achieved FLOP/s); `plan_view` adds them from the cost model.

Views decide nothing: the knees, SLA batches and recommendations are the library's
(`plan.ContextPlan`, `recommend.Recommendation.knee`, `fit.FitResult`), and so are the
sweep's predictions and its replay in the simulator (`loadgen.prediction`); a view only
reshapes them and puts the page's words (`prediction_label`) on them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from bstar import roofline as rl
from bstar.deployment import Deployment
from bstar.errors import BstarError
from bstar.loadgen.prediction import AGREE_TOL as AGREE_TOL  # the page's words quote it

if TYPE_CHECKING:
    from bstar.options import DeploymentOptions

# Enough samples that a log2 axis shows a smooth curve; the plan's own points are markers.
DENSE_SAMPLES = 240


def plan_view(plan: Any) -> dict[str, Any]:
    """`plan.to_dict()` plus, per context, a dense curve and roofs, and the batches the plan
    marks: its SLA batch (`ContextPlan.sla_batch`, for the bound it was made with) and its
    knee (`ContextPlan.knee`)."""
    d = plan.deployment
    out = plan.to_dict()
    peak_flops = d.gpu.peak_flops(d.weight.compute)
    bw = d.gpu.hbm_bandwidth_bytes_s
    out["roof"] = {
        "peak_flops_per_gpu": peak_flops, "hbm_bandwidth_bytes_s_per_gpu": bw,
        "compute_eff": d.eff.compute, "bandwidth_eff": d.eff.bandwidth,
        "ridge_flops_per_byte": peak_flops / bw,
        "compute": d.weight.compute,
    }
    out["gpu_name"] = d.gpu.name
    out["gpu_source"] = d.gpu.source
    out["gpu_provenance"] = d.gpu.provenance
    for cp, cd in zip(plan.contexts, out["contexts"], strict=True):
        ctx = cp.context_tokens
        top = int(max(int(cp.curve.batch.max()), cp.b_mem * 2, 2))
        grid = np.unique(np.geomspace(1, top, DENSE_SAMPLES).round().astype(np.int64))
        dense = rl.curve(d, grid, ctx)
        cd["dense"] = _curve_lists(dense)
        for p, f in zip(cd["curve"], _achieved_flops(cp.curve), strict=True):
            p["achieved_flops_s_per_gpu"] = f
        one = rl.decode_step(d, [1], ctx)
        flops_per_token_per_gpu = float(one.flops[0])
        # Limits of the memory-bound model as B grows without bound: the KV of one sequence
        # is read per token (seed 000's floor), and the compute roof of the GPUs.
        cd["throughput_ceiling_kv_tok_s"] = 1.0 / cp.amortized_floor_s
        cd["compute_roof_tok_s"] = peak_flops * d.eff.compute / flops_per_token_per_gpu
        cd["ai_limit_flops_per_byte"] = float(
            flops_per_token_per_gpu / (float(one.kv_bytes_read[0]) or 1.0))
        # The knee the recommendation was chosen from, so the picture marks the plan's
        # knee, never one of its own (`sla_batch` is the plan's too).
        cd["knee"] = cd["recommendation"]["knee"]
    return out


def _curve_lists(c: rl.Curve) -> dict[str, list[float]]:
    return {"batch": [int(b) for b in c.batch],
            "tpot_ms": [float(x) * 1e3 for x in c.tpot_s],
            "amortized_ms_per_token": [float(x) * 1e3 for x in c.amortized_s_per_token],
            "throughput_tok_s": [float(x) for x in c.throughput_tok_s],
            "arithmetic_intensity": [float(x) for x in c.arithmetic_intensity],
            "achieved_flops_s_per_gpu": _achieved_flops(c),
            "regime": list(c.regime)}


def _achieved_flops(c: rl.Curve) -> list[float]:
    # FLOPs of the running batch over its step time, per GPU (what a profiler would see).
    return [float(x) for x in c.cost.flops / c.step_s]


def fit_view(result: Any) -> dict[str, Any]:
    """`FitResult.to_dict()` plus the fitted curve sampled densely (`FitResult.curve`), from
    batch 1 to past the last prediction."""
    return {**result.to_dict(), "dense": result.curve(DENSE_SAMPLES)}


def sweep_deployment(options: dict[str, Any]) -> Deployment:
    """The cost model's deployment a sweep ran with (its stored model, GPU and
    `DeploymentOptions`; runs stored before those keep their flags as `deployment_args`)."""
    from bstar.options import DeploymentOptions

    return DeploymentOptions.from_sweep_options(options).build()


# ---- predictions as the page names them ------------------------------------------------------
BASIS_WORDS = {"incl_prefill": "output tok/s incl. prefill",
               "decode_only": "decode only, B / TPOT"}


def prediction_label(calibrated: bool, basis: str) -> str:
    """The words every predicted line, column and point carries: calibrated or not, and the
    throughput's basis (decode-only or with each request's prefill)."""
    return (f"{'calibrated' if calibrated else 'uncalibrated'} cost model "
            f"({BASIS_WORDS.get(basis, basis)})")


def _labelled(series: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The library's predicted curves, or level predictions, each with its label."""
    return [{**s, "label": prediction_label(s["calibrated"], s["throughput_basis"])}
            for s in series]


def _level_rows(sweep: dict[str, Any], series: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each drawable level beside every predicted series (`prediction.level_predictions`),
    each prediction labelled."""
    from bstar.loadgen.prediction import level_predictions

    levels = [(level_x(lv), float(lv["throughput_tok_s"]))
              for lv in drawable_levels(sweep["levels"])]
    return [{**row, "predicted": _labelled(row["predicted"])}
            for row in level_predictions(levels, series)]


def sweep_view(sweep: dict[str, Any], calibrated: Deployment | None = None,
               calibration: dict[str, Any] | None = None) -> dict[str, Any]:
    """The sweep JSON plus, when the run named a cost model (--model and --gpu), its
    prediction on a dense grid of batches between the levels, in the quantities the levels
    measured (`prediction.predicted_curves`). With a `calibrated` deployment (`calibration`
    says on what), that prediction is the calibrated one and the stored deployment's
    follows as `uncalibrated_curve`; `level_predictions` puts each level beside them."""
    from bstar.loadgen.prediction import predicted_curves, prediction_grid, sweep_shape

    out = dict(sweep)
    shape = sweep_shape(sweep)
    if shape is None:
        return out
    batches = [level_x(lv) for lv in drawable_levels(sweep["levels"])]
    preds = [lv["predicted"]["batch"] for lv in sweep["levels"]
             if (lv.get("predicted") or {}).get("batch")]
    grid = prediction_grid(min(preds), max(preds), batches)
    series = _labelled(predicted_curves(sweep, shape, grid, calibrated, calibration))
    out["predicted_curve"] = series[0]
    if len(series) > 1:
        out["uncalibrated_curve"] = series[1]
    out["level_predictions"] = _level_rows(sweep, series)
    return out


def measured_series(sweep: dict[str, Any]) -> dict[str, Any]:
    """A sweep's completed levels as aligned lists (median and p99 per-request TPOT)."""
    lv = drawable_levels(sweep["levels"])
    return {"batch": [level_x(x) for x in lv],
            "tpot_ms": [(x.get("tpot_ms") or {}).get("p50") for x in lv],
            "tpot_p99_ms": [(x.get("tpot_ms") or {}).get("p99") for x in lv],
            "throughput_tok_s": [x["throughput_tok_s"] for x in lv]}


def simulated_series(rows: list[dict[str, Any]], calibrated: bool) -> dict[str, Any]:
    """The simulator's replay of a sweep's levels (`prediction.replay_sweep`) as aligned
    lists; x is each level's running-batch bound, as on the sweep's axis."""
    return {"batch": [r["batch"] for r in rows],
            "tpot_ms": [r["tpot_ms"]["p50"] for r in rows],
            "tpot_p99_ms": [r["tpot_ms"]["p99"] for r in rows],
            "throughput_tok_s": [r["throughput_tok_s"] for r in rows],
            "preemptions": [r["preemptions"] for r in rows], "calibrated": calibrated}


def signature_view(measured: dict[str, Any] | None = None, fitted: dict[str, Any] | None = None,
                   predicted: tuple[dict[str, Any], int] | None = None,
                   simulated: dict[str, Any] | None = None, title: str = "",
                   series: list[dict[str, Any]] | None = None,
                   calibrated: bool = False) -> dict[str, Any]:
    """Predicted, fitted, measured and simulated curves for one picture. `predicted` is a
    plan view and the index of its context whose regimes, B*, B_mem and knee are drawn;
    `series` the predicted lines to draw (`loadgen.prediction.predicted_curves`, labelled:
    the first is the prediction, a second the uncalibrated one beside it), by default the
    plan's own curve (decode-only, calibrated or not as `calibrated` says)."""
    out: dict[str, Any] = {"title": title, "measured": measured, "simulated": simulated,
                           "fitted": None, "predicted": None, "predicted_uncalibrated": None,
                           "plan": None}
    if fitted is not None:
        out["fitted"] = {"batch": fitted["dense"]["batch"],
                         "tpot_ms": fitted["dense"]["tpot_ms"],
                         "throughput_tok_s": fitted["dense"]["throughput_tok_s"],
                         "last_measured_batch": fitted["dense"]["last_measured_batch"],
                         "knee_batch": fitted.get("knee_batch"),
                         "knee_rule": fitted.get("knee_rule"),
                         "throughput_kind": fitted.get("throughput_kind"),
                         "predictions": fitted.get("predictions", [])}
    if predicted is not None:
        p, i = predicted
        c = p["contexts"][i]
        out["plan"] = {"model": p["model"], "gpu": p.get("gpu_name") or p["gpu"],
                       "num_gpus": p["num_gpus"], **{k: c[k] for k in (
                           "context_tokens", "b_star", "b_star_weights_read", "b_mem",
                           "compute_crossover_batch", "knee", "recommendation")}}
        if series is None:
            out["predicted"] = {"batch": c["dense"]["batch"], "tpot_ms": c["dense"]["tpot_ms"],
                                "throughput_tok_s": c["dense"]["throughput_tok_s"],
                                "calibrated": calibrated, "throughput_basis": "decode_only",
                                "label": prediction_label(calibrated, "decode_only")}
    if series:
        out["predicted"] = series[0]
        out["predicted_uncalibrated"] = series[1] if len(series) > 1 else None
    return out


def run_signature(sweep: dict[str, Any], fit: Any | None, title: str = "",
                  deployment: Deployment | None = None,
                  calibration: dict[str, Any] | None = None) -> dict[str, Any]:
    """The signature picture of a sweep: its measured levels, the fit of them (a FitResult,
    or None), and, when the sweep named a cost model, the plan at the levels' context, the
    prediction in the quantities the levels measured and the simulator replaying the
    sweep's levels, with `deployment` (calibrated on the sweep itself, `calibration` says on
    what; then the stored, uncalibrated prediction is drawn beside it) or the one the sweep
    stored. The measured knee is the one the sweep's recommendation marks."""
    from bstar.loadgen import prediction as pr
    from bstar.plan import make_plan

    meas = measured_series(sweep)
    fitted = fit_view(fit) if fit is not None else None
    shape = pr.sweep_shape(sweep)
    predicted, simulated, series = None, None, None
    if shape is not None:
        d = deployment or pr.stored_deployment(sweep)
        extra = [p["batch"] for p in (fitted or {}).get("predictions", [])]
        batches = sorted({*meas["batch"], *extra})
        predicted = (plan_view(make_plan(d, [shape.context_tokens], batches)), 0)
        grid = pr.prediction_grid(1, max(batches), batches, DENSE_SAMPLES // 2)
        series = _labelled(pr.predicted_curves(sweep, shape, grid, deployment, calibration))
        simulated = simulated_series(
            pr.replay_sweep(d, sweep, drawable_levels(sweep["levels"]), shape),
            series[0]["calibrated"])
    v = signature_view(meas, fitted, predicted, simulated, title, series)
    if series:
        v["level_predictions"] = _level_rows(sweep, series)
    knee = (sweep.get("recommendation") or {}).get("knee") or {}
    v["measured_knee"] = knee.get("batch")
    return v


def demo_views(sweep: dict[str, Any], fit: Any, calibrated: Deployment,
               calibration: dict[str, Any], title: str) -> dict[str, Any]:
    """What `bstar demo`'s report draws: the signature picture, the sweep and the fit, each
    prediction the calibrated one (`calibration` says on what) with the uncalibrated one
    beside it, in the quantities the levels measured."""
    return {"signature": run_signature(sweep, fit, title, calibrated, calibration),
            "sweep": sweep_view(sweep, calibrated, calibration), "fit": fit_view(fit)}


def fit_signature(result: Any, options: DeploymentOptions | None,
                  context_tokens: int | None = None) -> dict[str, Any] | None:
    """For `bstar report fit` with --model and --gpu: the fit's points and curve beside the
    cost model's prediction for that deployment at `context_tokens` (default 512, as
    bstar fit)."""
    if options is None or not (options.model and options.gpu):
        return None
    from bstar.plan import make_plan

    ctx = context_tokens or 512
    d = options.build()
    fitted = fit_view(result)
    pts = fitted["points"]
    meas = {"batch": [p["batch"] for p in pts], "tpot_ms": [p["tpot_ms"] for p in pts],
            "throughput_tok_s": [p["throughput_tok_s"] for p in pts]}
    batches = sorted({*meas["batch"], *(p["batch"] for p in fitted["predictions"])})
    pv = plan_view(make_plan(d, [ctx], batches))
    return signature_view(meas, fitted, (pv, 0), None,
                          f"The fit beside the cost model: {pv['model']} on "
                          f"{pv['gpu_name']}, context {ctx:,}",
                          calibrated=bool(options.profile))


# ---- a sweep's levels as drawn ---------------------------------------------------------------
def level_x(level: dict[str, Any]) -> int:
    """The batch a level ran at (bstar.fit.points.level_batch)."""
    from bstar.fit.points import level_batch

    if (b := level_batch(level)) is not None:
        return int(b)
    raise BstarError("a sweep level has neither 'concurrency' nor 'max_num_seqs'")


def drawable_levels(levels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Levels with a batch and a measured throughput (a failed or rate-only level has no
    place on a batch axis), in batch order."""
    ok = [lv for lv in levels if (lv.get("max_num_seqs") is not None
                                  or lv.get("concurrency") is not None)
          and lv.get("throughput_tok_s")]
    return sorted(ok, key=level_x)
