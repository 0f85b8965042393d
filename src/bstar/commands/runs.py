"""`bstar runs list|show|export|compare`: read the sweep results store.

Standard library only at top level; rich and the loadgen modules load in run.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from bstar.commands.emit import emit


def add_runs_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", help="results DB (default ${BSTAR_DATA_DIR:-~/.local/share/bstar}"
                   "/runs.db)")
    sub = p.add_subparsers(dest="runs_command", metavar="ACTION")
    ls = sub.add_parser("list", help="stored runs, newest first")
    ls.add_argument("--limit", type=int, default=50)
    ls.add_argument("--json", action="store_true")
    sh = sub.add_parser("show", help="one run's verdict table")
    sh.add_argument("run")
    sh.add_argument("--json", action="store_true", help="the sweep --json object")
    ex = sub.add_parser("export", help="a run's levels or requests as CSV or JSON")
    ex.add_argument("run")
    ex.add_argument("--format", choices=["csv", "json"], default="csv")
    ex.add_argument("--what", choices=["levels", "requests"], default="levels")
    ex.add_argument("-o", "--output", help="file to write (default: stdout); never the DB "
                    "itself, nor an existing file that is not an earlier export")
    ex.add_argument("--force", action="store_true",
                    help="overwrite an existing -o file that is not an earlier export")
    cp = sub.add_parser("compare", help="two or more runs side by side, level by level")
    cp.add_argument("runs", nargs="+")
    cp.add_argument("--json", action="store_true")
    for sp in (ls, sh, ex, cp):
        sp.add_argument("--db", default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def run_runs(args: argparse.Namespace) -> int:
    from bstar.db import DbError
    from bstar.errors import BstarError
    from bstar.loadgen.store import Store

    action = args.runs_command or "list"
    handlers = {"list": _list, "show": _show, "export": _export, "compare": _compare}
    if action not in handlers:
        raise BstarError(f"unknown runs action {action!r}")
    # Every action only reads: the DB opens read-only, never created, never altered.
    store = Store(args.db, readonly=True)
    try:
        return handlers[action](args, store)
    except DbError as e:
        raise BstarError(f"cannot read the results DB {store.path}: {e}") from None
    finally:
        store.close()


def _list(args: argparse.Namespace, store: Any) -> int:
    from bstar.report.text import print_runs, wide_console

    runs = store.list_runs(getattr(args, "limit", 50))
    rows = [{k: r[k] for k in ("id", "created_at", "status", "url", "served_model",
                               "server_version", "levels_done")} for r in runs]
    return emit(args, lambda: rows, lambda: print_runs(runs, str(store.path), wide_console()))


def _show(args: argparse.Namespace, store: Any) -> int:
    from bstar.loadgen.sweep import load_result
    from bstar.report.text import print_result, wide_console

    res = load_result(store, args.run)
    return emit(args, res.to_dict, lambda: print_result(res, wide_console()))


def _export(args: argparse.Namespace, store: Any) -> int:
    from bstar.commands.emit import finite
    from bstar.errors import BstarError
    from bstar.loadgen.export import check_export_output, export_text, flat_level
    from bstar.loadgen.sweep import load_result
    from bstar.redact import redact_obj

    if args.output:
        check_export_output(args.output, store.path, getattr(args, "force", False))
    res = load_result(store, args.run)
    if args.what == "levels":
        rows = [flat_level(lv) for lv in res.to_dict()["levels"]]
    else:
        rows = store.request_rows(res.run_id)
    # Rows stored before masking existed may hold a key: masked on the way out too.
    text = export_text(redact_obj(finite(rows)), args.format)
    if args.output:
        try:
            with open(args.output, "w", encoding="utf-8", newline="") as f:
                f.write(text)
        except OSError as e:
            raise BstarError(f"cannot write -o {args.output}: {e.strerror or e}") from None
    else:
        sys.stdout.write(text)
    return 0


def _compare(args: argparse.Namespace, store: Any) -> int:
    from bstar.errors import BstarError
    from bstar.loadgen.sweep import compare_results, load_result
    from bstar.report.text import print_runs_compare, wide_console

    if len(args.runs) < 2:
        raise BstarError("compare needs at least two runs")
    cmp = compare_results([load_result(store, r) for r in args.runs])
    return emit(args, lambda: cmp, lambda: print_runs_compare(cmp, wide_console()))
