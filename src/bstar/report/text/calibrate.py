"""`bstar calibrate`: the fitted parameters beside their priors, every point measured,
calibrated and uncalibrated, the repeats' spread, and each `--check` run's errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bstar.units import GiB


def param_unit(name: str) -> tuple[float, str]:
    """How a parameter is shown: the scale from its stored unit and the unit's name."""
    if name == "overhead_s":
        return 1e3, " ms"
    if name.endswith("_s"):
        return 1e6, " us"
    return (1.0, " B") if name == "score_bytes" else (1.0, "")


def print_calibration(c: Any, profile: Path | None, spread: list[dict[str, Any]],
                      checks: list[tuple[str, str, list[Any], float, float]],
                      power: Any = None) -> None:
    """A `calibrate.Calibration`, the profile written (`profile`), the repeated batches'
    spread, per check (run, model, points, median |error| calibrated and not), and the
    power curve fitted to the sweep's GPU power (`calibrate.power.PowerCalibration`)."""
    from bstar.report.text._common import clean_text

    if power is not None:
        f = power.fit
        print(f"power curve: idle {f.idle_w:.0f} W + ({f.tdp_w:.0f} W TDP - idle) x u^"
              f"{f.exponent:.2f}, fitted to {f.points} levels' GPU power (rms "
              f"{f.rms_error_w:.1f} W; docs/energy.md)")

    print(f"calibration of {clean_text(c.model)} on {clean_text(c.gpu)} "
          f"(weights {c.weight_dtype}, KV {c.kv_dtype})"
          f"{', ' + clean_text(c.engine) if c.engine else ''} "
          f"{clean_text(c.engine_version)}".rstrip())
    print(f"  {'parameter':<20}{'value':>12}  {'1 sigma':<18}prior")
    for k, p in c.params.items():
        scale, u = param_unit(k)
        sd = f"{p.std * scale:.3g}" if p.std is not None else p.status
        print(f"  {k:<20}{p.value * scale:>12.4g}  {sd:<18}{p.prior * scale:g}{u}")
    print_step_points(list(c.points))
    print(f"  median |error| {c.median_abs_error:.1%} calibrated (max {c.max_abs_error:.1%}), "
          f"{c.uncalibrated_median_abs_error:.1%} uncalibrated")
    if spread:
        print("  repeated batches (every repeat is fitted; spread = (max - min) / mean):")
    for r in spread:
        print(f"    batch {r['batch']} context {r['context_tokens']}: {r['n']} repeats, "
              f"{r['min_ms']:.4g}..{r['max_ms']:.4g} ms, spread {r['rel_spread']:.1%}, "
              f"sd {r['std_ms']:.3g} ms")
    if c.reserve_bytes is not None:
        print(f"  KV pool {c.kv_pool_bytes / GiB:.2f} GiB from the log -> reserve "
              f"{c.reserve_bytes / GiB:.2f} GiB")
    for n in c.notes:
        print(f"  note: {clean_text(n, 1000)}")
    if profile is not None:
        print(f"wrote {profile}; use it with --profile {profile}")
    for run, model, pts, median, median_uncalibrated in checks:
        print(f"check: run {clean_text(run)}, model {clean_text(model)}, predicted with the "
              "calibration")
        print_step_points(pts)
        print(f"  median |error| {median:.1%} calibrated, "
              f"{median_uncalibrated:.1%} uncalibrated")


def print_step_points(points: list[Any]) -> None:
    """A line per point: batch, context (and chunk for mixed steps), the measured step,
    calibrated and uncalibrated predictions with their errors, and the bound."""
    mixed = any(getattr(p, "chunk_tokens", 0) for p in points)
    chunk_head = f"{'chunk':>7}" if mixed else ""
    print(f"  {'batch':>6}{'context':>9}{chunk_head}{'measured ms':>13}{'calibrated':>12}"
          f"{'error':>8}{'uncalibrated':>14}{'error':>8}  bound")
    for p in points:
        chunk = f"{p.chunk_tokens or '':>7}" if mixed else ""
        print(f"  {p.batch:>6}{p.context_tokens:>9}{chunk}{p.measured_ms:>13.3f}"
              f"{p.predicted_ms:>12.3f}{p.rel_error:>+8.1%}{p.uncalibrated_ms:>14.3f}"
              f"{p.uncalibrated_rel_error:>+8.1%}  {p.bound}")
