"""`bstar validate`: the planner's predictions against a table of published measurements.

Each row names a model, GPU, tensor-parallel degree, engine, input/output lengths, a batch
(concurrent sequences, or a static batch) and one measured metric:

- `tpot_ms`: per-request time per output token = the decode step at that batch, predicted
  at the mean context a request holds while decoding (input + output/2).
- `throughput_tok_s` (all GPUs) or `throughput_tok_s_per_gpu`: output tokens per second with
  `batch` sequences in flight. Each sequence is prefilled, then decodes `output_len` steps,
  so predicted = B x O / (prefill(B x I) + O x step(B, I + O/2)); the same aggregate holds
  for a static batch and, approximately, for a closed loop of B streams.

Errors are predicted / measured - 1, per row, with their median absolute value, twice:
uncalibrated (stated default efficiencies) and calibrated leave-one-out: for each row, the
efficiencies are fitted (bstar.calibrate.fit_efficiency) to the OTHER rows of the same GPU x
engine and then predict the held-out row, so no row is predicted from itself.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from bstar import roofline as rl
from bstar.calibrate import PARAMS, fit_efficiency
from bstar.deployment import Deployment, Efficiency, split_values
from bstar.errors import BstarError
from bstar.fit.points import read_table

REQUIRED = ("model", "gpu", "num_gpus", "engine", "input_len", "output_len", "batch",
            "metric", "value", "source")
OPTIONAL = ("dtype", "kv_dtype", "note")
METRICS = ("tpot_ms", "throughput_tok_s", "throughput_tok_s_per_gpu")
DEFAULT_FIT = ("bandwidth", "compute")


@dataclass(frozen=True, slots=True)
class Row:
    model: str
    gpu: str
    num_gpus: int
    engine: str
    input_len: int
    output_len: int
    batch: int
    metric: str
    value: float
    source: str
    dtype: str = ""
    kv_dtype: str = ""
    note: str = ""
    where: str = ""

    @property
    def group(self) -> tuple[str, str]:
        """Efficiencies belong to one GPU x engine (version included, as written)."""
        return (self.gpu, self.engine)


def rows_from_csv(text: str, where: str = "table") -> list[Row]:
    """Parse the table (header row; lines starting with # are comments)."""
    table = read_table(text, where)
    if table is None:
        raise BstarError(f"{where}: empty table")
    header = table.header
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise BstarError(f"{where}: missing column(s) {', '.join(missing)}")
    unknown = [h for h in header if h not in REQUIRED + OPTIONAL]
    if unknown:
        raise BstarError(f"{where}: unknown column(s) {', '.join(unknown)}")
    rows = []
    for cells, at in table.rows():
        r = {h: c.strip() for h, c in cells.items()}
        if r["metric"] not in METRICS:
            raise BstarError(f"{at}: metric {r['metric']!r} is not one of {', '.join(METRICS)}")
        if not r["source"]:
            raise BstarError(f"{at}: every row needs its source")
        try:
            ints = {k: int(r[k]) for k in ("num_gpus", "input_len", "output_len", "batch")}
            value = float(r["value"].replace(",", ""))
        except ValueError:
            raise BstarError(f"{at}: num_gpus, input_len, output_len, batch must be "
                             "integers and value a number") from None
        if min(ints.values()) < 1 or not (value > 0 and math.isfinite(value)):
            raise BstarError(f"{at}: counts must be >= 1 and value positive")
        rows.append(Row(r["model"], r["gpu"], ints["num_gpus"], r["engine"],
                        ints["input_len"], ints["output_len"], ints["batch"], r["metric"],
                        value, r["source"], r.get("dtype", ""), r.get("kv_dtype", ""),
                        r.get("note", ""), at))
    if not rows:
        raise BstarError(f"{where}: no rows")
    return rows


def deployment_for(row: Row, eff: Efficiency | None = None) -> Deployment:
    from bstar.options import assemble
    from bstar.specs.gpu import get_gpu
    from bstar.specs.precision import kv_dtype_for, weight_dtype_for
    from bstar.specs.presets import get_model

    try:
        m = get_model(row.model)
        return assemble(m, get_gpu(row.gpu), num_gpus=row.num_gpus,
                        weight_dtype=weight_dtype_for(row.dtype, m.default_dtype, "dtype"),
                        kv_dtype=kv_dtype_for(row.kv_dtype, "bf16", "kv_dtype"),
                        eff=eff or Efficiency())
    except BstarError as e:
        raise BstarError(f"{row.where}: {e}") from None


def predict(d: Deployment, row: Row) -> float:
    """The row's metric as the cost model predicts it for deployment `d`."""
    ctx = row.input_len + row.output_len // 2
    c = rl.curve(d, [row.batch], ctx)
    if row.metric == "tpot_ms":
        return float(c.tpot_s[0]) * 1e3
    tput = rl.batch_output_tok_s(d, row.batch, row.input_len, row.output_len, ctx)
    return tput / row.num_gpus if row.metric == "throughput_tok_s_per_gpu" else tput


@dataclass(frozen=True, slots=True)
class RowResult:
    row: Row
    uncalibrated: float
    calibrated: float | None  # leave-one-out; None when the group is too small
    calibrated_eff: Efficiency | None
    b_mem: int

    @property
    def uncalibrated_error(self) -> float:
        return self.uncalibrated / self.row.value - 1.0

    @property
    def calibrated_error(self) -> float | None:
        return None if self.calibrated is None else self.calibrated / self.row.value - 1.0


@dataclass(frozen=True, slots=True)
class Validation:
    rows: tuple[RowResult, ...]
    fit: tuple[str, ...]
    group_eff: dict[tuple[str, str], Efficiency]  # all rows of a group together
    notes: tuple[str, ...] = field(default=())

    @property
    def uncalibrated_median_abs_error(self) -> float:
        return float(np.median([abs(r.uncalibrated_error) for r in self.rows]))

    @property
    def calibrated_median_abs_error(self) -> float | None:
        errs = [abs(e) for r in self.rows if (e := r.calibrated_error) is not None]
        return float(np.median(errs)) if errs else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "fit": list(self.fit),
            "uncalibrated_median_abs_error": self.uncalibrated_median_abs_error,
            "calibrated_median_abs_error": self.calibrated_median_abs_error,
            "groups": [{"gpu": g, "engine": e, "efficiency": {k: getattr(eff, k)
                                                              for k in PARAMS
                                                              if hasattr(eff, k)}}
                       for (g, e), eff in self.group_eff.items()],
            "rows": [{"model": r.row.model, "gpu": r.row.gpu, "num_gpus": r.row.num_gpus,
                      "engine": r.row.engine, "input_len": r.row.input_len,
                      "output_len": r.row.output_len, "batch": r.row.batch,
                      "metric": r.row.metric, "value": r.row.value,
                      "uncalibrated": r.uncalibrated,
                      "uncalibrated_error": r.uncalibrated_error,
                      "calibrated_loo": r.calibrated, "calibrated_error": r.calibrated_error,
                      "b_mem": r.b_mem, "source": r.row.source} for r in self.rows],
            "notes": list(self.notes),
        }


def _fit_group(deps: Sequence[Deployment], rows: Sequence[Row],
               fit: Sequence[str], prior: Efficiency) -> Efficiency:
    def pred(v: Any) -> np.ndarray:
        eff = replace(prior, **split_values(v)[0])  # the step: Efficiency's fields
        return np.array([predict(d.with_eff(eff), r) for d, r in zip(deps, rows, strict=True)])

    return fit_efficiency(pred, [r.value for r in rows], prior, fit).eff


def validate(rows: Sequence[Row], fit: Sequence[str] = DEFAULT_FIT,
             prior: Efficiency | None = None) -> Validation:
    prior = prior or Efficiency()
    fit = tuple(fit)
    deps = [deployment_for(r, prior) for r in rows]
    groups: dict[tuple[str, str], list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault(r.group, []).append(i)
    loo: dict[int, tuple[float, Efficiency]] = {}
    group_eff: dict[tuple[str, str], Efficiency] = {}
    notes = []
    for g, idx in groups.items():
        if len(idx) - 1 < len(fit):
            notes.append(f"{g[0]} x {g[1]}: {len(idx)} row(s), too few to fit {len(fit)} "
                         "parameter(s) on the others; no calibrated prediction")
            continue
        group_eff[g] = _fit_group([deps[i] for i in idx], [rows[i] for i in idx], fit, prior)
        for i in idx:
            others = [j for j in idx if j != i]
            eff = _fit_group([deps[j] for j in others], [rows[j] for j in others], fit, prior)
            loo[i] = (predict(deps[i].with_eff(eff), rows[i]), eff)
    results = []
    for i, r in enumerate(rows):
        ctx = r.input_len + r.output_len // 2
        bm = rl.b_mem(deps[i], ctx)
        if r.batch > bm:
            notes.append(f"{r.where}: batch {r.batch} exceeds the model's B_mem {bm} at "
                         f"context {ctx}: predicted as {bm} running (time-sliced)")
        c = loo.get(i)
        results.append(RowResult(r, predict(deps[i], r), c[0] if c else None,
                                 c[1] if c else None, bm))
    return Validation(tuple(results), fit, group_eff, tuple(notes))
