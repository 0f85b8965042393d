"""`bstar validate`: the planner against measurements, as plain text. Three tables: whole
curves (per GPU x engine, per model, the knees), load stages (a line a stage, then the
errors and states per way of predicting) and rows (one line a measurement)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

# Names in a validation table come from the user's file: printed as data.
from bstar.report.text._common import clean_text as ct

if TYPE_CHECKING:
    from bstar.validate import Validation
    from bstar.validate_curves import CurvesValidation


def pct(x: float | None) -> str:
    """An |error| as a percentage, 6 wide; '-' when there is none."""
    return "     -" if x is None else f"{x * 100:5.1f}%"


def signed_pct(x: float | None) -> str:
    """A signed error, 6 wide: one decimal under 10%, none from there."""
    return "     -" if x is None else f"{x * 100:+5.0f}%" if abs(x) >= 9.995 \
        else f"{x * 100:+5.1f}%"


# ---- curves -----------------------------------------------------------------------------
def print_curves_validation(v: CurvesValidation, num_rows: int) -> None:
    """Per GPU x engine and metric the median |error| of each way (generic, profile,
    leave-one-model-out), per model, then the knees measured and predicted."""
    print(f"median |predicted / measured - 1| per GPU x engine ({num_rows} rows; "
          "step = decode step vs measured step/ITL/TPOT; throughput = output tok/s "
          "incl. prefill)")
    print(f"  {'gpu':<28}{'engine':<12}{'metric':<18}{'rows':>5}{'generic':>9}"
          f"{'profile':>9}{'LOMO':>8}")
    for g in v.groups:
        for k, m in g.metrics.items():
            d: dict[str, Any] = m.to_dict()
            print(f"  {ct(Path(g.gpu).name)[-27:]:<28}{ct(g.engine):<12}{k:<18}{d['rows']:>5}"
                  f"{pct(d['generic']):>9}{pct(d['uncalibrated']):>9}{pct(d['lomo']):>8}")
        for mdl, errs in g.model_uncalibrated.items():
            lomo = g.model_lomo.get(mdl, {})
            print(f"      {mdl}: " + ", ".join(
                f"{k} profile {pct(e).strip()}"
                + (f", left out {pct(lomo.get(k)).strip()}" if lomo else "")
                for k, e in errs.items()))
        if g.model_lomo:
            print(f"      worst model left out: {pct(g.worst_model_lomo).strip()} "
                  f"(fitting {', '.join(g.fit)} from the generic defaults)")
        for n in g.notes:
            print(f"      note: {n}")
    if v.knees:
        print("knees (seed 004's doubling rule on measured vs predicted throughput, same "
              "grid; profile predictions)")
        for k in v.knees:
            print(f"  {ct(k.curve):<42.42} {ct(Path(k.gpu).name)[-27:]:<28} measured "
                  f"{k.measured_knee if k.measured_knee is not None else '-':>5}  predicted "
                  f"{k.predicted_knee if k.predicted_knee is not None else '-':>5}  "
                  f"{k.grid_steps_apart} grid step(s) apart")
        within, n = v.knees_within_one_step
        print(f"  curves whose measured throughput has a knee: {n}; predicted knee within "
              f"one grid step on {within}")
    for s in v.skipped:
        print(f"  skipped {ct(s['model'])} on {ct(s['gpu'])}: {ct(s['reason'], 400)}")


# ---- load stages ------------------------------------------------------------------------
WAYS = (("generic", "generic"), ("profile", "profile"), ("lomo", "LOMO"), ("logo", "LOGO"))
METRIC_NAMES = (("e2e_mean_ms", "E2E"), ("ttft_mean_ms", "TTFT"),
                ("tpot_mean_ms", "per-token"))


def state_word(s: str) -> str:
    """A saturation state in its column's width: 'steady' or 'growing'."""
    return {"steady": "steady", "queue growing": "growing"}.get(s, s)


def print_stages_validation(v: dict[str, Any]) -> None:
    print(format_stages_validation(v))


def format_stages_validation(v: dict[str, Any]) -> str:
    """The load-stage validation (`StagesValidation.to_dict()`) as terminal text: one line
    per stage (measured means, the profile's and LOMO's errors, states), then per GPU x
    engine the mean / median |error| of each way and the states it gets right."""
    st = v["settings"]
    out = [f"load stages, each simulated like for like (at most {st['max_window_s']:g} s of "
           f"its arrivals, the first {st['warmup_fraction']:.0%} of requests left out); "
           "error = predicted / measured - 1",
           f"state: 'growing' when TTFT grows faster than {st['growth_limit']:g} s per s of "
           f"the stage or over {st['failed_limit']:.0%} of requests failed, else 'steady'"]
    for g in v["groups"]:
        out += _stage_group_lines(g)
    out += _speculative_lines(v.get("speculative") or [])
    for s in v["skipped"]:
        out.append(f"  skipped {s['stage']} ({s['model']} on {s['gpu']}): {s['reason']}")
    return "\n".join(out)


def _speculative_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Per speculative run: the acceptance its measured TPOT implies, the one used (and how),
    TPOT measured and predicted, the speedup predicted and, with a measured twin, measured."""
    if not rows:
        return []
    out = ["", "speculative runs: acceptance implied (simulated TPOT = measured) and used; "
               "speedup = TPOT without / with speculation",
           f"  {'run':<56}{'K':>3}{'implied':>9}{'used':>7}{'TPOT ms':>9}{'pred':>7}"
           f"{'err':>7}{'speedup pred':>14}{'meas':>7}"]
    for r in rows:
        meas = r["measured_speedup"]
        out.append(f"  {r['stage'][:55]:<56}{r['num_speculative_tokens']:>3}"
                   f"{r['implied_acceptance']:>9.3f}{r['acceptance']:>7.3f}"
                   f"{r['measured_tpot_ms']:>9.1f}{r['predicted_tpot_ms']:>7.1f}"
                   f"{signed_pct(r['predicted_tpot_ms'] / r['measured_tpot_ms'] - 1):>7}"
                   f"{r['predicted_speedup'] or 0:>13.2f}x"
                   + (f"{meas:>6.2f}x" if meas else f"{'-':>7}"))
    bases = sorted({r["acceptance_basis"] for r in rows})
    out += [f"  acceptance used: {b}" for b in bases]
    if not any(r["measured_speedup"] for r in rows):
        out.append("  no speculative run has a measured twin without speculation (same "
                   "engine, layout, lengths and concurrency): no measured speedup")
    return out


def _stage_group_lines(g: dict[str, Any]) -> list[str]:
    """One GPU x engine: its heading, a line per stage, the summary of each way."""
    ways = [(k, name) for k, name in WAYS if k in g["summary"]]
    lomo = (f"; LOMO fits {', '.join(g['fit'])} without the stage's model"
            if "lomo" in g["summary"] else "") + _logo_heading(g)
    out = ["", f"{Path(g['gpu']).name} x {g['engine']} (profile {g['profile']}, "
               f"{g['profile_basis']}{lomo})"]
    hdr = f"  {'stage':<31}{'load':>9}  {'state meas':<11}"
    hdr += "".join(f"{'pred ' + name:<15}" for k, name in ways if k != "generic")
    for _, m in METRIC_NAMES:
        hdr += f"{m + ' ms':>15}" + "".join(f"{name:>9}" for k, name in ways
                                             if k != "generic")
    out.append(hdr)
    out += [_stage_line(s, ways) for s in g["stages"]]
    n_steady = next(iter(g["summary"].values()))["latency_stages"]
    out.append(f"  mean / median |error| over the {n_steady} stages measured steady; "
               f"states right of {len(g['stages'])}")
    for k, name in ways:
        sm = g["summary"][k]
        line = f"    {name:<9}"
        for key, m in METRIC_NAMES:
            line += (f"  {m} {pct(sm[key]['mean']).strip()} / "
                     f"{pct(sm[key]['median']).strip()}")
        line += f"   states {sm['states_right']}/{sm['states_total']}"
        if sm["wrong_states"]:
            line += f" (wrong: {', '.join(sm['wrong_states'])})"
        out.append(line)
    for m, e in g["lomo_eff"].items():
        out.append(f"    LOMO without {m}: " + ", ".join(f"{k} = {x:.4g}"
                                                     for k, x in e.items()))
    out += _logo_lines(g)
    out += [f"    note: {n}" for n in g["notes"]]
    return out


def _stage_line(s: dict[str, Any], ways: list[tuple[str, str]]) -> str:
    """One stage: its load, the measured and predicted states, each metric measured and
    each way's error, and the TTFT growth where a state is not steady."""
    predicted = [(k, name) for k, name in ways if k != "generic"]
    load = (f"{s['rate_req_s']:g}/s" if s["rate_req_s"] is not None
            else f"{s['concurrency']} users")
    meas = s["measured"]
    line = f"  {s['stage'][:30]:<31}{load:>9}  {state_word(meas['state']):<11}"
    for k, _ in predicted:
        p = s["predicted"].get(k)
        mark = "" if p is None else (" ok" if p["state_right"] else " WRONG")
        line += f"{(state_word(p['state']) if p else '-') + mark:<15}"
    for key, _ in METRIC_NAMES:
        line += f"{meas[key]:>15.1f}"
        for k, _ in predicted:
            p = s["predicted"].get(k)
            line += f"{signed_pct(p['errors'].get(key) if p else None):>9}"
    if not s["latency_scored"]:
        line += "  (overloaded: state only)"
    growing = [k for k, _ in ways if s["predicted"].get(k)
               and s["predicted"][k]["state"] != "steady"]
    if growing or meas["state"] != "steady":
        g_meas = meas.get("ttft_growth")
        line += "  TTFT growth/s: meas " + (
            "-" if g_meas is None else f"{g_meas:.3g}") + "".join(
            f", {name} {s['predicted'][k]['ttft_growth']:.3g}" for k, name in predicted
            if s["predicted"].get(k))
    return line


# ---- closed-loop runs -------------------------------------------------------------------
RUN_METRICS = (("tpot_mean_ms", "TPOT"), ("ttft_mean_ms", "TTFT"), ("e2e_mean_ms", "E2E"),
               ("output_tok_s_per_gpu", "tok/s/GPU"))


def print_runs_validation(v: dict[str, Any]) -> None:
    print(format_runs_validation(v))


def format_runs_validation(v: dict[str, Any]) -> str:
    """The closed-loop run validation (`RunsValidation.to_dict()`) as terminal text: per GPU x
    engine a line per run (each metric measured and each way's error), then per way and per
    model the mean / median |error| of each metric."""
    out = ["closed-loop runs, each simulated like for like (all users start at t = 0, every "
           "request scored); error = predicted / measured - 1"]
    for g in v["groups"]:
        ways = [(k, name) for k, name in WAYS if k in g["summary"]]
        lomo = (f"; LOMO fits {', '.join(g['fit'])} without the run's model"
                if "lomo" in g["summary"] else "") + _logo_heading(g)
        out += ["", f"{Path(g['gpu']).name} x {g['engine']} (profile {g['profile']}, "
                    f"{g['profile_basis']}{lomo})"]
        hdr = f"  {'run':<44}"
        for _, m in RUN_METRICS:
            hdr += f"{m:>11}" + "".join(f"{name:>8}" for _, name in ways)
        out.append(hdr)
        for s in g["stages"]:
            line = f"  {s['stage'][:43]:<44}"
            for key, _ in RUN_METRICS:
                x = s["measured"].get(key)
                line += f"{x:>11.1f}" if x is not None else f"{'-':>11}"
                for k, _ in ways:
                    p = s["predicted"].get(k)
                    line += f"{signed_pct(p['errors'].get(key) if p else None):>8}"
            out.append(line)
        out.append("  mean / median |error|")
        for k, name in ways:
            sm = g["summary"][k]
            out.append(f"    {name:<9}" + "".join(
                f"  {m} {pct(sm[key]['mean']).strip()} / {pct(sm[key]['median']).strip()}"
                for key, m in RUN_METRICS)
                + (f"  TTFT p50 {pct(sm['ttft_median_ms']['mean']).strip()} / "
                   f"{pct(sm['ttft_median_ms']['median']).strip()}"
                   if "ttft_median_ms" in sm else ""))
        if len(g["models"]) > 1:
            out += _run_model_lines(g, ways)
        for m, e in g["lomo_eff"].items():
            out.append(f"    LOMO without {m}: " + ", ".join(f"{k} = {x:.4g}"
                                                         for k, x in e.items()))
        out += _logo_lines(g)
        out += [f"    note: {n}" for n in g["notes"]]
    out += _speculative_lines(v.get("speculative") or [])
    for s in v["skipped"]:
        out.append(f"  skipped {s['stage']} ({s['model']} on {s['gpu']}): {s['reason']}")
    return "\n".join(out)


def _logo_heading(g: dict[str, Any]) -> str:
    """The heading's words for the leave-one-GPU-out way, where the group has it."""
    if "logo" not in g["summary"]:
        return ""
    return (f"; LOGO fits {', '.join(g['fit'])} on {g['engine']}'s rows of "
            f"{', '.join(Path(x).name for x in g.get('logo_gpus') or [])} only")


def _logo_lines(g: dict[str, Any]) -> list[str]:
    """The terms the leave-one-GPU-out fit found."""
    if not g.get("logo_eff"):
        return []
    return ["    LOGO (fitted on " + ", ".join(Path(x).name for x in g["logo_gpus"]) + "): "
            + ", ".join(f"{k} = {x:.4g}" for k, x in g["logo_eff"].items())]


def _run_model_lines(g: dict[str, Any], ways: list[tuple[str, str]]) -> list[str]:
    """Median |error| of each metric per model and way."""
    import statistics

    out = []
    for model in g["models"]:
        for k, name in ways:
            cells = []
            for key, m in RUN_METRICS:
                e = [abs(p["errors"][key]) for s in g["stages"] if s["model"] == model
                     for p in [s["predicted"].get(k)] if p and key in p["errors"]]
                cells.append(f"{m} {pct(statistics.median(e) if e else None).strip()}")
            out.append(f"    {model} {name}: median " + ", ".join(cells))
    return out


# ---- rows -------------------------------------------------------------------------------
def print_rows_validation(v: Validation) -> None:
    """A line per measured row: measured, uncalibrated and leave-one-out calibrated with
    their errors; then the median |error| of each and the efficiencies per GPU x engine."""
    print(f"{'model':<12}{'gpu':<15}{'tp':>3} {'engine':<19}{'in':>5}{'out':>5}{'batch':>6}  "
          f"{'metric':<25}{'measured':>10}{'uncal.':>10}{'err':>7}{'LOO cal.':>10}{'err':>7}")
    for r in v.rows:
        row = r.row
        cal = f"{r.calibrated:>10.4g}{r.calibrated_error:>+7.0%}" if r.calibrated else \
            f"{'-':>10}{'':>7}"
        print(f"{ct(row.model):<12.12}{ct(row.gpu):<15.15}{row.num_gpus:>3} "
              f"{ct(row.engine):<19.19}"
              f"{row.input_len:>5}{row.output_len:>5}{row.batch:>6}  {row.metric:<25}"
              f"{row.value:>10.4g}{r.uncalibrated:>10.4g}{r.uncalibrated_error:>+7.0%}{cal}")
    cal_med = v.calibrated_median_abs_error
    print(f"median |error|: uncalibrated {v.uncalibrated_median_abs_error:.1%}, calibrated "
          f"(leave-one-out per GPU x engine, fitting {','.join(v.fit)}) "
          + (f"{cal_med:.1%}" if cal_med is not None else "n/a"))
    for (gpu, engine), eff in v.group_eff.items():
        print(f"  {ct(gpu)} x {ct(engine)}: bandwidth {eff.bandwidth:.2f}, compute "
              f"{eff.compute:.2f} (all rows)")
    for n in v.notes:
        print(f"  note: {n}")
