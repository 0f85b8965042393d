"""`bstar sweep` and `bstar runs`: a run's level table and verdict, the sweep's live
progress bars, the list of stored runs and runs side by side."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bstar.report.text._common import elided, gap_row, rich_table, wide_console
from bstar.report.text._common import markup_text as mt
from bstar.units import fmt_ms, sparkline

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from bstar.loadgen.sweep import SweepResult


def _cell_ms(v: float | None) -> str:
    """A measured latency in a level's cell: one decimal is within its noise."""
    return fmt_ms(v, 1, "-")


def level_name(lv: dict[str, Any]) -> str:
    parts = []
    if lv.get("max_num_seqs") is not None:
        parts.append(f"mns {lv['max_num_seqs']}")
    if lv.get("rate") is not None:
        parts.append(f"{lv['rate']:g}/s")
    elif lv.get("concurrency") is not None:
        parts.append(f"c {lv['concurrency']}")
    return " ".join(parts)


def levels_table(result: SweepResult, title: str | None = None) -> Table:
    d = result.to_dict()
    levels = d["levels"]
    has_pred = any(lv.get("predicted") for lv in levels)
    has_srv = any(lv.get("preemptions") is not None or lv.get("kv_cache_usage_max") is not None
                  or lv.get("running_max") is not None for lv in levels)
    t = rich_table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    for col, just in (("level", "left"), ("reqs", "right"), ("err", "right"),
                      ("tok/s", "right"), ("TTFT p50/p99 ms", "right"),
                      ("TPOT p50/p99 ms", "right"), ("ITL p50/p99 ms", "right")):
        t.add_column(col, justify=just, no_wrap=True)  # type: ignore[arg-type]
    if any(lv.get("goodput_req_s") is not None for lv in levels):
        t.add_column("goodput req/s", justify="right")
    if has_srv:
        t.add_column("preempt", justify="right")
        t.add_column("KV max", justify="right")
        t.add_column("run/wait max", justify="right")
    if has_pred:
        # Like for like: the measured tok/s counts every request's prefill, and so does the
        # prediction the sweep stored with its lengths (older runs: B / step, said so).
        incl = any((lv.get("predicted") or {}).get("throughput_basis") == "incl_prefill"
                   for lv in levels)
        t.add_column("model tok/s incl. prefill (err)" if incl
                     else "model tok/s decode-only (err)", justify="right")
        t.add_column("model TPOT ms (err)", justify="right")
    t.add_column("status")
    for k in elided(len(levels)):
        if k is None:
            t.add_row(f"[dim]{gap_row(len(levels), where='--json or runs export')}[/]")
            continue
        lv = levels[k]
        row = [
            level_name(lv), str(lv["requests"]), str(lv["errors"]) if lv["errors"] else "0",
            f"{lv['throughput_tok_s']:.1f}" if lv.get("throughput_tok_s") else "-",
            f"{_cell_ms(lv['ttft_ms']['p50'])} / {_cell_ms(lv['ttft_ms']['p99'])}",
            f"{_cell_ms(lv['tpot_ms']['p50'])} / {_cell_ms(lv['tpot_ms']['p99'])}",
            f"{_cell_ms(lv['itl_ms']['p50'])} / {_cell_ms(lv['itl_ms']['p99'])}",
        ]
        if any(x.get("goodput_req_s") is not None for x in levels):
            g = lv.get("goodput_req_s")
            row.append("-" if g is None else f"{g:.2f}")
        if has_srv:
            p = lv.get("preemptions")
            kv = lv.get("kv_cache_usage_max")
            rm, wm = lv.get("running_max"), lv.get("waiting_max")
            row += ["-" if p is None else str(p), "-" if kv is None else f"{kv * 100:.0f}%",
                    "-" if rm is None else f"{rm:g}/{wm if wm is not None else 0:g}"]
        if has_pred:
            pr = lv.get("predicted") or {}
            if pr.get("throughput_tok_s"):
                e = pr.get("throughput_error")
                row.append(f"{pr['throughput_tok_s']:.1f}"
                           + (f" ({e * 100:+.0f}%)" if e is not None else ""))
                e = pr.get("tpot_error")
                row.append(f"{pr['tpot_ms']:.2f}" + (f" ({e * 100:+.0f}%)" if e is not None
                                                     else ""))
            else:
                row += ["-", "-"]
        st = lv["status"]
        row.append(st if st == "completed" else f"[yellow]{mt(st)}[/]")
        t.add_row(*row)
    return t


def print_result(result: SweepResult, console: Console | None = None) -> None:
    console = console or wide_console()
    d = result.to_dict()
    # The model id and version are the server's words, the rest the DB's: data, not markup.
    head = f"run {mt(d['run_id'])}  {mt(d['url'])}  model {mt(d['served_model'] or '?')}"
    if d.get("server_version"):
        head += f"  ({mt(d['server_version'])})"
    console.print(f"[bold]{head}[/]")
    console.print(levels_table(result))
    done = [lv for lv in d["levels"] if lv.get("throughput_tok_s")]
    if len(done) > 1:
        # Without the plot extra, the shape of the curve at a glance.
        console.print(f"throughput {sparkline([float(lv['throughput_tok_s']) for lv in done])}"
                      f"  {level_name(done[0])} .. {level_name(done[-1])}")
    seen_caps: set[tuple[Any, Any]] = set()
    for lv in d["levels"]:
        if (lv.get("status_detail") and lv["status"] != "completed") or lv["errors"]:
            console.print(f"  [yellow]{level_name(lv)}[/]: "
                          f"{mt(lv.get('status_detail') or '', 400)}")
        cap = lv.get("kv_capacity_seqs")
        pred = lv.get("predicted") or {}
        if cap is not None and (cap, pred.get("b_mem")) not in seen_caps:
            seen_caps.add((cap, pred.get("b_mem")))
            extra = f" (cost model B_mem: {pred['b_mem']})" if pred.get("b_mem") else ""
            console.print(f"  {level_name(lv)}: server KV pool holds {cap} sequences of "
                          f"this length{extra}")
    if d.get("kv_regime"):
        console.print("[bold]regime (from /metrics)[/]")
        for line in d["kv_regime"]["verdict"].splitlines():
            console.print(f"  {line}", highlight=False)
    hits = [lv for lv in d["levels"] if (lv.get("server") or {}).get("prefix_cache_hit_tokens")]
    for lv in hits:
        # A cache hit means the level measured less prefill than a fresh prompt needs.
        srv = lv["server"]
        rate = lv.get("prefix_cache_hit_rate")
        share = f" ({rate:.0%})" if rate is not None else ""
        console.print(f"  [yellow]{level_name(lv)}[/]: prefix cache served "
                      f"{srv['prefix_cache_hit_tokens']:,} of "
                      f"{srv.get('prefix_cache_query_tokens') or '?'} prompt tokens{share}")
    if hits:
        console.print("  (repeated prompts: a replayed --seed measures a warm cache)")
    for lv in d["levels"]:
        srv = lv.get("server") or {}
        if (srv.get("prefix_cache_segments") or 1) > 1:
            console.print(f"  [yellow]{level_name(lv)}[/]: the prefix-cache counters fell "
                          f"{srv['prefix_cache_segments'] - 1} time(s) between scrapes (a "
                          "restarted server?); the level's counts are summed over "
                          f"{srv['prefix_cache_segments']} segments")
        if srv.get("prefix_cache_refused"):
            console.print(f"  [yellow]{level_name(lv)}[/]: prefix-cache counters refused: "
                          f"{mt(srv['prefix_cache_refused'], 300)}")
    opts = d.get("options") or {}
    if opts.get("seed") is not None and not opts.get("prompts_file"):
        console.print(f"prompts: seed {opts['seed']} (--seed {opts['seed']} replays them)")
    knee = d["knee"]
    if knee.get("note"):
        console.print(f"knee: {knee['note']}")
    for name, k in (knee.get("rules") or {}).items():
        b = "-" if k["batch"] is None else str(k["batch"])
        console.print(f"knee ({name}): [bold]{b}[/]  {k['reason']}")
    rec = d.get("recommendation")
    if rec:
        console.print(f"[bold green]recommendation: max_num_seqs = {rec['max_num_seqs']}[/]  "
                      f"{rec['reason']}")
    status = d.get("status")
    if status and status != "completed":
        console.print(f"[yellow]run status: {mt(status)}[/] "
                      f"{mt(d.get('status_detail') or '', 400)}")


class Progress:
    """Rich progress bars (on stderr) fed by run_sweep's events."""

    def __init__(self, console: Console | None = None) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as RichProgress

        self.console = console or Console(stderr=True)
        self.p = RichProgress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=self.console,
            transient=False)
        self.tasks: dict[int, Any] = {}
        self.tokens: dict[int, int] = {}

    def __enter__(self) -> Progress:
        self.p.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.p.__exit__(*exc)

    def __call__(self, kind: str, data: dict[str, Any]) -> None:
        if kind == "run_start":
            self.console.print(f"run {mt(data['run_id'])} -> {mt(data['db'], 400)}")
        elif kind == "power_source":
            self.console.print(mt(data["detail"], 400) if data["source"] else
                               f"[yellow]{mt(data['detail'], 400)}[/]")
        elif kind == "server_start":
            self.console.print(f"starting server: {data['cmd']}  (log {data['log']})")
        elif kind == "server_ready":
            self.console.print(f"server healthy after {data['start_s']:.1f} s")
        elif kind == "level_start":
            self.tasks[data["level"]] = self.p.add_task(data["label"], total=data["total"],
                                                        info="")
            self.tokens[data["level"]] = 0
        elif kind == "request":
            lv = data["level"]
            self.tokens[lv] += data["output_tokens"] if data["ok"] else 0
            tps = self.tokens[lv] / max(data["elapsed_s"], 1e-9)
            err = f"  [red]{data['errors']} err[/]" if data["errors"] else ""
            self.p.update(self.tasks[lv], completed=data["done"], info=f"{tps:7.1f} tok/s{err}")
        elif kind == "level_end":
            lv = data["level"]
            if data["status"] != "completed" and data.get("detail"):
                self.console.print(f"[yellow]level {lv}: {data['status']}[/] "
                                   f"{mt(data['detail'], 400)}")


def print_runs(runs: list[dict[str, Any]], title: str, out: Console) -> None:
    """`bstar runs list`: one row per stored run, newest first."""
    if not runs:
        out.print(f"no runs in {mt(title, 400)}")
        return
    t = rich_table(show_edge=False, pad_edge=False, title=mt(title, 400), title_justify="left")
    for c in ("run", "when (UTC)", "status", "url", "model", "levels done"):
        t.add_column(c)
    for r in runs:
        t.add_row(mt(r["id"]), mt(r["created_at"]), mt(r["status"]), mt(r["url"]),
                  mt(r["served_model"] or "-"), mt(r["levels_done"]))
    out.print(t)


def print_runs_compare(cmp: dict[str, Any], out: Console) -> None:
    """`bstar runs compare` (`loadgen.sweep.compare_results`): a column per run, the
    throughput ratio for two, then each run's recommendation."""
    names = cmp["runs"]
    t = rich_table(show_edge=False, pad_edge=False)
    t.add_column("level")
    for run_id in names:
        t.add_column(f"{mt(run_id)}\ntok/s | TPOT p50 | TTFT p99", justify="right")
    if len(names) == 2:
        t.add_column("tok/s ratio", justify="right")
    for row in cmp["levels"]:
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
        if len(names) == 2:
            a, b = row["runs"]
            ok = a and b and a["throughput_tok_s"] and b["throughput_tok_s"]
            cells.append(f"{b['throughput_tok_s'] / a['throughput_tok_s']:.2f}x" if ok else "-")
        t.add_row(*cells)
    out.print(t)
    for run_id, rec in zip(names, cmp["recommendations"], strict=True):
        out.print(f"{mt(run_id)}: " + (f"max_num_seqs = {rec['max_num_seqs']} ({rec['bound']})"
                                   if rec else "no verdict"))
