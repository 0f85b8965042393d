"""`bstar plan` as plain text with ANSI styles: the deployment, then per context B*, B_mem,
the curve by batch and the recommendation with each engine's flags. No rich here: the plan
is the command people run first, and its path stays light to import."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, TextIO

from bstar.report.text._common import (
    Styler,
    ansi_styler,
    clean_text,
    elided,
    fmt_b_star,
    gap_row,
    plain_columns,
)
from bstar.units import GiB, KiB, fmt_bytes, fmt_count, fmt_ms, sparkline

if TYPE_CHECKING:
    from bstar.plan import ContextPlan, Plan

REGIME_STYLE = {"weight-dominated": "green", "kv-dominated": "yellow",
                "compute-bound": "magenta", "memory-exhausted": "red"}


def print_plan(plan: Plan, out: TextIO | None = None) -> None:
    """The whole plan on `out` (stdout): the deployment's sizes and rates, each context,
    and the footnotes on units and on queueing past B_mem."""
    stream = out or sys.stdout
    st = ansi_styler(stream)
    lines = deployment_lines(plan, st)
    queued_any = False
    for cp in plan.contexts:
        lines.append("")
        queued, context = context_lines(plan, cp, st)
        lines += context
        queued_any = queued_any or queued
    lines.append("")
    lines.append(st("GB = 1e9 bytes, GiB = 2^30. TPOT is per request (= step time); amortized "
                    "ms/token = step / batch (seed 000's 'TPOT' curve).", "dim"))
    if queued_any:
        lines.append(st("queued: past B_mem the engine runs B_mem sequences and keeps the "
                        "rest waiting (vLLM's queue); TPOT is the running requests', the "
                        "waiting ones add queueing time before their first token.", "dim"))
    stream.write("\n".join(lines) + "\n")


def deployment_lines(plan: Plan, st: Styler) -> list[str]:
    """The model on the GPUs: weights, KV per token, the memory sum, rates and priors."""
    d = plan.deployment
    m, g, e = d.model, d.gpu, d.eff
    # Names from a config.json or a GPU file: printed as data (clean_text).
    out = [st(clean_text(m.name), "bold") + f" ({fmt_count(m.num_params)} params"
           + (f", {fmt_count(m.num_active_params)} active" if m.is_moe else "")
           + f", {m.attention_kind}, {m.num_layers} layers) on "
           + st(f"{d.num_gpus} x {clean_text(g.name)}", "bold") + f" ({clean_text(g.id)})",
           f"  weights W        {fmt_bytes(plan.weight_bytes)} in {d.weight.name}"
           + (f"; {fmt_bytes(plan.weight_bytes_per_gpu)} per GPU" if d.num_gpus > 1 else ""),
           f"  KV per token     {plan.kv_bytes_per_token:,} bytes "
           f"({plan.kv_bytes_per_token / KiB:.1f} KiB) in {d.kv.name}",
           f"  GPU memory       {fmt_bytes(g.memory_bytes)} x util {d.gpu_util:g} - weights - "
           f"reserve {d.reserve_bytes / GiB:.2f} GiB = KV pool "
           + (f"{fmt_bytes(plan.kv_pool_bytes)} per GPU" if d.data_parallel == 1 else
              f"{fmt_bytes(plan.kv_pool_bytes // d.data_parallel)} per GPU x "
              f"{d.data_parallel} attention DP ranks (each holds its own sequences)")
           + (f"; experts over EP {d.expert_parallel}" if d.expert_parallel > 1 else ""),
           f"  HBM bandwidth    {g.hbm_bandwidth_bytes_s / 1e12:.3f} TB/s x {e.bandwidth:g}; "
           f"peak {d.weight.compute} {g.peak_flops(d.weight.compute) / 1e12:.1f} TFLOP/s x "
           f"{e.compute:g}; ridge {g.ridge_flops_per_byte:.1f} FLOP/byte; overhead "
           f"{e.overhead_s * 1e3:g} ms + {e.overhead_per_seq_s * 1e6:g} us/seq per step"]
    prof = plan.to_dict().get("engine_profile")
    if prof:
        out.append(f"  engine priors    {prof['name']} ({prof['basis']}; --engine, "
                   "docs/cost-model.md; a --profile replaces them)")
        if prof.get("kernel_basis"):
            out.append(f"  kernel terms     {prof['kernel_basis']}")
    elif d.engine == "ideal":
        out.append("  engine priors    none (--ideal: the pure roofline, cost model 1)")
    return out


def context_lines(plan: Plan, cp: ContextPlan, st: Styler) -> tuple[bool, list[str]]:
    """One context: KV per sequence (per layer kind for hybrid models), B*, B_mem, the
    curve and the recommendation; True when a batch of the curve waits in the queue."""
    m = plan.deployment.model
    cross = (f"{cp.compute_crossover_batch:.1f}" if cp.compute_crossover_batch is not None
             else "none (memory-bound at any batch)")
    out = [st(f"context {cp.context_tokens} tokens", "bold") + ": KV per sequence "
           f"{fmt_bytes(cp.kv_bytes_per_seq)}"]
    kinds = cp.kv_per_kind
    if len(kinds) > 1 or any(k["kind"] != "full" for k in kinds):
        out.append("  one sequence holds " + "; ".join(kind_held(k) for k in kinds))
        out.append("  the engine allocates " + "; ".join(kind_allocated(k) for k in kinds)
                   + f" = {fmt_bytes(cp.kv_bytes_per_seq_allocated)} per GPU (vLLM V1's per "
                   "kind pools, docs/models.md)")
    out += ["  " + st(f"warning: {w}", "yellow") for w in cp.warnings]
    out.append(f"  B* = W / kv_per_seq = {st(fmt_b_star(cp.b_star), 'bold')}   B_mem = "
               f"{st(str(cp.b_mem), 'bold')}   compute crossover = {cross}")
    vmc = cp.vllm_max_concurrency
    if vmc is not None and vmc != cp.b_mem:
        out.append(f"  B_mem counts the blocks behind each window freed and one budget-sized "
                   f"prefill in flight; vLLM's start-up \"Maximum concurrency\" says {vmc} "
                   "(every sequence counted as prefilling; docs/models.md)")
    br = cp.b_star_read
    if br is not None and abs(br - cp.b_star) > 0.005 * cp.b_star:
        # The regime column compares the bytes actually read per step, B* the resident
        # weights: say where each switches (docs/cost-model.md, "B* and the regimes").
        out.append(f"  the regime turns kv-dominated at B = {fmt_b_star(br)}, where KV reads "
                   "pass the weight bytes actually read per step (B* counts all resident "
                   "weights" + (", every expert" if m.is_moe else "")
                   + ("; an untied embedding table is not read" if not m.tie_word_embeddings
                      else "") + ")")
    out.append(f"  amortized time/token floor (kv_per_seq / BW) = "
               f"{cp.amortized_floor_s * 1e3:.4f} ms; prefill of {cp.context_tokens} tokens ~ "
               f"{cp.prefill_s * 1e3:.1f} ms")
    queued, table = curve_lines(cp, st)
    spec: list[str] = []
    if cp.speculative is not None:
        from bstar.report.text.speculative import speculative_lines

        spec = speculative_lines(cp.speculative, st)
    return queued, out + table + recommendation_lines(cp, st) + spec


def curve_lines(cp: ContextPlan, st: Styler) -> tuple[bool, list[str]]:
    """The curve by batch (TPOT, amortized, throughput, intensity, regime) and its
    sparkline; True when a batch past B_mem queues."""
    cv = cp.curve
    queued = False
    rows: list[list[tuple[str, str]]] = []
    for i in elided(cv.batch.size):
        if i is None:  # a long --batch list: its middle rows left out (--json has them)
            rows.append([("", "")] * 5 + [(gap_row(cv.batch.size), "dim")])
            continue
        r = cv.regime[i]
        b, run = int(cv.batch[i]), int(cv.running_batch[i])
        if b > run:
            # What the engine does past B_mem: B_mem sequences run, the rest wait in its
            # queue (vLLM's "waiting"); the running ones keep B_mem's TPOT.
            queued = True
            label, name = f"queued: {run} run, {b - run} wait", "red"
        else:
            label, name = r, REGIME_STYLE[r]
        rows.append([(str(b), ""), (fmt_ms(float(cv.step_s[i]) * 1e3), ""),
                     (fmt_ms(float(cv.amortized_s_per_token[i]) * 1e3), ""),
                     (f"{cv.throughput_tok_s[i]:,.0f}", ""),
                     (f"{cv.arithmetic_intensity[i]:.1f}", ""), (label, name)])
    table = plain_columns([("batch", ""), ("TPOT ms", "(per request)"),
                           ("amortized", "ms/token"), ("throughput", "tok/s"),
                           ("AI", "FLOP/B"), ("regime", "")],
                          rows, [True, True, True, True, True, False])
    out = []
    for k, row in enumerate(table):
        if k >= 2:  # the regime cell in its colour
            label, name = rows[k - 2][-1]
            row = row[: len(row) - len(label)] + st(label, name)
        out.append(row)
    out.append(f"  throughput {sparkline([float(x) for x in cv.throughput_tok_s])}")
    return queued, out


def recommendation_lines(cp: ContextPlan, st: Styler) -> list[str]:
    """max_num_seqs and its reason, the point it picks, each engine's flags and defaults."""
    rec = cp.recommendation
    out = ["  " + st(f"max_num_seqs = {rec.max_num_seqs}", "bold green") + f": {rec.reason}"]
    at = cp.at_recommendation
    if at is not None:
        out.append(f"    at {at['batch']}: TPOT {at['tpot_ms']:.2f} ms per request, "
                   f"{at['throughput_tok_s']:,.0f} tok/s, {at['regime']} (B* "
                   f"{fmt_b_star(cp.b_star)}, B_mem {cp.b_mem})")
        if at.get("joules_per_output_token") is not None:
            out.append(f"    energy: {at['power_w']:,.0f} W per GPU, "
                       f"{at['joules_per_output_token']:.3g} J per output token, "
                       f"${at['energy_usd_per_mtok']:.3g} per million output tokens at "
                       f"${cp.electricity_usd_per_kwh:g}/kWh (power model: docs/energy.md)")
    if cp.sla_unmet and cp.tpot_batch1_s is not None:
        out.append("    " + st(f"the SLO cannot be met on this hardware: the TPOT floor is "
                               f"{cp.tpot_batch1_s * 1e3:.2f} ms (batch 1)", "bold red"))
    out += [f"    {engine:<13} {flags}" for engine, flags in cp.flags.items()]
    out.append("    " + engine_defaults_line(cp.engine_defaults, st))
    return out


def kind_held(k: dict[str, Any]) -> str:
    """'12 sliding layers x 128 tokens (window 128) 3.1 MB': one kind's share of a sequence."""
    n, kind = k["layers"], k["kind"]
    if kind == "state":
        return (f"{n} state layers x {k['state_bytes_per_layer']:,} bytes (fixed) "
                f"{fmt_bytes(k['bytes'])}")
    extra = {"sliding": f" (window {k.get('window_tokens', 0):,})",
             "chunked": f" (chunk {k.get('chunk_tokens', 0):,})",
             "dsa": f" (reads top {k.get('topk_tokens', 0):,})"}.get(kind, "")
    return f"{n} {kind} layers x {k['tokens_per_layer']:,} tokens{extra} {fmt_bytes(k['bytes'])}"


def kind_allocated(k: dict[str, Any]) -> str:
    """What the engine allocates a sequence of one layer kind: pages or tokens a layer."""
    if k["kind"] == "state":
        return f"state {k['allocated_blocks_per_layer']} pages a layer"
    return f"{k['kind']} {k['allocated_tokens_per_layer']:,} tokens"


def engine_defaults_line(defaults: tuple[dict[str, Any], ...], st: Styler) -> str:
    """Each engine's own default cap in one line; a warning when one is above B_mem or far
    from the recommendation (`plan.engine_defaults`)."""
    by = {e["engine"]: e for e in defaults}
    v, s = by.get("vllm"), by.get("sglang")
    parts = []
    if v is not None:
        parts.append(f"vLLM {v['max_num_seqs']}")
    if s is not None:
        parts.append(f"SGLang ~{s['max_num_seqs']:,} (min(KV tokens / 2, request pool))")
    if "tgi" in by:
        parts.append("TGI none (token budget)")
    text = "engine defaults without the flag: " + ", ".join(parts)
    if v is not None and v.get("note"):
        return text + "\n    " + st(v["note"], "yellow")
    return text
