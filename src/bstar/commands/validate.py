"""`bstar validate FILE.csv`: the planner against published measurements, per row and in
median, uncalibrated and calibrated leave-one-out per GPU x engine."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bstar.commands.common import str_list


def add_validate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("table", type=Path, metavar="FILE.csv",
                   help="columns: model, gpu, num_gpus, engine, input_len, output_len, batch, "
                        "metric (tpot_ms, throughput_tok_s, throughput_tok_s_per_gpu), value, "
                        "source; optional dtype, kv_dtype, note "
                        "(example: examples/published-measurements.csv)")
    p.add_argument("--fit", type=str_list, default=["bandwidth", "compute"],
                   help="parameters fitted in the leave-one-out calibration "
                        "(default bandwidth,compute)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def run_validate(args: argparse.Namespace) -> int:
    from bstar.errors import BstarError
    from bstar.validate import rows_from_csv, validate

    try:
        text = args.table.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise BstarError(f"{args.table}: cannot read: {e}") from None
    v = validate(rows_from_csv(text, str(args.table)), args.fit)
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
