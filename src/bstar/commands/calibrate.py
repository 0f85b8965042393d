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
    from bstar.commands.plan import deployment_from_args
    from bstar.errors import BstarError

    d = deployment_from_args(args)
    path = Path(args.source)
    warnings: list[str] = []
    workload = None
    result = None
    if path.is_file():
        from bstar.fit.points import load_steps

        points, warnings = load_steps(path, args.context)
        source = str(path)
    else:
        points, source, run, result = points_from_run(args.db, args.source, args.metric,
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
        from bstar.loadgen.measured import workload_toml

        text = cal.profile_toml(c) + ("" if workload is None else workload_toml(workload)) \
            + ("" if power is None else power.toml())
        _loads_back(args.output, text)
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
                                           "points": [_point_dict(p) for p in pts]}
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


def _loads_back(path: Path, text: str) -> None:
    """The profile about to be written, read by the readers `--profile` uses (the
    calibration's and the [workload]'s): a profile bstar writes is one bstar reads, or
    nothing is written."""
    import tomllib

    from bstar import calibrate as cal
    from bstar.errors import BstarError
    from bstar.loadgen.measured import traffic_from_data

    try:
        cal.profile_from_text(path, text)
        traffic_from_data(path, tomllib.loads(text))
    except BstarError as e:
        raise BstarError(f"not written: the profile would not load with --profile ({e})") \
            from None


def _check(args: argparse.Namespace, spec: str, c: Any) -> tuple[str, str, list[Any]]:
    from bstar import calibrate as cal
    from bstar.commands.plan import deployment_from_args

    run_id, _, model = spec.partition("=")
    points, _, run, _ = points_from_run(args.db, run_id, args.metric, None)
    model = model or (run.get("options") or {}).get("model") or args.model
    d = deployment_from_args(args, model)
    return run["id"], d.model.name, list(cal.check(d, c.eff, points, c.bandwidth_scale,
                                                   c.compute_scale))


def _point_dict(p: Any) -> dict[str, Any]:
    return {"batch": p.batch, "context_tokens": p.context_tokens,
            "chunk_tokens": p.chunk_tokens, "chunk_start": p.chunk_start,
            "measured_ms": p.measured_ms,
            "predicted_ms": p.predicted_ms, "rel_error": p.rel_error,
            "uncalibrated_ms": p.uncalibrated_ms,
            "uncalibrated_rel_error": p.uncalibrated_rel_error, "bound": p.bound}


def points_from_run(db: str | None, run_id: str, metric: str,
                    context: int | None) -> tuple[list[Any], str, dict[str, Any], Any]:
    """Decode-step points from a stored sweep run (bstar sweep's store), read by
    bstar.fit.points.steps_from_sweep."""
    from bstar.db import DbError
    from bstar.errors import BstarError
    from bstar.fit.points import steps_from_sweep
    from bstar.loadgen.store import Store
    from bstar.loadgen.sweep import load_result

    # db None: the sweep's default store. Read-only: never creates a file.
    with Store(db, readonly=True) as store:
        try:
            result = load_result(store, run_id)
        except DbError as e:
            raise BstarError(f"cannot read the results DB {store.path}: {e}") from None
    points = steps_from_sweep(result, metric, context)
    return points, f"sweep run {result.run_id} ({result.db}), {metric}", result.run, result
