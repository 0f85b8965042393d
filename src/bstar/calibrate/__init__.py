"""Calibrate the cost model to measured decode steps: efficiencies and per-step overhead.

The roofline (bstar.roofline) predicts a decode step at batch B and context s as

    step_s = max(bytes(B, s) / (BW * eta_bw), flops(B, s) / (peak * eta_fl))
             + comm_s(B) + overhead_s + overhead_per_seq_s * B

Bytes, FLOPs and communication are exact for a given model and deployment; what a real
engine on real hardware adds is captured by four numbers: eta_bw, eta_fl, overhead_s and
overhead_per_seq_s. This package fits them to measured (B, s, step time) points by robust
nonlinear least squares on the log of the step time (relative errors: a 10% miss at batch
1 counts as much as at batch 64), within bounds (overheads >= 0; efficiencies in (0, 1]
against a datasheet GPU, up to MAX_EFF_MEASURED against a probed one, the excess filed as
a scale on the GPU's figures), and reports each parameter's 1-sigma uncertainty and every
point's residual.

Identifiability, stated rather than hidden: a parameter whose term never sets any point's
step time (eta_fl when every point is memory-bound) has a zero column in the Jacobian; it
is reported as not identified and takes the value nearest its prior that fits; parameters
in an exact trade-off (a null direction of the Jacobian) are reported as tied. Compute
efficiency and the per-sequence overhead are both linear in B and separate only through
the kink of the max (and through context length or model size); their correlation is
reported.

The modules: `params` (names, bounds, units of what is fitted), `fit` (the fit and the
calibrated prediction, `check`), `results` (`Calibration` and the statistics over its
points), `vllm_log` (the KV pool from a vLLM start-up log), `profiles` (the profile file).
The measured steps are `bstar.fit.steps.Point`, read by `bstar.fit.points` (the one point
reader). Pure: no I/O here beyond `load_profile` (a small TOML reader, the mirror of
`profile_toml`).
"""

from __future__ import annotations

from bstar.calibrate.fit import (
    EfficiencyFit,
    calibrate,
    calibrate_own_levels,
    check,
    fit_efficiency,
    fit_steps,
    predict_step_s,
)
from bstar.calibrate.fit import _unique_shapes as _unique_shapes
from bstar.calibrate.params import _FOLLOWS as _FOLLOWS
from bstar.calibrate.params import _SCALE as _SCALE
from bstar.calibrate.params import _UPPER as _UPPER
from bstar.calibrate.params import (
    DEFAULT_FIT,
    MAX_EFF_MEASURED,
    MIXED_FIT,
    PARAMS,
    ROBUST_SCALE,
    scaled,
)
from bstar.calibrate.profiles import Profile, load_profile, profile_from_text, profile_toml
from bstar.calibrate.results import (
    Calibration,
    ParamFit,
    PointFit,
    median_abs_error,
    repeat_spread,
)
from bstar.calibrate.vllm_log import (
    VllmKvLog,
    kv_pool_from_log,
    parse_vllm_log,
    reserve_from_kv_pool,
)
from bstar.fit.points import points_from_fit, steps_from_sweep
from bstar.fit.steps import Point

# The public API; validation (validate_stages.py) and tests also reach for _FOLLOWS, _SCALE,
# _UPPER and _unique_shapes, re-exported above by name.
__all__ = [
    "DEFAULT_FIT", "MAX_EFF_MEASURED", "MIXED_FIT", "PARAMS", "ROBUST_SCALE", "Calibration",
    "EfficiencyFit", "ParamFit", "Point", "PointFit", "Profile", "VllmKvLog", "calibrate",
    "calibrate_own_levels",
    "check", "fit_efficiency", "fit_steps", "kv_pool_from_log", "load_profile",
    "median_abs_error", "parse_vllm_log", "points_from_fit", "predict_step_s",
    "profile_from_text", "profile_toml",
    "repeat_spread", "reserve_from_kv_pool", "scaled", "steps_from_sweep",
]
