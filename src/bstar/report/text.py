"""Terminal renderers (rich tables) over the result objects. No computation here."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from bstar.plan import Plan
from bstar.units import GB, GiB, KiB, fmt_bytes, fmt_count, fmt_ms, sparkline

_REGIME_STYLE = {"weight-dominated": "green", "kv-dominated": "yellow",
                 "compute-bound": "magenta", "memory-exhausted": "red"}


def console() -> Console:
    import sys

    # Piped output would wrap at rich's 80-column default and break tables; widen it.
    width = None if sys.stdout.isatty() else 200
    return Console(highlight=False, soft_wrap=False, width=width)


def print_plan(plan: Plan, out: Console | None = None) -> None:
    c = out or console()
    d = plan.deployment
    m, g, e = d.model, d.gpu, d.eff
    c.print(f"[bold]{m.name}[/] ({fmt_count(m.num_params)} params"
            + (f", {fmt_count(m.num_active_params)} active" if m.is_moe else "")
            + f", {m.attention_kind}, {m.num_layers} layers) on "
            f"[bold]{d.num_gpus} x {g.name}[/] ({g.id})")
    c.print(f"  weights W        {fmt_bytes(plan.weight_bytes)} in {d.weight.name}"
            + (f"; {fmt_bytes(plan.weight_bytes_per_gpu)} per GPU" if d.num_gpus > 1 else ""))
    c.print(f"  KV per token     {plan.kv_bytes_per_token:,} bytes "
            f"({plan.kv_bytes_per_token / KiB:.1f} KiB) in {d.kv.name}")
    c.print(f"  GPU memory       {fmt_bytes(g.memory_bytes)} x util {d.gpu_util:g} - weights - "
            f"reserve {d.reserve_bytes / GiB:.2f} GiB = KV pool {fmt_bytes(plan.kv_pool_bytes)}"
            " per GPU")
    c.print(f"  HBM bandwidth    {g.hbm_bandwidth_bytes_s / 1e12:.3f} TB/s x {e.bandwidth:g}; "
            f"peak {d.weight.compute} {g.peak_flops(d.weight.compute) / 1e12:.1f} TFLOP/s x "
            f"{e.compute:g}; ridge {g.ridge_flops_per_byte:.1f} FLOP/byte; overhead "
            f"{e.overhead_s * 1e3:g} ms + {e.overhead_per_seq_s * 1e6:g} us/seq per step")
    for cp in plan.contexts:
        c.print()
        cross = (f"{cp.compute_crossover_batch:.1f}" if cp.compute_crossover_batch is not None
                 else "none (memory-bound at any batch)")
        c.print(f"[bold]context {cp.context_tokens} tokens[/]: KV per sequence "
                f"{fmt_bytes(cp.kv_bytes_per_seq)}")
        for w in cp.warnings:
            c.print(f"  [yellow]warning: {w}[/]")
        c.print(f"  B* = W / kv_per_seq = [bold]{cp.b_star:.1f}[/]   B_mem = [bold]{cp.b_mem}"
                f"[/]   compute crossover = {cross}")
        c.print(f"  amortized time/token floor (kv_per_seq / BW) = "
                f"{cp.tpot_floor_s * 1e3:.4f} ms; prefill of {cp.context_tokens} tokens ~ "
                f"{cp.prefill_s * 1e3:.1f} ms")
        t = Table(show_edge=False, pad_edge=False, box=None)
        for col in ("batch", "TPOT ms\n(per request)", "amortized\nms/token",
                    "throughput\ntok/s", "AI\nFLOP/B", "regime"):
            t.add_column(col, justify="right" if col != "regime" else "left")
        cv = cp.curve
        for i in range(cv.batch.size):
            r = cv.regime[i]
            t.add_row(str(int(cv.batch[i])), fmt_ms(float(cv.tpot_s[i])),
                      fmt_ms(float(cv.amortized_s_per_token[i])),
                      f"{cv.throughput_tok_s[i]:,.0f}", f"{cv.arithmetic_intensity[i]:.1f}",
                      f"[{_REGIME_STYLE[r]}]{r}[/]")
        c.print(t)
        c.print(f"  throughput {sparkline([float(x) for x in cv.throughput_tok_s])}")
        rec = cp.recommendation
        c.print(f"  [bold green]max_num_seqs = {rec.max_num_seqs}[/]: {rec.reason}")
        for engine, flags in cp.flags.items():
            c.print(f"    {engine:<13} {flags}")
    c.print()
    c.print("[dim]GB = 1e9 bytes, GiB = 2^30. TPOT is per request (= step time); amortized "
            "ms/token = step / batch (seed 000's 'TPOT' curve).[/]")


def print_compare(rows: list[dict[str, Any]], out: Console | None = None) -> None:
    c = out or console()
    t = Table(title="B* = W / kv_per_seq and B_mem per model, GPU and context")
    for col in ("model", "gpu", "attn", "W GB", "KV/token KiB", "context", "KV/seq MiB",
                "B*", "B_mem", "crossover", "TPOT@1 ms", "max_num_seqs", "bound"):
        t.add_column(col, justify="left" if col in ("model", "gpu", "attn", "bound")
                     else "right", no_wrap=col in ("model", "gpu"))
    for r in rows:
        sizes = (r["model"], f"{r['num_gpus']}x{r['gpu']}", r["attention"],
                 f"{r['weight_bytes'] / GB:.2f}", f"{r['kv_bytes_per_token'] / KiB:.0f}",
                 str(r["context_tokens"]), f"{r['kv_bytes_per_seq'] / 2**20:.0f}",
                 f"{r['b_star']:.1f}")
        if not r["fits"]:
            need = r["min_num_gpus"]
            t.add_row(*sizes, "[red]0[/]", "-", "-", "-",
                      f"[red]does not fit; --num-gpus {need}[/]" if need else
                      "[red]does not fit[/]")
            continue
        cross = r["compute_crossover_batch"]
        t.add_row(*sizes, str(r["b_mem"]), f"{cross:.0f}" if cross is not None else "-",
                  f"{r['tpot_batch1_ms']:.2f}", str(r["recommendation"]["max_num_seqs"]),
                  r["recommendation"]["bound"])
    c.print(t)
    for r in rows:
        for w in r.get("warnings") or ():
            c.print(f"[yellow]warning ({r['model']}, {r['context_tokens']} tokens): {w}[/]")
    c.print("[dim]GB = 1e9 bytes; KiB/MiB = 2^10/2^20. crossover: batch where compute "
            "overtakes memory ('-': never).[/]")


def print_models(rows: list[dict[str, Any]], out: Console | None = None) -> None:
    c = out or console()
    t = Table(title="Bundled model presets (parameters computed from config.json)")
    for col in ("id", "params", "published", "active", "attention", "layers", "dtype",
                "hf repo"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["id"], fmt_count(r["params"]), fmt_count(r["published_params"]),
                  fmt_count(r["active_params"]) if r["moe"] else "", r["attention"],
                  str(r["layers"]), r["dtype"], r["hf_repo"])
    c.print(t)


def print_gpus(rows: list[dict[str, Any]], out: Console | None = None) -> None:
    c = out or console()
    t = Table(title="GPU catalog (memory as the device reports it; rates dense, decimal)")
    for col in ("id", "name", "memory", "HBM TB/s", "BF16 TFLOP/s", "FP8 TFLOP/s",
                "ridge", "interconnect GB/s"):
        t.add_column(col, justify="left" if col in ("id", "name") else "right")
    for r in rows:
        t.add_row(r["id"], r["name"], f"{r['memory_bytes'] / GiB:.2f} GiB",
                  f"{r['hbm_bandwidth_bytes_s'] / 1e12:.3f}", f"{r['bf16_flops'] / 1e12:.1f}",
                  f"{r['fp8_flops'] / 1e12:.1f}" if r["fp8_flops"] else "-",
                  f"{r['bf16_flops'] / r['hbm_bandwidth_bytes_s']:.0f}",
                  f"{r['interconnect_bytes_s'] / 1e9:.0f}")
    c.print(t)
