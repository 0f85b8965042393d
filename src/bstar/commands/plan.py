"""`bstar plan`, `bstar compare`, `bstar models`, `bstar gpus`."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from bstar.commands.common import (
    add_deployment_arguments,
    add_electricity_argument,
    add_force_argument,
    add_speculative_arguments,
    build_deployment,
    command_line,
    deployment_options,
    int_list,
    positive_float,
    report_written,
    speculative_from_args,
    warn,
)
from bstar.commands.emit import emit


def add_plan_arguments(p: argparse.ArgumentParser) -> None:
    add_deployment_arguments(p)
    p.add_argument("--context", "--max-model-len", dest="context", type=int_list, default=None,
                   help="context lengths in tokens each sequence holds, comma-separated "
                        "(default 512,2048,8192)")
    p.add_argument("--batch", type=int_list, default=None,
                   help="batch sizes of the curve (default: powers of two past B_mem)")
    p.add_argument("--max-tpot-ms", type=positive_float, default=None,
                   help="per-request TPOT SLA in ms: cap the recommendation to meet it")
    p.add_argument("--json", action="store_true", help="print one JSON object (contract)")
    p.add_argument("--plot", default=None, metavar="FILE.png|.svg",
                   help="also draw the curves, regimes and roofline (needs bstar[plot])")
    add_electricity_argument(p)
    add_force_argument(p)
    add_speculative_arguments(p)
    from bstar.commands.disagg_flags import add_disagg_arguments

    add_disagg_arguments(p)


def add_compare_arguments(p: argparse.ArgumentParser) -> None:
    add_deployment_arguments(p, many=True)
    p.add_argument("--context", "--max-model-len", dest="context", type=int_list, default=None,
                   help="context lengths, comma-separated (default 512,2048,8192)")
    p.add_argument("--max-tpot-ms", type=positive_float, default=None,
                   help="per-request TPOT SLA in ms")
    p.add_argument("--json", action="store_true", help="print a JSON list of rows")
    p.add_argument("--plot", default=None, metavar="FILE.png|.svg",
                   help="also draw B* and B_mem per model and context (needs bstar[plot])")
    add_force_argument(p)


def add_models_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON")


def add_gpus_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON")


def run_plan(args: argparse.Namespace) -> int:
    from bstar.plan import DEFAULT_CONTEXTS, make_plan
    from bstar.report import save_plan_plot
    from bstar.report.text import print_plan

    if args.disaggregate or args.deployment:
        return run_disagg_plan(args)
    d = build_deployment(args)
    spec, drafter = speculative_from_args(args, d)
    plan = make_plan(d, tuple(args.context or DEFAULT_CONTEXTS), args.batch, args.max_tpot_ms,
                     spec=spec, drafter=drafter,
                     electricity_usd_per_kwh=args.electricity_usd_per_kwh)
    rc = emit(args, plan.to_dict, lambda: print_plan(plan),
              lambda path: save_plan_plot(plan, path))
    return rc or sla_unmet_status(
        [(cp.context_tokens, cp.tpot_batch1_s) for cp in plan.contexts if cp.sla_unmet],
        args.max_tpot_ms)


# Exit status when --max-tpot-ms cannot be met by any batch (docs/contracts.md): the plan or
# JSON is still printed, and stderr says what the floor is.
EXIT_SLA_UNMET = 3


def sla_unmet_status(unmet: list[tuple[int, float | None]], max_tpot_ms: float | None) -> int:
    """EXIT_SLA_UNMET and one stderr line per context whose SLA no batch meets, else 0."""
    for ctx, floor_s in unmet:
        floor = f"{floor_s * 1e3:.2f} ms at batch 1" if floor_s is not None else "unknown"
        print(f"bstar: error: TPOT <= {max_tpot_ms:g} ms cannot be met on this hardware at "
              f"{ctx} tokens: the floor is {floor}; use faster GPUs, more GPUs or a looser "
              "SLO", file=sys.stderr)
    return EXIT_SLA_UNMET if unmet else 0


def run_compare(args: argparse.Namespace) -> int:
    from bstar.report import save_compare_plot
    from bstar.report.text import print_compare

    rows = compare_rows(args)
    rc = emit(args, lambda: rows, lambda: print_compare(rows),
              lambda path: save_compare_plot(rows, path))
    unmet = [(r["context_tokens"], r["tpot_batch1_ms"] / 1e3) for r in rows
             if r["fits"] and r["recommendation"]["bound"] == "sla-unmet"]
    return rc or sla_unmet_status(unmet, args.max_tpot_ms)


def compare_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """One row per model x GPU x context (`bstar compare --json`)."""
    from bstar.plan import compare

    return compare(deployment_options(args), args.model, args.gpu, args.context,
                   args.max_tpot_ms, warn=warn)


def run_models(args: argparse.Namespace) -> int:
    from bstar.report.text import print_models
    from bstar.specs.presets import get_model, model_index

    rows = []
    for pid, info in model_index().items():
        m = get_model(pid)
        rows.append({"id": pid, "hf_repo": info.hf_repo, "params": m.num_params,
                     "active_params": m.num_active_params,
                     "published_params": info.published_params,
                     "attention": m.attention_kind, "layers": m.num_layers,
                     "dtype": m.default_dtype, "moe": m.is_moe, "source": info.source})
    return emit(args, lambda: rows, lambda: print_models(rows))


def run_gpus(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from bstar.report.text import print_gpus
    from bstar.specs.gpu import gpu_catalog

    rows = [asdict(g) for g in gpu_catalog().values()]
    return emit(args, lambda: rows, lambda: print_gpus(rows))


def report_plan(args: argparse.Namespace) -> int:
    """`bstar report plan`: this command's page (`commands/report.py`)."""
    return report_written(args, lambda: _report_plan(args))


def _report_plan(args: argparse.Namespace) -> tuple[Any, dict[str, Any] | None]:
    from bstar.plan import DEFAULT_CONTEXTS, make_plan
    from bstar.report import save_plan_plot, write_plan_report

    if getattr(args, "num_speculative_tokens", None) is not None:
        from bstar.errors import BstarError

        raise BstarError("the plan report does not draw speculative decoding yet: use "
                         "`bstar plan --num-speculative-tokens K` (text or --json)")
    d = build_deployment(args)
    plan = make_plan(d, tuple(args.context or DEFAULT_CONTEXTS), args.batch, args.max_tpot_ms)
    path = write_plan_report(plan, args.output, command_line())
    if getattr(args, "plot", None):
        save_plan_plot(plan, args.plot)
    return path, None


def report_compare(args: argparse.Namespace) -> int:
    """`bstar report compare`: this command's page (`commands/report.py`)."""
    return report_written(args, lambda: _report_compare(args))


def _report_compare(args: argparse.Namespace) -> tuple[Any, dict[str, Any] | None]:
    from bstar.report import save_compare_plot, write_compare_report

    rows = compare_rows(args)
    path = write_compare_report(rows, args.output, command_line())
    if getattr(args, "plot", None):
        save_compare_plot(rows, args.plot)
    return path, None


def run_disagg_plan(args: argparse.Namespace) -> int:
    from bstar.commands.disagg_flags import disagg_from_args, disagg_speculative
    from bstar.disaggregate import plan_disaggregated
    from bstar.report.text import print_disagg_plan

    dd = disagg_from_args(args)
    plan = plan_disaggregated(dd, args.prompt_tokens or 1024, args.output_tokens or 1024,
                              concurrency=args.concurrency, rate_req_s=args.rate,
                              speculative=disagg_speculative(args))
    data = plan.to_dict()
    return emit(args, lambda: data, lambda: print_disagg_plan(data))
