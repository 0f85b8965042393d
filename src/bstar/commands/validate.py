"""`bstar validate FILE.csv`: the planner against measurements. Four table shapes:
- a closed-loop runs table (`num_prompts` and `output_len_max` columns;
  data/inferencemax/runs.csv): each run simulated like for like and scored per GPU x
  engine as load stages are, with output tok/s per GPU and a leave-one-GPU-out way
  (bstar.validate_runs);
- a load-stages table (`arrival` and `duration_s` columns; data/vllm-h100/stages.csv): each
  stage simulated like for like and scored per GPU x engine, generic, profile and
  leave-one-model-out, with its saturation state (bstar.validate_stages);
- a curves table (a `batch_kind` column; data/published/curves.csv): whole curves scored per
  GPU x engine, generic, uncalibrated and leave-one-model-out, and the knee distance;
- a per-row table (metric, value columns; examples/published-measurements.csv): each row,
  uncalibrated and leave-one-out calibrated per GPU x engine."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from bstar.commands.common import str_list
from bstar.commands.emit import emit


def add_validate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("table", type=Path, metavar="FILE.csv",
                   help="a closed-loop runs table (columns run, model, gpu, num_gpus, "
                        "engine, max_num_seqs, max_num_batched_tokens, concurrency, "
                        "num_prompts, prompt_len_min/max, output_len_min/max, ttft_mean_ms, "
                        "tpot_mean_ms, e2e_mean_ms, source; e.g. data/inferencemax/runs.csv), "
                        "a load-stages table (columns stage, model, gpu, num_gpus, engine, "
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
                   help="load stages and runs: the engine profile of the 'profile' column "
                        "(default: each row's engine)")
    p.add_argument("--no-lomo", action="store_true",
                   help="load stages and runs: skip the leave-one-model-out fit (it simulates the "
                        "other models' stages many times)")
    p.add_argument("--no-logo", action="store_true",
                   help="load stages and runs: skip the leave-one-GPU-out fit (per GPU x "
                        "engine whose engine has rows on other GPUs: fitted on those, "
                        "predicting this GPU's)")
    p.add_argument("--acceptance-rate", type=float, default=None, metavar="A",
                   help="runs: the per-token acceptance rate of every speculative (MTP) run "
                        "(default: the row's acceptance_rate, else fitted leave one run "
                        "out on the other speculative runs of its engine)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def run_validate(args: argparse.Namespace) -> int:
    from bstar import safeio
    from bstar.fit.points import read_table
    from bstar.runs_table import is_runs_table
    from bstar.validate_curves import is_curves_table
    from bstar.validate_stages import is_stages_table

    text = safeio.read_text(args.table, safeio.MAX_TABLE_BYTES, "table (UTF-8 CSV)")
    table = read_table(text, str(args.table))
    if table is not None and is_runs_table(table.header):
        return _run_runs(args, text)
    if table is not None and is_stages_table(table.header):
        return _run_stages(args, text)
    if table is not None and is_curves_table(table.header):
        return _run_curves(args, text)
    return _run_rows(args, text)


def _run_curves(args: argparse.Namespace, text: str) -> int:
    from bstar.report.text import print_curves_validation
    from bstar.validate_curves import DEFAULT_FIT, curves_from_csv, score_curves

    rows = curves_from_csv(text, str(args.table), args.table.resolve().parent)
    fit = tuple(args.fit) if args.fit else DEFAULT_FIT
    v = score_curves(rows, fit, _progress(args, "scoring "))
    return emit(args, v.to_dict, lambda: print_curves_validation(v, len(rows)))


def _progress(args: argparse.Namespace, prefix: str = "") -> Callable[[str], None]:
    """Progress lines on a terminal's stderr ('scoring llama-3-8b ...'), none with --json."""
    def progress(what: str) -> None:
        if not args.json and sys.stderr.isatty():
            print(f"{prefix}{what} ...", file=sys.stderr)

    return progress


def _run_stages(args: argparse.Namespace, text: str) -> int:
    from bstar.report.text import print_stages_validation
    from bstar.validate_stages import DEFAULT_FIT, score_stages, stages_from_csv

    stages = stages_from_csv(text, str(args.table), args.table.resolve().parent)
    fit = tuple(args.fit) if args.fit else DEFAULT_FIT
    v = score_stages(stages, fit, engine=args.engine, lomo=not args.no_lomo,
                     logo=not args.no_logo, progress=_progress(args))
    return emit(args, v.to_dict, lambda: print_stages_validation(v.to_dict()))


def _run_runs(args: argparse.Namespace, text: str) -> int:
    from bstar.report.text import print_runs_validation
    from bstar.runs_table import runs_from_csv
    from bstar.validate_runs import DEFAULT_FIT, score_runs

    runs = runs_from_csv(text, str(args.table), args.table.resolve().parent)
    fit = tuple(args.fit) if args.fit else DEFAULT_FIT
    a = args.acceptance_rate
    if a is not None and not 0 <= a <= 1:
        from bstar.errors import BstarError

        raise BstarError(f"--acceptance-rate must be in [0, 1], got {a}")
    v = score_runs(runs, fit, engine=args.engine, lomo=not args.no_lomo, acceptance=a,
                   logo=not args.no_logo, progress=_progress(args))
    return emit(args, v.to_dict, lambda: print_runs_validation(v.to_dict()))


def _run_rows(args: argparse.Namespace, text: str) -> int:
    from bstar.report.text import print_rows_validation
    from bstar.validate import DEFAULT_FIT, rows_from_csv, validate

    v = validate(rows_from_csv(text, str(args.table)), args.fit or DEFAULT_FIT)
    return emit(args, v.to_dict, lambda: print_rows_validation(v))
