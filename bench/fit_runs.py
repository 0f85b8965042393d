"""Fit the engine profiles' MoE and request terms to closed-loop runs (data/inferencemax/).

    python bench/fit_runs.py [data/inferencemax/runs.csv] [--engine NAME]
        [--path ARCH:PATH [--also TERM,TERM]] [--ttft median] [--terms TERM,TERM]
        [--start TERM=VALUE,TERM=VALUE]

Per engine of the table (vllm, sglang, trt-llm), `bstar.validate_stages.fit_stages` fits, from
the bundled profile, the terms of FIT[engine] to the runs' measured TPOT, TTFT and E2E means
(every run simulated like for like, as `bstar validate` does: bstar.validate_runs), and prints
the fitted values with the medians of |predicted / measured - 1| before and after. First, where
one workload ran at three or more TP sizes, the measured TTFT split as a + b / N (`tp_split`):
the part tensor parallelism does not divide, which `prompt_token_s` and `front_token_s` price.
vLLM's terms are fitted to both vLLM data sets at once, these runs and the H100 load stages
(data/vllm-h100/stages.csv), since one profile serves both. The values go into
src/bstar/presets/engines.toml with this command as their source. One set per engine, fitted
over all its models and TP sizes: no per-model constant. The profile's own terms are fitted
on the runs of its kernel path (`kernel_path` in engines.toml); `--path ARCH:PATH` fits an
entry's kernel terms (moe_compute, moe_layer_s) on the runs that take that path
(`[ENGINE.kernels."ARCH:PATH"]`), and with `--also` engine terms of that architecture
with them (`[ENGINE.arch.ARCH]`; docs/cost-model.md, "Kernel paths"), or, for a cold start
that is the path's own, the entry's `behaviour` (`cold_start_s`: TensorRT-LLM's FP8 blocks
on Hopper, docs/cost-model.md, "Checked on InferenceX"). `--ttft median` fits
the runs' measured TTFT medians in place of their means (`fit_stages(ttft="median")`: a
benchmark without a warm-up carries its cold first requests in the mean). Every fit starts
from the bundled profile or entry and refines it; `--terms` refits only the terms named,
the others kept as bundled (an 8-bit path's weight stream alone: docs/transfer.md, "The FP8
weights' stream"). `--start` begins the fit from the values given in place of the
bundled ones: Gauss-Newton from a far start can stop where its first step raises the cost
(B200's vLLM front end, `[vllm.arch.blackwell]`: docs/transfer.md, "B200's vLLM front end").
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from bstar.calibrate.params import _SCALE  # noqa: E402
from bstar.deployment import (  # noqa: E402
    Efficiency,
    EngineBehaviour,
    fitted_kernel_fields,
    generic_kernel_terms,
)
from bstar.engines import get_engine  # noqa: E402
from bstar.runs_table import load_runs  # noqa: E402
from bstar.stages_table import load_stages  # noqa: E402
from bstar.validate_runs import ttft_median_abs_error  # noqa: E402
from bstar.validate_stages import (  # noqa: E402
    evaluate,
    fit_stages,
    measured_state,
    stage_deployment,
)
from bstar.validate_stages.score import STEADY  # noqa: E402

# The MoE terms (docs/cost-model.md, "2026 models") everywhere. vLLM: also the all-reduce
# latency (TP 1, 2, 4 and 8 of one model pin it; the H100 stages could not) and the prompt
# time that tensor parallelism does not divide (an 8k prompt's TTFT falls as a + b / N, not
# b / N), in two places: in the step (`prompt_token_s`: every running request waits for it)
# and in the API server's one tokenizing thread (`front_token_s`: first come, first served,
# TTFT only); with the stages, their terms (kv_bandwidth, overhead_s, request_overhead_s).
# Its eager floor (a step past the captured graphs, 512 tokens) stays the profile's stated
# estimate: with the prompt tokens priced no run's step sits at the floor, so the runs cannot
# pin it. The engines never fitted on real load before (sglang, trt-llm) also fit their CPU
# time per step and per request; their prompt steps run outside graphs too, but under
# kernels longer than any launch floor.
FIT = {"vllm": ("moe_compute", "moe_layer_s", "allreduce_latency_s", "prompt_token_s",
                "front_token_s", "kv_bandwidth", "overhead_s", "request_overhead_s"),
       "sglang": ("moe_compute", "moe_layer_s", "overhead_s", "request_overhead_s"),
       "trt-llm": ("moe_compute", "moe_layer_s", "overhead_s", "request_overhead_s")}
# Fitted together with the runs (the same engine's other data set).
ALSO = {"vllm": ROOT / "data" / "vllm-h100" / "stages.csv"}


def _medians(runs: list, eff: Efficiency, beh: EngineBehaviour,
             path: str | None = None) -> dict[str, float]:
    scores, _ = evaluate(runs, eff, behaviour=beh, kernel_path=path)
    scores = [s for s, r in zip(scores, runs, strict=True) if measured_state(r) == STEADY]
    out = {k: float(np.median([abs(s.errors[k]) for s in scores if k in s.errors]))
           for k in ("tpot_mean_ms", "ttft_mean_ms", "e2e_mean_ms")}
    p50 = ttft_median_abs_error(scores)
    return out | ({} if p50 is None else {"ttft_p50": p50})


def tp_split(runs: list) -> list[tuple[str, int, float, float, float]]:
    """Where one model, workload and concurrency ran at three or more TP sizes N: the
    least-squares TTFT = a + b / N over them (seconds), with the largest residual as a
    fraction. `a` is the part of TTFT tensor parallelism does not divide."""
    groups: dict[tuple, list] = defaultdict(list)
    for r in runs:
        groups[(r.model, r.prompt_len[-1][1], r.output_len, r.concurrency)].append(r)
    out = []
    for (model, isl, osl, conc), rs in sorted(groups.items()):
        if len({r.num_gpus for r in rs}) < 3:
            continue
        x = np.array([[1.0, 1.0 / r.num_gpus] for r in rs])
        y = np.array([r.ttft_mean_ms / 1e3 for r in rs])
        (a, b), *_ = np.linalg.lstsq(x, y, rcond=None)
        worst = float(np.max(np.abs(x @ np.array([a, b]) / y - 1)))
        out.append((f"{model} {int(isl)}/{osl} c{conc}", len(rs), float(a), float(b), worst))
    return out


def run_path(run: Any) -> str:
    """The kernel path a run's deployment takes (bstar.deployment.kernel_path)."""
    return stage_deployment(run).kernel_path


def with_start(e: Efficiency, b: EngineBehaviour, start: dict[str, float]
               ) -> tuple[Efficiency, EngineBehaviour]:
    """`e` and `b` with the `--start` values, each in the record that holds it."""
    unknown = [k for k in start if not hasattr(e, k) and not hasattr(b, k)]
    if unknown:
        raise SystemExit(f"--start: unknown term(s) {', '.join(unknown)}")
    return (replace(e, **{k: v for k, v in start.items() if hasattr(e, k)}),
            replace(b, **{k: v for k, v in start.items() if not hasattr(e, k)}))


def fit_entry(runs: list, eng: str, path: str, also: tuple[str, ...] = (),
              ttft: str = "mean", terms: tuple[str, ...] = (),
              start_at: dict[str, float] | None = None) -> None:
    """Fit the engine's kernel terms (deployment.fitted_kernel_fields) for kernel path `path`
    on the runs that take it, from the profile's entry for the path (its generic kernel
    terms where the entry names none), and the engine terms `also` (an entry for the path's
    architecture, `[ENGINE.arch.ARCH]`); or only `terms`. Print them and the medians. The
    8-bit weights' stream is fitted only when named (`--terms fp8_weight_stream`): fitted
    with the floor, it trades against it (docs/transfer.md, "The FP8 weights' stream")."""
    # From the entry's own terms (its path's generic ones where it has none): the fit
    # refines the bundled entry, as four Gauss-Newton rounds from the generic start can stop
    # short. The profile with its entry for the path's architecture over it (`for_gpu`), as
    # `bstar validate` prices these runs: ROCm's SGLang has no per-request time of its own.
    mla = all(stage_deployment(r).model.is_mla for r in runs)
    prof, beh, terms_path, _ = get_engine(eng).for_gpu(path.split(":")[0], path, mla=mla)
    start = prof if terms_path == path else replace(prof, **generic_kernel_terms(path))
    # a term at 0 has no slope for the fit's 10% steps: the ones `also` fits start at their
    # fitting unit (1 ms a request, 1 s a cold start: bstar.calibrate's _SCALE)
    zero = {k: _SCALE[k] for k in also if k.endswith("_s")
            and getattr(start, k, getattr(beh, k, None)) == 0}
    start = replace(start, **{k: v for k, v in zero.items() if hasattr(start, k)})
    beh = replace(beh, **{k: v for k, v in zero.items() if not hasattr(prof, k)})
    start, beh = with_start(start, beh, start_at or {})
    fit = terms or (*(k for k in fitted_kernel_fields(path) if k != "fp8_weight_stream"),
                    *also)
    before = _medians(runs, start, beh, path)
    got = fit_stages(runs, start, fit, iterations=4, behaviour=beh, kernel_path=path,
                     ttft=ttft)
    if got is None:
        print(f"{eng} {path}: the runs cannot determine {', '.join(fit)}")
        return
    e, b = got
    print(f"{eng} [kernels.{path!r}] and [arch] ({len(runs)} runs, TTFT {ttft}s): "
          f"{_values(e, b, fit)}")
    for name, m in (("before (the entry)", before),
                    ("after", _medians(runs, e, b, path))):
        print(f"  runs {name}: {_errors(m)}")


def _values(e: Efficiency, b: EngineBehaviour, fit: tuple[str, ...]) -> str:
    """The fitted terms, each from the record that holds it."""
    return ", ".join(f"{k} = {getattr(e, k) if hasattr(e, k) else getattr(b, k):.4g}"
                     for k in fit)


def _errors(medians: dict[str, float]) -> str:
    return "median |error| " + ", ".join(f"{q.split('_')[0].upper()} {x:.1%}"
                                          for q, x in medians.items())


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description="Fit the engine profiles' terms to the runs "
                                "(this module's docstring).")
    p.add_argument("runs", nargs="?", default=str(ROOT / "data" / "inferencemax" / "runs.csv"))
    p.add_argument("--engine", default=None, help="only this engine's runs")
    p.add_argument("--path", default=None, help="fit the entry for this kernel path")
    p.add_argument("--also", default="",
                   help="engine terms of the path's architecture, fitted with it (T,T)")
    p.add_argument("--terms", default="",
                   help="refit only these terms of the bundled profile or entry (T,T)")
    p.add_argument("--ttft", default="mean", choices=("mean", "median"))
    p.add_argument("--start", default="",
                   help="begin the fit from these values, not the bundled ones (T=V,T=V)")
    args = p.parse_args(argv)
    try:
        start_at = {k: float(v) for k, v in (t.split("=", 1) for t in args.start.split(",")
                                             if t)}
    except ValueError:
        p.error(f"--start takes TERM=VALUE,TERM=VALUE, got {args.start!r}")
    only, entry, ttft, path = args.engine, args.path, args.ttft, args.runs
    also = tuple(t for t in args.also.split(",") if t)
    terms = tuple(t for t in args.terms.split(",") if t)
    by_engine: dict[str, list] = defaultdict(list)
    for r in load_runs(path):
        if not r.dp_attention and only in (None, r.engine):
            by_engine[r.engine].append(r)
    if entry is not None:  # one kernel-path entry: the runs that take that path
        for eng, runs in sorted(by_engine.items()):
            mine = [r for r in runs if run_path(r) == entry]
            if mine:
                fit_entry(mine, eng, entry, also, ttft, terms, start_at)
        return 0
    for eng, runs in sorted(by_engine.items()):
        # The profile's own terms are fitted on the runs of its kernel path (its kernel
        # terms belong to that path; the other GPUs' runs get entries: --path).
        home = get_engine(eng).kernel_path
        runs = [r for r in runs if not home or run_path(r) == home]
        split = tp_split(runs)
        if split:
            print(f"{eng}: measured TTFT = a + b / N over the TP sizes N of one workload")
        for name, n, a, b, worst in split:
            print(f"  {name:28} {n} TP sizes: a {a * 1e3:6.1f} ms, b {b * 1e3:6.1f} ms "
                  f"(worst residual {worst:.1%})")
        # The bundled profile, refined: four Gauss-Newton rounds from a generic start stop
        # short of its optimum (see fit_entry).
        start, beh = with_start(get_engine(eng).efficiency(), get_engine(eng).behaviour(),
                                start_at)
        fit = terms or FIT.get(eng, FIT["vllm"])
        sets = {"runs": runs}
        if eng in ALSO:
            # Eight terms on two data sets (run on its own output the fit moves nothing:
            # docs/cost-model.md, "2026 models"). A start with the front end idle stays
            # there: its queue pays only once it holds most of the undivided prompt time.
            sets[ALSO[eng].parent.name] = load_stages(ALSO[eng])
        before = {k: _medians(v, start, beh) for k, v in sets.items()}
        got = fit_stages([x for v in sets.values() for x in v], start, fit, iterations=4,
                         behaviour=beh, ttft=ttft)
        if got is None:
            print(f"{eng}: the runs cannot determine {', '.join(fit)}")
            continue
        e, b = got
        print(f"{eng} ({', '.join(f'{len(v)} {k}' for k, v in sets.items())}): "
              f"{_values(e, b, tuple(fit))}")
        for k, v in sets.items():
            for name, m in (("before", before[k]), ("after", _medians(v, e, b))):
                print(f"  {k} {name}: {_errors(m)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
