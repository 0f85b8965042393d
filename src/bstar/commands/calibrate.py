"""`bstar calibrate RUN|POINTS --model M --gpu G -o PROFILE`: fit the cost model's
efficiencies and overheads to measured decode steps; write a calibration profile that
`--profile FILE` applies to every command."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from bstar.commands.common import (
    add_deployment_arguments,
    add_force_argument,
    build_deployment,
    positive_int,
    str_list,
)

FIT_DEFAULT = "bandwidth,compute,overhead_s,overhead_per_seq_s"


def add_calibrate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", metavar="RUN|POINTS",
                   help="a CSV/JSON file of measured points (batch + tpot_ms or "
                        "throughput_tok_s, optional context_tokens), or a sweep run id")
    add_deployment_arguments(p)
    p.add_argument("--context", "--max-model-len", dest="context", type=positive_int,
                   default=None,
                   help="tokens each sequence holds while decoding, for points without a "
                        "context_tokens column (e.g. input + output/2)")
    p.add_argument("--fit", type=str_list, default=None,
                   help=f"parameters to fit, the rest keep the flags' values (default "
                        f"{FIT_DEFAULT}, plus attention_compute,chunk_layer_s when the "
                        "points hold mixed prefill + decode steps)")
    p.add_argument("--engine-version", default="",
                   help="version of the engine the points come from (--engine names it)")
    p.add_argument("--vllm-log", type=Path, default=None,
                   help="a vLLM start-up log: its KV cache size calibrates the reserve "
                        "(and so B_mem)")
    p.add_argument("--db", default=None,
                   help="results store for a sweep RUN id (default: bstar sweep's)")
    p.add_argument("--metric", choices=("itl_p50", "tpot_mean", "tpot_p50"), default="itl_p50",
                   help="a sweep level's step time (RUN input): the median inter-token gap "
                        "(default: one decode step; a mean TPOT also carries the stalls of "
                        "other requests' prefills), or the mean / median TPOT")
    p.add_argument("--check", action="append", default=[], metavar="RUN[=MODEL]",
                   help="another sweep run to predict with the calibration (another context, "
                        "or a sibling MODEL on the same GPU and engine); prints the error per "
                        "level. Repeatable")
    p.add_argument("-o", "--output", type=Path, default=None,
                   help="calibration profile to write (TOML)")
    add_force_argument(p)
    p.add_argument("--json", action="store_true", help="print the calibration as JSON")


def run_calibrate(args: argparse.Namespace) -> int:
    from bstar import calibrate as cal
    from bstar.errors import BstarError
    from bstar.loadgen.measured import steps_from_run

    d = build_deployment(args)
    path = Path(args.source)
    warnings: list[str] = []
    workload = None
    result = None
    if path.is_file():
        from bstar.fit.points import load_steps

        points, warnings = load_steps(path, args.context)
        source = str(path)
    else:
        points, source, run, result = steps_from_run(args.db, args.source, args.metric,
                                                     args.context)
        workload = _workload(args.db, run["id"])
        if not args.engine_version and run.get("server_version"):
            args.engine_version = str(run["server_version"])
    c = cal.calibrate(d, points, args.fit, engine=args.engine,
                      engine_version=args.engine_version, source=source)
    if args.vllm_log is not None:
        from bstar import safeio

        raw = safeio.read_bytes(args.vllm_log, safeio.MAX_TABLE_BYTES, "vLLM log")
        log = cal.parse_vllm_log(raw.decode("utf-8", errors="replace"))
        pool = cal.kv_pool_from_log(d, log)
        from dataclasses import replace
        c = replace(c, kv_pool_bytes=pool, reserve_bytes=cal.reserve_from_kv_pool(d, pool))
    power = None
    if result is not None:
        from bstar.calibrate.power import power_from_run

        # Each level's utilization under the calibrated step (its efficiencies).
        power = power_from_run(c.apply(d), result, args.context)
        if power is None:
            warnings.append("no power curve: fewer than 3 completed levels of the run "
                            "stored GPU power (the sweep had no power source); the power "
                            "model keeps its defaults (docs/energy.md)")
    if args.output is not None:
        from bstar.loadgen.measured import profile_text

        text = profile_text(args.output, c, workload,
                            "" if power is None else power.toml())
        try:
            args.output.write_text(text)
        except OSError as e:
            raise BstarError(f"{args.output}: cannot write ({e.strerror})") from None
    if warnings:
        from dataclasses import replace
        c = replace(c, notes=(*warnings, *c.notes))
    checks = [_check(args, spec, c) for spec in args.check]
    spread = cal.repeat_spread(list(c.points))
    from bstar.commands.emit import emit
    from bstar.report.text import print_calibration

    checked = [(run, model, pts, cal.median_abs_error(pts),
                cal.median_abs_error(pts, uncalibrated=True)) for run, model, pts in checks]
    return emit(args, lambda: {**c.to_dict(), "profile": str(args.output or ""),
                               "repeat_spread": spread,
                               "workload": None if workload is None else workload.to_dict(),
                               "power": None if power is None else power.to_dict(),
                               "checks": [{"run": run, "model": model,
                                           "median_abs_error": median,
                                           "points": [p.to_dict() for p in pts]}
                                          for run, model, pts, median, _ in checked]},
                lambda: print_calibration(c, args.output, spread, checked, power))


def _workload(db: str | None, run_id: str) -> Any:
    """The traffic the sweep measured (`bstar.loadgen.measured`), for the profile's
    [workload] table; None when its requests carry no token counts. Counters that lie
    (hits above queries, a negative count) are refused, by name."""
    from bstar.loadgen.measured import NoTraffic, measured_traffic

    try:
        return measured_traffic(db, run_id)
    except NoTraffic:
        return None


def _check(args: argparse.Namespace, spec: str, c: Any) -> tuple[str, str, list[Any]]:
    from bstar import calibrate as cal
    from bstar.loadgen.measured import steps_from_run

    run_id, _, model = spec.partition("=")
    points, _, run, _ = steps_from_run(args.db, run_id, args.metric, None)
    model = model or (run.get("options") or {}).get("model") or args.model
    d = build_deployment(args, model)
    return run["id"], d.model.name, list(cal.check(d, c.eff, points, c.bandwidth_scale,
                                                   c.compute_scale))
