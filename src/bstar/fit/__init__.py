"""Fit measured (batch, throughput, TPOT) points with the cost model's shape, extrapolate with
stated confidence, find the knee. Pure computation except `load_points` (reads one file);
scipy (a base dependency) is imported inside the functions that need it.

The model is the roofline of a decode step (docs/cost-model.md, bstar.roofline) reduced to three
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

from bstar.fit.model import (
    LOSS,
    LOSS_SCALE,
    ROOF_MIN_EXCESS,
    ROOF_SIGMAS,
    Params,
    RoofCheck,
)
from bstar.fit.points import (
    COLUMNS,
    CONFLICT_TOLERANCE,
    MIN_POINTS,
    Points,
    load_points,
    make_points,
    points_from_rows,
    points_from_sweep,
    read_table,
)
from bstar.fit.result import INTERVAL_PCT, ROOF_SOURCES, FitResult, Prediction
from bstar.fit.run import DEFAULT_BOOTSTRAP, KneeRules, fit_points
from bstar.fit.spec import spec_terms
from bstar.fit.sweep import fit_sweep, prefill_aware, with_prefill

__all__ = [
    "COLUMNS", "CONFLICT_TOLERANCE", "DEFAULT_BOOTSTRAP", "INTERVAL_PCT", "LOSS", "LOSS_SCALE",
    "MIN_POINTS", "ROOF_MIN_EXCESS", "ROOF_SIGMAS", "ROOF_SOURCES", "FitResult", "KneeRules",
    "Params", "Points", "Prediction", "RoofCheck", "fit_points", "fit_sweep", "load_points",
    "make_points", "points_from_rows", "points_from_sweep", "prefill_aware", "read_table",
    "spec_terms", "with_prefill",
]
