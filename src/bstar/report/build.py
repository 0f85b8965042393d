"""Assemble a Report (cards, facts, charts, tables, assumptions) from a result's dict.

Each builder reads only the JSON shape of its result (plan view, compare rows, sweep,
fit, simulate contracts), so a stored or freshly computed result renders the same.
"""

from __future__ import annotations

from typing import Any

from bstar.report import charts as ch
from bstar.report.html import Card, Report, Section, Table
from bstar.report.views import drawable_levels, level_x
from bstar.report.words import (
    CONTEXT_NOTE,
    FIT_BOUND_WORDS,
    REGIME_CELL,
    REGIME_NOTE,
    ROOF_WORDS,
    SIGNATURE_INTRO,
    TPOT_NOTE,
    UNITS_NOTE,
    calibration_note,
    collapse,
    fit_basis,
    prediction_cells,
    prediction_columns,
    words,
)
from bstar.units import MiB, fmt_bytes
from bstar.units import fmt_ms as _ms
from bstar.units import fmt_num as _num


# ---- plan ----------------------------------------------------------------------------------
def plan_report(p: dict[str, Any], command: str = "") -> Report:
    """`p` is `bstar.report.views.plan_view(plan)`.

    Long on purpose: a linear description of the page, section by section, in reading
    order; splitting it would scatter one document over helpers."""
    gpus = (f"{p['num_gpus']} x " if p["num_gpus"] > 1 else "") + (p.get("gpu_name") or p["gpu"])
    r = Report("plan", f"Batch size plan: {p['model']} on {gpus}",
               f"weights {p['weight_dtype']}, KV cache {p['kv_dtype']}, contexts "
               + ", ".join(f"{c['context_tokens']:,}" for c in p["contexts"]) + " tokens",
               command=command)
    for c in p["contexts"]:
        rec = c["recommendation"]
        tone = {"b_star": "good", "b_mem": "warn", "compute": "info", "sla": "info"}.get(
            rec.get("bound", ""), "bad")
        r.cards.append(Card(f"context {c['context_tokens']:,} tokens → max_num_seqs",
                            f"{rec['max_num_seqs']:,}", rec["reason"],
                            words(rec.get("bound")), rec.get("flags", {}), tone))
    e, roof = p["efficiency"], p["roof"]
    r.sections.append(Section(
        "Model and hardware", "hardware", "The inputs of the cost model; every number below "
        "follows from these.",
        facts=[("weights W", fmt_bytes(p["weight_bytes"])),
               ("parameters", f"{p['num_params'] / 1e9:.2f} B"
                + (f" ({p['num_active_params'] / 1e9:.2f} B active)"
                   if p["num_active_params"] != p["num_params"] else "")),
               ("attention", p["attention"]),
               ("KV per token", f"{p['kv_bytes_per_token']:,} bytes "
                                f"({p['kv_bytes_per_token'] / 1024:.1f} KiB)"),
               ("GPU memory", fmt_bytes(p["gpu_memory_bytes"]) + f" x util {p['gpu_util']:g}"),
               ("KV pool per GPU", fmt_bytes(p["kv_pool_bytes_per_gpu"])),
               ("reserve per GPU", fmt_bytes(p["reserve_bytes"])),
               ("HBM bandwidth", f"{roof['hbm_bandwidth_bytes_s_per_gpu'] / 1e12:.3f} TB/s "
                                 f"x {e['bandwidth']:g} achieved"),
               (f"peak {roof['compute']}", f"{roof['peak_flops_per_gpu'] / 1e12:.1f} TFLOP/s "
                                          f"x {e['compute']:g} achieved"),
               ("ridge point", f"{roof['ridge_flops_per_byte']:.1f} FLOP/byte"),
               ("step overhead", f"{e['overhead_ms']:g} ms + "
                                 f"{e['overhead_per_seq_ms'] * 1e3:g} µs per sequence"),
               ("GPU figures", p.get("gpu_provenance", "datasheet"))]))
    for c in p["contexts"]:
        ctx = c["context_tokens"]
        knee = c.get("knee") or {}
        facts = [("KV per sequence", fmt_bytes(c["kv_bytes_per_seq"])),
                 ("B* = W / kv_per_seq", _num(c["b_star"])),
                 ("B_mem (KV fits)", f"{c['b_mem']:,}"),
                 ("compute crossover", _num(c["compute_crossover_batch"], 0)
                  if c["compute_crossover_batch"] is not None else "none: memory-bound"),
                 ("amortized floor", f"{_ms(c['amortized_floor_ms'])} ms/token"),
                 ("TPOT at batch 1", f"{_ms(c['curve'][0]['tpot_ms'])} ms"),
                 ("prefill of the context", f"{_ms(c['prefill_ms'])} ms"),
                 ("throughput ceiling", f"{c['throughput_ceiling_kv_tok_s']:,.0f} tok/s (KV read)"),
                 ("compute roof", f"{c['compute_roof_tok_s']:,.0f} tok/s")]
        if knee.get("batch"):
            facts.append(("knee", f"{knee['batch']:,} ({knee.get('rule', '')})"))
        if p.get("max_tpot_ms") is not None:  # the plan's SLA batch; None: not even batch 1
            facts.append((f"SLA TPOT ≤ {p['max_tpot_ms']:g} ms", "not met at batch 1"
                          if c["sla_batch"] is None else f"up to batch {c['sla_batch']:,}"))
        rec_b = c["recommendation"]["max_num_seqs"]
        rows, classes = [], []
        for pt in c["curve"]:
            rows.append([f"{pt['batch']:,}", _ms(pt["tpot_ms"]), _ms(pt["amortized_ms_per_token"]),
                         f"{pt['throughput_tok_s']:,.0f}", f"{pt['arithmetic_intensity']:.1f}",
                         pt["regime"]])
            classes.append(pt["regime"])
        charts = list(ch.plan_charts_for_context(p, c))
        r.sections.append(Section(
            f"Context {ctx:,} tokens", f"ctx-{ctx}",
            f"Recommended max_num_seqs = {rec_b:,}. " + c["recommendation"]["reason"] + ".",
            facts=facts, charts=charts,
            tables=[Table(f"The curve at context {ctx:,} (batch sizes as powers of two)",
                          ["batch", "TPOT ms (per request)", "amortized ms/token",
                           "throughput tok/s", "AI FLOP/byte", "regime"], rows, classes,
                          collapsed=True)]))
    r.sections.append(Section("Roofline", "roofline",
                              "Attainable FLOP/s against arithmetic intensity. "
                              "AI(B) = FLOPs / (weights read + B · kv_per_seq) rises with "
                              "the batch toward FLOPs per token / kv_per_seq.",
                              charts=[ch.roofline_chart(p)]))
    r.assumptions = [
        UNITS_NOTE, TPOT_NOTE, CONTEXT_NOTE, REGIME_NOTE,
        f"Efficiencies are stated defaults unless calibrated: bandwidth {e['bandwidth']:g}, "
        f"compute {e['compute']:g}, overhead {e['overhead_ms']:g} ms + "
        f"{e['overhead_per_seq_ms'] * 1e3:g} µs per sequence per step"
        + (f", all-reduce latency {e['allreduce_latency_ms'] * 1e3:g} µs"
           if p["num_gpus"] > 1 else "") + ". `--ideal` gives the pure roofline.",
        f"B_mem = floor((memory x {p['gpu_util']:g} - weights - reserve) / KV per sequence), "
        "with KV allocated in whole blocks of the engine's block size.",
        "The recommendation is B* when it fits within 85% of B_mem, else 85% of B_mem "
        "(seed 000: 80-90%), lowered to the compute crossover and to a TPOT SLA when given.",
        f"GPU figures: {p.get('gpu_source') or p['gpu']} ({p.get('gpu_provenance', '')}).",
    ]
    return r


# ---- compare -------------------------------------------------------------------------------
def compare_report(rows: list[dict[str, Any]], command: str = "") -> Report:
    r = Report("compare", "B* and B_mem across models, GPUs and contexts",
               f"{len(rows)} combinations", command=command)
    table_rows, classes = [], []
    for row in rows:
        rec = row.get("recommendation") or {}
        gpu = f"{row['num_gpus']}x{row['gpu']}" if row["num_gpus"] > 1 else row["gpu"]
        fits = row.get("fits", True)
        table_rows.append([
            row["model"], gpu, row["attention"], f"{row['weight_bytes'] / 1e9:.2f}",
            f"{row['kv_bytes_per_token'] / 1024:.0f}", f"{row['context_tokens']:,}",
            f"{row['kv_bytes_per_seq'] / MiB:,.0f}", f"{row['b_star']:.1f}",
            f"{row['b_mem']:,}" if fits else "0",
            _num(row.get("compute_crossover_batch"), 0),
            _ms(row.get("tpot_batch1_ms")),
            f"{rec['max_num_seqs']:,}" if rec else
            (f"needs --num-gpus {row['min_num_gpus']}" if row.get("min_num_gpus")
             else "does not fit"),
            words(rec.get("bound")).removeprefix("bound: ") if rec else ""])
        classes.append("" if fits else "nofit")
    r.sections.append(Section(
        "B* and B_mem", "compare",
        "B* = W / kv_per_seq is where the KV read per step equals the weight read; B_mem is "
        "how many sequences' KV fits. A model with many KV heads (MHA) saturates at a small "
        "batch despite more parameters.",
        charts=[ch.compare_chart(rows)],
        tables=[Table("Every combination", ["model", "GPU", "attention", "W GB", "KV/token KiB",
                                            "context", "KV/seq MiB", "B*", "B_mem", "crossover",
                                            "TPOT@1 ms", "max_num_seqs", "bound"],
                      table_rows, classes)]))
    r.assumptions = [UNITS_NOTE, TPOT_NOTE, CONTEXT_NOTE,
                     "Efficiencies: the stated defaults or the flags given (see the command)."]
    return r


# ---- sweep ---------------------------------------------------------------------------------
def signature_section(v: dict[str, Any]) -> Section:
    present = [v[k]["label"] if k == "predicted" else k
               for k in ("predicted", "fitted", "measured", "simulated") if v.get(k)]
    return Section("Predicted, fitted, measured, simulated", "signature",
                   SIGNATURE_INTRO + (" Shown here: " + ", ".join(present) + "."),
                   charts=[ch.signature_chart(v)])


def sweep_report(s: dict[str, Any], command: str = "",
                 signature: dict[str, Any] | None = None) -> Report:
    """`s` is the sweep JSON contract (optionally with served_model, url, workload keys);
    `signature` a `views.run_signature` of it, drawn first."""
    levels = s["levels"]
    xname = "max_num_seqs" if any(lv.get("max_num_seqs") is not None for lv in levels) \
        else "concurrency"
    r = Report("sweep", f"Measured sweep{' · run ' + str(s['run_id']) if s.get('run_id') else ''}",
               " · ".join(str(x) for x in (s.get("served_model"), s.get("url")) if x),
               command=command)
    rec = s.get("recommendation") or {}
    if rec:
        r.cards.append(Card("measured recommendation → max_num_seqs",
                            f"{rec['max_num_seqs']:,}", rec.get("reason", ""),
                            words(rec.get("bound")), rec.get("flags", {}), "good"))
    knee = s.get("knee") or {}
    drawn = drawable_levels(levels)
    # Columns the server left empty (llama.cpp has no preemption or KV metrics) are left out.
    server = [(name, key) for name, key in (("preemptions", "preemptions"),
                                             ("KV max", "kv_cache_usage_max"))
              if any(lv.get(key) is not None for lv in drawn)]
    by_batch = {row["batch"]: row["predicted"] for row in s.get("level_predictions") or []}
    series = [x for x in (s.get("predicted_curve"), s.get("uncalibrated_curve")) if x]
    pred_cols = [c for i, x in enumerate(series) for c in prediction_columns(x, i == 0)]
    rows = []
    for lv in drawn:
        def p(key: str, q: str, lv: dict[str, Any] = lv) -> str:
            return _ms((lv.get(key) or {}).get(q))
        cells = [f"{level_x(lv):,}", str(lv.get("requests", "")), str(lv.get("errors", "")),
                 f"{lv['throughput_tok_s']:,.1f}", p("tpot_ms", "p50"), p("tpot_ms", "p99"),
                 p("ttft_ms", "p50"), p("ttft_ms", "p99"), p("e2e_ms", "p50")]
        for _, key in server:
            v = lv.get(key)
            cells.append("–" if v is None else f"{100 * v:.0f}%" if key.startswith("kv")
                         else str(v))
        for i, q in enumerate(by_batch.get(level_x(lv), [])):
            cells += prediction_cells(q, i == 0)
        rows.append(cells + ["–"] * (9 + len(server) + len(pred_cols) - len(cells)))
    facts = [(k, str(v)) for k, v in (("run", s.get("run_id")), ("results DB", s.get("db")),
                                       ("levels", len(levels)))
             if v is not None]
    knee_rows = [[k.get("rule", name), "–" if k.get("batch") is None else f"{k['batch']:,}",
                  k.get("reason", "")] for name, k in (knee.get("rules") or {}).items()]
    skipped = len(levels) - len(drawable_levels(levels))
    if skipped:
        facts.append(("levels not drawn", f"{skipped} (failed, or no batch)"))
    if signature is not None:
        r.sections.append(signature_section(signature))
    r.sections.append(Section(
        "Measured levels", "sweep",
        "Each level ran a fixed number of requests at one load. Dots are medians, whiskers "
        "reach the 99th percentile"
        + (f"; dashed lines are the {series[0]['label']}"
           + (f", dotted grey the {series[1]['label']}" if len(series) > 1 else "") + "."
           if series else "; dashed lines are the cost model's prediction." if any(
               lv.get("predicted") for lv in levels) else
           ". (No cost-model prediction: the sweep ran without --model/--gpu.)"),
        facts=facts, charts=[ch.sweep_chart(s)],
        tables=[Table("Per level (ms unless stated)",
                      [xname, "requests", "errors", "tok/s", "TPOT p50", "TPOT p99",
                       "TTFT p50", "TTFT p99", "E2E p50", *(n for n, _ in server),
                       *pred_cols], rows,
                      note="pred.: the cost model at the level's batch; vs measured: "
                           "predicted / measured tok/s − 1." if pred_cols else ""),
                *([Table("Knee rules on the measured curve", ["rule", "batch", "reason"],
                         knee_rows)] if knee_rows else [])]))
    r.assumptions = [
        TPOT_NOTE,
        "Metrics follow vLLM's benchmark: TTFT = send → first token; TPOT = (E2E − TTFT) / "
        "(output tokens − 1); throughput = output tokens / wall time of the level.",
        "Preemptions and KV-cache usage come from the server's Prometheus /metrics when it "
        "exposes them ('–' where it does not).", UNITS_NOTE]
    return r


# ---- simulate ------------------------------------------------------------------------------
def simulate_report(results: list[dict[str, Any]], command: str = "") -> Report:
    """`results` are simulate JSON objects, one per max_num_seqs."""
    rs = sorted(results, key=lambda x: x["max_num_seqs"])
    first = rs[0]
    r = Report("simulate", "Simulated continuous batching",
               f"{len(rs)} max_num_seqs level(s), {first.get('requests_total', '?')} requests "
               f"each; KV pool {first.get('kv_blocks', 0):,} blocks of "
               f"{first.get('block_size', '?')} tokens", command=command)
    advice = next((x["sweep"] for x in rs if x.get("sweep")), None)
    if advice:
        r.cards.append(Card("simulated recommendation → max_num_seqs",
                            f"{advice['max_num_seqs']:,}", advice["reason"],
                            words(advice["bound"]),
                            tone="good" if advice["bound"] == "knee" else "info"))
    best = max(rs, key=lambda x: x["throughput_tok_s"])
    r.cards.append(Card("highest simulated throughput", f"{best['throughput_tok_s']:,.0f} tok/s",
                        f"at max_num_seqs {best['max_num_seqs']:,}: TPOT p99 "
                        f"{_ms((best.get('tpot_ms') or {}).get('p99'))} ms, TTFT p99 "
                        f"{_ms((best.get('ttft_ms') or {}).get('p99'))} ms, "
                        f"{best.get('preemptions', 0)} preemptions", tone="info"))
    rows = []
    for x in rs:
        def q(key: str, p: str, x: dict[str, Any] = x) -> str:
            return _ms((x.get(key) or {}).get(p))
        kv = x.get("kv_utilization_max")
        rows.append([f"{x['max_num_seqs']:,}", str(x.get("requests", "")),
                     f"{x['throughput_tok_s']:,.0f}", q("ttft_ms", "p50"), q("ttft_ms", "p99"),
                     q("tpot_ms", "p50"), q("tpot_ms", "p99"), q("e2e_ms", "p50"),
                     q("e2e_ms", "p99"), str(x.get("preemptions", "")),
                     "–" if kv is None else f"{100 * kv:.0f}%"])
    knee_rows = [[k["rule"], "–" if k["batch"] is None else f"{k['batch']:,}", k["reason"]]
                 for k in ((advice or {}).get("knees") or {}).values()]
    facts = [(k, str(first[key])) for k, key in (("max_num_batched_tokens",
                                                  "max_num_batched_tokens"),
                                                 ("preemption", "preemption_mode"))
             if first.get(key) is not None]
    r.sections.append(Section(
        "Simulation", "simulate",
        "A continuous-batching scheduler with paged KV, chunked prefill and preemption, "
        "stepping with the cost model's step times.", facts=facts,
        charts=[ch.simulate_chart(rs)],
        tables=[Table("Per max_num_seqs (ms)", ["max_num_seqs", "requests", "tok/s",
                                                "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99",
                                                "E2E p50", "E2E p99", "preemptions",
                                                "KV max"], rows),
                *([Table("Knee rules on the simulated curve", ["rule", "batch", "reason"],
                         knee_rows)] if knee_rows else [])]))
    r.assumptions = [TPOT_NOTE, CONTEXT_NOTE,
                     "Step times come from the cost model with the stated efficiencies; the "
                     "simulator adds the scheduling, queueing and preemption the cost model "
                     "alone does not see.", UNITS_NOTE]
    return r


# ---- fit -----------------------------------------------------------------------------------
def fit_report(f: dict[str, Any], command: str = "",
               signature: dict[str, Any] | None = None) -> Report:
    """`f` is `bstar.report.views.fit_view(result)` (the fit JSON contract plus a curve);
    `signature` the fit beside the cost model (`views.fit_signature`), drawn after it.

    Long on purpose: a linear description of the page, section by section, in reading
    order; splitting it would scatter one document over helpers."""
    pr = f["params"]
    r = Report("fit", "Fit of measured points", f"source: {f.get('source', '')}",
               command=command)
    if f.get("knee_batch"):
        knees = {**f["knees"].get("measured", {}), **f["knees"].get("fitted", {})}
        reason = (knees.get(f.get("knee_rule") or "") or {}).get("reason", "")
        r.cards.append(Card("knee → max_num_seqs", f"{f['knee_batch']:,}", reason,
                            words(f.get("knee_rule")), tone="good"))
    basis = fit_basis(f)
    for q in f["predictions"]:
        r.cards.append(Card(
            f"the fit predicts batch {q['batch']:,} ({basis})",
            f"{q['throughput_tok_s']:,.0f} tok/s",
            ("extrapolated by the fit of the measured levels, not the cost model; "
             if q.get("extrapolated") else "the fit of the measured levels; ")
            + f"per-request TPOT {_ms(q['tpot_ms'])} ms (interval {_ms(q['low']['tpot_ms'])}–"
            f"{_ms(q['high']['tpot_ms'])} ms); throughput interval "
            f"{q['low']['throughput_tok_s']:,.0f}–{q['high']['throughput_tok_s']:,.0f} tok/s"
            + (f"; {FIT_BOUND_WORDS.get(q['bound'], q['bound'])}" if q.get("bound") else ""),
            words(q["regime"]), tone="info" if q.get("extrapolated") else "good"))
    iv = pr.get("intervals") or {}

    def with_iv(key: str, fmt: str, unit: str) -> str:
        v = pr.get(key)
        if v is None:
            return "–"
        i = iv.get(key)
        return f"{format(v, fmt)}{unit}" + (f" [{format(i[0], fmt)}, {format(i[1], fmt)}]"
                                            if i else "")
    facts = [("a: step at B→0", with_iv("a_ms", ".3f", " ms")),
             ("b: per sequence (memory)", with_iv("b_ms", ".4f", " ms")),
             ("c: per sequence (compute)", with_iv("c_ms", ".4f", " ms")),
             ("overhead", f"{pr.get('overhead_ms') or 0:.3f} ms"),
             ("fitted B* = a / b", with_iv("b_star", ".0f", "")),
             ("compute crossover", _num(pr.get("crossover_batch"), 0)),
             ("roof", ROOF_WORDS.get(str(pr.get("roof")), str(pr.get("roof")))),
             ("compute roof", f"{pr['plateau_tok_s']:,.0f} tok/s"
              if pr.get("plateau_tok_s") else "–"),
             ("memory ceiling 1 / b", f"{pr['memory_ceiling_tok_s']:,.0f} tok/s")]
    for key, name in (("weight_bandwidth_bytes_s", "weights read at ≥"),
                      ("kv_bandwidth_bytes_s", "KV read at"),
                      ("achieved_flops", "achieved")):
        if pr.get(key):
            facts.append((name, f"{pr[key] / 1e12:.2f} {'TFLOP/s' if 'flops' in key else 'TB/s'}"))
    point_rows = [[f"{p['batch']:,}", _num(p.get("throughput_tok_s"), 1), _ms(p.get("tpot_ms")),
                   _ms(p["fitted_tpot_ms"]), f"{p['residual_pct']:+.1f}%",
                   REGIME_CELL.get(p["regime"], p["regime"]),
                   "outlier" if p.get("outlier") else (p.get("derived") or "")]
                  for p in f["points"]]
    pred_rows = [[f"{q['batch']:,}", f"{q['throughput_tok_s']:,.0f}",
                  f"{q['low']['throughput_tok_s']:,.0f}–{q['high']['throughput_tok_s']:,.0f}",
                  _ms(q["tpot_ms"]), f"{_ms(q['low']['tpot_ms'])}–{_ms(q['high']['tpot_ms'])}",
                  REGIME_CELL.get(q["regime"], q["regime"]),
                  "yes" if q.get("extrapolated") else "no"]
                 for q in f["predictions"]]
    knee_rows = [[on, k["rule"], "–" if k["batch"] is None else f"{k['batch']:,}", k["reason"]]
                 for on in ("measured", "fitted") for k in f["knees"].get(on, {}).values()]
    tables = [Table("Measured points and the fit", ["batch", "throughput tok/s", "TPOT ms",
                                                    "fitted TPOT ms", "residual", "regime",
                                                    "note"], point_rows)]
    if pred_rows:
        tables.append(Table("The fit's predictions (intervals: bootstrap 5–95%)",
                            ["batch", f"tok/s ({basis.removeprefix('output tok/s ')})",
                             "interval", "TPOT ms", "interval",
                             "regime", "extrapolated"], pred_rows))
    if knee_rows:
        tables.append(Table("Knee rules", ["on", "rule", "batch", "reason"], knee_rows,
                            note="step: seed 000 (amortized time per token improves < 5% per "
                                 "step); doubling: seed 004 (< 15% throughput per doubling); "
                                 "bca: Recasens et al. 2025; sla: the largest batch meeting "
                                 "the TPOT limit."))
    r.sections.append(Section(
        "Fit", "fit", "step(B) = overhead + max(a + b·B, c·B): a is the weight read and fixed "
        "costs per step, b each sequence's KV read and per-sequence work, c the compute per "
        "sequence once the roof binds. " + (pr.get("roof_note") or ""),
        facts=facts, charts=[ch.fit_chart(f)], tables=tables))
    if signature is not None:
        r.sections.append(signature_section(signature))
    notes = [*(f"warning: {w}" for w in collapse(list(f.get("warnings", [])))),
             *collapse(list(f.get("notes", [])))]
    if notes:
        r.sections.append(Section("Warnings and notes", "notes", notes=notes))
    r.assumptions = [
        TPOT_NOTE,
        "Throughput and TPOT are tied by throughput = batch / TPOT; a point given with one "
        "has the other derived (marked in the table).",
        f"Fit: {pr.get('loss', '')}; intervals from {pr.get('n_bootstrap', 0)} bootstrap "
        f"resamples (seed {pr.get('seed', 0)}).",
        "Past the measured range the curve is an extrapolation: it holds only while the "
        "model's regimes hold (no preemption, same context).", UNITS_NOTE]
    return r


# ---- demo: a sweep and its fit on one page ---------------------------------------------------
def demo_report(views: dict[str, Any], command: str = "") -> Report:
    """The measured sweep of the tiny model and the fit of its curve, in one report, after
    the signature picture; `views` is `views.demo_views(...)`."""
    sweep = views["sweep"]
    s = sweep_report(sweep, command, views.get("signature"))
    f = fit_report(views["fit"], command)
    r = Report("demo", "bstar demo: measure, fit, predict",
               "a tiny random-weight Llama served by llama.cpp on this machine's CPU, swept "
               "over concurrency" + (f" · run {sweep['run_id']}" if sweep.get("run_id") else ""),
               cards=s.cards + f.cards, sections=s.sections + f.sections, command=command)
    cal = (sweep.get("predicted_curve") or {}).get("calibration")
    r.assumptions = [
        "The model is random-weight and tiny; the numbers describe this machine's CPU, not a "
        "GPU. The shape of the curve (a climb, then a knee) is the point.",
        *([calibration_note(cal)] if cal else []),
        *dict.fromkeys(s.assumptions + f.assumptions)]
    return r
