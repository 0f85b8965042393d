"""`bstar models` and `bstar gpus`: the bundled catalogs, each a rich table that fits the
terminal, then where every figure comes from."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bstar.report.text._common import Column, console, table_to_width
from bstar.units import GiB, fmt_count

if TYPE_CHECKING:
    from rich.console import Console


def print_models(rows: list[dict[str, Any]], out: Console | None = None) -> None:
    c = out or console()
    cols = [Column("id"), Column("params", True), Column("published", True, drop=2),
            Column("active", True), Column("attention"), Column("layers", True, drop=3),
            Column("dtype"), Column("hf repo", keep=False, drop=1)]
    cells = [[r["id"], fmt_count(r["params"]), fmt_count(r["published_params"]),
              fmt_count(r["active_params"]) if r["moe"] else "", r["attention"],
              str(r["layers"]), r["dtype"], r["hf_repo"]] for r in rows]
    c.print(table_to_width(c, cols, cells, title="Bundled model presets (parameters "
                                                 "computed from config.json)"))
    c.print("[bold]sources[/] (each preset's config.json):")
    for r in rows:
        c.print(f"  {r['id']}: {r['source'] or r['hf_repo']}", overflow="fold")


def print_gpus(rows: list[dict[str, Any]], out: Console | None = None) -> None:
    c = out or console()
    cols = [Column("id"), Column("name", keep=False, drop=1), Column("memory\nGiB", True),
            Column("HBM\nTB/s", True), Column("BF16\nTFLOP/s", True),
            Column("FP8\nTFLOP/s", True), Column("ridge", True, drop=2),
            Column("interconnect\nGB/s", True, drop=3)]
    cells = [[r["id"], r["name"], f"{r['memory_bytes'] / GiB:.2f}",
              f"{r['hbm_bandwidth_bytes_s'] / 1e12:.3f}", f"{r['bf16_flops'] / 1e12:.1f}",
              f"{r['fp8_flops'] / 1e12:.1f}" if r["fp8_flops"] else "-",
              f"{r['bf16_flops'] / r['hbm_bandwidth_bytes_s']:.0f}",
              f"{r['interconnect_bytes_s'] / 1e9:.0f}"] for r in rows]
    c.print(table_to_width(c, cols, cells, title="GPU catalog (memory as the device reports "
                                                 "it; rates dense, decimal)"))
    c.print("[bold]sources[/] (datasheets; memory as the device reports it):")
    for r in rows:
        mem = f"; memory: {r['memory_source']}" if r.get("memory_source") else ""
        c.print(f"  {r['id']}: {r.get('source') or r.get('provenance') or '-'}{mem}",
                overflow="fold")
