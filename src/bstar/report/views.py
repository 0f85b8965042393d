"""What the pictures need, as plain JSON-able dicts built from the result objects.

The plots and the HTML report draw from these dicts only, never from live objects, so that a
plan, a fit, a sweep run or a simulation (each a `.to_dict()` or a contract JSON) plugs in
the same way. A plan's `to_dict()` lacks a few things a picture wants (the roofs, a dense
curve to draw smoothly, achieved FLOP/s); `plan_view` adds them from the cost model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from bstar import roofline as rl
from bstar.errors import BstarError

if TYPE_CHECKING:
    from bstar.deployment import DeploymentOptions

# Enough samples that a log2 axis shows a smooth curve; the plan's own points are markers.
DENSE_SAMPLES = 240


def plan_view(plan: Any, max_tpot_ms: float | None = None) -> dict[str, Any]:
    """`plan.to_dict()` plus, per context, a dense curve, roofs and marked batches."""
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
    out["max_tpot_ms"] = max_tpot_ms
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
        cd["throughput_ceiling_kv_tok_s"] = 1.0 / cp.tpot_floor_s
        cd["compute_roof_tok_s"] = peak_flops * d.eff.compute / flops_per_token_per_gpu
        cd["ai_limit_flops_per_byte"] = float(
            flops_per_token_per_gpu / (float(one.kv_bytes_read[0]) or 1.0))
        cd["sla_batch"] = sla_batch(d, ctx, cp.b_mem, max_tpot_ms)
        # The knee the recommendation was chosen from (seed 004's doubling rule on the
        # plan's fine grid), so the picture marks the plan's knee, never one of its own.
        cd["knee"] = (cd["recommendation"].get("knees") or {}).get("doubling")
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


def sla_batch(d: rl.Deployment, context_tokens: int, b_mem: int,
              max_tpot_ms: float | None) -> int | None:
    """Largest running batch whose predicted per-request TPOT meets the SLA, by the knee
    module's SLA rule over every batch up to B_mem (None: no SLA given, 0: even batch 1
    misses it)."""
    if max_tpot_ms is None:
        return None
    from bstar import knee

    grid = np.arange(1, max(b_mem, 1) + 1)
    k = knee.sla_knee(grid, rl.curve(d, grid, context_tokens).tpot_s * 1e3, max_tpot_ms)
    return k.batch or 0


def fit_view(result: Any, max_tpot_ms: float | None = None) -> dict[str, Any]:
    """`FitResult.to_dict()` plus the fitted curve sampled densely (through the result's own
    `step_ms`), from batch 1 to past the last prediction."""
    out = result.to_dict()
    batches = [p["batch"] for p in out["points"]] + [p["batch"] for p in out["predictions"]]
    top = max(max(batches) * 1.25, 2.0)
    grid = np.unique(np.geomspace(1, top, DENSE_SAMPLES))
    step_ms = np.asarray(result.step_ms(grid), dtype=np.float64)
    out["dense"] = {"batch": [float(x) for x in grid], "tpot_ms": [float(x) for x in step_ms],
                    "throughput_tok_s": [float(x) for x in result.throughput_at(grid, step_ms)],
                    "last_measured_batch": float(max(p["batch"] for p in out["points"]))}
    out["max_tpot_ms"] = max_tpot_ms if max_tpot_ms is not None else getattr(
        result, "max_tpot_ms", None)
    return out


def sweep_deployment(options: dict[str, Any]) -> rl.Deployment:
    """The cost model's deployment a sweep ran with (its stored model, GPU and
    `DeploymentOptions`; runs stored before those keep their flags as `deployment_args`)."""
    from bstar.deployment import DeploymentOptions

    return DeploymentOptions.from_sweep_options(options).build()


# ---- predictions as the page names them ------------------------------------------------------
# A calibrated prediction that lands within this of the measured level it sits beside agrees
# with it; one that misses says by how much, beside the level.
AGREE_TOL = 0.15
BASIS_WORDS = {"incl_prefill": "output tok/s incl. prefill",
               "decode_only": "decode only, B / TPOT"}


def prediction_label(calibrated: bool, basis: str) -> str:
    """The words every predicted line, column and point carries: calibrated or not, and the
    throughput's basis (decode-only or with each request's prefill)."""
    return (f"{'calibrated' if calibrated else 'uncalibrated'} cost model "
            f"({BASIS_WORDS.get(basis, basis)})")


def _sweep_lengths(sweep: dict[str, Any]) -> tuple[int, tuple[int, int]] | None:
    """The context the sweep's levels were predicted at and the (input, output) lengths of
    a prefill-aware prediction ((0, 0): runs stored before it stay decode-only, as their
    levels); None when the sweep named no cost model."""
    opts = sweep.get("options") or {}
    preds = [lv["predicted"] for lv in sweep.get("levels", []) if lv.get("predicted")]
    if not (opts.get("model") and opts.get("gpu") and preds
            and preds[0].get("context_tokens")):
        return None
    lengths = ((int(opts.get("input_len") or 0), int(opts.get("output_len") or 0))
               if preds[0].get("throughput_basis") == "incl_prefill" else (0, 0))
    return int(preds[0]["context_tokens"]), lengths


def _stored_is_calibrated(sweep: dict[str, Any]) -> bool:
    """Whether the deployment a sweep stored was already calibrated (a --profile)."""
    from bstar.deployment import DeploymentOptions

    return bool(DeploymentOptions.from_sweep_options(sweep.get("options") or {}).profile)


def predicted_series(d: rl.Deployment, sweep: dict[str, Any], batches: list[int],
                     calibrated: bool, calibration: dict[str, Any] | None = None
                     ) -> dict[str, Any]:
    """The cost model at `batches`, each figure the quantity the sweep's levels measure
    (the sweep's own `predict_level`), labelled calibrated or not and with its basis."""
    from bstar.loadgen.runner import predict_level

    at = _sweep_lengths(sweep)
    if at is None:
        raise BstarError("the sweep named no cost model (--model and --gpu)")
    ctx, lengths = at
    rows = [predict_level(d, int(b), ctx, *lengths) for b in batches]
    basis = rows[0]["throughput_basis"]
    return {"batch": [r["batch"] for r in rows], "tpot_ms": [r["tpot_ms"] for r in rows],
            "throughput_tok_s": [r["throughput_tok_s"] for r in rows],
            "b_mem": rows[0]["b_mem"], "b_star": rows[0]["b_star"],
            "throughput_basis": basis, "calibrated": calibrated,
            "label": prediction_label(calibrated, basis), "calibration": calibration,
            "context_tokens": ctx, "model": d.model.name, "gpu": d.gpu.name}


def prediction_grid(lo: float, hi: float, levels: list[int], n: int = 120) -> list[int]:
    """Integer batches from lo to hi for a smooth line, the measured levels among them."""
    grid = np.geomspace(max(lo, 1), max(hi, lo, 1), n).round().astype(np.int64)
    return sorted({*(int(b) for b in grid), *levels})


def level_predictions(sweep: dict[str, Any], series: list[dict[str, Any]]
                      ) -> list[dict[str, Any]]:
    """Each drawable level beside every predicted series: the prediction at its batch, its
    error against the measured throughput, and whether it agrees (within AGREE_TOL)."""
    out = []
    for lv in drawable_levels(sweep["levels"]):
        b, meas = level_x(lv), float(lv["throughput_tok_s"])
        preds = []
        for s in series:
            i = s["batch"].index(b)
            tput = float(s["throughput_tok_s"][i])
            err = tput / meas - 1.0
            preds.append({"label": s["label"], "calibrated": s["calibrated"],
                          "throughput_basis": s["throughput_basis"],
                          "tpot_ms": float(s["tpot_ms"][i]), "throughput_tok_s": tput,
                          "error": err, "agrees": abs(err) <= AGREE_TOL})
        out.append({"batch": b, "measured_tok_s": meas, "predicted": preds})
    return out


def sweep_view(sweep: dict[str, Any], calibrated: rl.Deployment | None = None,
               calibration: dict[str, Any] | None = None) -> dict[str, Any]:
    """The sweep JSON plus, when the run named a cost model (--model and --gpu), its
    prediction on a dense grid of batches between the levels, in the quantities the levels
    measured. With a `calibrated` deployment (`calibration` says on what), that prediction
    is the calibrated one and the stored deployment's follows as `uncalibrated_curve`;
    `level_predictions` puts each level beside them."""
    out = dict(sweep)
    if _sweep_lengths(sweep) is None:
        return out
    d = sweep_deployment(sweep.get("options") or {})
    batches = [level_x(lv) for lv in drawable_levels(sweep["levels"])]
    preds = [lv["predicted"]["batch"] for lv in sweep["levels"]
             if (lv.get("predicted") or {}).get("batch")]
    grid = prediction_grid(min(preds), max(preds), batches)
    if calibrated is not None:
        series = [predicted_series(calibrated, sweep, grid, True, calibration),
                  predicted_series(d, sweep, grid, False)]
    else:
        series = [predicted_series(d, sweep, grid, _stored_is_calibrated(sweep))]
    out["predicted_curve"] = series[0]
    if len(series) > 1:
        out["uncalibrated_curve"] = series[1]
    out["level_predictions"] = level_predictions(sweep, series)
    return out


def measured_series(sweep: dict[str, Any]) -> dict[str, Any]:
    """A sweep's completed levels as aligned lists (median and p99 per-request TPOT)."""
    lv = drawable_levels(sweep["levels"])
    return {"batch": [level_x(x) for x in lv],
            "tpot_ms": [(x.get("tpot_ms") or {}).get("p50") for x in lv],
            "tpot_p99_ms": [(x.get("tpot_ms") or {}).get("p99") for x in lv],
            "throughput_tok_s": [x["throughput_tok_s"] for x in lv]}


def simulated_series(d: rl.Deployment, levels: list[tuple[int, int]], input_tokens: int,
                     output_tokens: int, num_requests: int, seed: int = 0) -> dict[str, Any]:
    """The simulator at each sweep level, given as (closed-loop users, server batch cap),
    with the sweep's request shape: what the sweep would have measured if the cost model
    were right, with scheduling and queueing included. x is the running-batch bound,
    min(users, cap), as on the sweep's axis."""
    from bstar.sim import ClosedLoop, SchedulerConfig, SimConfig, parse_lengths, simulate_levels

    rows = []
    for users, cap in levels:
        rows.append(simulate_levels(d, [cap], ClosedLoop(users),
                                    parse_lengths(str(input_tokens)),
                                    parse_lengths(str(output_tokens)), num_requests, seed,
                                    SimConfig(SchedulerConfig(cap)))[0].to_dict())
    return {"batch": [min(u, c) for u, c in levels],
            "tpot_ms": [r["tpot_ms"]["p50"] for r in rows],
            "tpot_p99_ms": [r["tpot_ms"]["p99"] for r in rows],
            "throughput_tok_s": [r["throughput_tok_s"] for r in rows],
            "preemptions": [r["preemptions"] for r in rows]}


def signature_view(measured: dict[str, Any] | None = None, fitted: dict[str, Any] | None = None,
                   predicted: tuple[dict[str, Any], int] | None = None,
                   simulated: dict[str, Any] | None = None, title: str = "",
                   series: list[dict[str, Any]] | None = None,
                   calibrated: bool = False) -> dict[str, Any]:
    """Predicted, fitted, measured and simulated curves for one picture. `predicted` is a
    plan view and the index of its context whose regimes, B*, B_mem and knee are drawn;
    `series` the predicted lines to draw (`predicted_series`: the first is the prediction,
    a second the uncalibrated one beside it), by default the plan's own curve (decode-only,
    calibrated or not as `calibrated` says)."""
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
                  deployment: rl.Deployment | None = None,
                  calibration: dict[str, Any] | None = None) -> dict[str, Any]:
    """The signature picture of a sweep: its measured levels, the fit of them (a FitResult,
    or None), and, when the sweep named a cost model, the plan at the levels' context, the
    prediction in the quantities the levels measured and the simulator replaying the
    sweep's levels, with `deployment` (calibrated on the sweep itself when `calibration`
    says on what; then the stored, uncalibrated prediction is drawn beside it) or the one
    the sweep stored."""
    from bstar.plan import make_plan

    meas = measured_series(sweep)
    fitted = fit_view(fit) if fit is not None else None
    opts = sweep.get("options") or {}
    at = _sweep_lengths(sweep)
    predicted, simulated, series = None, None, None
    if at is not None:
        stored = sweep_deployment(opts)
        d = deployment or stored
        ctx = at[0]
        extra = [p["batch"] for p in (fitted or {}).get("predictions", [])]
        batches = sorted({*meas["batch"], *extra})
        pv = plan_view(make_plan(d, [ctx], batches))
        predicted = (pv, 0)
        grid = prediction_grid(1, max(batches), batches, DENSE_SAMPLES // 2)
        if calibration is not None and deployment is not None:
            series = [predicted_series(d, sweep, grid, True, calibration),
                      predicted_series(stored, sweep, grid, False)]
        else:
            series = [predicted_series(d, sweep, grid, _stored_is_calibrated(sweep))]
        levels = drawable_levels(sweep["levels"])
        conc = [lv.get("concurrency") for lv in levels]
        top = max([c for c in conc if c] or [1])
        pairs = [(lv.get("concurrency") or lv["max_num_seqs"], lv.get("max_num_seqs") or top)
                 for lv in levels]
        simulated = simulated_series(d, pairs, int(opts.get("input_len") or ctx),
                                     int(opts.get("output_len") or 1),
                                     int(opts.get("num_requests") or 64),
                                     int(opts.get("seed") or 0))
    if simulated is not None:
        simulated["calibrated"] = bool(series and series[0]["calibrated"])
    v = signature_view(meas, fitted, predicted, simulated, title, series)
    if series:
        v["level_predictions"] = level_predictions(sweep, series)
    knee = sweep_knee(sweep)
    v["measured_knee"] = knee.get("batch") if knee else None
    return v


def demo_views(sweep: dict[str, Any], fit: Any, calibrated: rl.Deployment,
               calibration: dict[str, Any], title: str) -> dict[str, Any]:
    """What `bstar demo`'s report draws: the signature picture, the sweep and the fit, each
    prediction the calibrated one (`calibration` says on what) with the uncalibrated one
    beside it, in the quantities the levels measured."""
    return {"signature": run_signature(sweep, fit, title, calibrated, calibration),
            "sweep": sweep_view(sweep, calibrated, calibration), "fit": fit_view(fit)}


def fit_sweep(sweep: dict[str, Any], predict: list[int] | None = None) -> Any | None:
    """bstar fit on a sweep's levels (through the fit's own sweep reader), predicting 2x and
    4x the largest level by default; None when the levels cannot be fitted (too few)."""
    from bstar.errors import BstarError
    from bstar.fit import fit_points
    from bstar.fit.points import points_from_sweep

    try:
        points = points_from_sweep(sweep["levels"], "sweep.json")
        top = max(points.batch)
        return prefill_aware(fit_points(points, predict=predict or [2 * top, 4 * top]),
                             sweep)
    except BstarError:
        return None


def prefill_aware(fit: Any, sweep: dict[str, Any]) -> Any:
    """The fit of a closed-loop (concurrency) sweep, predicting output throughput with each
    request's prefill (`fit.with_prefill`): the quantity the sweep measured. Other sweeps
    (rates, max_num_seqs) keep B / TPOT."""
    from bstar.fit import with_prefill

    out_len = int((sweep.get("options") or {}).get("output_len") or 0)
    rows = [(lv["concurrency"], (lv.get("ttft_ms") or {}).get("mean"))
            for lv in sweep.get("levels", [])
            if lv.get("concurrency") and not lv.get("max_num_seqs") and lv.get("requests")]
    rows = [(b, t) for b, t in rows if t]
    if out_len < 1 or len(rows) < 2:
        return fit
    return with_prefill(fit, [b for b, _ in rows], [t for _, t in rows], out_len)


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


def sweep_knee(s: dict[str, Any]) -> dict[str, Any] | None:
    """The measured knee to mark: the rule the sweep's recommendation followed, else seed
    000's step rule, else seed 004's doubling rule; also accepts a flat {"batch": ...}."""
    knee = s.get("knee") or {}
    if knee.get("batch"):
        return knee
    rules = knee.get("rules") or {}
    rec = s.get("recommendation") or {}
    if rec.get("bound") == "knee":  # the rule the recommendation followed
        for k in rules.values():
            if k.get("batch") == rec.get("max_num_seqs"):
                return k
    for name in ("step", "doubling"):
        k = rules.get(name) or {}
        if k.get("batch"):
            return k
    return None
