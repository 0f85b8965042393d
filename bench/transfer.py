"""Judge the engine terms by what they did not see (issue 37, item 0): the transfer matrix.

    python bench/transfer.py [--quick] [--json] [--jobs N] [--no-write] [--engine NAME]
        [--runs RUNS.csv]

The shared real data of each engine: the closed-loop runs (data/inferencemax/runs.csv:
vLLM, SGLang and TensorRT-LLM on H200, B200 and MI300X) and, for vLLM, the H100 load stages
(data/vllm-h100/stages.csv). Each slice of it is left out in turn; the engine's terms are
fitted on the rest (`bstar.validate_stages.fit_stages`, as bench/fit_runs.py fits the
profiles) and the slice is predicted (`bstar.validate_stages.evaluate`). Per slice, the
median |predicted / measured - 1| of the mean TPOT, TTFT and E2E over its measured-steady
rows, and of the median TTFT over its rows that state one (a benchmark without a warm-up
puts its first requests' compile and tune time in the mean), two ways side by side:

- in-sample: the shipped engine profile (src/bstar/presets/engines.toml), which was fitted
  on every row, the slice's included;
- left out: the terms refitted without the slice.

Slices:
- GPU left out (H100 stages, H200, B200, MI300X), per engine with rows on two GPUs or more;
- model left out (Llama-2-7B, CodeLlama-34B, gpt-oss-120b, DeepSeek-R1), per engine with two
  models or more;
- engine left out: an engine's rows predicted with its terms fitted on the other engines'
  rows (each simulated with the left-out engine's structure: its scheduling lag, per-layer
  costs and every term not fitted).

The terms fitted: bench/fit_runs.py's FIT of the engine, from the generic defaults (the
engine's structure kept, as `bstar validate`'s leave-one-model-out fit starts), so that no
value learned on the slice enters. The kernel terms among them (moe_compute, moe_layer_s:
bstar.deployment.KERNEL_FIELDS) are fitted once per kernel path of the training rows
(`bstar.validate_stages.fit_stages_by_path`), as the profiles hold them: one entry per
path, the other terms shared. A slice row on a path the training rows take prices that
path's fitted terms; one on a path they do not take, its path's generic ones
(bstar.deployment.generic_kernel_terms: a native FP4 path streams its weights at the 16-bit
rate), which is how bstar prices a GPU whose path has no entry in the profile. Each
training set is fitted by one `fit_stages_by_path` call over all its rows.

--quick (docs/transfer.md says how long it took, and under what load) drops, for both the
fits and the scored slices: the runs at every other concurrency (keeps 4, 16, 64 of 4-128),
the runs at TP sizes other than the smallest and largest of each GPU x engine x model, every
other H100 stage; and in the fits: Gauss-Newton iterations 1 instead of 4 and each row
simulated for at most 15 s instead of 40 s (bstar.validate_stages.FIT_WINDOW_S). The scored
figures (in-sample and left out) use the same simulation window as `bstar validate`.

Regressions rule (issue 37): a change to a profile or a step term that improves an in-sample
cell and worsens a left-out cell by more than a point is a regression, whatever the
in-sample figure says. The page docs/transfer.md holds the matrix this command printed; it
is rewritten on every run (--no-write: print only).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from bstar.deployment import (  # noqa: E402
    KERNEL_FIELDS,
    Efficiency,
    EngineBehaviour,
)
from bstar.engines import get_engine  # noqa: E402
from bstar.runs_table import load_runs  # noqa: E402
from bstar.stages_table import Stage, load_stages  # noqa: E402
from bstar.validate_runs import ttft_median_abs_error as ttft_p50_error  # noqa: E402
from bstar.validate_stages import (  # noqa: E402
    FIT_WINDOW_S,
    evaluate,
    fit_stages_by_path,
    stage_deployment,
)
from fit_runs import FIT  # noqa: E402

RUNS = ROOT / "data" / "inferencemax" / "runs.csv"
STAGES = ROOT / "data" / "vllm-h100" / "stages.csv"
PAGE = ROOT / "docs" / "transfer.md"
QUANTITIES = ("tpot_mean_ms", "ttft_mean_ms", "e2e_mean_ms")
FULL = {"iterations": 4, "fit_window_s": FIT_WINDOW_S}
QUICK = {"iterations": 1, "fit_window_s": 15.0}
QUICK_CONCURRENCY = (4, 16, 64)
QUICK_NOTE = ("With --quick the fits ran one Gauss-Newton round from the generic start: a "
              "left-out figure far above the in-sample one may be an unconverged fit, not only "
              "a term that does not transfer; the full command (4 rounds, every row) is the "
              "reference.")


@dataclass(frozen=True)
class Slice:
    kind: str  # "gpu", "model", "engine"
    engine: str  # the engine whose terms are fitted
    left_out: str  # the GPU, model or engine left out
    test: tuple[Stage, ...]
    train: tuple[Stage, ...]


def load_rows(quick: bool, runs_path: Path = RUNS) -> list[Stage]:
    """Every shared row (runs with tensor-parallel attention, and the vLLM H100 stages);
    with `quick`, the subsample the docstring names."""
    runs = [r for r in load_runs(runs_path) if not r.dp_attention]
    stages = load_stages(STAGES)
    if not quick:
        return [*runs, *stages]
    tps: dict[tuple[str, str, str], set[int]] = {}
    for r in runs:
        tps.setdefault((r.engine, r.gpu, r.model), set()).add(r.num_gpus)
    keep = [r for r in runs if r.concurrency in QUICK_CONCURRENCY
            and r.num_gpus in (min(tps[(r.engine, r.gpu, r.model)]),
                               max(tps[(r.engine, r.gpu, r.model)]))]
    return [*keep, *stages[::2]]


def slices(rows: Sequence[Stage]) -> list[Slice]:
    """Every slice the docstring lists, in the order of the matrix."""
    out: list[Slice] = []
    engines = sorted({r.engine for r in rows})
    for kind, key in (("gpu", lambda r: r.gpu), ("model", lambda r: r.model)):
        for eng in engines:
            mine = [r for r in rows if r.engine == eng]
            values = sorted({key(r) for r in mine})
            if len(values) < 2:
                continue
            for v in values:
                out.append(Slice(kind, eng, v, tuple(r for r in mine if key(r) == v),
                                 tuple(r for r in mine if key(r) != v)))
    if len(engines) > 1:
        for eng in engines:
            out.append(Slice("engine", eng, eng, tuple(r for r in rows if r.engine == eng),
                             tuple(r for r in rows if r.engine != eng)))
    return out


def start_terms(engine: str, fit: Sequence[str]) -> tuple[Efficiency, EngineBehaviour]:
    """The engine's profile with the fitted terms and the kernel terms at their generic
    values: its structure kept, nothing learned on any row."""
    prof = get_engine(engine)
    e, b = prof.efficiency(), prof.behaviour()
    ge, gb = Efficiency(), EngineBehaviour()
    e = replace(e, **{k: getattr(ge, k) for k in (*fit, *KERNEL_FIELDS) if hasattr(ge, k)})
    b = replace(b, **{k: getattr(gb, k) for k in fit if hasattr(gb, k)})
    return e, b


def _medians(summary: Any) -> dict[str, float | None]:
    return {k: summary.median_abs[k] for k in QUANTITIES}


def run_slice(sl: Slice, quick: bool) -> dict[str, Any]:
    """One cell row of the matrix: in-sample (shipped profile) and left out (refit)."""
    t0 = time.monotonic()
    settings = QUICK if quick else FULL
    fit = FIT.get(sl.engine, FIT["vllm"])
    inside_rows, inside = evaluate(list(sl.test))
    e, b = start_terms(sl.engine, fit)
    got = fit_stages_by_path(list(sl.train), e, fit, max_window_s=settings["fit_window_s"],
                             iterations=settings["iterations"], behaviour=b)
    out: dict[str, Any] = {
        "kind": sl.kind, "engine": sl.engine, "left_out": sl.left_out,
        "test_rows": len(sl.test), "train_rows": len(sl.train), "fit": list(fit),
        "in_sample": _medians(inside), "left_out_errors": None, "fitted": None,
        "in_sample_ttft_p50": ttft_p50_error(inside_rows), "left_out_ttft_p50": None}
    if got is None:
        out["note"] = "the training rows cannot determine the terms"
    else:
        held_rows, held = evaluate(list(sl.test), got.eff, behaviour=got.behaviour,
                                   path_terms=got.path_terms)
        out["left_out_errors"] = _medians(held)
        out["left_out_ttft_p50"] = ttft_p50_error(held_rows)
        out["fitted"] = got.values(fit)
        test_paths = {stage_deployment(r).kernel_path for r in sl.test}
        out["paths_fitted"] = sorted(got.path_terms)
        out["slice_paths_generic"] = sorted(test_paths - set(got.path_terms))
    out["seconds"] = round(time.monotonic() - t0, 1)
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def table(results: Sequence[dict[str, Any]]) -> str:
    """The matrix as a markdown table."""
    lines = ["| left out | engine | rows (slice / fit) | terms fitted | in-sample TPOT / TTFT "
             "/ E2E | left out TPOT / TTFT / E2E | median TTFT in-sample / left out |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        shared = [k for k in r["fit"] if k not in KERNEL_FIELDS]
        kernel = [k for k in r["fit"] if k in KERNEL_FIELDS]
        per_path = r.get("paths_fitted") or []
        terms = ", ".join(shared) + (
            f"; {', '.join(kernel)} per path ({', '.join(per_path)})" if per_path and kernel
            else "")
        ins = " / ".join(_pct(r["in_sample"][k]) for k in QUANTITIES)
        lo = r["left_out_errors"]
        out = (" / ".join(_pct(lo[k]) for k in QUANTITIES) if lo
               else f"- ({r.get('note', '')})")
        p50 = f"{_pct(r.get('in_sample_ttft_p50'))} / {_pct(r.get('left_out_ttft_p50'))}"
        lines.append(f"| {r['kind']} {r['left_out']} | {r['engine']} | {r['test_rows']} / "
                     f"{r['train_rows']} | {terms} | {ins} | {out} | {p50} |")
    return "\n".join(lines)


def page(results: Sequence[dict[str, Any]], quick: bool, minutes: float,
         load: tuple[float, float, float]) -> str:
    cmd = "python bench/transfer.py" + (" --quick" if quick else "")
    date = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    avg = " / ".join(f"{x:.1f}" for x in load)
    return f"""# The transfer matrix: engine terms judged by what they did not see

Issue 37, item 0. Each slice of the shared real data (a GPU, a model, an engine) is left
out in turn: the engine's terms are fitted on the rest of that engine's data
(`bstar.validate_stages.fit_stages_by_path`, the terms of `bench/fit_runs.py`'s FIT from the
generic defaults; the kernel terms `moe_compute`, `moe_layer_s` once per kernel path of the
training rows, as the profiles hold them; a slice row on a path no training row takes is
priced with its path's generic ones, as bstar prices a GPU with no entry for its path:
`bstar.deployment.generic_kernel_terms`), and the slice is predicted. Each cell
is the median |predicted / measured - 1| of the mean TPOT, TTFT and E2E over the slice's
measured-steady rows (the last column: of the median TTFT, over its rows that state one):

- **in-sample**: the shipped engine profile (`src/bstar/presets/engines.toml`), fitted on
  every row, the slice's included;
- **left out**: the terms refitted without the slice.

"engine X left out" predicts engine X's rows with X's terms fitted on the other engines'
rows (X's structure kept). What `--quick` drops is in the docstring of `bench/transfer.py`.

**Regressions rule.** A change to a profile or a step term lands only with this matrix in
its commit. A change that improves an in-sample cell and worsens a left-out cell by more
than a point is a regression, whatever the in-sample figure says.

Regenerate with `{cmd}` (from the repository root; it rewrites
this page up to its matrix and keeps the sections after it, written by hand).

## The matrix

Printed by `{cmd}` on {date}, in {minutes:.0f} min, on a shared
machine with load average {avg} (1 / 5 / 15 min) on its {os.cpu_count()} cores
({", ".join(f"{k} {v}" for k, v in versions().items())}).
{textwrap.fill(QUICK_NOTE, 92) if quick else ""}

{table(results)}
"""


def versions() -> dict[str, str]:
    """The interpreter's and the numerical libraries' versions: SGLang's GPU slices printed
    different cells on two machines from the same code (docs/transfer.md, "A request's
    time in a joint fit"), so a run says what it ran on."""
    import platform

    import numpy
    import scipy

    return {"python": platform.python_version(), "numpy": numpy.__version__,
            "scipy": scipy.__version__}


def hand_written(old_page: str) -> str:
    """The sections of the page after its matrix (from the first heading that follows "## The
    matrix"): written by hand about earlier runs, kept when the matrix is regenerated."""
    i = old_page.find("\n## The matrix")
    j = old_page.find("\n## ", i + 1) if i >= 0 else -1
    return old_page[j:] if j >= 0 else ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python bench/transfer.py", description=__doc__.split(
        "\n")[0])
    p.add_argument("--quick", action="store_true", help="subsampled rows, one fit round")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--jobs", type=int, default=2, help="slices fitted side by side")
    p.add_argument("--no-write", action="store_true", help=f"do not rewrite {PAGE.name}")
    p.add_argument("--only", default=None, help="only the slices of this kind")
    p.add_argument("--engine", default=None,
                   help="only this engine's slices (the page is then left as it is)")
    p.add_argument("--runs", type=Path, default=RUNS,
                   help="the runs table (default data/inferencemax/runs.csv; another one "
                        "leaves the page as it is)")
    args = p.parse_args(argv)
    t0 = time.monotonic()
    rows = load_rows(args.quick, args.runs)
    todo = [s for s in slices(rows) if args.only in (None, s.kind)
            and args.engine in (None, s.engine)]
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [pool.submit(run_slice, s, args.quick) for s in todo]
        results = []
        for s, f in zip(todo, futures, strict=True):
            results.append(f.result())
            print(f"done: {s.kind} {s.left_out} ({s.engine}), {results[-1]['seconds']} s",
                  file=sys.stderr, flush=True)
    minutes = (time.monotonic() - t0) / 60
    load = os.getloadavg()
    if args.json:
        print(json.dumps({"quick": args.quick, "minutes": minutes, "load": load,
                          "versions": versions(), "slices": results}, indent=2))
    else:
        print(table(results))
    if not args.no_write and args.engine is None and args.runs == RUNS:  # the whole, only
        old = PAGE.read_text() if PAGE.exists() else ""
        PAGE.write_text(page(results, args.quick, minutes, load) + hand_written(old))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
