"""Fit measured (batch, throughput, TPOT) points with the cost model's shape, extrapolate with
stated confidence, find the knee. Pure computation except `load_points` (reads one file);
scipy (extra `bstar[fit]`) is imported inside the functions that need it.

The model is the roofline of a decode step (DESIGN.md, bstar.roofline) reduced to three
numbers, in milliseconds:

    step(B) = max(a + b*B, c*B)  (+ d, an optional constant overhead)

    a  the per-step cost paid once whatever the batch: reading the weights, plus fixed engine
       overhead (launches, scheduling, sampling);
    b  the cost each sequence adds on the memory side: reading its KV cache;
    c  the cost each sequence adds on the compute side: its FLOPs at the achieved FLOP/s;
    B* = a/b  the batch at which the KV term reaches the weight term (seed 000).

Per-request TPOT is step(B); throughput is B / step(B). On the memory line throughput rises
towards 1/b; on the compute line it is flat at 1/c and TPOT grows linearly, c*B.

The roof c is identifiable only when at least two points lie on the compute line (through
the origin: step proportional to B, throughput flat). Otherwise it comes from a known critical
batch N, read as the batch where the memory line meets the compute line, so
c = (a + b*N)/N = step(N)/N and past N, TPOT(B) = c*B = step(N) * B/N (seed 001); or from the
cost model's compute term for a model and GPU; or it stays unknown, and past the data the fit
is a lower bound on TPOT (an upper bound on throughput). The data do bound it from the other
side: a roof below the points would have shown, so c <= step(B_last)/B_last, which caps TPOT
at step(B_last) * B/B_last; that cap is the `high` of such predictions.

Fitting is in log space (relative residuals: points span an order of magnitude of step time)
with scipy.optimize.least_squares and a soft-L1 loss scaled at 5%, so one bad point is
down-weighted rather than followed; parameters are fitted as logs, hence positive.
Uncertainty: a seeded residual bootstrap, 5th-95th percentiles of every prediction.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from bstar import knee as kn
from bstar.errors import BstarError, closest
from bstar.recommend import Recommendation, SlaBound

if TYPE_CHECKING:
    from bstar.deployment import DeploymentOptions

FloatArray = npt.NDArray[np.float64]

COLUMNS = ("batch", "throughput_tok_s", "tpot_ms")
MIN_POINTS = 3
# Given throughput and TPOT must agree on the step time to this fraction, else a warning.
CONFLICT_TOLERANCE = 0.05
# Soft-L1 loss scale in log space: residuals past ~5% count linearly, not quadratically.
LOSS = "soft_l1"
LOSS_SCALE = 0.05
INTERVAL_PCT = (5.0, 95.0)
DEFAULT_BOOTSTRAP = 200
# The roof counts as seen in the data when at least two points lie on the fitted compute line
# and either they sit above the memory-only fit by more than 3 robust sigmas of the full fit
# (and at least 2%), or the memory-only fit misses by 3x the full fit's robust sigma.
ROOF_SIGMAS = 3.0
ROOF_MIN_EXCESS = 0.02
MAX_SLA_GRID = 1 << 20

ROOF_SOURCES = ("data", "critical-batch", "cost-model", "unknown")


# ---- points ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Points:
    """Measured points, sorted by batch. `tpot_ms` is what the fit uses (per-request step
    time); `throughput_tok_s` is as given or derived (= batch / TPOT); `derived[i]` names the
    column computed for point i ("" when both were given)."""

    batch: tuple[int, ...]
    tpot_ms: tuple[float, ...]
    throughput_tok_s: tuple[float, ...]
    derived: tuple[str, ...]
    warnings: tuple[str, ...] = ()
    source: str = ""

    def __len__(self) -> int:
        return len(self.batch)


def _number(raw: object, column: str, where: str) -> float | None:
    """A cell as a positive finite number; None when empty."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    if isinstance(raw, bool):
        raise BstarError(f"{where}: {column} is {raw!r}, not a number")
    if isinstance(raw, int | float):
        v = float(raw)
    elif isinstance(raw, str):
        try:
            v = float(raw.strip().replace("_", ""))
        except ValueError:
            raise BstarError(f"{where}: {column} is {raw.strip()!r}, not a number") from None
    else:
        raise BstarError(f"{where}: {column} is {raw!r}, not a number")
    if not math.isfinite(v):
        raise BstarError(f"{where}: {column} is {raw!r}, not a finite number")
    if v <= 0:
        raise BstarError(f"{where}: {column} must be positive, got {v:g}")
    return v


def points_from_rows(rows: Sequence[Mapping[str, object]], labels: Sequence[str] | None = None,
                     source: str = "") -> Points:
    """Validate rows of {column: value} (strings or numbers) into Points. `labels[i]` names
    row i in messages ("line 3", "point 2"). Every error is one line naming the row."""
    labels = list(labels) if labels is not None else [f"row {i + 1}" for i in range(len(rows))]
    seen_cols: set[str] = set()
    for row, where in zip(rows, labels, strict=True):
        for k in row:
            if k not in COLUMNS:
                raise BstarError(f"{where}: unknown column {k!r} (expected batch, "
                                 f"throughput_tok_s, tpot_ms){closest(str(k), COLUMNS)}")
            seen_cols.add(k)
    if rows and "batch" not in seen_cols:
        raise BstarError(f"{source or 'points'}: no 'batch' column")
    if rows and not seen_cols & {"throughput_tok_s", "tpot_ms"}:
        raise BstarError(f"{source or 'points'}: need a 'throughput_tok_s' or 'tpot_ms' column "
                         "besides 'batch'")
    parsed: list[tuple[int, float | None, float | None, str]] = []
    for row, where in zip(rows, labels, strict=True):
        b = _number(row.get("batch"), "batch", where)
        if b is None:
            raise BstarError(f"{where}: batch is empty")
        if b != round(b):
            raise BstarError(f"{where}: batch must be a whole number of sequences, got {b:g}")
        t = _number(row.get("throughput_tok_s"), "throughput_tok_s", where)
        p = _number(row.get("tpot_ms"), "tpot_ms", where)
        if t is None and p is None:
            raise BstarError(f"{where}: batch {int(b)} has neither throughput_tok_s nor tpot_ms")
        parsed.append((int(b), t, p, where))
    return _points(parsed, source)


def make_points(batch: Sequence[float], throughput_tok_s: Sequence[float | None] | None = None,
                tpot_ms: Sequence[float | None] | None = None, source: str = "") -> Points:
    """Points from aligned sequences (a sweep's levels, a simulation): batch and at least one
    of throughput_tok_s, tpot_ms (None entries allowed where the other is given)."""
    n = len(batch)
    if throughput_tok_s is None and tpot_ms is None:
        raise BstarError("need throughput_tok_s or tpot_ms besides batch")
    for name, col in (("throughput_tok_s", throughput_tok_s), ("tpot_ms", tpot_ms)):
        if col is not None and len(col) != n:
            raise BstarError(f"{name} has {len(col)} values for {n} batches")
    rows: list[dict[str, object]] = []
    for i in range(n):
        row: dict[str, object] = {"batch": batch[i]}
        if throughput_tok_s is not None:
            row["throughput_tok_s"] = throughput_tok_s[i]
        if tpot_ms is not None:
            row["tpot_ms"] = tpot_ms[i]
        rows.append(row)
    return points_from_rows(rows, [f"point {i + 1}" for i in range(n)], source)


def _points(parsed: list[tuple[int, float | None, float | None, str]], source: str) -> Points:
    warnings: list[str] = []
    by_batch: dict[int, tuple[float | None, float | None, str]] = {}
    for b, t, p, where in parsed:
        if b in by_batch:
            t0, p0, where0 = by_batch[b]
            if t0 == t and p0 == p:
                warnings.append(f"{where}: batch {b} repeats {where0} with the same values; "
                                "used once")
                continue
            raise BstarError(f"{where}: batch {b} is listed twice with different values "
                             f"(also at {where0}); average the repeats or drop one")
        by_batch[b] = (t, p, where)
    if len(by_batch) < MIN_POINTS:
        raise BstarError(f"{source or 'points'}: need at least {MIN_POINTS} distinct batch sizes "
                         f"to fit a, b (and c), got {len(by_batch)}")
    batches = sorted(by_batch)
    tpot: list[float] = []
    tput: list[float] = []
    derived: list[str] = []
    for b in batches:
        t, p, where = by_batch[b]
        if p is None:
            assert t is not None
            tpot.append(1e3 * b / t)
            tput.append(t)
            derived.append("tpot_ms")
        elif t is None:
            tpot.append(p)
            tput.append(1e3 * b / p)
            derived.append("throughput_tok_s")
        else:
            implied_ms = 1e3 * b / t
            if abs(implied_ms / p - 1) > CONFLICT_TOLERANCE:
                warnings.append(
                    f"{where}: batch {b}: throughput {t:,.4g} tok/s implies a step of "
                    f"{implied_ms:.4g} ms but tpot_ms is {p:.4g} ({(implied_ms / p - 1) * 100:+.0f}"
                    f"%, over {CONFLICT_TOLERANCE * 100:g}%); the fit uses tpot_ms (throughput "
                    "over a run also counts prefill and ramp-up)")
            tpot.append(p)
            tput.append(t)
            derived.append("")
    return Points(tuple(batches), tuple(tpot), tuple(tput), tuple(derived), tuple(warnings),
                  source)


def load_points(path: str | Path) -> Points:
    """Read POINTS: CSV with a header (`batch` and at least one of `throughput_tok_s`,
    `tpot_ms`; lines starting with # are comments), or JSON: a list of such objects,
    {"points": [...]}, or a sweep result {"levels": [{"concurrency" or "max_num_seqs",
    "throughput_tok_s", "tpot_ms": number or {"mean": ...}}]}."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BstarError(f"{p}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise BstarError(f"{p}: cannot read: {e}") from None
    if p.suffix.lower() == ".json" or text.lstrip().startswith(("[", "{")):
        return _points_from_json(text, str(p))
    return _points_from_csv(text, str(p))


def _points_from_csv(text: str, source: str) -> Points:
    lines = text.splitlines()
    numbered = [(i + 1, ln) for i, ln in enumerate(lines)
                if ln.strip() and not ln.lstrip().startswith("#")]
    if not numbered:
        raise BstarError(f"{source}: no header and no points")
    reader = csv.reader([ln for _, ln in numbered])
    header = [h.strip() for h in next(reader)]
    header_line = numbered[0][0]
    for h in header:
        if not h:
            raise BstarError(f"{source}: line {header_line}: empty column name in the header")
        if h not in COLUMNS:
            raise BstarError(f"{source}: line {header_line}: unknown column {h!r} (expected "
                             f"batch, throughput_tok_s, tpot_ms){closest(h, COLUMNS)}")
    if len(set(header)) != len(header):
        raise BstarError(f"{source}: line {header_line}: a column is named twice")
    rows: list[dict[str, object]] = []
    labels: list[str] = []
    for (lineno, _), cells in zip(numbered[1:], reader, strict=True):
        if len(cells) != len(header):
            raise BstarError(f"{source}: line {lineno}: {len(cells)} cells for "
                             f"{len(header)} columns")
        rows.append(dict(zip(header, cells, strict=True)))
        labels.append(f"{source}: line {lineno}")
    if "batch" not in header:
        raise BstarError(f"{source}: line {header_line}: no 'batch' column")
    return points_from_rows(rows, labels, source)


def _points_from_json(text: str, source: str) -> Points:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise BstarError(f"{source}: not valid JSON: {e.msg} at line {e.lineno}") from None
    if isinstance(data, dict) and "levels" in data:
        return _points_from_sweep(data["levels"], source)
    if isinstance(data, dict) and "points" in data:
        data = data["points"]
    if not isinstance(data, list):
        raise BstarError(f"{source}: expected a list of points, {{\"points\": [...]}} or a "
                         "sweep result with \"levels\"")
    labels = [f"{source}: point {i + 1}" for i in range(len(data))]
    for item, where in zip(data, labels, strict=True):
        if not isinstance(item, dict):
            raise BstarError(f"{where}: expected an object with batch and throughput_tok_s "
                             "and/or tpot_ms")
    return points_from_rows(data, labels, source)


def _points_from_sweep(levels: object, source: str) -> Points:
    if not isinstance(levels, list):
        raise BstarError(f"{source}: \"levels\" must be a list")
    rows: list[dict[str, object]] = []
    labels: list[str] = []
    for i, lv in enumerate(levels):
        where = f"{source}: level {i + 1}"
        if not isinstance(lv, dict):
            raise BstarError(f"{where}: expected an object")
        b = lv.get("max_num_seqs", lv.get("concurrency"))
        tp = lv.get("tpot_ms")
        if isinstance(tp, dict):
            tp = tp.get("mean")  # vLLM's mean_tpot_ms
        rows.append({"batch": b, "throughput_tok_s": lv.get("throughput_tok_s"), "tpot_ms": tp})
        labels.append(where)
    return points_from_rows(rows, labels, source)


# ---- the model ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Params:
    a_ms: float
    b_ms: float
    c_ms: float | None  # None: roof unknown
    overhead_ms: float = 0.0

    def step_ms(self, batch: npt.ArrayLike) -> FloatArray:
        b = np.asarray(batch, dtype=np.float64)
        mem = self.a_ms + self.b_ms * b
        if self.c_ms is None:
            return np.asarray(self.overhead_ms + mem, dtype=np.float64)
        return np.asarray(self.overhead_ms + np.maximum(mem, self.c_ms * b), dtype=np.float64)

    def memory_ms(self, batch: npt.ArrayLike) -> FloatArray:
        return np.asarray(self.overhead_ms + self.a_ms + self.b_ms
                          * np.asarray(batch, dtype=np.float64), dtype=np.float64)

    @property
    def b_star(self) -> float:
        return self.a_ms / self.b_ms

    @property
    def crossover_batch(self) -> float | None:
        """Where the memory line meets the compute line; None if compute never wins."""
        if self.c_ms is None or self.c_ms <= self.b_ms:
            return None
        return self.a_ms / (self.c_ms - self.b_ms)


@dataclass(frozen=True, slots=True)
class _Mode:
    """How c is obtained: "free" (fitted), "tied" (c = a/N + b), "fixed" (given), "none"."""

    kind: str
    critical_batch: float | None = None
    c_ms: float | None = None
    overhead: bool = False

    def unpack(self, x: FloatArray) -> Params:
        a, b = math.exp(x[0]), math.exp(x[1])
        i = 2
        c: float | None
        if self.kind == "free":
            c = math.exp(x[2])
            i = 3
        elif self.kind == "tied":
            assert self.critical_batch is not None
            c = a / self.critical_batch + b
        elif self.kind == "fixed":
            c = self.c_ms
        else:
            c = None
        d = math.exp(x[i]) if self.overhead else 0.0
        return Params(a, b, c, d)

    def pack(self, p: Params) -> list[float]:
        x = [math.log(p.a_ms), math.log(p.b_ms)]
        if self.kind == "free":
            assert p.c_ms is not None
            x.append(math.log(p.c_ms))
        if self.overhead:
            x.append(math.log(max(p.overhead_ms, 1e-6)))
        return x


_LOG_LO, _LOG_HI = -40.0, 40.0


def _solve(mode: _Mode, b: FloatArray, y: FloatArray, start: Params) -> tuple[Params, float]:
    """Robust least squares in log space from `start`; returns (params, robust cost)."""
    from scipy.optimize import least_squares

    def resid(x: FloatArray) -> FloatArray:
        return np.log(mode.unpack(x).step_ms(b)) - y

    x0 = np.clip(np.array(mode.pack(start)), _LOG_LO + 1, _LOG_HI - 1)
    r = least_squares(resid, x0, loss=LOSS, f_scale=LOSS_SCALE, method="trf",
                      bounds=(_LOG_LO, _LOG_HI), x_scale=1.0, max_nfev=2000)
    return mode.unpack(r.x), float(r.cost)


def _line_start(b: FloatArray, step: FloatArray) -> Params:
    """a, b from a plain straight-line fit, kept positive: a starting point only."""
    if b.size >= 2:
        slope, icpt = np.polyfit(b, step, 1)
    else:
        slope, icpt = 0.0, float(step[0])
    lo = float(np.min(step))
    a = float(icpt) if icpt > 0.05 * lo else 0.5 * lo
    s = float(slope) if slope > 0 else 1e-3 * lo / max(float(b.max()), 1.0)
    return Params(a, s, None)


def _fit_free_roof(b: FloatArray, y: FloatArray, overhead: bool) -> tuple[Params, float] | None:
    """The best fit with c free, over starts that put the top m points on the compute line."""
    n, step = b.size, np.exp(y)
    best: tuple[Params, float] | None = None
    mode = _Mode("free", overhead=overhead)
    for m in range(2, n - 1):
        lo = _line_start(b[: n - m], step[: n - m])
        c0 = float(np.median(step[n - m:] / b[n - m:]))
        start = Params(lo.a_ms, lo.b_ms, max(c0, lo.b_ms * 1.01),
                       0.05 * lo.a_ms if overhead else 0.0)
        got = _solve(mode, b, y, start)
        if best is None or got[1] < best[1]:
            best = got
    return best


@dataclass(frozen=True, slots=True)
class RoofCheck:
    """What the data say about the compute roof on their own."""

    identified: bool
    params: Params | None  # the free-roof fit, when one was tried
    points_on_roof: tuple[int, ...]
    reason: str


def _check_roof(b: FloatArray, y: FloatArray, mem_fit: Params, overhead: bool) -> RoofCheck:
    if b.size < 4:
        return RoofCheck(False, None, (), f"{b.size} points cannot show a roof (it needs two "
                         "points on each line)")
    got = _fit_free_roof(b, y, overhead)
    assert got is not None
    full = got[0]
    assert full.c_ms is not None
    on = (full.c_ms * b) > (full.a_ms + full.b_ms * b) * 1.001
    on_batches = tuple(int(x) for x in b[on])
    if on.sum() < 2:
        return RoofCheck(False, full, on_batches,
                         "no two points lie on a compute line (throughput flat, step "
                         "proportional to batch)")
    r_full = np.log(full.step_ms(b)) - y
    r_mem = np.log(mem_fit.step_ms(b)) - y
    sigma_full = max(1.4826 * float(np.median(np.abs(r_full))), 0.01)
    sigma_mem = 1.4826 * float(np.median(np.abs(r_mem)))
    excess = -r_mem[on]  # how far the roof points sit above the memory-only fit
    need = max(ROOF_SIGMAS * sigma_full, ROOF_MIN_EXCESS)
    where = f"B={', '.join(map(str, on_batches))}"
    # Two ways a roof shows: the memory-only fit treats the roof points as outliers (they sit
    # above it), or it bends to reach them and then misfits everything (its typical residual
    # is several times the full model's).
    if np.all(excess > 0) and float(np.mean(excess)) > need:
        return RoofCheck(True, full, on_batches,
                         f"points at {where} sit {float(np.mean(excess)) * 100:.0f}% above the "
                         "memory line, on a flat-throughput line")
    if sigma_mem > ROOF_SIGMAS * sigma_full:
        return RoofCheck(True, full, on_batches,
                         f"points at {where} lie on a flat-throughput line; a memory line alone "
                         f"misses the data by {sigma_mem * 100:.0f}% (typical), the roofline by "
                         f"{sigma_full * 100:.1f}%")
    return RoofCheck(False, full, on_batches,
                     f"the points at {where} are within noise of the memory line (typical "
                     f"miss {sigma_mem * 100:.1f}% without a roof, {sigma_full * 100:.1f}% with "
                     "one)")


# ---- results --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Prediction:
    batch: int
    tpot_ms: float
    throughput_tok_s: float
    tpot_low_ms: float
    tpot_high_ms: float
    throughput_low_tok_s: float
    throughput_high_tok_s: float
    regime: str  # "memory-bound", "compute-bound", "unknown"
    extrapolated: bool
    bound: str | None  # "tpot_lower_bound" where the roof is unknown past the data

    def to_dict(self) -> dict[str, Any]:
        return {"batch": self.batch, "throughput_tok_s": self.throughput_tok_s,
                "tpot_ms": self.tpot_ms,
                "low": {"tpot_ms": self.tpot_low_ms,
                        "throughput_tok_s": self.throughput_low_tok_s},
                "high": {"tpot_ms": self.tpot_high_ms,
                         "throughput_tok_s": self.throughput_high_tok_s},
                "regime": self.regime, "extrapolated": self.extrapolated,
                "bound": self.bound}


@dataclass(frozen=True, slots=True)
class FitResult:
    points: Points
    params: Params
    roof_source: str  # one of ROOF_SOURCES
    roof_note: str
    critical_batch: float | None
    fitted_tpot_ms: tuple[float, ...]
    residual_pct: tuple[float, ...]  # (measured / fitted - 1) * 100
    outliers: tuple[int, ...]  # batches whose residual is far outside the rest
    regimes: tuple[str, ...]  # per point
    predictions: tuple[Prediction, ...]
    knees_fitted: dict[str, kn.Knee]
    knees_measured: dict[str, kn.Knee]
    knee_batch: int | None
    knee_rule: str | None
    param_intervals: dict[str, tuple[float, float] | None]
    warnings: tuple[str, ...]
    notes: tuple[str, ...]
    n_bootstrap: int
    seed: int
    fit_overhead: bool
    weight_bytes: int | None = None
    kv_bytes_per_seq: int | None = None
    flops_per_token: float | None = None
    max_tpot_ms: float | None = None
    _boot: FloatArray | None = field(default=None, repr=False, compare=False)

    @property
    def roof_known(self) -> bool:
        return self.roof_source != "unknown"

    def step_ms(self, batch: npt.ArrayLike) -> FloatArray:
        return self.params.step_ms(batch)

    @property
    def weight_bandwidth_bytes_s(self) -> float | None:
        """Bandwidth equivalent of a: the weight bytes read in a (an upper bound on the time
        spent reading them, so a lower bound on the bandwidth achieved)."""
        if self.weight_bytes is None:
            return None
        return self.weight_bytes / (self.params.a_ms / 1e3)

    @property
    def kv_bandwidth_bytes_s(self) -> float | None:
        if self.kv_bytes_per_seq is None:
            return None
        return self.kv_bytes_per_seq / (self.params.b_ms / 1e3)

    @property
    def achieved_flops(self) -> float | None:
        """FLOP/s implied by a measured roof (data or a known critical batch); None when c
        is the cost model's own assumption or unknown."""
        if self.flops_per_token is None or self.params.c_ms is None \
                or self.roof_source not in ("data", "critical-batch"):
            return None
        return self.flops_per_token / (self.params.c_ms / 1e3)

    def params_dict(self) -> dict[str, Any]:
        p = self.params
        cross = p.crossover_batch
        plateau = 1e3 / p.c_ms if p.c_ms is not None and cross is not None else None
        return {
            "a_ms": p.a_ms, "b_ms": p.b_ms, "c_ms": p.c_ms, "overhead_ms": p.overhead_ms,
            "b_star": p.b_star, "crossover_batch": cross,
            "roof": self.roof_source, "roof_note": self.roof_note,
            "critical_batch": self.critical_batch,
            "plateau_tok_s": plateau,
            "memory_ceiling_tok_s": 1e3 / p.b_ms,
            "weight_bandwidth_bytes_s": self.weight_bandwidth_bytes_s,
            "kv_bandwidth_bytes_s": self.kv_bandwidth_bytes_s,
            "achieved_flops": self.achieved_flops,
            "intervals": {k: (list(v) if v else None) for k, v in self.param_intervals.items()},
            "interval_pct": list(INTERVAL_PCT), "n_bootstrap": self.n_bootstrap,
            "seed": self.seed, "loss": f"{LOSS} on log(step), scale {LOSS_SCALE}",
            "model": "step_ms(B) = overhead_ms + max(a_ms + b_ms*B, c_ms*B)",
        }

    def to_dict(self) -> dict[str, Any]:
        """The `bstar fit --json` contract (DESIGN.md) plus points, knees, warnings."""
        regime_at = {str(b): r for b, r in zip(self.points.batch, self.regimes, strict=True)}
        for pr in self.predictions:
            regime_at[str(pr.batch)] = pr.regime
        pts = self.points
        return {
            "params": self.params_dict(),
            "knee_batch": self.knee_batch,
            "knee_rule": self.knee_rule,
            "predictions": [pr.to_dict() for pr in self.predictions],
            "regime_at": regime_at,
            "points": [{"batch": pts.batch[i], "throughput_tok_s": pts.throughput_tok_s[i],
                        "tpot_ms": pts.tpot_ms[i], "derived": pts.derived[i] or None,
                        "fitted_tpot_ms": self.fitted_tpot_ms[i],
                        "residual_pct": self.residual_pct[i], "regime": self.regimes[i],
                        "outlier": pts.batch[i] in self.outliers}
                       for i in range(len(pts))],
            "knees": {"fitted": {k: v.to_dict() for k, v in self.knees_fitted.items()},
                      "measured": {k: v.to_dict() for k, v in self.knees_measured.items()}},
            "warnings": list(self.warnings),
            "notes": list(self.notes),
            "source": pts.source,
        }


def _regime(p: Params, batch: float, roof_known: bool, past_data: bool) -> str:
    if p.c_ms is None:
        return "unknown" if (past_data and not roof_known) else "memory-bound"
    return "compute-bound" if p.c_ms * batch > p.a_ms + p.b_ms * batch else "memory-bound"


def fit_points(points: Points, *, predict: Sequence[int] = (),
               critical_batch: float | None = None, compute_ms_per_seq: float | None = None,
               fit_overhead: bool = False, knee_step: float = kn.DEFAULT_STEP,
               knee_doubling: float = kn.DEFAULT_DOUBLING, max_tpot_ms: float | None = None,
               bca_epsilon_tok_s: float | None = None,
               bca_epsilon_fraction: float = kn.DEFAULT_BCA_EPSILON_FRACTION,
               bca_latency_factor: float = kn.DEFAULT_BCA_LATENCY_FACTOR,
               bca_reference_batch: float = kn.DEFAULT_BCA_REFERENCE_BATCH,
               n_bootstrap: int = DEFAULT_BOOTSTRAP, seed: int = 0,
               weight_bytes: int | None = None, kv_bytes_per_seq: int | None = None,
               flops_per_token: float | None = None) -> FitResult:
    """Fit `points`, predict at `predict` (default: 2x and 4x the largest measured batch),
    find the knees. The roof comes from, in order: `critical_batch` (a known roof: the batch
    where the memory line meets the compute line), the data (when they reach it),
    `compute_ms_per_seq` (the cost model's compute term, ms per sequence per step), or stays
    unknown. `weight_bytes`, `kv_bytes_per_seq`, `flops_per_token` (from --model) only turn
    a, b, c into bandwidths and FLOP/s for display."""
    if len(points) < MIN_POINTS:
        raise BstarError(f"need at least {MIN_POINTS} points, got {len(points)}")
    if critical_batch is not None and not critical_batch > 0:
        raise BstarError(f"--critical-batch must be positive, got {critical_batch}")
    if compute_ms_per_seq is not None and not compute_ms_per_seq > 0:
        raise BstarError("the compute term must be positive")
    if n_bootstrap < 0:
        raise BstarError("the number of bootstrap resamples must not be negative")
    for q in predict:
        if q < 1:
            raise BstarError(f"--predict batch sizes must be at least 1, got {q}")
    b = np.array(points.batch, dtype=np.float64)
    y = np.log(np.array(points.tpot_ms, dtype=np.float64))
    warnings = list(points.warnings)
    notes: list[str] = []

    mem_mode = _Mode("none", overhead=False)
    mem_fit, _ = _solve(mem_mode, b, y, _line_start(b, np.exp(y)))
    check = _check_roof(b, y, mem_fit, fit_overhead)

    if critical_batch is not None:
        mode = _Mode("tied", critical_batch=critical_batch)
        roof_source = "critical-batch"
        below = b <= critical_batch
        start = _line_start(b[below], np.exp(y[below])) if below.sum() >= 2 else mem_fit
        params, _ = _solve(mode, b, y, start)
        assert params.c_ms is not None
        roof_note = (f"known roof at B={critical_batch:g}: c = (a + b*{critical_batch:g})/"
                     f"{critical_batch:g} = step({critical_batch:g})/{critical_batch:g} = "
                     f"{params.c_ms:.4g} ms per sequence; past it TPOT = c*B and throughput "
                     f"stays at {1e3 / params.c_ms:,.0f} tok/s")
        if int((b < critical_batch).sum()) < 2:
            warnings.append(f"fewer than two points lie below --critical-batch "
                            f"{critical_batch:g}: a and b are not separately determined, only "
                            "step on the roof is")
        if check.identified and check.params is not None:
            seen = check.params.crossover_batch
            if seen is not None and abs(math.log(seen / critical_batch)) > math.log(1.25):
                warnings.append(f"the data put the roof near B={seen:.0f}, not at the given "
                                f"--critical-batch {critical_batch:g}; using the given one")
        if fit_overhead:
            warnings.append("--fit-overhead needs the roof fitted from the data; overhead "
                            "fixed at 0")
    elif check.identified:
        assert check.params is not None
        mode = _Mode("free", overhead=fit_overhead)
        params = check.params
        roof_source = "data"
        roof_note = f"roof fitted from the data: {check.reason}"
        if compute_ms_per_seq is not None:
            notes.append(f"the cost model's compute term is {compute_ms_per_seq:.4g} ms per "
                         f"sequence; the data say c = {params.c_ms:.4g} ms (the data win)")
    else:
        if fit_overhead:
            warnings.append("--fit-overhead needs points past the roof; overhead fixed at 0")
        if compute_ms_per_seq is not None:
            mode = _Mode("fixed", c_ms=compute_ms_per_seq)
            params, _ = _solve(mode, b, y, mem_fit)
            roof_source = "cost-model"
            cross = params.crossover_batch
            roof_note = (f"roof from the cost model's compute term (the data do not reach it: "
                         f"{check.reason}): c = {compute_ms_per_seq:.4g} ms per sequence, "
                         + (f"meeting the memory line at B={cross:.0f}" if cross is not None
                            else f"below b = {params.b_ms:.4g} ms, so compute never binds: "
                                 "memory-bound at any batch"))
        else:
            mode = _Mode("none")
            params = mem_fit
            roof_source = "unknown"
            roof_note = (f"the plateau cannot be determined from these points ({check.reason})"
                         "; past the data, predictions are a lower bound on TPOT and an upper "
                         "bound on throughput. Give --critical-batch N or --model/--gpu for a "
                         "roof")

    fitted = params.step_ms(b)
    resid = np.array(points.tpot_ms) / fitted - 1.0
    lr = np.log(np.array(points.tpot_ms)) - np.log(fitted)
    sigma = 1.4826 * float(np.median(np.abs(lr)))
    outliers = tuple(int(x) for x, r in zip(b, lr, strict=True)
                     if abs(r) > max(3 * sigma, LOSS_SCALE))
    if outliers:
        notes.append(f"down-weighted as outliers by the robust loss: B="
                     f"{', '.join(map(str, outliers))}")
    b_last = float(b[-1])
    regimes = tuple(_regime(params, x, roof_source != "unknown", False) for x in b)

    # Bootstrap: resample the log residuals onto the fit and refit (seeded).
    rng = np.random.default_rng(seed)
    boot: list[Params] = []
    for _ in range(n_bootstrap):
        y_star = np.log(fitted) + rng.choice(lr, size=lr.size, replace=True)
        boot.append(_solve(mode, b, y_star, params)[0])

    def interval(f: Callable[[Params], float]) -> tuple[float, float] | None:
        if not boot:
            return None
        vals = np.array([f(p) for p in boot])
        lo, hi = np.percentile(vals, INTERVAL_PCT)
        return float(lo), float(hi)

    param_intervals: dict[str, tuple[float, float] | None] = {
        "a_ms": interval(lambda p: p.a_ms), "b_ms": interval(lambda p: p.b_ms),
        "c_ms": (interval(lambda p: p.c_ms or math.nan) if mode.kind in ("free", "tied")
                 else None),
        "b_star": interval(lambda p: p.b_star)}
    if mode.overhead:
        param_intervals["overhead_ms"] = interval(lambda p: p.overhead_ms)

    queries = list(predict) if predict else [int(2 * b_last), int(4 * b_last)]
    preds = tuple(_predict(params, boot, q, b_last, roof_source) for q in queries)

    # Knees on the fitted curve (powers of two; only over the data when the roof is unknown)
    # and on the measured points.
    top = b_last if roof_source == "unknown" else max([b_last, *queries])
    grid = np.array(kn.pow2_grid(top), dtype=np.float64)
    step_grid = params.step_ms(grid)
    kw: dict[str, Any] = {"step": knee_step, "doubling": knee_doubling,
                          "bca_epsilon_tok_s": bca_epsilon_tok_s,
                          "bca_epsilon_fraction": bca_epsilon_fraction,
                          "bca_latency_factor": bca_latency_factor,
                          "bca_reference_batch": bca_reference_batch}
    knees_fitted = kn.all_knees(grid, 1e3 * grid / step_grid, step_grid, **kw)
    if max_tpot_ms is not None:
        dense = np.arange(1, min(int(top), MAX_SLA_GRID) + 1, dtype=np.float64)
        knees_fitted["sla"] = kn.sla_knee(dense, params.step_ms(dense), max_tpot_ms,
                                          "fitted per-request TPOT")
    knees_measured = kn.all_knees(b, np.array(points.throughput_tok_s),
                                  np.array(points.tpot_ms), max_tpot_ms=max_tpot_ms, **kw)
    if roof_source == "unknown":
        notes.append(f"knees on the fitted curve are searched up to the last point "
                     f"(B={b_last:g}); past it the curve is only a bound")
    rec = Recommendation.from_curve(
        "fitted", [int(x) for x in grid], knees_fitted,
        [SlaBound(knees_fitted["sla"], f"TPOT <= {max_tpot_ms:g} ms")]
        if max_tpot_ms is not None else [])
    # The fit's knee is the recommendation's pick; none when no rule fired or no batch
    # meets the SLA (then the rule is "sla").
    knee_batch = None if rec.bound in ("none", "sla-unmet") else rec.max_num_seqs
    knee_rule = rec.rule

    return FitResult(
        points=points, params=params, roof_source=roof_source, roof_note=roof_note,
        critical_batch=critical_batch, fitted_tpot_ms=tuple(float(x) for x in fitted),
        residual_pct=tuple(float(x) * 100 for x in resid), outliers=outliers,
        regimes=regimes, predictions=preds, knees_fitted=knees_fitted,
        knees_measured=knees_measured, knee_batch=knee_batch, knee_rule=knee_rule,
        param_intervals=param_intervals, warnings=tuple(warnings), notes=tuple(notes),
        n_bootstrap=n_bootstrap, seed=seed, fit_overhead=fit_overhead and mode.overhead,
        weight_bytes=weight_bytes, kv_bytes_per_seq=kv_bytes_per_seq,
        flops_per_token=flops_per_token, max_tpot_ms=max_tpot_ms)


def _predict(params: Params, boot: list[Params], batch: int, b_last: float,
             roof_source: str) -> Prediction:
    x = float(batch)
    tpot = float(params.step_ms(x))
    if boot:
        samples = np.array([float(p.step_ms(x)) for p in boot])
        lo, hi = (float(v) for v in np.percentile(samples, INTERVAL_PCT))
        last_hi = float(np.percentile([float(p.step_ms(b_last)) for p in boot],
                                      INTERVAL_PCT[1]))
    else:
        lo = hi = tpot
        last_hi = float(params.step_ms(b_last))
    past = x > b_last
    bound = None
    if past and roof_source == "unknown":
        # The roof is at or above the data: c <= step(B_last)/B_last, so the worst case
        # is the roof right at the last point, TPOT = step(B_last) * B / B_last.
        hi = max(hi, last_hi * x / b_last)
        bound = "tpot_lower_bound"
    lo, hi = min(lo, tpot), max(hi, tpot)
    return Prediction(batch=batch, tpot_ms=tpot, throughput_tok_s=1e3 * x / tpot,
                      tpot_low_ms=lo, tpot_high_ms=hi, throughput_low_tok_s=1e3 * x / hi,
                      throughput_high_tok_s=1e3 * x / lo,
                      regime=_regime(params, x, roof_source != "unknown", past),
                      extrapolated=past, bound=bound)


def spec_terms(options: DeploymentOptions, context_tokens: int | None = None
               ) -> dict[str, Any]:
    """From the model (and GPU) of `options`: the weight, KV and FLOP figures that give a,
    b and c a physical reading, and with a GPU the cost model's compute term, ms per
    sequence, at `context_tokens` (default 512). Empty without a model."""
    if options.model is None:
        if options.gpu is not None:
            raise BstarError("--gpu needs --model: the compute term is the model's FLOPs at "
                             "the GPU's peak")
        return {}
    from bstar.specs.precision import get_precision
    from bstar.specs.presets import get_model

    m = get_model(options.model)
    ctx = context_tokens or 512
    kv = get_precision(options.kv_dtype)
    out: dict[str, Any] = {
        "weight_bytes": m.weight_bytes(get_precision(options.weight_dtype or m.default_dtype)),
        "flops_per_token": float(2 * m.matmul_params_per_token
                                 + m.attention_flops_per_token(ctx)),
        "context": ctx, "model_name": m.name}
    if context_tokens is not None:
        out["kv_bytes_per_seq"] = m.kv_bytes_per_seq(ctx, kv)
    if options.gpu is not None:
        from bstar import roofline as rl

        d = options.build()
        one = rl.decode_step(d, [1], ctx)
        out["compute_ms_per_seq"] = float(one.compute_s[0]) * 1e3
        out["gpu_name"] = d.gpu.id
        out["flops_eff"] = d.eff.compute
    return out
