"""Every terminal renderer (rich tables and text) over bstar's result objects: plans,
comparisons, catalogs, fits, simulations and sweeps (with the sweep's live progress).
No computation here; the commands call these through `commands/emit.py`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

from bstar.units import GB, GiB, KiB, fmt_bytes, fmt_count

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from bstar.loadgen.sweep import SweepResult
    from bstar.plan import Plan
    from bstar.sim.study import Study

_REGIME_STYLE = {"weight-dominated": "green", "kv-dominated": "yellow",
                 "compute-bound": "magenta", "memory-exhausted": "red"}


def console() -> Console:
    import sys

    from rich.console import Console

    # Piped output would wrap at rich's 80-column default and break tables; widen it.
    width = None if sys.stdout.isatty() else 200
    return Console(highlight=False, soft_wrap=False, width=width)


def _styler(stream: Any) -> Callable[[str, str], str]:
    """ANSI styles for a terminal (none when piped or NO_COLOR is set)."""
    import os

    on = bool(getattr(stream, "isatty", lambda: False)()) and "NO_COLOR" not in os.environ
    codes = {"bold": "1", "dim": "2", "red": "31", "green": "32", "yellow": "33",
             "magenta": "35", "bold green": "1;32", "bold red": "1;31"}

    def style(text: str, name: str) -> str:
        return f"\x1b[{codes[name]}m{text}\x1b[0m" if on and name in codes else text
    return style


def fmt_b_star(b: float) -> str:
    """B* with two decimals wherever it is printed beside a batch (14.96, not 15.0)."""
    return f"{b:.2f}"


def _plain_table(headers: list[tuple[str, str]], rows: list[list[tuple[str, str]]],
                 right: list[bool], indent: str = "  ") -> list[str]:
    """Plain-text columns: two header lines, cells (text, style name) never cut."""
    widths = [max(len(h[0]), len(h[1]), *(len(r[i][0]) for r in rows))
              for i, h in enumerate(headers)]

    def cell(text: str, i: int) -> str:
        return text.rjust(widths[i]) if right[i] else text.ljust(widths[i])

    out = [indent + "  ".join(cell(h[k], i) for i, h in enumerate(headers)).rstrip()
           for k in (0, 1)]
    for r in rows:
        out.append(indent + "  ".join(cell(t, i) for i, (t, _) in enumerate(r)).rstrip())
    return out


def _table(**kw: Any) -> Table:
    from rich.table import Table

    return Table(**kw)


def _kind_held(k: dict[str, Any]) -> str:
    """'12 sliding layers x 128 tokens (window 128) 3.1 MB': one kind's share of a sequence."""
    from bstar.units import fmt_bytes

    n, kind = k["layers"], k["kind"]
    if kind == "state":
        return (f"{n} state layers x {k['state_bytes_per_layer']:,} bytes (fixed) "
                f"{fmt_bytes(k['bytes'])}")
    extra = {"sliding": f" (window {k.get('window_tokens', 0):,})",
             "chunked": f" (chunk {k.get('chunk_tokens', 0):,})",
             "dsa": f" (reads top {k.get('topk_tokens', 0):,})"}.get(kind, "")
    return f"{n} {kind} layers x {k['tokens_per_layer']:,} tokens{extra} {fmt_bytes(k['bytes'])}"


def _kind_allocated(k: dict[str, Any]) -> str:
    if k["kind"] == "state":
        return f"state {k['allocated_blocks_per_layer']} pages a layer"
    return f"{k['kind']} {k['allocated_tokens_per_layer']:,} tokens"


def _defaults_line(defaults: tuple[dict[str, Any], ...], b_mem: int,
                   st: Callable[[str, str], str]) -> str:
    """Each engine's own default cap in one line; a warning when one is above B_mem or far
    from the recommendation (`plan.engine_defaults`)."""
    by = {e["engine"]: e for e in defaults}
    v, s = by.get("vllm"), by.get("sglang")
    parts = []
    if v is not None:
        parts.append(f"vLLM {v['max_num_seqs']}")
    if s is not None:
        parts.append(f"SGLang ~{s['max_num_seqs']:,} (KV tokens / 2)")
    if "tgi" in by:
        parts.append("TGI none (token budget)")
    text = "engine defaults without the flag: " + ", ".join(parts)
    if v is not None and v.get("note"):
        return text + "\n    " + st(v["note"], "yellow")
    return text


def print_plan(plan: Plan, out: TextIO | None = None) -> None:
    """`bstar plan` as plain text (no rich: the plan path stays light to import)."""
    import sys

    from bstar.units import GiB, KiB, fmt_count, fmt_ms, sparkline

    stream = out or sys.stdout
    st = _styler(stream)
    lines: list[str] = []
    put = lines.append
    d = plan.deployment
    m, g, e = d.model, d.gpu, d.eff
    put(st(m.name, "bold") + f" ({fmt_count(m.num_params)} params"
        + (f", {fmt_count(m.num_active_params)} active" if m.is_moe else "")
        + f", {m.attention_kind}, {m.num_layers} layers) on "
        + st(f"{d.num_gpus} x {g.name}", "bold") + f" ({g.id})")
    put(f"  weights W        {fmt_bytes(plan.weight_bytes)} in {d.weight.name}"
        + (f"; {fmt_bytes(plan.weight_bytes_per_gpu)} per GPU" if d.num_gpus > 1 else ""))
    put(f"  KV per token     {plan.kv_bytes_per_token:,} bytes "
        f"({plan.kv_bytes_per_token / KiB:.1f} KiB) in {d.kv.name}")
    put(f"  GPU memory       {fmt_bytes(g.memory_bytes)} x util {d.gpu_util:g} - weights - "
        f"reserve {d.reserve_bytes / GiB:.2f} GiB = KV pool {fmt_bytes(plan.kv_pool_bytes)}"
        " per GPU")
    put(f"  HBM bandwidth    {g.hbm_bandwidth_bytes_s / 1e12:.3f} TB/s x {e.bandwidth:g}; "
        f"peak {d.weight.compute} {g.peak_flops(d.weight.compute) / 1e12:.1f} TFLOP/s x "
        f"{e.compute:g}; ridge {g.ridge_flops_per_byte:.1f} FLOP/byte; overhead "
        f"{e.overhead_s * 1e3:g} ms + {e.overhead_per_seq_s * 1e6:g} us/seq per step")
    prof = plan.to_dict().get("engine_profile")
    if prof:
        put(f"  engine priors    {prof['name']} ({prof['basis']}; --engine, "
            "docs/cost-model.md; a --profile replaces them)")
    elif d.engine == "ideal":
        put("  engine priors    none (--ideal: the pure roofline, cost model 1)")
    queued_any = False
    for cp in plan.contexts:
        put("")
        cross = (f"{cp.compute_crossover_batch:.1f}" if cp.compute_crossover_batch is not None
                 else "none (memory-bound at any batch)")
        put(st(f"context {cp.context_tokens} tokens", "bold") + ": KV per sequence "
            f"{fmt_bytes(cp.kv_bytes_per_seq)}")
        kinds = cp.kv_per_kind
        if len(kinds) > 1 or any(k["kind"] != "full" for k in kinds):
            put("  one sequence holds " + "; ".join(_kind_held(k) for k in kinds))
            put("  the engine allocates " + "; ".join(_kind_allocated(k) for k in kinds)
                + f" = {fmt_bytes(cp.kv_bytes_per_seq_allocated)} per GPU (vLLM V1's per "
                "kind pools, docs/models.md)")
        for w in cp.warnings:
            put("  " + st(f"warning: {w}", "yellow"))
        put(f"  B* = W / kv_per_seq = {st(fmt_b_star(cp.b_star), 'bold')}   B_mem = "
            f"{st(str(cp.b_mem), 'bold')}   compute crossover = {cross}")
        br = cp.b_star_read
        if br is not None and abs(br - cp.b_star) > 0.005 * cp.b_star:
            # The regime column compares the bytes actually read per step, B* the resident
            # weights: say where each switches (docs/cost-model.md, "B* and the regimes").
            put(f"  the regime turns kv-dominated at B = {fmt_b_star(br)}, where KV reads "
                "pass the weight bytes actually read per step (B* counts all resident "
                "weights" + (", every expert" if m.is_moe else "")
                + ("; an untied embedding table is not read" if not m.tie_word_embeddings
                   else "") + ")")
        put(f"  amortized time/token floor (kv_per_seq / BW) = "
            f"{cp.tpot_floor_s * 1e3:.4f} ms; prefill of {cp.context_tokens} tokens ~ "
            f"{cp.prefill_s * 1e3:.1f} ms")
        cv = cp.curve
        rows: list[list[tuple[str, str]]] = []
        for i in range(cv.batch.size):
            r = cv.regime[i]
            b, run = int(cv.batch[i]), int(cv.running_batch[i])
            if b > run:
                # What the engine does past B_mem: B_mem sequences run, the rest wait in
                # its queue (vLLM's "waiting"); the running ones keep B_mem's TPOT.
                queued_any = True
                label, name = f"queued: {run} run, {b - run} wait", "red"
            else:
                label, name = r, _REGIME_STYLE[r]
            rows.append([(str(b), ""), (fmt_ms(float(cv.step_s[i])), ""),
                         (fmt_ms(float(cv.amortized_s_per_token[i])), ""),
                         (f"{cv.throughput_tok_s[i]:,.0f}", ""),
                         (f"{cv.arithmetic_intensity[i]:.1f}", ""), (label, name)])
        table = _plain_table([("batch", ""), ("TPOT ms", "(per request)"),
                              ("amortized", "ms/token"), ("throughput", "tok/s"),
                              ("AI", "FLOP/B"), ("regime", "")],
                             rows, [True, True, True, True, True, False])
        for k, row in enumerate(table):
            if k >= 2:
                label, name = rows[k - 2][-1]
                row = row[: len(row) - len(label)] + st(label, name)
            put(row)
        put(f"  throughput {sparkline([float(x) for x in cv.throughput_tok_s])}")
        rec = cp.recommendation
        put("  " + st(f"max_num_seqs = {rec.max_num_seqs}", "bold green") + f": {rec.reason}")
        at = cp.at_recommendation
        if at is not None:
            put(f"    at {at['batch']}: TPOT {at['tpot_ms']:.2f} ms per request, "
                f"{at['throughput_tok_s']:,.0f} tok/s, {at['regime']} (B* "
                f"{fmt_b_star(cp.b_star)}, B_mem {cp.b_mem})")
        if cp.sla_unmet and cp.tpot_batch1_s is not None:
            put("    " + st(f"the SLO cannot be met on this hardware: the TPOT floor is "
                           f"{cp.tpot_batch1_s * 1e3:.2f} ms (batch 1)", "bold red"))
        for engine, flags in cp.flags.items():
            put(f"    {engine:<13} {flags}")
        put("    " + _defaults_line(cp.engine_defaults, cp.b_mem, st))
    put("")
    put(st("GB = 1e9 bytes, GiB = 2^30. TPOT is per request (= step time); amortized "
           "ms/token = step / batch (seed 000's 'TPOT' curve).", "dim"))
    if queued_any:
        put(st("queued: past B_mem the engine runs B_mem sequences and keeps the rest "
               "waiting (vLLM's queue); TPOT is the running requests', the waiting ones "
               "add queueing time before their first token.", "dim"))
    stream.write("\n".join(lines) + "\n")


@dataclass(frozen=True, slots=True)
class Col:
    """A column of a catalog table: `keep` columns (ids, numbers) are never cut or wrapped;
    the others wrap, and columns with a `drop` rank leave (lowest rank first) when the
    table does not fit the terminal."""

    name: str
    right: bool = False
    keep: bool = True
    drop: int | None = None


def _fit_table(c: Console, cols: list[Col], rows: list[list[str]], **kw: Any) -> Table:
    """A rich table that fits `c.width` without cutting a `keep` cell: wrap the rest, and
    leave out droppable columns while the narrowest layout is still too wide."""
    from rich.text import Text

    def plain(cell: str) -> str:
        return Text.from_markup(cell).plain

    mins = []
    for i, col in enumerate(cols):
        cells = [plain(r[i]) for r in rows]
        head = max(len(w) for w in col.name.split("\n"))
        if col.keep:
            mins.append(max([head, *(len(x) for x in cells)]))
        else:  # wraps at spaces: its longest word
            mins.append(max([head, 1, *(len(w) for x in cells for w in x.split())]))
    shown = list(range(len(cols)))
    # Heavy box with edges: a bar before each column and one after, padding 1 each side.
    while sum(mins[i] + 3 for i in shown) + 1 > c.width:
        droppable = [i for i in shown if cols[i].drop is not None]
        if not droppable:
            break
        shown.remove(min(droppable, key=lambda i: cols[i].drop or 0))
    t = _table(**kw)
    for i in shown:
        col = cols[i]
        t.add_column(col.name, justify="right" if col.right else "left", no_wrap=col.keep,
                     min_width=mins[i] if col.keep else None, overflow="fold")
    for r in rows:
        t.add_row(*(r[i] for i in shown))
    return t


def print_compare(rows: list[dict[str, Any]], out: Console | None = None) -> None:
    c = out or console()
    cols = [Col("model"), Col("gpu"), Col("attn", drop=1), Col("W\nGB", True, drop=4),
            Col("KV/token\nKiB", True, drop=2), Col("context", True),
            Col("KV/seq\nMiB", True, drop=3), Col("B*", True), Col("B_mem", True),
            Col("crossover", True, drop=5), Col("TPOT@1\nms", True, drop=6),
            Col("max_num\n_seqs", True), Col("bound", keep=False, drop=7)]
    cells = []
    for r in rows:
        sizes = [r["model"], f"{r['num_gpus']}x{r['gpu']}", r["attention"],
                 f"{r['weight_bytes'] / GB:.2f}", f"{r['kv_bytes_per_token'] / KiB:.0f}",
                 str(r["context_tokens"]), f"{r['kv_bytes_per_seq'] / 2**20:.0f}"]
        if not r["fits"]:
            # No B* or B_mem for a deployment that cannot hold one sequence: say so, and
            # the smallest GPU count that does.
            need = r.get("min_num_gpus")
            cells.append([*sizes, "-", "[red]no fit[/]", "-", "-",
                          f"[red]--num-gpus {need}[/]" if need else "[red]none[/]",
                          "[red]does not fit[/]"])
            continue
        cross = r["compute_crossover_batch"]
        cells.append([*sizes, fmt_b_star(r["b_star"]), str(r["b_mem"]),
                      f"{cross:.0f}" if cross is not None else "-",
                      f"{r['tpot_batch1_ms']:.2f}", str(r["recommendation"]["max_num_seqs"]),
                      r["recommendation"]["bound"]])
    c.print(_fit_table(c, cols, cells,
                       title="B* = W / kv_per_seq and B_mem per model, GPU and context"))
    for r in rows:
        if not r["fits"]:
            need = r.get("min_num_gpus")
            c.print(f"[red]{r['model']} on {r['num_gpus']} x {r['gpu']} at "
                    f"{r['context_tokens']} tokens does not fit[/]: "
                    + (f"the smallest tensor-parallel size that fits is --num-gpus {need}"
                       if need else "no tensor-parallel size up to 64 fits"))
        for w in r.get("warnings") or ():
            c.print(f"[yellow]warning ({r['model']}, {r['context_tokens']} tokens): {w}[/]")
    c.print("[dim]GB = 1e9 bytes; KiB/MiB = 2^10/2^20. crossover: batch where compute "
            "overtakes memory ('-': never). Columns that do not fit the terminal are left "
            "out; --json has them all.[/]")


def print_models(rows: list[dict[str, Any]], out: Console | None = None) -> None:
    c = out or console()
    cols = [Col("id"), Col("params", True), Col("published", True, drop=2),
            Col("active", True), Col("attention"), Col("layers", True, drop=3),
            Col("dtype"), Col("hf repo", keep=False, drop=1)]
    cells = [[r["id"], fmt_count(r["params"]), fmt_count(r["published_params"]),
              fmt_count(r["active_params"]) if r["moe"] else "", r["attention"],
              str(r["layers"]), r["dtype"], r["hf_repo"]] for r in rows]
    c.print(_fit_table(c, cols, cells,
                       title="Bundled model presets (parameters computed from config.json)"))
    c.print("[bold]sources[/] (each preset's config.json):")
    for r in rows:
        c.print(f"  {r['id']}: {r['source'] or r['hf_repo']}", overflow="fold")


def print_gpus(rows: list[dict[str, Any]], out: Console | None = None) -> None:
    c = out or console()
    cols = [Col("id"), Col("name", keep=False, drop=1), Col("memory\nGiB", True),
            Col("HBM\nTB/s", True), Col("BF16\nTFLOP/s", True), Col("FP8\nTFLOP/s", True),
            Col("ridge", True, drop=2), Col("interconnect\nGB/s", True, drop=3)]
    cells = [[r["id"], r["name"], f"{r['memory_bytes'] / GiB:.2f}",
              f"{r['hbm_bandwidth_bytes_s'] / 1e12:.3f}", f"{r['bf16_flops'] / 1e12:.1f}",
              f"{r['fp8_flops'] / 1e12:.1f}" if r["fp8_flops"] else "-",
              f"{r['bf16_flops'] / r['hbm_bandwidth_bytes_s']:.0f}",
              f"{r['interconnect_bytes_s'] / 1e9:.0f}"] for r in rows]
    c.print(_fit_table(c, cols, cells, title="GPU catalog (memory as the device reports it; "
                                             "rates dense, decimal)"))
    c.print("[bold]sources[/] (datasheets; memory as the device reports it):")
    for r in rows:
        mem = f"; memory: {r['memory_source']}" if r.get("memory_source") else ""
        c.print(f"  {r['id']}: {r.get('source') or r.get('provenance') or '-'}{mem}",
                overflow="fold")


def print_runs(runs: list[dict[str, Any]], title: str, out: Console) -> None:
    """`bstar runs list`: one row per stored run, newest first."""
    if not runs:
        out.print(f"no runs in {title}")
        return
    t = _table(show_edge=False, pad_edge=False, title=title, title_justify="left")
    for c in ("run", "when (UTC)", "status", "url", "model", "levels done"):
        t.add_column(c)
    for r in runs:
        t.add_row(r["id"], r["created_at"], r["status"], r["url"],
                  r["served_model"] or "-", str(r["levels_done"]))
    out.print(t)


def print_runs_compare(cmp: dict[str, Any], out: Console) -> None:
    """`bstar runs compare` (`loadgen.sweep.compare_results`): a column per run, the
    throughput ratio for two, then each run's recommendation."""
    names = cmp["runs"]
    t = _table(show_edge=False, pad_edge=False)
    t.add_column("level")
    for run_id in names:
        t.add_column(f"{run_id}\ntok/s | TPOT p50 | TTFT p99", justify="right")
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
        out.print(f"{run_id}: " + (f"max_num_seqs = {rec['max_num_seqs']} ({rec['bound']})"
                                   if rec else "no verdict"))


# ---- bstar sweep and bstar runs --------------------------------------------------------------
def _ms(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}"


def _level_name(lv: dict[str, Any]) -> str:
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
    t = _table(title=title, title_justify="left", show_edge=False, pad_edge=False)
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
    for lv in levels:
        row = [
            _level_name(lv), str(lv["requests"]), str(lv["errors"]) if lv["errors"] else "0",
            f"{lv['throughput_tok_s']:.1f}" if lv.get("throughput_tok_s") else "-",
            f"{_ms(lv['ttft_ms']['p50'])} / {_ms(lv['ttft_ms']['p99'])}",
            f"{_ms(lv['tpot_ms']['p50'])} / {_ms(lv['tpot_ms']['p99'])}",
            f"{_ms(lv['itl_ms']['p50'])} / {_ms(lv['itl_ms']['p99'])}",
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
        row.append(st if st == "completed" else f"[yellow]{st}[/]")
        t.add_row(*row)
    return t


def wide_console(**kw: Any) -> Console:
    """A console that does not squeeze the level table into 80 columns when piped."""
    import sys

    stream = kw.get("file") or (sys.stderr if kw.get("stderr") else sys.stdout)
    if not stream.isatty():
        kw.setdefault("width", 200)
    from rich.console import Console

    return Console(**kw)


def print_result(result: SweepResult, console: Console | None = None) -> None:
    console = console or wide_console()
    d = result.to_dict()
    head = f"run {d['run_id']}  {d['url']}  model {d['served_model'] or '?'}"
    if d.get("server_version"):
        head += f"  ({d['server_version']})"
    console.print(f"[bold]{head}[/]")
    console.print(levels_table(result))
    done = [lv for lv in d["levels"] if lv.get("throughput_tok_s")]
    if len(done) > 1:
        from bstar.units import sparkline

        # Without the plot extra, the shape of the curve at a glance.
        console.print(f"throughput {sparkline([float(lv['throughput_tok_s']) for lv in done])}"
                      f"  {_level_name(done[0])} .. {_level_name(done[-1])}")
    seen_caps: set[tuple[Any, Any]] = set()
    for lv in d["levels"]:
        if (lv.get("status_detail") and lv["status"] != "completed") or lv["errors"]:
            console.print(f"  [yellow]{_level_name(lv)}[/]: {lv.get('status_detail') or ''}")
        cap = lv.get("kv_capacity_seqs")
        pred = lv.get("predicted") or {}
        if cap is not None and (cap, pred.get("b_mem")) not in seen_caps:
            seen_caps.add((cap, pred.get("b_mem")))
            extra = f" (cost model B_mem: {pred['b_mem']})" if pred.get("b_mem") else ""
            console.print(f"  {_level_name(lv)}: server KV pool holds {cap} sequences of "
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
        console.print(f"  [yellow]{_level_name(lv)}[/]: prefix cache served "
                      f"{srv['prefix_cache_hit_tokens']:,} of "
                      f"{srv.get('prefix_cache_query_tokens') or '?'} prompt tokens{share}")
    if hits:
        console.print("  (repeated prompts: a replayed --seed measures a warm cache)")
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
        console.print(f"[yellow]run status: {status}[/] {d.get('status_detail') or ''}")


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
            self.console.print(f"run {data['run_id']} -> {data['db']}")
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
                self.console.print(f"[yellow]level {lv}: {data['status']}[/] {data['detail']}")


# ---- bstar fit ------------------------------------------------------------------------------
def _iv(v: tuple[float, float] | None, fmt: str) -> str:
    return f" [{format(v[0], fmt)}, {format(v[1], fmt)}]" if v else ""


def print_fit(r: Any, spec: dict[str, Any] | None = None) -> None:
    """Render a FitResult (bstar.fit) as text and rich tables."""

    from bstar.fit import INTERVAL_PCT, LOSS, LOSS_SCALE

    spec = spec or {}
    c = console()
    p, pts = r.params, r.points
    lo, hi = INTERVAL_PCT
    c.print(f"[bold]bstar fit[/] {pts.source}: {len(pts)} points; step(B) = "
            + ("d + " if r.fit_overhead else "") + "max(a + b*B, c*B), robust "
            f"({LOSS} on log step time, scale {LOSS_SCALE:g}); intervals are the "
            f"{lo:g}th-{hi:g}th percentiles of {r.n_bootstrap} bootstrap refits (seed {r.seed})")
    for w in r.warnings:
        c.print(f"[yellow]warning:[/] {w}")
    bw = r.weight_bandwidth_bytes_s
    c.print(f"  a = [bold]{p.a_ms:.4g} ms[/]{_iv(r.param_intervals.get('a_ms'), '.4g')}  per "
            "step, whatever the batch: weight reads + fixed engine overhead"
            + (f"; {fmt_bytes(r.weight_bytes)} of weights ({spec.get('model_name')}) in a = "
               f"{bw / 1e12:.2f} TB/s if a were all weight reads" if bw else ""))
    kvbw = r.kv_bandwidth_bytes_s
    c.print(f"  b = [bold]{p.b_ms:.4g} ms[/]{_iv(r.param_intervals.get('b_ms'), '.4g')}  per "
            "sequence per step: its KV-cache reads (memory side)"
            + (f"; {fmt_bytes(r.kv_bytes_per_seq)} of KV per sequence at "
               f"{spec.get('context')} tokens = {kvbw / 1e12:.2f} TB/s" if kvbw else ""))
    if p.c_ms is not None:
        fl = r.achieved_flops
        src = ""
        if r.roof_source == "cost-model":
            src = (f"; the cost model's: {spec.get('model_name')} on {spec.get('gpu_name')} "
                   f"at {spec.get('flops_eff'):g} of peak")
        elif fl:
            src = (f"; {r.flops_per_token / 1e9:.1f} GFLOP per token in c = "
                   f"{fl / 1e12:.0f} TFLOP/s achieved")
        c.print(f"  c = [bold]{p.c_ms:.4g} ms[/]{_iv(r.param_intervals.get('c_ms'), '.4g')}  "
                "per sequence per step on the compute side (its FLOPs at the achieved rate)"
                + src)
    else:
        c.print("  c = [bold]unknown[/]  the points do not reach the compute roof")
    if r.fit_overhead:
        c.print(f"  d = {p.overhead_ms:.4g} ms  constant overhead on both lines")
    c.print(f"  B* = a/b = [bold]{p.b_star:.1f}[/]{_iv(r.param_intervals.get('b_star'), '.1f')}"
            "  (KV reads per step reach the weight term; seed 000)")
    cross = p.crossover_batch
    if cross is not None:
        c.print(f"  compute roof: memory line meets compute line at B = {cross:.1f}; "
                f"throughput plateau {1e3 / p.c_ms:,.0f} tok/s")
    c.print(f"  roof: [bold]{r.roof_source}[/]: {r.roof_note}")
    for n in r.notes:
        c.print(f"  [dim]note:[/] {n}")
    _print_fit_tables(c, r)


def _print_fit_tables(c: Console, r: Any) -> None:
    """The points beside the fit, the predictions with intervals, the knee by rule."""
    from rich.table import Table

    from bstar.fit import INTERVAL_PCT

    pts = r.points
    lo, hi = INTERVAL_PCT
    t = Table(title="measured points and the fit", show_edge=False)
    for col in ("batch", "throughput\ntok/s", "TPOT ms\n(per request)", "fitted\nTPOT ms",
                "residual", "regime"):
        t.add_column(col, justify="left" if col == "regime" else "right")
    for i, b in enumerate(pts.batch):
        d = pts.derived[i]
        star_t = "*" if d == "throughput_tok_s" else ""
        star_p = "*" if d == "tpot_ms" else ""
        flag = " outlier" if b in r.outliers else ""
        t.add_row(str(b), f"{pts.throughput_tok_s[i]:,.0f}{star_t}",
                  f"{pts.tpot_ms[i]:.4g}{star_p}", f"{r.fitted_tpot_ms[i]:.4g}",
                  f"{r.residual_pct[i]:+.1f}%{flag}", r.regimes[i])
    c.print(t)
    if any(pts.derived):
        c.print("  [dim]* derived: throughput = batch / TPOT[/]")

    t = Table(title=f"predictions ({lo:g}-{hi:g}% interval)", show_edge=False)
    for col in ("batch", "throughput tok/s", "TPOT ms (per request)", "regime", "note"):
        t.add_column(col, justify="left" if col in ("regime", "note") else "right")
    for pr in r.predictions:
        note = ""
        if pr.bound == "tpot_lower_bound":
            note = ("roof unknown: TPOT at least this, throughput at most; high = roof at "
                    f"the last point (B={pts.batch[-1]})")
        elif pr.extrapolated:
            note = "extrapolated past the data"
        t.add_row(str(pr.batch),
                  f"{pr.throughput_tok_s:,.0f} [{pr.throughput_low_tok_s:,.0f}, "
                  f"{pr.throughput_high_tok_s:,.0f}]",
                  f"{pr.tpot_ms:.4g} [{pr.tpot_low_ms:.4g}, {pr.tpot_high_ms:.4g}]",
                  pr.regime, note)
    c.print(t)

    t = Table(title="knee by rule", show_edge=False)
    for col in ("rule", "fitted curve", "measured points", "why (fitted curve)"):
        t.add_column(col, justify="right" if col in ("fitted curve", "measured points")
                     else "left")
    names = {"step": "seed 000: <5%/step", "doubling": "seed 004: <15%/doubling",
             "bca": "BCA (Recasens 2025)", "sla": "SLA"}
    if r.max_tpot_ms is not None:
        names["sla"] = f"SLA TPOT <= {r.max_tpot_ms:g} ms"
    for rule, kf in r.knees_fitted.items():
        km = r.knees_measured.get(rule)
        t.add_row(names.get(rule, rule), "-" if kf.batch is None else str(kf.batch),
                  "-" if km is None or km.batch is None else str(km.batch), kf.reason)
    c.print(t)
    if r.knee_batch is not None:
        c.print(f"[bold green]knee: B = {r.knee_batch}[/] ({r.knee_rule} rule on the fitted "
                "curve)")
    elif r.knee_rule == "sla":
        c.print("[bold red]knee: none[/]: no batch meets the TPOT limit")
    else:
        c.print("[bold]knee: not within the curve[/] (no rule fires where the fit is "
                "trusted)")


# ---- bstar simulate -------------------------------------------------------------------------
def print_simulation(study: Study) -> None:
    """A `bstar simulate` study: the pool, the traffic, a row per level, the timelines and
    the advice."""
    from rich.table import Table

    from bstar import roofline as rl
    from bstar.sim.traffic import parse_lengths

    c = console()
    d, rows, advice, arrivals = study.deployment, study.rows, study.advice, study.arrivals
    args, tokens = study.options, study.max_num_batched_tokens
    first = rows[0]
    inp, out = parse_lengths(args.input_len), parse_lengths(args.output_len)
    c.print(f"[bold]{d.model.name}[/] on [bold]{d.num_gpus} x {d.gpu.name}[/] ({d.gpu.id}): "
            f"KV pool {fmt_bytes(rl.kv_pool_bytes(d))} per GPU = {first.kv_blocks:,} blocks "
            f"of {first.block_size} tokens ({first.kv_blocks * first.block_size:,} tokens)")
    lengths = "lengths from the trace" if args.trace is not None else \
        f"input {inp.describe()}, output {out.describe()}"
    c.print(f"  traffic: {arrivals.describe()}, {lengths}, {first.requests_total:,} requests, "
            f"seed {args.seed}; "
            f"max_num_batched_tokens {tokens}, preemption {args.preemption}")
    t = Table(show_edge=False, pad_edge=False, box=None)
    cols = ["max_num_seqs", "done", "out tok/s", "req/s"]
    if first.goodput_req_s is not None:
        cols.append("goodput\nreq/s")
    cols += ["TTFT ms\np50", "TTFT ms\np99", "TPOT ms\np50", "TPOT ms\np99", "ITL ms\np99",
             "E2E s\np99", "preempt", "KV peak", "queue\nmax", "running\nmax"]
    for col in cols:
        t.add_column(col, justify="right")

    def f(v: float | None, scale: float = 1.0, nd: int = 1) -> str:
        return "-" if v is None else f"{v * scale:,.{nd}f}"

    for r in rows:
        mark = " *" if advice is not None and r.max_num_seqs == advice.max_num_seqs else ""
        cells = [f"{r.max_num_seqs}{mark}",
                 f"{r.requests}/{r.requests_total}" if r.truncated else str(r.requests),
                 f"{r.throughput_tok_s:,.0f}", f"{r.request_throughput_req_s:.2f}"]
        if first.goodput_req_s is not None:
            cells.append(f(r.goodput_req_s, nd=2))
        cells += [f(r.ttft_ms["p50"]), f(r.ttft_ms["p99"]), f(r.tpot_ms["p50"], nd=2),
                  f(r.tpot_ms["p99"], nd=2), f(r.itl_ms["p99"], nd=2),
                  f(r.e2e_ms["p99"], 1e-3, 2),
                  f"[red]{r.preemptions}[/]" if r.preemptions else "0",
                  f"{r.kv_utilization_max * 100:.0f}%", str(r.queue_max), str(r.running_max)]
        t.add_row(*cells)
    c.print(t)
    _print_simulation_tail(c, study)


def _print_simulation_tail(c: Console, study: Study) -> None:
    """Throughput across levels, KV and queue over time, warnings, the knees and advice."""
    from bstar.units import sparkline

    rows, advice, arrivals = study.rows, study.advice, study.arrivals
    if len(rows) > 1:
        c.print(f"  throughput {sparkline([r.throughput_tok_s for r in rows])}")
    queue_top = max(max(r.queue_max for r in rows), 1)
    c.print(f"  over time, peak per bin (KV: 0..100% of the pool; queue: 0..{queue_top}):")
    for r in rows:
        tl = r.timeline
        span = tl["time_s"][-1] if tl["time_s"] else 0.0
        c.print(f"    {r.max_num_seqs:>6}  KV {_bars(tl['kv_utilization'][::2], 1.0):<50} "
                f"queue {_bars(tl['num_waiting'][::2], queue_top):<50} 0..{span:,.0f} s")
    rate = getattr(arrivals, "rate_per_s", None)
    caps = study.capacities or []
    for r, cap in zip(rows, caps, strict=False):
        if cap is None:
            continue
        bound = (f"the KV pool holds {cap['running_max']}" if cap["kv_bound"]
                 else f"a full batch of {cap['running_max']}")
        line = (f"  capacity at max_num_seqs {r.max_num_seqs}: sustains up to "
                f"{cap['capacity_req_s']:.2f} req/s ({cap['capacity_tok_s']:,.0f} out tok/s, "
                f"{bound})")
        if cap.get("at_rate_req_s"):
            line += (f"; at {cap['at_rate_fraction']:.0%} of it ({cap['at_rate_req_s']:.2f} "
                     f"req/s, Poisson) TTFT p50/p99 {cap['ttft_ms']['p50']:,.1f}/"
                     f"{cap['ttft_ms']['p99']:,.1f} ms, TPOT p50/p99 "
                     f"{cap['tpot_ms']['p50']:.2f}/{cap['tpot_ms']['p99']:.2f} ms")
        c.print(line)
    best = max(r.request_throughput_req_s for r in rows)
    top = max((cap["capacity_req_s"] for cap in caps if cap is not None), default=None)
    if rate is not None and ((top is not None and rate >= top)
                             or (top is None and best < 0.95 * rate)):
        c.print(f"  [yellow]overloaded: {rate:g} req/s offered, above the capacity of every "
                "level; the queue grows for the whole run and TTFT is mostly waiting "
                "(its tail grows with --num-requests)[/]")
    for r in rows:
        if r.truncated:
            c.print(f"  [yellow]max_num_seqs {r.max_num_seqs}: stopped at "
                    f"{study.options.max_sim_time_s:g} s simulated with requests unfinished[/]")
    if advice is not None:
        for k in advice.knees.values():
            c.print(f"  knee ({k.rule}): "
                    + (f"[bold]{k.batch}[/]" if k.batch is not None else "none")
                    + f" - {k.reason}")
        c.print(f"  [bold green]max_num_seqs = {advice.max_num_seqs}[/] ({advice.bound}): "
                f"{advice.reason}")
    c.print("[dim]TPOT per request = (E2E - TTFT)/(output - 1); ITL = gaps between tokens; "
            "out tok/s = output tokens / time to the last finish (vLLM benchmark "
            "definitions). Step times from the cost model; * = recommended.[/]")


def _bars(values: list[float], top: float) -> str:
    """A bar per value on a fixed scale 0..top (so levels compare; units.sparkline rescales
    each series to its own range)."""
    bars = " ▁▂▃▄▅▆▇█"
    return "".join(bars[min(8, max(0, round(v / top * 8)))] for v in values)


# ---- bstar search ---------------------------------------------------------------------
def _sn(v: float | None, nd: int = 1) -> str:
    return "-" if v is None else f"{v:,.{nd}f}"


def print_search(s: dict[str, Any], top: int = 15) -> None:
    from rich.table import Table

    c = console()
    tr = s["traffic"]
    slo = ", ".join(f"{k.removesuffix('_ms')} p99 <= {v:g} ms" for k, v in s["slo"].items())
    n = s["counts"]
    c.print(f"[bold]search[/] {', '.join(s['models'])} on {', '.join(s['gpus'])}: demand "
            f"{s['demand_req_s']:g} req/s, input {tr['input_len']['describe']}, output "
            f"{tr['output_len']['describe']} ({tr['num_requests']} requests per simulation, "
            f"seed {tr['seed']}); SLO {slo}")
    t = s["timing"]
    c.print(f"  {n['candidates']} candidates, {n['pruned']} pruned before simulating, "
            f"{n['evaluations']} replica configurations ({t['evaluations_reused']} reused "
            f"from the store), {n['simulations']} simulations; {s['backend']}, "
            f"{t['wall_s']:.1f} s")
    p = s["prices"]
    if p is not None:
        c.print(f"  prices: {p['path']} (as of {p['as_of']}, {p['currency']}; the file's "
                "figures, not current quotes)")
    else:
        c.print("  no --price: ranked by GPUs needed")
    tab = Table(show_edge=False, pad_edge=False, box=None)
    for col in ("#", "model", "GPU", "GPUs\n/inst", "TP", "DP", "max\nseqs", "batched\ntokens",
                "req/s\n/replica", "GPUs\ntotal", "tok/s\n/GPU", "TTFT\np99 ms",
                "TPOT\np99 ms", "cost\n/Mtok", "binding", "terms"):
        tab.add_column(col, justify="left" if col in ("model", "GPU", "binding", "terms")
                       else "right")
    shown = [r for r in s["candidates"] if r["status"] == "ok" and r["rank"] <= top]
    for r in shown:
        mark = " *" if r["pareto_cost"] or r["pareto_throughput"] else ""
        tab.add_row(f"{r['rank']}{mark}", r["model"], r["gpu"], str(r["num_gpus"]),
                    str(r["tensor_parallel"]), str(r["data_parallel"]),
                    str(r["max_num_seqs"]), str(r["max_num_batched_tokens"]),
                    _sn(r["rate_per_replica_req_s"], 2), str(r["gpus_total"]),
                    _sn(r["tok_s_per_gpu"], 0), _sn(r["ttft_p99_ms"], 0),
                    _sn(r["tpot_p99_ms"], 1), _sn(r["cost_per_mtok"], 3), r["limit"],
                    r["terms"])
    c.print(tab)
    rest = [r for r in s["candidates"] if r["status"] != "ok"]
    if rest:
        by: dict[str, int] = {}
        for r in rest:
            by[f"{r['status']} ({r['limit']})"] = by.get(f"{r['status']} ({r['limit']})", 0) + 1
        c.print("  not feasible: " + ", ".join(f"{v} {k}" for k, v in sorted(by.items())))
    for model, w in s["winners"].items():
        cost = (f", {_sn(w['cost_per_mtok'], 3)} {s['prices']['currency']} per million output "
                "tokens" if w["cost_per_mtok"] is not None else "")
        c.print(f"[bold green]{model}[/]: {w['gpus_total']} x {w['gpu']} ({w['instances']} "
                f"instance(s) of {w['num_gpus']} GPUs, TP {w['tensor_parallel']} x DP "
                f"{w['data_parallel']}){cost}; binding: {w['limit']} - {w['reason']}")
        c.print(f"  {w['flags']['vllm']}")
        c.print(f"  sglang: {w['flags']['sglang']}")
    if not s["winners"]:
        c.print("[red]no candidate meets the SLO[/]: loosen it, or add GPUs or faster ones")
    cal = sorted({r["gpu"] for r in s["candidates"] if r["calibrated"]})
    c.print("[dim]terms: "
            + (f"calibrated profiles apply on {', '.join(cal)}; " if cal else "")
            + f"'defaults' rows rest on the stated efficiencies ({_search_eff(s)}). "
              "* = on a Pareto front (cost or tok/s per GPU vs TPOT p99). binding: what "
              "stopped a higher rate per replica (SLO, memory, compute).[/]")


def _search_eff(s: dict[str, Any]) -> str:
    """The efficiencies the search's 'defaults' rows used, from its own spec."""
    e = s["spec"]["efficiency"]
    return (f"bandwidth {e['bandwidth']:.2f}, compute {e['compute']:.2f}, "
            f"{e['overhead_s'] * 1e3:g} ms + {e['overhead_per_seq_s'] * 1e6:g} us/seq per step")
