"""`bstar compare`: B*, B_mem and the recommendation per model x GPU x context, one rich
table that fits the terminal (columns leave in rank order; --json has them all)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bstar.report.text._common import Column, console, fmt_b_star, table_to_width
from bstar.report.text._common import markup_text as mt
from bstar.units import GB, KiB, MiB

if TYPE_CHECKING:
    from rich.console import Console


def print_compare(rows: list[dict[str, Any]], out: Console | None = None) -> None:
    c = out or console()
    cols = [Column("model"), Column("gpu"), Column("attn", drop=1),
            Column("W\nGB", True, drop=4), Column("KV/token\nKiB", True, drop=2),
            Column("context", True), Column("KV/seq\nMiB", True, drop=3),
            Column("B*", True), Column("B_mem", True), Column("crossover", True, drop=5),
            Column("TPOT@1\nms", True, drop=6), Column("max_num\n_seqs", True),
            Column("bound", keep=False, drop=7)]
    c.print(table_to_width(c, cols, [compare_cells(r) for r in rows],
                           title="B* = W / kv_per_seq and B_mem per model, GPU and context"))
    for r in rows:
        if not r["fits"]:
            need = r.get("min_num_gpus")
            c.print(f"[red]{mt(r['model'])} on {r['num_gpus']} x {mt(r['gpu'])} at "
                    f"{r['context_tokens']} tokens does not fit[/]: "
                    + (f"the smallest tensor-parallel size that fits is --num-gpus {need}"
                       if need else "no tensor-parallel size up to 64 fits"))
        for w in r.get("warnings") or ():
            c.print(f"[yellow]warning ({mt(r['model'])}, {r['context_tokens']} tokens): "
                    f"{mt(w, 400)}[/]")
    c.print("[dim]GB = 1e9 bytes; KiB/MiB = 2^10/2^20. crossover: batch where compute "
            "overtakes memory ('-': never). Columns that do not fit the terminal are left "
            "out; --json has them all.[/]")


def compare_cells(r: dict[str, Any]) -> list[str]:
    """One row's cells (rich markup): sizes, then B*, B_mem and the recommendation, or
    'no fit' and the GPU count that holds one sequence."""
    sizes = [mt(r["model"]), f"{r['num_gpus']}x{mt(r['gpu'])}", r["attention"],
             f"{r['weight_bytes'] / GB:.2f}", f"{r['kv_bytes_per_token'] / KiB:.0f}",
             str(r["context_tokens"]), f"{r['kv_bytes_per_seq'] / MiB:.0f}"]
    if not r["fits"]:
        # No B* or B_mem for a deployment that cannot hold one sequence: say so, and the
        # smallest GPU count that does.
        need = r.get("min_num_gpus")
        return [*sizes, "-", "[red]no fit[/]", "-", "-",
                f"[red]--num-gpus {need}[/]" if need else "[red]none[/]",
                "[red]does not fit[/]"]
    cross = r["compute_crossover_batch"]
    return [*sizes, fmt_b_star(r["b_star"]), str(r["b_mem"]),
            f"{cross:.0f}" if cross is not None else "-",
            f"{r['tpot_batch1_ms']:.2f}", str(r["recommendation"]["max_num_seqs"]),
            r["recommendation"]["bound"]]
