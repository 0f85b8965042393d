"""How well does the cost model predict real measurements? Every median, in one run.

    python bench/accuracy.py                 # the tables
    python bench/accuracy.py --fit-profiles  # also the fitted engine priors (engines.toml)
    python bench/accuracy.py --json          # machine-readable

Data: data/h200/ (decode and mixed chunked-prefill steps of 7 models on a real H200, through
bench/gpu_steps.py) and data/published/curves.csv (public curves, each with its source).
Predictions are compared only with the quantity they model: a decode step with a measured
step or inter-token latency, a static batch's output throughput (prefill included) with the
prefill-then-decode aggregate (bstar.validate.predict).

Each figure is |predicted / measured - 1|:
- generic: the default efficiencies (no engine named), nothing fitted to the points;
- uncalibrated: the engine's bundled profile (`--engine`); where that profile was fitted
  to these very rows (basis = "fitted"), this figure is in-sample;
- leave-one-model-out (LOMO): cost model 2's parameters fitted (bstar.calibrate.fit_steps)
  to the OTHER models' points of the same GPU x engine, then predicting the held-out model;
- cost model 1 beside it: one bandwidth efficiency, one max over the step (0.70 / 0.60 /
  0.5 ms + 5 us/seq uncalibrated; calibrated on the same split).
Whole curves (`bstar validate data/{published,h200,cpu}/curves.csv`, bstar.validate_curves):
per GPU x engine, generic / profile / LOMO medians and the knee distance: on each curve
with >= 4 batch sizes, the grid steps between the measured knee (seed 004's doubling rule
on measured throughput) and the knee of bstar's predicted throughput over the same grid.
Tensor parallel: the all-reduce latency's growth with N (constant, log2(N), N-1), left out
model by model on LMDeploy's A100 rows.
Load stages (`bstar validate data/vllm-h100/stages.csv`, bstar.validate_stages): a real vLLM
V1 on H100-SXM under constant-rate load, each stage simulated like for like; per GPU x
engine, the mean and median |pred/meas - 1| of the E2E, TTFT and per-token means over the
stages measured steady, generic / profile / LOMO, and the saturation states right.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from bstar import roofline as rl  # noqa: E402
from bstar import step  # noqa: E402
from bstar import validate_curves as vc  # noqa: E402
from bstar import validate_stages as vs  # noqa: E402
from bstar.calibrate import Point, fit_steps, predict_step_s  # noqa: E402
from bstar.deployment import Deployment, Efficiency  # noqa: E402
from bstar.engines import get_engine  # noqa: E402
from bstar.knee import doubling_knee  # noqa: E402
from bstar.specs.gpu import get_gpu  # noqa: E402
from bstar.specs.model import ModelSpec, from_hf_config, load_config_file  # noqa: E402
from bstar.specs.presets import get_model  # noqa: E402
from bstar.step import allreduce_rounds  # noqa: E402

H200 = ROOT / "data" / "h200"
PRESETS = ROOT / "src" / "bstar" / "presets" / "models"

# Cost model 2 parameters fitted across models (one model cannot separate them).
MULTI_FIT = ("bandwidth", "kv_bandwidth", "compute", "overhead_s", "decode_layer_s",
             "score_bytes")
MIXED_FIT = ("attention_compute", "chunk_layer_s")
# Cost model 1: one bandwidth efficiency, one max, the first wave's defaults.
MODEL1 = Efficiency(bandwidth=0.70, compute=0.60, overhead_s=0.5e-3, overhead_per_seq_s=5e-6,
                       kv_bandwidth=0.70, attention_compute=0.60, layer_s=0.0,
                       decode_layer_s=0.0, chunk_layer_s=0.0, score_bytes=0.0,
                       roof_sharpness=math.inf, fp8_weight_stream=1.0, int4_weight_stream=1.0,
                       grouped=False)
MODEL1_FIT = ("bandwidth", "compute", "overhead_s", "overhead_per_seq_s")


@dataclass
class Group:
    """One model's measured steps on one GPU x engine."""

    label: str
    deployment: Deployment
    points: list[Point]


def med(x: list[float]) -> float:
    return float(np.median(np.abs(x))) if x else math.nan


def pct(x: float) -> str:
    return "   n/a" if math.isnan(x) else f"{x * 100:5.1f}%"


# ---- the H200 steps -----------------------------------------------------------------------
def h200_model(label: str) -> tuple[ModelSpec, str]:
    name, *tags = label.split("@")
    dtype = "fp8" if "fp8" in tags else ""
    layers = [t for t in tags if t.endswith("l")]
    if layers:
        cfg = load_config_file(PRESETS / f"{name}.json")
        cfg["num_hidden_layers"] = int(layers[0][:-1])
        return from_hf_config(cfg, name=label), dtype
    return get_model(name), dtype


def h200_groups(eff: Efficiency) -> list[Group]:
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for f in ("steps.jsonl", "mixed-other-models.jsonl", "llama-3-8b-decode.jsonl"):
        for line in (H200 / f).read_text().splitlines():
            r = json.loads(line)
            if r["kind"] in ("decode", "mixed"):
                by[r["model"]].append(r)
    gpu = get_gpu("h200")
    out = []
    for label, rows in by.items():
        model, dtype = h200_model(label)
        d = Deployment(model, gpu, weight_dtype=dtype, kv_dtype="bf16", eff=eff)
        pts = [Point(r["batch"], r["context"], r["step_ms"] / 1e3, label,
                     r.get("chunk_tokens", 0), r.get("chunk_start", 0)) for r in rows]
        out.append(Group(label, d, pts))
    return out


def errors(g: Group, eff: Efficiency) -> tuple[list[float], list[float]]:
    pred = predict_step_s(g.deployment.with_eff(eff), g.points)
    dec, mix = [], []
    for p, y in zip(g.points, pred, strict=True):
        (mix if p.mixed else dec).append(float(y) / p.step_s - 1.0)
    return dec, mix


def lomo(groups: list[Group], prior: Efficiency, fit: tuple[str, ...],
         mixed_fit: tuple[str, ...] = ()) -> dict[str, Efficiency]:
    """Per model, the parameters fitted to the other models' points (same base model
    family counted as one: the fp8 and 8-layer variants leave with their parent)."""
    out = {}
    for g in groups:
        parent = g.label.split("@")[0]
        others = [(o.deployment.with_eff(prior), o.points) for o in groups
                  if o.label.split("@")[0] != parent]
        has_mixed = any(p.mixed for _, pts in others for p in pts)
        out[g.label] = fit_steps(others, fit + (mixed_fit if has_mixed else ()), prior).eff
    return out


def h200_report(fit_profiles: bool) -> dict[str, Any]:
    prof = get_engine("torch-graph").efficiency()
    groups = h200_groups(prof)
    cal2 = lomo(groups, prof, MULTI_FIT, MIXED_FIT)
    cal1 = lomo(groups, MODEL1, MODEL1_FIT)
    rows = []
    print("H200 steps (data/h200/, engine profile torch-graph): median |pred/meas - 1|")
    print(f"  {'model':18} {'n':>4} {'m1 uncal':>9} {'m1 LOMO':>8} {'uncal':>7} {'LOMO':>7}"
          f" {'mixed n':>8} {'m1 uncal':>9} {'uncal':>7} {'LOMO':>7}")
    for g in groups:
        d1, m1 = errors(g, MODEL1)
        d1c, _ = errors(g, cal1[g.label])
        d2, m2 = errors(g, prof)
        d2c, m2c = errors(g, cal2[g.label])
        r = {"model": g.label, "decode_points": len(d2), "mixed_points": len(m2),
             "model1_uncalibrated": med(d1), "model1_lomo": med(d1c),
             "uncalibrated": med(d2), "lomo": med(d2c), "lomo_max": max(map(abs, d2c)),
             "mixed_model1_uncalibrated": med(m1), "mixed_uncalibrated": med(m2),
             "mixed_uncalibrated_max": max(map(abs, m2), default=math.nan),
             "mixed_lomo": med(m2c)}
        rows.append(r)
        print(f"  {g.label:18} {len(d2):4d} {pct(r['model1_uncalibrated']):>9} "
              f"{pct(r['model1_lomo']):>8} {pct(r['uncalibrated']):>7} {pct(r['lomo']):>7} "
              f"{len(m2):8d} {pct(r['mixed_model1_uncalibrated']):>9} "
              f"{pct(r['mixed_uncalibrated']):>7} {pct(r['mixed_lomo']):>7}")
    all_dec = {k: [] for k in ("m1", "m1c", "u", "c")}
    all_mix = {k: [] for k in ("m1", "u", "c")}
    for g in groups:
        all_dec["m1"] += errors(g, MODEL1)[0]
        all_dec["m1c"] += errors(g, cal1[g.label])[0]
        d2, m2 = errors(g, prof)
        all_dec["u"] += d2
        all_mix["u"] += m2
        all_mix["m1"] += errors(g, MODEL1)[1]
        d2c, m2c = errors(g, cal2[g.label])
        all_dec["c"] += d2c
        all_mix["c"] += m2c
    summary = {"decode_model1_uncalibrated": med(all_dec["m1"]),
               "decode_model1_lomo": med(all_dec["m1c"]),
               "decode_uncalibrated": med(all_dec["u"]), "decode_lomo": med(all_dec["c"]),
               "mixed_model1_uncalibrated": med(all_mix["m1"]),
               "mixed_uncalibrated": med(all_mix["u"]),
               "mixed_uncalibrated_max": max(map(abs, all_mix["u"])),
               "mixed_lomo": med(all_mix["c"]),
               # The 8-layer cut is no model anyone serves: it is there to separate the
               # per-layer cost from the per-step one, and is left out of the worst model.
               "worst_model_lomo": max(r["lomo"] for r in rows if "@8l" not in r["model"])}
    print(f"  all decode: cost model 1 {pct(summary['decode_model1_uncalibrated'])} uncal, "
          f"{pct(summary['decode_model1_lomo'])} LOMO; cost model 2 "
          f"{pct(summary['decode_uncalibrated'])} uncal, {pct(summary['decode_lomo'])} LOMO "
          f"(worst served model {pct(summary['worst_model_lomo'])})")
    print(f"  all mixed:  cost model 1 {pct(summary['mixed_model1_uncalibrated'])} uncal; "
          f"cost model 2 {pct(summary['mixed_uncalibrated'])} uncal (worst "
          f"{pct(summary['mixed_uncalibrated_max'])}), {pct(summary['mixed_lomo'])} LOMO")
    out: dict[str, Any] = {"models": rows, "summary": summary}
    if fit_profiles:
        every = [(g.deployment.with_eff(prof), g.points) for g in groups]
        f = fit_steps(every, MULTI_FIT + MIXED_FIT, prof)
        fp8 = [(g.deployment.with_eff(f.eff), g.points) for g in groups if "fp8" in g.label]
        f8 = fit_steps(fp8, ("fp8_weight_stream",), f.eff)
        fitted = {k: v.value for k, v in f.params.items() if v.fitted}
        fitted["fp8_weight_stream"] = f8.eff.fp8_weight_stream
        print("  fitted on every H200 step (the torch-graph profile and the GPU-side defaults):")
        print("   ", ", ".join(f"{k} = {v:.4g}" for k, v in fitted.items()))
        out["fitted"] = fitted
        out["sharpness"] = {}
        for k in (1.0, 1.5, 2.0, 3.0, math.inf):  # the roof's shape, refitted at each k
            pk = replace(prof, roof_sharpness=k)
            fk = fit_steps([(d.with_eff(pk), pts) for d, pts in every],
                           MULTI_FIT + MIXED_FIT, pk).eff
            dec, mix = [], []
            for g in groups:
                a, b = errors(g, fk)
                dec += a
                mix += b
            out["sharpness"][str(k)] = {"decode": med(dec), "mixed": med(mix)}
            print(f"    roof_sharpness {k:>4}: decode {pct(med(dec))}, mixed {pct(med(mix))}"
                  " (every step fitted)")
    return out


# ---- whole curves (bstar validate) --------------------------------------------------------
def curves_report(name: str, fit: tuple[str, ...] = vc.DEFAULT_FIT,
                  file: str = "curves.csv") -> dict[str, Any]:
    """`bstar validate data/NAME/FILE`: generic, profile and leave-one-model-out medians per
    GPU x engine, and the knees."""
    path = ROOT / "data" / name / file
    v = vc.score_curves(vc.curves_from_csv(path.read_text(), str(path), path.parent), fit)
    print(f"\n{path.relative_to(ROOT)} (bstar validate; LOMO fits {', '.join(fit)}): "
          "median |pred/meas - 1|")
    for g in v.groups:
        for k, m in g.metrics.items():
            d = m.to_dict()
            print(f"  {Path(g.gpu).name[-24:]:24} {g.engine:11} {k:17} n={d['rows']:3d} generic "
                  f"{pct(d['generic'] or math.nan)}  profile {pct(d['uncalibrated'] or math.nan)}"
                  f"  LOMO {pct(d['lomo'] if d['lomo'] is not None else math.nan)}")
        if g.model_lomo:
            print(f"    worst model left out: {pct(g.worst_model_lomo or math.nan)}")
    within, n = v.knees_within_one_step
    print(f"  knees: {n} curve(s) whose measured throughput has one; predicted within one "
          f"grid step on {within}")
    for s in v.skipped:
        print(f"  skipped {s['model']}: {s['reason']}")
    return v.to_dict()


def stages_report(name: str = "vllm-h100", file: str = "stages.csv",
                  lomo: bool = True) -> dict[str, Any]:
    """`bstar validate data/NAME/FILE` on a load-stages table: per GPU x engine, mean / median
    |pred/meas - 1| of the E2E, TTFT and per-token means (stages measured steady) and the
    saturation states right (all stages), generic / profile / LOMO."""
    path = ROOT / "data" / name / file
    v = vs.score_stages(vs.load_stages(path), lomo=lomo)
    print(f"\n{path.relative_to(ROOT)} (bstar validate, load stages simulated like for like; "
          f"LOMO fits {', '.join(vs.DEFAULT_FIT)}): mean / median |pred/meas - 1|")
    for g in v.groups:
        n_steady = next(iter(g.summaries.values())).latency_stages
        print(f"  {Path(g.gpu).name[-24:]} x {g.engine} (profile {g.profile}): "
              f"{len(g.scores['generic'])} stages, {n_steady} measured steady")
        for way, sm in g.summaries.items():
            cols = "  ".join(f"{k.split('_')[0]} {pct(sm.mean_abs[k] or math.nan)} / "
                             f"{pct(sm.median_abs[k] or math.nan)}" for k in vs.METRICS)
            print(f"    {way:8} {cols}  states {sm.states_right}/{sm.stages}"
                  + (f" (wrong: {', '.join(sm.wrong_states)})" if sm.wrong_states else ""))
        for m, e in g.lomo_eff.items():
            print(f"    LOMO without {m}: " + ", ".join(f"{k} = {x:.4g}" for k, x in e.items()))
    return v.to_dict()


def tp_forms_report() -> dict[str, Any]:
    """The all-reduce latency's growth with the TP size, tried three ways on LMDeploy's A100
    rows (leave one model out): one latency per call at any N, x log2(N) (the cost model), and
    x (N-1) (a ring's hop count). The published curves are the only tensor-parallel data."""
    path = ROOT / "data" / "published" / "curves.csv"
    rows = [r for r in vc.curves_from_csv(path.read_text(), str(path), path.parent)
            if r.engine == "lmdeploy"]
    forms = {"constant": lambda n: 1.0 if n > 1 else 0.0, "log2(N)": allreduce_rounds,
             "N-1": lambda n: float(n - 1)}
    out: dict[str, Any] = {}
    print("\nTensor parallel: the all-reduce latency's growth with N, leave one model out on "
          "LMDeploy's A100 rows (ITL / throughput)")
    import bstar.parallel as parallel

    keep = parallel.allreduce_rounds
    try:
        for name, f in forms.items():
            # The one price of a step reads it from bstar.parallel (the all-reduce rounds of
            # TP and attention DP) when it builds a deployment's shape: swap it there and
            # drop the shapes already built.
            parallel.allreduce_rounds = f
            step._SHAPES.clear()
            (g,) = vc.score_curves(rows).groups
            out[name] = g.model_lomo
            tp = {m: e for m, e in g.model_lomo.items() if m in ("internlm/internlm-20b",
                                                                 "llama-2-70b")}
            print(f"  {name:9} " + "; ".join(
                f"{m} (TP {2 if 'internlm' in m else 4}) {pct(e['step_ms'] or math.nan)} / "
                f"{pct(e['throughput_tok_s'] or math.nan)}" for m, e in tp.items()))
    finally:
        parallel.allreduce_rounds = keep
        step._SHAPES.clear()
    return out


def lmdeploy_tail_report() -> list[dict[str, Any]]:
    """What one step time cannot match on LMDeploy's decode-only rows (1-token prompts):
    the run's total time (B x O / throughput) against O x its median ITL. Beyond the 1 ms
    resolution (+-64 ms over 128 tokens), the difference is the ITL distribution's tail."""
    path = ROOT / "data" / "published" / "curves.csv"
    out = []
    print("\nLMDeploy 1-token prompts: total time (B x O / throughput) vs O x P50 ITL")
    for r in vc.curves_from_csv(path.read_text(), str(path), path.parent):
        if r.engine != "lmdeploy" or r.input_len != 1 or r.step_ms is None \
                or r.throughput_tok_s is None:
            continue
        total = r.batch * r.output_len / r.throughput_tok_s
        steps = r.output_len * r.step_ms / 1e3
        out.append({"model": r.model, "batch": r.batch, "total_s": total, "steps_s": steps})
        print(f"  {r.model:22} batch {r.batch:3}: {total:6.3f} s total, {steps:6.3f} s of "
              f"P50 steps, {total - steps:+6.3f} s")
    return out


def fit_lmdeploy_profile() -> dict[str, float]:
    """The lmdeploy profile's engine terms, fitted to every LMDeploy row."""
    path = ROOT / "data" / "published" / "curves.csv"
    rows = [r for r in vc.curves_from_csv(path.read_text(), str(path), path.parent)
            if r.engine == "lmdeploy"]
    terms = ("overhead_s", "overhead_per_seq_s", "allreduce_latency_s")
    eff = vc.fit_rows(rows, get_engine("lmdeploy").efficiency(), terms)
    assert eff is not None
    vals = {k: getattr(eff, k) for k in terms}
    print("    fitted lmdeploy profile on every row: "
          + ", ".join(f"{k} = {v:.4g}" for k, v in vals.items()))
    return vals


# The vllm profile's terms that real vLLM V1 load stages on GPUs pin (engines.toml [vllm]);
# the same terms validate_stages' leave-one-model-out fits.
VLLM_FIT = vs.DEFAULT_FIT


def fit_vllm_profile() -> dict[str, float]:
    """The vllm profile's terms fitted to every load stage of data/vllm-h100 (real vLLM V1 on
    H100-SXM, TP 1 and 2), starting from the profile's own values."""
    path = ROOT / "data" / "vllm-h100" / "stages.csv"
    stages = vs.load_stages(path)
    vllm = get_engine("vllm")
    fitted = vs.fit_stages(stages, vllm.efficiency(), VLLM_FIT, behaviour=vllm.behaviour())
    assert fitted is not None
    vals = {k: getattr(fitted[0] if hasattr(fitted[0], k) else fitted[1], k)
            for k in VLLM_FIT}
    print("    fitted vllm profile on every stage of data/vllm-h100: "
          + ", ".join(f"{k} = {v:.4g}" for k, v in vals.items()))
    return vals


def bstar_report() -> list[dict[str, Any]]:
    """Seed 000's B* against the knee of the measured H200 decode curves: where the measured
    throughput stops gaining 15% per doubling (seed 004), and what B* leaves unused."""
    out = []
    print("\nB* against the measured knee (H200 decode curves, seed 004's doubling rule)")
    for g in h200_groups(get_engine("torch-graph").efficiency()):
        if "@" in g.label:
            continue
        by_ctx: dict[int, list[Point]] = defaultdict(list)
        for p in g.points:
            if not p.mixed:
                by_ctx[p.context_tokens].append(p)
        for ctx, pts in sorted(by_ctx.items()):
            pts = sorted({p.batch: p for p in pts}.values(), key=lambda p: p.batch)
            grid = [p.batch for p in pts]
            if len(grid) < 5 or grid[-1] < 8 * grid[0]:
                continue
            tput = [p.batch / p.step_s for p in pts]
            knee = doubling_knee(grid, tput).batch
            bstar = rl.b_star(g.deployment, ctx)
            if not grid[0] <= bstar <= grid[-1]:
                continue  # B* off the measured curve: nothing to compare
            at_bstar = float(np.interp(math.log2(bstar), np.log2(grid), tput))
            at_knee = tput[-1] if knee is None else float(np.interp(math.log2(knee),
                                                                     np.log2(grid), tput))
            r = {"model": g.label, "context": ctx, "b_star": bstar, "measured_knee": knee,
                 "largest_batch": grid[-1], "throughput_at_b_star_vs_knee": at_bstar / at_knee}
            out.append(r)
            print(f"  {g.label:12} context {ctx:5d}: B* {bstar:6.1f}, measured knee "
                  f"{knee if knee is not None else '> ' + str(grid[-1]):>6}; throughput at B* "
                  f"is {at_bstar / at_knee:.0%} of the knee's")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit-profiles", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--only-stages", action="store_true",
                    help="only the load-stage section (data/vllm-h100/stages.csv)")
    args = ap.parse_args(argv)
    if args.only_stages:
        report_stages = {"vllm_h100_stages": stages_report()}
        if args.fit_profiles:
            report_stages["fitted_vllm"] = fit_vllm_profile()
        if args.json:
            print(json.dumps(report_stages, indent=1, default=str))
        return 0
    report: dict[str, Any] = {"h200": h200_report(args.fit_profiles)}
    report["published"] = curves_report("published")
    if args.fit_profiles:
        report["published"]["fitted_lmdeploy"] = fit_lmdeploy_profile()
    report["tensor_parallel"] = tp_forms_report()
    report["lmdeploy_tail"] = lmdeploy_tail_report()
    report["h200_curves"] = curves_report("h200")
    # Five models measured after the torch-graph profile was fitted: its "profile" column
    # is a prediction made before the measurement.
    report["h200_heldout"] = curves_report("h200", file="heldout-curves.csv")
    # A CPU engine at these sizes is compute-bound past batch 1: its left-out fit needs the
    # compute rate, the per-sequence cost and the roof's shape (one thread loads, then
    # multiplies: the times add) too.
    report["cpu_curves"] = curves_report("cpu", fit=("bandwidth", "compute", "overhead_s",
                                                     "overhead_per_seq_s", "roof_sharpness"))
    report["b_star"] = bstar_report()
    report["vllm_h100_stages"] = stages_report()
    if args.fit_profiles:
        report["fitted_vllm"] = fit_vllm_profile()
    if args.json:
        print(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
