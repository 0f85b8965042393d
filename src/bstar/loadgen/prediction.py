"""A stored sweep's levels predicted again, for the report: the cost model on a grid of
batches in the quantities the levels measured (`predicted_curves`: the drawn one first,
calibrated when a calibrated deployment is given, the sweep's stored one beside it), each
measured level beside those predictions (`level_predictions`: the error, and whether it
agrees within AGREE_TOL), and the simulator replaying the levels (`replay_sweep`). Each
figure is a level's own prediction (`runner.predict_level`); the report draws these and
decides none of them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from bstar.deployment import Deployment
from bstar.loadgen.runner import predict_level
from bstar.options import DeploymentOptions

# A calibrated prediction within this of the measured level it sits beside agrees with it.
AGREE_TOL = 0.15


@dataclass(frozen=True, slots=True)
class SweepShape:
    """What a sweep's levels were predicted at: the context, and the request lengths of a
    prefill-aware prediction ((0, 0): runs stored before it stay decode-only, as their
    levels' stored predictions are)."""

    context_tokens: int
    input_len: int = 0
    output_len: int = 0


def sweep_shape(sweep: dict[str, Any]) -> SweepShape | None:
    """The shape of the sweep's stored level predictions; None when it named no cost model
    (--model and --gpu)."""
    opts = sweep.get("options") or {}
    preds = [lv["predicted"] for lv in sweep.get("levels", []) if lv.get("predicted")]
    if not (opts.get("model") and opts.get("gpu") and preds
            and preds[0].get("context_tokens")):
        return None
    ctx = int(preds[0]["context_tokens"])
    if preds[0].get("throughput_basis") != "incl_prefill":
        return SweepShape(ctx)
    return SweepShape(ctx, int(opts.get("input_len") or 0), int(opts.get("output_len") or 0))


def stored_deployment(sweep: dict[str, Any]) -> Deployment:
    """The cost model's deployment the sweep ran with (`DeploymentOptions` as stored)."""
    return DeploymentOptions.from_sweep_options(sweep.get("options") or {}).build()


def stored_is_calibrated(sweep: dict[str, Any]) -> bool:
    """Whether the deployment a sweep stored was already calibrated (a --profile)."""
    return bool(DeploymentOptions.from_sweep_options(sweep.get("options") or {}).profile)


def prediction_grid(lo: float, hi: float, levels: list[int], n: int = 120) -> list[int]:
    """Integer batches from lo to hi for a smooth line, the measured levels among them."""
    grid = np.geomspace(max(lo, 1), max(hi, lo, 1), n).round().astype(np.int64)
    return sorted({*(int(b) for b in grid), *levels})


def predicted_curve(d: Deployment, shape: SweepShape, batches: list[int], calibrated: bool,
                    calibration: dict[str, Any] | None = None) -> dict[str, Any]:
    """The cost model at `batches`, each figure the quantity the sweep's levels measure
    (`predict_level`), with whether it is calibrated (and on what) and its basis."""
    rows = [predict_level(d, int(b), shape.context_tokens, shape.input_len, shape.output_len)
            for b in batches]
    return {"batch": [r["batch"] for r in rows], "tpot_ms": [r["tpot_ms"] for r in rows],
            "throughput_tok_s": [r["throughput_tok_s"] for r in rows],
            "b_mem": rows[0]["b_mem"], "b_star": rows[0]["b_star"],
            "throughput_basis": rows[0]["throughput_basis"], "calibrated": calibrated,
            "calibration": calibration, "context_tokens": shape.context_tokens,
            "model": d.model.name, "gpu": d.gpu.name}


def predicted_curves(sweep: dict[str, Any], shape: SweepShape, batches: list[int],
                     calibrated: Deployment | None = None,
                     calibration: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The predictions to draw, the first drawn as the prediction: with a `calibrated`
    deployment (`calibration` says on what) the calibrated one, then the sweep's stored,
    uncalibrated one beside it; else the stored one alone (calibrated when the sweep ran
    with a --profile)."""
    stored = stored_deployment(sweep)
    if calibrated is not None:
        return [predicted_curve(calibrated, shape, batches, True, calibration),
                predicted_curve(stored, shape, batches, False)]
    return [predicted_curve(stored, shape, batches, stored_is_calibrated(sweep))]


def level_predictions(levels: list[tuple[int, float]], curves: list[dict[str, Any]]
                      ) -> list[dict[str, Any]]:
    """Each level, given as (batch, measured throughput), beside every predicted curve (each
    holds the level's batch): the prediction there, its error against the measured
    throughput and whether it agrees (within AGREE_TOL)."""
    out = []
    for b, meas in levels:
        preds = []
        for c in curves:
            i = c["batch"].index(b)
            tput = float(c["throughput_tok_s"][i])
            err = tput / float(meas) - 1.0
            preds.append({"calibrated": c["calibrated"],
                          "throughput_basis": c["throughput_basis"],
                          "tpot_ms": float(c["tpot_ms"][i]), "throughput_tok_s": tput,
                          "error": err, "agrees": abs(err) <= AGREE_TOL})
        out.append({"batch": b, "measured_tok_s": float(meas), "predicted": preds})
    return out


def replay_sweep(d: Deployment, sweep: dict[str, Any], levels: list[dict[str, Any]],
                 shape: SweepShape) -> list[dict[str, Any]]:
    """The simulator replaying `levels` (of `sweep`) on `d`, each as the sweep ran it: a
    closed loop of its concurrency under its max_num_seqs (a restarted server's cap; else
    the largest concurrency, one server for every level), with the sweep's request lengths,
    requests per level and seed (`sim.study.replay_closed_loops`)."""
    from bstar.sim.study import replay_closed_loops

    opts = sweep.get("options") or {}
    top = max([c for c in (lv.get("concurrency") for lv in levels) if c] or [1])
    pairs = [(lv.get("concurrency") or lv["max_num_seqs"], lv.get("max_num_seqs") or top)
             for lv in levels]
    return replay_closed_loops(d, pairs, int(opts.get("input_len") or shape.context_tokens),
                               int(opts.get("output_len") or 1),
                               int(opts.get("num_requests") or 64), int(opts.get("seed") or 0))
