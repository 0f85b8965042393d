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
    ex.add_argument("-o", "--output", help="file to write (default: stdout)")
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


def _level_key(lv: dict[str, Any]) -> tuple[Any, ...]:
    return (lv.get("max_num_seqs"), lv.get("concurrency"), lv.get("rate"))


def run_runs(args: argparse.Namespace) -> int:
    from rich.table import Table

    from bstar.errors import BstarError
    from bstar.loadgen.store import Store
    from bstar.loadgen.sweep import load_result

    action = args.runs_command or "list"
    store = Store(args.db)
    from bstar.report.text import wide_console

    out = wide_console()
    try:
        if action == "list":
            runs = store.list_runs(getattr(args, "limit", 50))
            if getattr(args, "json", False):
                print(json.dumps([{k: r[k] for k in ("id", "created_at", "status", "url",
                                                     "served_model", "server_version",
                                                     "levels_done")} for r in runs],
                                 indent=2))
                return 0
            if not runs:
                out.print(f"no runs in {store.path}")
                return 0
            t = Table(show_edge=False, pad_edge=False, title=str(store.path),
                      title_justify="left")
            for c in ("run", "when (UTC)", "status", "url", "model", "levels done"):
                t.add_column(c)
            for r in runs:
                t.add_row(r["id"], r["created_at"], r["status"], r["url"],
                          r["served_model"] or "-", str(r["levels_done"]))
            out.print(t)
            return 0
        if action == "show":
            res = load_result(store, args.run)
            if args.json:
                print(json.dumps(res.to_dict(), indent=2))
            else:
                from bstar.report.text import print_result

                print_result(res, out)
            return 0
        if action == "export":
            res = load_result(store, args.run)
            if args.what == "levels":
                rows = [_flat_level(lv) for lv in res.to_dict()["levels"]]
            else:
                rows = store.request_rows(res.run_id)
            if args.format == "json":
                text = json.dumps(rows, indent=2) + "\n"
            else:
                buf = io.StringIO()
                cols: list[str] = []
                for r in rows:
                    cols += [k for k in r if k not in cols]
                w = csv.DictWriter(buf, fieldnames=cols)
                w.writeheader()
                w.writerows(rows)
                text = buf.getvalue()
            if args.output:
                with open(args.output, "w", encoding="utf-8", newline="") as f:
                    f.write(text)
            else:
                sys.stdout.write(text)
            return 0
        if action == "compare":
            if len(args.runs) < 2:
                raise BstarError("compare needs at least two runs")
            results = [load_result(store, r) for r in args.runs]
            dicts = [r.to_dict() for r in results]
            keys: list[tuple[Any, ...]] = []
            for d in dicts:
                keys += [k for k in map(_level_key, d["levels"]) if k not in keys]
            table_rows = []
            for k in keys:
                row: dict[str, Any] = {"max_num_seqs": k[0], "concurrency": k[1], "rate": k[2],
                                       "runs": []}
                for d in dicts:
                    lv = next((x for x in d["levels"] if _level_key(x) == k), None)
                    row["runs"].append(None if lv is None else {
                        "throughput_tok_s": lv["throughput_tok_s"],
                        "tpot_ms_p50": lv["tpot_ms"]["p50"], "tpot_ms_p99": lv["tpot_ms"]["p99"],
                        "ttft_ms_p99": lv["ttft_ms"]["p99"], "errors": lv["errors"],
                        "preemptions": lv["preemptions"]})
                table_rows.append(row)
            if args.json:
                print(json.dumps({"runs": [d["run_id"] for d in dicts],
                                  "recommendations": [d["recommendation"] for d in dicts],
                                  "levels": table_rows}, indent=2))
                return 0
            t = Table(show_edge=False, pad_edge=False)
            t.add_column("level")
            for d in dicts:
                t.add_column(f"{d['run_id']}\ntok/s | TPOT p50 | TTFT p99", justify="right")
            if len(dicts) == 2:
                t.add_column("tok/s ratio", justify="right")
            for row in table_rows:
                name = " ".join(f"{n} {v:g}" for n, v in
                                (("mns", row["max_num_seqs"]), ("c", row["concurrency"]),
                                 ("rate", row["rate"])) if v is not None)
                cells = [name]
                for r in row["runs"]:
                    if r is None or not r["throughput_tok_s"]:
                        cells.append("-")
                        continue
                    tp = r["tpot_ms_p50"]
                    tt = r["ttft_ms_p99"]
                    cells.append(f"{r['throughput_tok_s']:.1f} | "
                                 f"{'-' if tp is None else f'{tp:.1f}'} | "
                                 f"{'-' if tt is None else f'{tt:.0f}'}")
                if len(dicts) == 2:
                    a, b = row["runs"]
                    ok = a and b and a["throughput_tok_s"] and b["throughput_tok_s"]
                    cells.append(f"{b['throughput_tok_s'] / a['throughput_tok_s']:.2f}x"
                                 if ok else "-")
                t.add_row(*cells)
            out.print(t)
            for d in dicts:
                rec = d["recommendation"]
                out.print(f"{d['run_id']}: " + (f"max_num_seqs = {rec['max_num_seqs']} "
                                                f"({rec['bound']})" if rec else "no verdict"))
            return 0
        raise BstarError(f"unknown runs action {action!r}")
    finally:
        store.close()
