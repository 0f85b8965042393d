"""`bstar report SOURCE ... -o report.html`: one self-contained HTML file of a plan, a
comparison, a fit, a stored sweep run or a simulation. Standard library only at top level."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from bstar.commands import fit as fit_cmd
from bstar.commands import plan as plan_cmd
from bstar.commands import search as search_cmd
from bstar.commands import simulate as sim_cmd
from bstar.commands.common import add_force_argument, deployment_options


def _add_output(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", required=True, metavar="FILE.html",
                   help="where to write the report (one self-contained HTML file)")
    add_force_argument(p)


def add_report_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="report_source", metavar="SOURCE", required=True)
    sp = sub.add_parser("plan", help="the cost model's plan (takes `bstar plan`'s flags)",
                        description="Report of `bstar plan` with the same flags.")
    plan_cmd.add_plan_arguments(sp)
    _add_output(sp)
    sc = sub.add_parser("compare", help="B* and B_mem across models/GPUs/contexts (takes "
                                        "`bstar compare`'s flags)",
                        description="Report of `bstar compare` with the same flags.")
    plan_cmd.add_compare_arguments(sc)
    _add_output(sc)
    sf = sub.add_parser("fit", help="a fit of measured points (takes `bstar fit`'s POINTS "
                                    "and flags)",
                        description="Report of `bstar fit` with the same arguments.")
    fit_cmd.add_fit_arguments(sf)
    _add_output(sf)
    sr = sub.add_parser("run", help="a stored sweep run (bstar sweep / bstar runs)",
                        description="Report of a sweep run stored in the results DB.")
    sr.add_argument("run_id", metavar="RUN_ID", help="the run's id (bstar runs lists them)")
    sr.add_argument("--db", default=None, help="results DB (default: bstar sweep's default, "
                                               "${BSTAR_DATA_DIR:-~/.local/share/bstar}/runs.db)")
    sr.add_argument("--plot", default=None, metavar="FILE.png|.svg",
                    help="also write the sweep chart as an image")
    add_force_argument(sr)
    sr.add_argument("--json", action="store_true", help="print {\"report\": path, ...}")
    _add_output(sr)
    sm = sub.add_parser("simulate", help="a simulated sweep over max_num_seqs (takes "
                                         "`bstar simulate`'s flags)",
                        description="Report of `bstar simulate` with the same flags.")
    sim_cmd.add_simulate_arguments(sm)
    _add_output(sm)
    ss = sub.add_parser("search", help="the cheapest deployment that meets the SLO (takes "
                                       "`bstar search`'s flags)",
                        description="Report of `bstar search` with the same flags.")
    search_cmd.add_search_arguments(ss)
    _add_output(ss)


def _command_line() -> str:
    # The command as typed, when bstar was started as a program (not from a test harness).
    prog = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path()
    if prog.name == "bstar" or (prog.name == "__main__.py" and prog.parent.name == "bstar"):
        return shlex.join(["bstar", *sys.argv[1:]])
    return ""


def _done(args: argparse.Namespace, path: Any, extra: dict[str, Any] | None = None) -> int:
    from bstar.commands.emit import emit

    return emit(args, lambda: {"report": str(path), **(extra or {})},
                lambda: print(f"report written to {path}"))


def run_report(args: argparse.Namespace) -> int:
    from bstar.errors import BstarError

    try:
        return _run_report(args)
    except OSError as e:
        # The report's file (or --plot's) on a read-only or missing folder: one line.
        where = e.filename or args.output
        raise BstarError(f"cannot write {where}: {e.strerror or e}") from None


def _run_report(args: argparse.Namespace) -> int:
    source = args.report_source
    if source == "plan":
        return _report_plan(args)
    if source == "compare":
        return _report_compare(args)
    if source == "fit":
        return _report_fit(args)
    if source == "simulate":
        return _report_simulate(args)
    if source == "run":
        return _report_run(args)
    if source == "search":
        return _report_search(args)
    raise AssertionError(source)  # argparse only lets the sources above through


def _report_plan(args: argparse.Namespace) -> int:
    from bstar.plan import DEFAULT_CONTEXTS, make_plan
    from bstar.report import save_plan_plot, write_plan_report

    if getattr(args, "num_speculative_tokens", None) is not None:
        from bstar.errors import BstarError

        raise BstarError("the plan report does not draw speculative decoding yet: use "
                         "`bstar plan --num-speculative-tokens K` (text or --json)")
    d = plan_cmd.deployment_from_args(args)
    plan = make_plan(d, tuple(args.context or DEFAULT_CONTEXTS), args.batch, args.max_tpot_ms)
    path = write_plan_report(plan, args.output, _command_line())
    if getattr(args, "plot", None):
        save_plan_plot(plan, args.plot)
    return _done(args, path)


def _report_compare(args: argparse.Namespace) -> int:
    from bstar.report import save_compare_plot, write_compare_report

    rows = plan_cmd.compare_rows(args)
    path = write_compare_report(rows, args.output, _command_line())
    if getattr(args, "plot", None):
        save_compare_plot(rows, args.plot)
    return _done(args, path)


def _report_fit(args: argparse.Namespace) -> int:
    from bstar.report import save_fit_plot, write_fit_report

    result, _spec = fit_cmd.fit_from_args(args)
    path = write_fit_report(result, args.output, _command_line(), deployment_options(args),
                            args.context)
    if getattr(args, "plot", None):
        save_fit_plot(result, args.plot)
    return _done(args, path, {"knee_batch": result.knee_batch})


def _report_simulate(args: argparse.Namespace) -> int:
    from bstar.report import save_simulate_plot, write_simulate_report

    study = sim_cmd.simulate_from_args(args)
    objs = study.to_objects()
    advice = study.advice
    path = write_simulate_report(objs, args.output, _command_line())
    if getattr(args, "plot", None):
        save_simulate_plot(objs, args.plot)
    return _done(args, path, {"max_num_seqs": advice.max_num_seqs if advice else None})


def _report_search(args: argparse.Namespace) -> int:
    from bstar.report import save_search_plot, write_search_report

    result = search_cmd.search_from_args(args, quiet=True)
    obj = result.to_dict()
    path = write_search_report(obj, args.output, _command_line())
    if getattr(args, "plot", None):
        save_search_plot(obj, args.plot)
    winners = {m: {"gpus_total": w["gpus_total"], "gpu": w["gpu"],
                   "cost_per_mtok": w["cost_per_mtok"]} for m, w in obj["winners"].items()}
    return _done(args, path, {"search_id": obj["search_id"], "winners": winners})


def _report_run(args: argparse.Namespace) -> int:
    from bstar.db import DbError
    from bstar.errors import BstarError
    from bstar.loadgen.store import Store
    from bstar.loadgen.sweep import load_result
    from bstar.report import save_sweep_plot, write_sweep_report

    # Read-only: a missing path is an error, never a new empty DB; a foreign or corrupt
    # file is one line.
    with Store(args.db, readonly=True) as store:
        try:
            sweep = load_result(store, args.run_id).to_dict()
        except DbError as e:
            raise BstarError(f"cannot read the results DB {store.path}: {e}") from None
    path = write_sweep_report(sweep, args.output, _command_line())
    if args.plot:
        save_sweep_plot(sweep, args.plot)
    return _done(args, path, {"run_id": sweep["run_id"],
                              "recommendation": sweep.get("recommendation")})
