"""`bstar validate FILE.csv`: the planner against measurements. Three table shapes:
- a load-stages table (`arrival` and `duration_s` columns; data/vllm-h100/stages.csv): each
  stage simulated like for like and scored per GPU x engine, generic, profile and
  leave-one-model-out, with its saturation state (bstar.validate_stages);
- a curves table (a `batch_kind` column; data/published/curves.csv): whole curves scored per
  GPU x engine, generic, uncalibrated and leave-one-model-out, and the knee distance;
- a per-row table (metric, value columns; examples/published-measurements.csv): each row,
  uncalibrated and leave-one-out calibrated per GPU x engine."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bstar.commands.common import str_list


def add_validate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("table", type=Path, metavar="FILE.csv",
                   help="a load-stages table (columns stage, model, gpu, num_gpus, engine, "
                        "max_num_seqs, max_num_batched_tokens, arrival, rate_req_s or "
                        "concurrency, duration_s, prompt_len_p50, output_len, ttft_mean_ms, "
                        "e2e_mean_ms, source; e.g. data/vllm-h100/stages.csv), a curves "
                        "table (columns model, gpu, num_gpus, engine, batch, batch_kind, "
                        "source and any of step_ms, itl_ms, tpot_ms, "
                        "throughput_tok_s; e.g. data/published/curves.csv), or a per-row "
                        "table (model, gpu, num_gpus, engine, input_len, output_len, batch, "
                        "metric, value, source; e.g. examples/published-measurements.csv)")
    p.add_argument("--fit", type=str_list, default=None,
                   help="parameters fitted in the leave-out calibration (default: "
                        "bandwidth,overhead_s,allreduce_latency_s for curves, "
                        "bandwidth,compute per row); for curves, roof_sharpness also "
                        "chooses the roof's shape (1, 1.5, 2, 3 or a hard max); for load "
                        "stages bandwidth,overhead_s,allreduce_latency_s")
    p.add_argument("--engine", default=None, metavar="NAME",
                   help="load stages: the engine profile of the 'profile' column (default: "
                        "each row's engine)")
    p.add_argument("--no-lomo", action="store_true",
                   help="load stages: skip the leave-one-model-out fit (it simulates the "
                        "other models' stages many times)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def run_validate(args: argparse.Namespace) -> int:
    from bstar.errors import BstarError
    from bstar.fit.points import read_table
    from bstar.validate_curves import is_curves_table
    from bstar.validate_stages import is_stages_table

    try:
        text = args.table.read_text(encoding="utf-8-sig")  # a BOM is not the header
    except (OSError, UnicodeDecodeError) as e:
        raise BstarError(f"{args.table}: cannot read: {e}") from None
    table = read_table(text, str(args.table))
    if table is not None and is_stages_table(table.header):
        return _run_stages(args, text)
    if table is not None and is_curves_table(table.header):
        return _run_curves(args, text)
    return _run_rows(args, text)


def _pct(x: float | None) -> str:
    return "     -" if x is None else f"{x * 100:5.1f}%"


def _run_curves(args: argparse.Namespace, text: str) -> int:
    from bstar.validate_curves import DEFAULT_FIT, curves_from_csv, score_curves

    rows = curves_from_csv(text, str(args.table), args.table.resolve().parent)
    fit = tuple(args.fit) if args.fit else DEFAULT_FIT

    def progress(what: str) -> None:
        if not args.json and sys.stderr.isatty():
            print(f"scoring {what} ...", file=sys.stderr)

    v = score_curves(rows, fit, progress)
    if args.json:
        print(json.dumps(v.to_dict(), indent=2))
        return 0
    print(f"median |predicted / measured - 1| per GPU x engine ({len(rows)} rows; "
          "step = decode step vs measured step/ITL/TPOT; throughput = output tok/s "
          "incl. prefill)")
    print(f"  {'gpu':<28}{'engine':<12}{'metric':<18}{'rows':>5}{'generic':>9}"
          f"{'profile':>9}{'LOMO':>8}")
    for g in v.groups:
        for k, m in g.metrics.items():
            d: dict[str, Any] = m.to_dict()
            print(f"  {Path(g.gpu).name[-27:]:<28}{g.engine:<12}{k:<18}{d['rows']:>5}"
                  f"{_pct(d['generic']):>9}{_pct(d['uncalibrated']):>9}{_pct(d['lomo']):>8}")
        for mdl, errs in g.model_uncalibrated.items():
            lomo = g.model_lomo.get(mdl, {})
            print(f"      {mdl}: " + ", ".join(
                f"{k} profile {_pct(e).strip()}"
                + (f", left out {_pct(lomo.get(k)).strip()}" if lomo else "")
                for k, e in errs.items()))
        if g.model_lomo:
            print(f"      worst model left out: {_pct(g.worst_model_lomo).strip()} "
                  f"(fitting {', '.join(g.fit)} from the generic defaults)")
        for n in g.notes:
            print(f"      note: {n}")
    if v.knees:
        print("knees (seed 004's doubling rule on measured vs predicted throughput, same "
              "grid; profile predictions)")
        for k in v.knees:
            print(f"  {k.curve:<42.42} {Path(k.gpu).name[-27:]:<28} measured "
                  f"{k.measured_knee if k.measured_knee is not None else '-':>5}  predicted "
                  f"{k.predicted_knee if k.predicted_knee is not None else '-':>5}  "
                  f"{k.grid_steps_apart} grid step(s) apart")
        within, n = v.knees_within_one_step
        print(f"  curves whose measured throughput has a knee: {n}; predicted knee within "
              f"one grid step on {within}")
    for s in v.skipped:
        print(f"  skipped {s['model']} on {s['gpu']}: {s['reason']}")
    return 0


def _progress(args: argparse.Namespace) -> Any:
    def progress(what: str) -> None:
        if not args.json and sys.stderr.isatty():
            print(f"{what} ...", file=sys.stderr)

    return progress


def _run_stages(args: argparse.Namespace, text: str) -> int:
    from bstar.validate_stages import DEFAULT_FIT, score_stages, stages_from_csv

    stages = stages_from_csv(text, str(args.table), args.table.resolve().parent)
    fit = tuple(args.fit) if args.fit else DEFAULT_FIT
    v = score_stages(stages, fit, engine=args.engine, lomo=not args.no_lomo,
                     progress=_progress(args))
    if args.json:
        print(json.dumps(v.to_dict(), indent=2))
        return 0
    print(render_stages(v.to_dict()))
    return 0


_WAYS = (("generic", "generic"), ("profile", "profile"), ("lomo", "LOMO"))
_METRIC_NAMES = (("e2e_mean_ms", "E2E"), ("ttft_mean_ms", "TTFT"),
                 ("tpot_mean_ms", "per-token"))


def _err(x: float | None) -> str:
    return "     -" if x is None else f"{x * 100:+5.0f}%" if abs(x) >= 9.995 \
        else f"{x * 100:+5.1f}%"


def _state(s: str) -> str:
    return {"steady": "steady", "queue growing": "growing"}.get(s, s)


def render_stages(v: dict[str, Any]) -> str:
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
        ways = [(k, name) for k, name in _WAYS if k in g["summary"]]
        out.append("")
        lomo = (f"; LOMO fits {', '.join(g['fit'])} without the stage's model"
                if "lomo" in g["summary"] else "")
        out.append(f"{Path(g['gpu']).name} x {g['engine']} (profile {g['profile']}, "
                   f"{g['profile_basis']}{lomo})")
        hdr = f"  {'stage':<31}{'load':>9}  {'state meas':<11}"
        hdr += "".join(f"{'pred ' + name:<15}" for k, name in ways if k != "generic")
        for _, m in _METRIC_NAMES:
            hdr += f"{m + ' ms':>15}" + "".join(f"{name:>9}" for k, name in ways
                                                 if k != "generic")
        out.append(hdr)
        for s in g["stages"]:
            load = (f"{s['rate_req_s']:g}/s" if s["rate_req_s"] is not None
                    else f"{s['concurrency']} users")
            meas = s["measured"]
            line = f"  {s['stage'][:30]:<31}{load:>9}  {_state(meas['state']):<11}"
            for k, _ in ways:
                if k == "generic":
                    continue
                p = s["predicted"].get(k)
                mark = "" if p is None else (" ok" if p["state_right"] else " WRONG")
                line += f"{(_state(p['state']) if p else '-') + mark:<15}"
            for key, _ in _METRIC_NAMES:
                line += f"{meas[key]:>15.1f}"
                for k, _ in ways:
                    if k == "generic":
                        continue
                    p = s["predicted"].get(k)
                    e = p["errors"].get(key) if p else None
                    line += f"{_err(e):>9}"
            if not s["latency_scored"]:
                line += "  (overloaded: state only)"
            growing = [k for k, _ in ways if s["predicted"].get(k)
                       and s["predicted"][k]["state"] != "steady"]
            if growing or meas["state"] != "steady":
                g_meas = meas.get("ttft_growth")
                line += "  TTFT growth/s: meas " + (
                    "-" if g_meas is None else f"{g_meas:.3g}") + "".join(
                    f", {name} {s['predicted'][k]['ttft_growth']:.3g}" for k, name in ways
                    if k != "generic" and s["predicted"].get(k))
            out.append(line)
        n_steady = next(iter(g["summary"].values()))["latency_stages"]
        out.append(f"  mean / median |error| over the {n_steady} stages measured steady; "
                   f"states right of {len(g['stages'])}")
        for k, name in ways:
            sm = g["summary"][k]
            line = f"    {name:<9}"
            for key, m in _METRIC_NAMES:
                line += (f"  {m} {_pct(sm[key]['mean']).strip()} / "
                         f"{_pct(sm[key]['median']).strip()}")
            line += f"   states {sm['states_right']}/{sm['states_total']}"
            if sm["wrong_states"]:
                line += f" (wrong: {', '.join(sm['wrong_states'])})"
            out.append(line)
        for m, e in g["lomo_eff"].items():
            out.append(f"    LOMO without {m}: " + ", ".join(f"{k} = {x:.4g}"
                                                         for k, x in e.items()))
        for n in g["notes"]:
            out.append(f"    note: {n}")
    for s in v["skipped"]:
        out.append(f"  skipped {s['stage']} ({s['model']} on {s['gpu']}): {s['reason']}")
    return "\n".join(out)


def _run_rows(args: argparse.Namespace, text: str) -> int:
    from bstar.validate import DEFAULT_FIT, rows_from_csv, validate

    v = validate(rows_from_csv(text, str(args.table)), args.fit or DEFAULT_FIT)
    if args.json:
        print(json.dumps(v.to_dict(), indent=2))
        return 0
    print(f"{'model':<12}{'gpu':<15}{'tp':>3} {'engine':<19}{'in':>5}{'out':>5}{'batch':>6}  "
          f"{'metric':<25}{'measured':>10}{'uncal.':>10}{'err':>7}{'LOO cal.':>10}{'err':>7}")
    for r in v.rows:
        row = r.row
        cal = f"{r.calibrated:>10.4g}{r.calibrated_error:>+7.0%}" if r.calibrated else \
            f"{'-':>10}{'':>7}"
        print(f"{row.model:<12.12}{row.gpu:<15.15}{row.num_gpus:>3} {row.engine:<19.19}"
              f"{row.input_len:>5}{row.output_len:>5}{row.batch:>6}  {row.metric:<25}"
              f"{row.value:>10.4g}{r.uncalibrated:>10.4g}{r.uncalibrated_error:>+7.0%}{cal}")
    cal_med = v.calibrated_median_abs_error
    print(f"median |error|: uncalibrated {v.uncalibrated_median_abs_error:.1%}, calibrated "
          f"(leave-one-out per GPU x engine, fitting {','.join(v.fit)}) "
          + (f"{cal_med:.1%}" if cal_med is not None else "n/a"))
    for (gpu, engine), eff in v.group_eff.items():
        print(f"  {gpu} x {engine}: bandwidth {eff.bandwidth:.2f}, compute {eff.compute:.2f} "
              "(all rows)")
    for n in v.notes:
        print(f"  note: {n}")
    return 0
