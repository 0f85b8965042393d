"""`bstar validate CURVES.csv`: the cost model against whole measured curves.

The table (`bstar.curves_table`: its columns, `CurveRow`, `curves_from_csv`) has one row per
(model, GPU, engine, lengths, batch) measurement; `model` and `gpu` are read offline (a
bundled preset or a config.json path, a catalog id or a GPU file).

Each measurement is compared only with the quantity it is (like for like):
- a step, ITL or TPOT with the predicted decode step at the row's context (`context_tokens`,
  else input + output / 2): a request's TPOT, time-sliced past B_mem, for serving rows; the
  step of exactly `batch` sequences for `step` rows (a timed step, not a server);
- output throughput (prefill included) with the prefill-then-decode aggregate
  (`bstar.validate.predict`), for rows that give their input and output lengths.

Per GPU x engine it reports |predicted / measured - 1| in median three ways:
- generic: the default efficiencies, no engine named;
- uncalibrated: the engine's bundled profile (`--engine`; a "fitted" profile fitted to these
  very rows is in-sample, and the output says so);
- leave one model out (LOMO): the parameters in `fit` fitted to the OTHER models' rows of the
  group, from the generic defaults, then predicting the model left out;
and, for each curve with at least four batch sizes and a throughput, the distance in grid
steps between the knee of the measured throughput and of the predicted one (seed 004's
doubling rule on the same grid: what bstar would recommend).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from bstar import curves_table as _table
from bstar import roofline as rl
from bstar.curves_table import CurveRow
from bstar.deployment import Deployment, Efficiency, split_values
from bstar.errors import BstarError

# The table's reader lives in bstar.curves_table; these names stay importable from here.
curves_from_csv = _table.curves_from_csv
is_curves_table = _table.is_curves_table

# What a group's rows calibrate in leave-one-model-out: the weight stream, the engine's CPU
# time per step, and (with tensor-parallel rows) the all-reduce latency.
DEFAULT_FIT = ("bandwidth", "overhead_s", "allreduce_latency_s")
METRICS = ("step_ms", "throughput_tok_s")


# ---- deployments --------------------------------------------------------------------------
def _resolve(name: str, base_dir: str) -> str:
    if CurveRow._is_path(name) and base_dir and not Path(name).is_absolute():
        return str(Path(base_dir) / name)
    return name


def model_for(row: CurveRow) -> Any:
    """The row's ModelSpec, offline only: a bundled preset or a config.json path. Raises
    BstarError (the row is then skipped, with this reason) for anything else."""
    from bstar.specs.presets import _resolve_preset, get_model

    name = _resolve(row.model, row.base_dir)
    if CurveRow._is_path(name) or _resolve_preset(name) is not None:
        return get_model(name)
    raise BstarError(f"no bundled config for {row.model!r} (give a config.json path)")


def deployment_for(row: CurveRow, eff: Efficiency, model: Any = None,
                   gpu: Any = None) -> Deployment:
    """The row's deployment at `eff` (`model` and `gpu`, when given, are the row's specs
    already read: a fit builds thousands of deployments)."""
    from bstar.options import assemble
    from bstar.specs.gpu import get_gpu
    from bstar.specs.precision import kv_dtype_for, weight_dtype_for

    m = model or model_for(row)
    where = f"{row.where}: " if getattr(row, "where", "") else ""
    weight = weight_dtype_for(row.dtype, m.default_dtype, f"{where}dtype")
    return assemble(m, gpu or get_gpu(_resolve(row.gpu, row.base_dir)),
                    num_gpus=row.num_gpus, weight_dtype=weight,
                    kv_dtype=kv_dtype_for(row.kv_dtype, "fp32" if (weight or m.default_dtype)
                                          == "fp32" else "bf16", f"{where}kv_dtype"),
                    eff=eff)


def measured(row: CurveRow) -> dict[str, float]:
    out: dict[str, float] = {}
    if row.context <= 0:  # no lengths given: nothing to predict it at
        return out
    if row.step_ms is not None:
        out["step_ms"] = row.step_ms
    if row.throughput_tok_s is not None and row.input_len and row.output_len \
            and row.batch_kind != "step":
        out["throughput_tok_s"] = row.throughput_tok_s
    return out


def predicted(d: Deployment, row: CurveRow) -> dict[str, float]:
    """The row's measured quantities as the cost model predicts them, like for like."""
    out = {}
    m = measured(row)
    if "step_ms" in m and row.batch_kind == "step":
        # A timed step of exactly `batch` sequences, whatever a server's memory policy
        # would have admitted: the step itself, not a request's (time-sliced) TPOT.
        out["step_ms"] = float(rl.decode_step(d, [row.batch], row.context).step_s[0]) * 1e3
    elif "step_ms" in m:
        c = rl.curve(d, [row.batch], row.context)
        out["step_ms"] = float(c.tpot_s[0]) * 1e3
    if "throughput_tok_s" in m:
        out["throughput_tok_s"] = rl.batch_output_tok_s(d, row.batch, row.input_len,
                                                        row.output_len)
    return out


def predicted_many(d: Deployment, rows: Sequence[CurveRow]) -> list[dict[str, float]]:
    """`predicted` for rows that share the deployment `d`, with one vectorized step pricing
    per (context, kind): a fit predicts every row at every trial, so a curve of n batches
    costs one call, not n (`predicted` row by row gives the same numbers)."""
    out: list[dict[str, float]] = [{} for _ in rows]
    groups: dict[tuple[int, str], list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        m = measured(r)
        if "step_ms" in m:
            groups[(r.context, "step" if r.batch_kind == "step" else "tpot")].append(i)
        if "throughput_tok_s" in m:
            groups[(r.input_len + r.output_len // 2, f"tput:{r.input_len}:{r.output_len}")
                   ].append(i)
    for (ctx, kind), idx in groups.items():
        batches = [rows[i].batch for i in idx]
        if kind == "step":
            t = rl.decode_step(d, batches, ctx).step_s
            for i, v in zip(idx, t, strict=True):
                out[i]["step_ms"] = float(v) * 1e3
            continue
        c = rl.curve(d, batches, ctx)
        if kind == "tpot":
            for i, v in zip(idx, c.tpot_s, strict=True):
                out[i]["step_ms"] = float(v) * 1e3
            continue
        inp, outp = rows[idx[0]].input_len, rows[idx[0]].output_len
        for i, running, step in zip(idx, c.running_batch, c.step_s, strict=True):
            total = rl.prefill_s(d, inp, int(running)) + outp * float(step)
            out[i]["throughput_tok_s"] = int(running) * outp / total
    return out


# ---- scoring ------------------------------------------------------------------------------
def _med(x: Sequence[float]) -> float | None:
    return float(np.median(np.abs(x))) if len(x) else None


@dataclass
class MetricScore:
    rows: int = 0
    generic: list[float] = field(default_factory=list)
    uncalibrated: list[float] = field(default_factory=list)
    lomo: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "generic": _med(self.generic),
                "uncalibrated": _med(self.uncalibrated), "lomo": _med(self.lomo)}


@dataclass
class GroupScore:
    gpu: str
    engine: str
    profile: str | None
    profile_basis: str | None
    fit: tuple[str, ...]
    models: list[str]
    metrics: dict[str, MetricScore]
    model_lomo: dict[str, dict[str, float | None]]
    notes: list[str]
    model_uncalibrated: dict[str, dict[str, float | None]] = field(default_factory=dict)

    @property
    def worst_model_lomo(self) -> float | None:
        vals = [v for m in self.model_lomo.values() for v in m.values() if v is not None]
        return max(vals) if vals else None

    def to_dict(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "engine": self.engine, "profile": self.profile,
                "profile_basis": self.profile_basis, "fit": list(self.fit),
                "models": self.models,
                "metrics": {k: v.to_dict() for k, v in self.metrics.items()},
                "model_uncalibrated": self.model_uncalibrated,
                "model_lomo": self.model_lomo, "worst_model_lomo": self.worst_model_lomo,
                "notes": self.notes}


@dataclass(frozen=True)
class KneeScore:
    curve: str
    gpu: str
    engine: str
    grid: list[int]
    measured_knee: int | None
    predicted_knee: int | None
    grid_steps_apart: int

    def to_dict(self) -> dict[str, Any]:
        return {"curve": self.curve, "gpu": self.gpu, "engine": self.engine,
                "grid": self.grid, "measured_knee": self.measured_knee,
                "predicted_knee": self.predicted_knee,
                "grid_steps_apart": self.grid_steps_apart}


@dataclass
class CurvesValidation:
    groups: list[GroupScore]
    knees: list[KneeScore]
    skipped: list[dict[str, str]]

    @property
    def knees_within_one_step(self) -> tuple[int, int]:
        with_knee = [k for k in self.knees if k.measured_knee is not None]
        return sum(1 for k in with_knee if k.grid_steps_apart <= 1), len(with_knee)

    def to_dict(self) -> dict[str, Any]:
        within, n = self.knees_within_one_step
        return {"kind": "curves", "groups": [g.to_dict() for g in self.groups],
                "knees": [k.to_dict() for k in self.knees],
                "knees_within_one_grid_step": within, "curves_with_measured_knee": n,
                "skipped": self.skipped}


# The roof's shapes `--fit roof_sharpness` chooses among (bstar.roof): 1 adds the
# memory and compute times (a CPU thread that loads and multiplies in turn), 2 is the soft
# maximum fitted on the H200, inf the hard maximum.
SHARPNESS_CHOICES = (1.0, 1.5, 2.0, 3.0, math.inf)


def fit_rows(rows: Sequence[CurveRow], prior: Efficiency,
             fit: Sequence[str]) -> Efficiency | None:
    """Parameters `fit` fitted to the rows' measurements (log space, robust, bounded:
    bstar.calibrate.fit_efficiency); None when the rows cannot determine them. With
    "roof_sharpness" in `fit`, the others are fitted at each of SHARPNESS_CHOICES and the
    shape whose fit leaves the smallest median |error| on these rows is kept."""
    if "roof_sharpness" in fit:
        rest = tuple(k for k in fit if k != "roof_sharpness")
        best: tuple[float, Efficiency] | None = None
        for k in SHARPNESS_CHOICES:
            eff = fit_rows(rows, replace(prior, roof_sharpness=k), rest)
            if eff is None:
                return None
            err = float(np.median(np.abs([e for v in _errors(rows, eff).values()
                                          for e in v])))
            if best is None or err < best[0]:
                best = (err, eff)
        return best[1] if best else None
    from bstar.calibrate import fit_efficiency

    fit = tuple(k for k in fit if k != "allreduce_latency_s"
                or any(r.num_gpus > 1 for r in rows))
    models = {id(r): model_for(r) for r in rows}  # parsed once, not per evaluation
    pairs = [(r, k, v) for r in rows for k, v in measured(r).items()]
    if not fit or len(pairs) < len(fit) + 1:
        return None
    from bstar.specs.gpu import get_gpu

    gpus = {r.gpu: get_gpu(_resolve(r.gpu, r.base_dir)) for r in rows}

    # Rows that share a deployment (model, GPU, TP, dtypes) are priced together.
    by_dep: dict[tuple[Any, ...], list[CurveRow]] = defaultdict(list)
    for r in rows:
        by_dep[(r.model, str(r.base_dir), r.gpu, r.num_gpus, r.dtype, r.kv_dtype)].append(r)

    def pred_all(v: dict[str, float]) -> np.ndarray:
        e = replace(prior, **split_values(v)[0])  # the step: Efficiency's fields
        cache: dict[int, dict[str, float]] = {}
        for group in by_dep.values():
            r0 = group[0]
            d = deployment_for(r0, e, models[id(r0)], gpus[r0.gpu])
            for r, p in zip(group, predicted_many(d, group), strict=True):
                cache[id(r)] = p
        return np.array([cache[id(r)][k] for r, k, _ in pairs])

    return fit_efficiency(pred_all, [v for _, _, v in pairs], prior, fit).eff


def _errors(rows: Sequence[CurveRow], eff: Efficiency) -> dict[str, list[float]]:
    out: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        p = predicted(deployment_for(r, eff), r)
        for k, v in measured(r).items():
            out[k].append(p[k] / v - 1.0)
    return out


def score_curves(rows: Sequence[CurveRow], fit: Sequence[str] = DEFAULT_FIT,
                 progress: Callable[[str], None] | None = None) -> CurvesValidation:
    from bstar.engines import get_engine

    generic = Efficiency()
    usable, skipped, seen = [], [], set()
    for r in rows:
        try:
            deployment_for(r, generic)
            if not measured(r):
                raise BstarError("no input/output lengths or context given: nothing to "
                                 "predict the measurement at")
        except BstarError as e:
            if (r.model, r.gpu, str(e)) not in seen:
                skipped.append({"model": r.model, "gpu": r.gpu, "reason": str(e)})
                seen.add((r.model, r.gpu, str(e)))
            continue
        usable.append(r)
    by_group: dict[tuple[str, str], list[CurveRow]] = defaultdict(list)
    for r in usable:
        by_group[r.group].append(r)
    groups = []
    for (gpu, engine), rs in by_group.items():
        if progress:
            progress(f"{gpu} x {engine}")
        notes: list[str] = []
        try:
            prof = get_engine(engine)
            prof_eff, prof_name, basis = prof.efficiency(), prof.name, prof.basis
        except BstarError:
            prof_eff, prof_name, basis = generic, None, None
            notes.append(f"no bundled profile for engine {engine!r}: uncalibrated = generic")
        metrics: dict[str, MetricScore] = {k: MetricScore() for k in METRICS}
        for k, v in _errors(rs, generic).items():
            metrics[k].generic += v
            metrics[k].rows = len(v)
        by_model: dict[str, list[CurveRow]] = defaultdict(list)
        for r in rs:
            by_model[r.model].append(r)
        models = sorted(by_model)
        model_uncal = {}
        for m in models:
            errs = _errors(by_model[m], prof_eff)
            for k, v in errs.items():
                metrics[k].uncalibrated += v
            model_uncal[m] = {k: _med(v) for k, v in errs.items()}
        model_lomo: dict[str, dict[str, float | None]] = {}
        if len(models) < 2:
            notes.append("one model: no leave-one-model-out figure")
        else:
            for m in models:
                train = [r for r in rs if r.model != m]
                eff = fit_rows(train, generic, fit)
                if eff is None:
                    notes.append(f"{m}: the other models' rows cannot determine "
                                 f"{', '.join(fit)}")
                    continue
                errs = _errors(by_model[m], eff)
                for k, v in errs.items():
                    metrics[k].lomo += v
                model_lomo[m] = {k: _med(v) for k, v in errs.items()}
        if basis == "fitted":
            notes.append(f"the {prof_name} profile is fitted: where it was fitted to these "
                         "rows, its figure is in-sample")
        groups.append(GroupScore(gpu, engine, prof_name, basis, tuple(fit), models,
                                 {k: v for k, v in metrics.items() if v.rows}, model_lomo,
                                 notes, model_uncal))
    return CurvesValidation(groups, knee_scores(usable), skipped)


def knee_scores(rows: Sequence[CurveRow]) -> list[KneeScore]:
    """Measured vs predicted knee (seed 004's doubling rule) on each curve with >= 4 batch
    sizes and a throughput (measured, or B / step for decode-step curves)."""
    from bstar.engines import get_engine
    from bstar.knee import all_knees

    curves: dict[tuple[Any, ...], list[CurveRow]] = defaultdict(list)
    for r in rows:
        curves[r.curve].append(r)
    out = []
    for rs in curves.values():
        rs = sorted({r.batch: r for r in rs}.values(), key=lambda r: r.batch)
        if len(rs) < 4:
            continue
        try:
            eff = get_engine(rs[0].engine).efficiency()
        except BstarError:
            eff = Efficiency()
        meas, pred = [], []
        for r in rs:
            m, p = measured(r), predicted(deployment_for(r, eff), r)
            if "throughput_tok_s" in m:
                meas.append(m["throughput_tok_s"])
                pred.append(p["throughput_tok_s"])
            elif r.batch_kind == "step" and "step_ms" in m:
                meas.append(r.batch / m["step_ms"])
                pred.append(r.batch / p["step_ms"])
            else:
                break
        else:
            grid = [r.batch for r in rs]
            km = all_knees(grid, meas)["doubling"].batch
            kp = all_knees(grid, pred)["doubling"].batch

            def idx(k: int | None, grid: list[int] = grid) -> int:
                return len(grid) - 1 if k is None else int(np.argmin([abs(g - k)
                                                                      for g in grid]))

            out.append(KneeScore(rs[0].curve_label, rs[0].gpu, rs[0].engine, grid, km, kp,
                                 abs(idx(km) - idx(kp))))
    return out
