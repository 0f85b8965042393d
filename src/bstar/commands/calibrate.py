"""`bstar calibrate RUN|POINTS --model M --gpu G -o PROFILE`: fit the cost model's
efficiencies and overheads to measured decode steps; write a calibration profile that
`--profile FILE` applies to every command."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bstar.commands.common import add_deployment_arguments, positive_int, str_list

FIT_DEFAULT = "bandwidth,compute,overhead_s,overhead_per_seq_s"


def add_calibrate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", metavar="RUN|POINTS",
                   help="a CSV/JSON file of measured points (batch + tpot_ms or "
                        "throughput_tok_s, optional context_tokens), or a sweep run id")
    add_deployment_arguments(p)
    p.add_argument("--context", type=positive_int, default=None,
                   help="tokens each sequence holds while decoding, for points without a "
                        "context_tokens column (e.g. input + output/2)")
    p.add_argument("--fit", type=str_list, default=FIT_DEFAULT.split(","),
                   help=f"parameters to fit, the rest keep the flags' values (default "
                        f"{FIT_DEFAULT})")
    p.add_argument("--engine", default="", help="engine the points come from (e.g. vllm)")
    p.add_argument("--engine-version", default="", help="its version")
    p.add_argument("--vllm-log", type=Path, default=None,
                   help="a vLLM start-up log: its KV cache size calibrates the reserve "
                        "(and so B_mem)")
    p.add_argument("--db", default=None, help="results store for a sweep RUN id")
    p.add_argument("-o", "--output", type=Path, default=None,
                   help="calibration profile to write (TOML)")
    p.add_argument("--json", action="store_true", help="print the calibration as JSON")


def read_points_file(path: Path) -> list[dict[str, Any]]:
    """Rows of a points CSV or JSON (a list of objects, or {"points": [...]})."""
    import csv

    from bstar.errors import BstarError

    try:
        text = path.read_text()
    except OSError as e:
        raise BstarError(f"{path}: cannot read ({e.strerror})") from None
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise BstarError(f"{path}: not valid JSON ({e})") from None
        rows = data.get("points") if isinstance(data, dict) else data
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise BstarError(f"{path}: expected a list of point objects")
        return rows
    rows = list(csv.DictReader(text.splitlines()))
    if not rows:
        raise BstarError(f"{path}: no rows")
    return rows


def run_calibrate(args: argparse.Namespace) -> int:
    from bstar import calibrate as cal
    from bstar.commands.plan import deployment_from_args
    from bstar.errors import BstarError

    d = deployment_from_args(args)
    path = Path(args.source)
    if path.is_file():
        rows = read_points_file(path)
        points = cal.points_from_rows(rows, args.context, where=str(path))
        source = str(path)
    else:
        points, source = _points_from_run(args, d)
    c = cal.calibrate(d, points, args.fit, engine=args.engine,
                      engine_version=args.engine_version, source=source)
    if args.vllm_log is not None:
        try:
            log = cal.parse_vllm_log(args.vllm_log.read_text(errors="replace"))
        except OSError as e:
            raise BstarError(f"{args.vllm_log}: cannot read ({e.strerror})") from None
        pool = cal.kv_pool_from_log(d, log)
        from dataclasses import replace
        c = replace(c, kv_pool_bytes=pool, reserve_bytes=cal.reserve_from_kv_pool(d, pool))
    if args.output is not None:
        try:
            args.output.write_text(cal.profile_toml(c))
        except OSError as e:
            raise BstarError(f"{args.output}: cannot write ({e.strerror})") from None
    if args.json:
        print(json.dumps({**c.to_dict(), "profile": str(args.output or "")}, indent=2))
        return 0
    _print(c, args.output)
    return 0


def _points_from_run(args: argparse.Namespace, d: Any) -> tuple[list[Any], str]:
    from bstar.errors import BstarError

    raise BstarError(f"{args.source}: no such points file (reading sweep runs from the "
                     "results store needs `bstar sweep`'s store, not in this build)")


def _print(c: Any, out: Path | None) -> None:
    units = {"bandwidth": (1.0, ""), "compute": (1.0, ""), "overhead_s": (1e3, " ms"),
             "overhead_per_seq_s": (1e6, " us")}
    print(f"calibration of {c.model} on {c.gpu} (weights {c.weight_dtype}, KV {c.kv_dtype})"
          f"{', ' + c.engine if c.engine else ''} {c.engine_version}".rstrip())
    print(f"  {'parameter':<20}{'value':>12}{'1 sigma':>12}  prior")
    for k, p in c.params.items():
        scale, unit = units[k]
        sd = f"{p.std * scale:.3g}" if p.std is not None else p.status
        print(f"  {k:<20}{p.value * scale:>12.4g}{sd:>12}  {p.prior * scale:g}{unit}")
    print(f"  {'batch':>6}{'context':>9}{'measured ms':>13}{'calibrated':>12}{'error':>8}"
          f"{'uncalibrated':>14}{'error':>8}  bound")
    for p in c.points:
        print(f"  {p.batch:>6}{p.context_tokens:>9}{p.measured_ms:>13.3f}"
              f"{p.predicted_ms:>12.3f}{p.rel_error:>+8.1%}{p.uncalibrated_ms:>14.3f}"
              f"{p.uncalibrated_rel_error:>+8.1%}  {p.bound}")
    print(f"  median |error| {c.median_abs_error:.1%} calibrated (max {c.max_abs_error:.1%}), "
          f"{c.uncalibrated_median_abs_error:.1%} uncalibrated")
    if c.reserve_bytes is not None:
        print(f"  KV pool {c.kv_pool_bytes / 2**30:.2f} GiB from the log -> reserve "
              f"{c.reserve_bytes / 2**30:.2f} GiB")
    for n in c.notes:
        print(f"  note: {n}")
    if out is not None:
        print(f"wrote {out}; use it with --profile {out}")
