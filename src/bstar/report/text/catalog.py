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
    c.print(_chip_table(c, rows))
    c.print("[bold]sources[/] (datasheets; memory as the device reports it; chip: "
            "architecture, formats, SMs, clock, power; all-reduce: its latency):")
    for r in rows:
        parts = [r.get("source") or r.get("provenance") or "-"]
        for key, label in (("memory_source", "memory"), ("chip_source", "chip"),
                           ("allreduce_source", "all-reduce")):
            if r.get(key):
                parts.append(f"{label}: {r[key]}")
        c.print(f"  {r['id']}: " + "; ".join(parts), overflow="fold", markup=False)


def _chip_table(c: Console, rows: list[dict[str, Any]]) -> Any:
    """The chip as the kernels see it: family, native tensor formats, SMs, clock, power,
    and the all-reduce path ("est." where the latency is an estimate, not a measurement)."""
    cols = [Column("id"), Column("arch"), Column("native tensor formats", keep=False),
            Column("SMs/CUs", True), Column("boost\nMHz", True, drop=2),
            Column("FP4\nTFLOP/s", True, drop=3), Column("TDP\nW", True, drop=1),
            Column("all-reduce", keep=False)]

    def num(v: float) -> str:
        return f"{v:.0f}" if v else "-"

    def allreduce(r: dict[str, Any]) -> str:
        link = r.get("allreduce_link") or "-"
        lat = r.get("allreduce_latency_us") or 0.0
        if not lat:
            return link
        est = " est." if str(r.get("allreduce_source", "")).startswith("estimate") else ""
        return f"{link} {lat:g} us{est}"

    cells = [[r["id"], r.get("arch") or "-", " ".join(r.get("native_precisions") or ()) or "-",
              num(r.get("num_sms", 0)), num(r.get("boost_clock_mhz", 0.0)),
              num(r.get("fp4_flops", 0.0) / 1e12), num(r.get("tdp_w", 0.0)), allreduce(r)]
             for r in rows]
    return table_to_width(c, cols, cells, title="As the kernels see each chip (docs/gpus.md)")
