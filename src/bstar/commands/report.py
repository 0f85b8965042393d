"""`bstar report SOURCE ... -o report.html`: one self-contained HTML file of a plan, a
comparison, a fit, a stored sweep run, a simulation or a search. Standard library only at
top level.

A source that reruns a command (plan, compare, fit, simulate, search) takes that command's
flags and is written by that command's module (`report_SOURCE`, e.g.
`commands/plan.report_plan`): `bstar.cli.REPORT_SOURCES` hands them to
`add_report_arguments`, so no command module imports another. The stored sweep run's page
is this module's own (`run_report`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

from bstar.commands.common import (
    add_force_argument,
    add_report_output,
    command_line,
    report_written,
)

# (source, help, the command's add_*_arguments, "module:function" that writes the page)
ReportSource = tuple[str, str, Callable[[argparse.ArgumentParser], None], str]


def add_report_arguments(p: argparse.ArgumentParser,
                         sources: Sequence[ReportSource] = ()) -> None:
    sub = p.add_subparsers(dest="report_source", metavar="SOURCE", required=True)
    for name, help_, add_arguments, run in sources:
        sp = sub.add_parser(name, help=help_,
                            description=f"Report of `bstar {name}` with the same flags.")
        add_arguments(sp)
        add_report_output(sp)
        sp.set_defaults(_run=run)
    sr = sub.add_parser("run", help="a stored sweep run (bstar sweep / bstar runs)",
                        description="Report of a sweep run stored in the results DB.")
    sr.add_argument("run_id", metavar="RUN_ID", help="the run's id (bstar runs lists them)")
    sr.add_argument("--db", default=None, help="results DB (default: bstar sweep's default, "
                                               "${BSTAR_DATA_DIR:-~/.local/share/bstar}/runs.db)")
    sr.add_argument("--plot", default=None, metavar="FILE.png|.svg",
                    help="also write the sweep chart as an image")
    add_force_argument(sr)
    sr.add_argument("--json", action="store_true", help="print {\"report\": path, ...}")
    add_report_output(sr)


def run_report(args: argparse.Namespace) -> int:
    """`bstar report run RUN_ID`: the page of a stored sweep run."""
    return report_written(args, lambda: _report_run(args))


def _report_run(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
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
    path = write_sweep_report(sweep, args.output, command_line())
    if args.plot:
        save_sweep_plot(sweep, args.plot)
    return path, {"run_id": sweep["run_id"], "recommendation": sweep.get("recommendation")}
