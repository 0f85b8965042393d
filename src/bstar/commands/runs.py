"""`bstar runs list|show|export|compare`: read the sweep results store.

Standard library only at top level; rich and the loadgen modules load in run.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
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


def _flat_level(lv: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in lv.items():
        if k in ("server", "error_kinds"):
            out[k] = json.dumps(v) if v else ""
        elif isinstance(v, dict):
            for kk, vv in v.items():
                out[f"{k}_{kk}"] = vv
        else:
            out[k] = v
    return out


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


# The columns that mark a file as an earlier `runs export` (levels, or requests).
_EXPORT_MARKS = ({"concurrency", "status", "requests", "errors"},
                 {"level", "attempt", "level_id", "start_s", "token_source"})


def _is_export(path: Any) -> bool:
    """Whether the existing file at `path` is an earlier `bstar runs export` (CSV or JSON,
    levels or requests) or empty, so that overwriting it loses nothing else."""
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 16)
    except OSError:
        return False
    if not head.strip():
        return True
    try:
        text = head.decode("utf-8-sig")
    except UnicodeDecodeError:
        return False
    first = text.lstrip()
    if first.startswith("["):
        try:
            with open(path, encoding="utf-8") as f:
                rows = json.load(f)
        except (OSError, ValueError):
            return False
        return isinstance(rows, list) and all(isinstance(r, dict) for r in rows) and (
            not rows or any(m <= set(rows[0]) for m in _EXPORT_MARKS))
    header = set(next(csv.reader([text.splitlines()[0]]), []))
    return any(m <= header for m in _EXPORT_MARKS)


def _check_output(args: argparse.Namespace, db: Any) -> None:
    """Refuse an -o that would destroy data: the DB itself (or its -wal/-shm), a folder, or
    an existing file that is not an earlier export (unless --force)."""
    from pathlib import Path

    from bstar.errors import BstarError

    out = Path(args.output)
    if out.is_dir():
        raise BstarError(f"-o {out} is a folder; give a file")
    if not out.exists():
        return
    dbp = Path(db).resolve()
    same = {dbp, Path(f"{dbp}-wal"), Path(f"{dbp}-shm"), Path(f"{dbp}-journal")}
    if out.resolve() in same or (dbp.exists() and out.samefile(dbp)):
        raise BstarError(f"-o {out} is the results DB itself; export to another file")
    with open(out, "rb") as f:
        sqlite = f.read(16) == b"SQLite format 3\x00"
    if sqlite:
        raise BstarError(f"-o {out} is a SQLite database; bstar does not overwrite it "
                         "(export to another file)")
    if not getattr(args, "force", False) and not _is_export(out):
        raise BstarError(f"-o {out} exists and is not an earlier bstar export; "
                         "give --force to overwrite it, or another file")


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
    from bstar.loadgen.sweep import load_result
    from bstar.redact import redact_obj

    if args.output:
        _check_output(args, store.path)
    res = load_result(store, args.run)
    if args.what == "levels":
        rows = [_flat_level(lv) for lv in res.to_dict()["levels"]]
    else:
        rows = store.request_rows(res.run_id)
    # Rows stored before masking existed may hold a key: masked on the way out too.
    rows = redact_obj(finite(rows))
    if args.format == "json":
        text = json.dumps(rows, indent=2) + "\n"
    else:
        buf = io.StringIO()
        cols: list[str] = []
        for r in rows:
            cols += [k for k in r if k not in cols]
        w = csv.DictWriter(buf, fieldnames=cols)
        w.writeheader()
        w.writerows(_csv_cells(r) for r in rows)
        text = buf.getvalue()
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


# A cell a spreadsheet would run as a formula (OWASP's "CSV injection" list): a server's
# text (an error body, a model id) must stay text.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _csv_cells(row: dict[str, Any]) -> dict[str, Any]:
    """A row for `runs export --format csv`: text cells that start like a formula get a
    leading apostrophe (numbers stay numbers)."""
    return {k: "'" + v if isinstance(v, str) and v.startswith(_FORMULA_START) else v
            for k, v in row.items()}
