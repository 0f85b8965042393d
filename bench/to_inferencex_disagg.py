"""Write InferenceX's disaggregated H200 runs (Dynamo + SGLang, Dynamo + TensorRT-LLM) as a
disaggregated runs table (bstar.disagg_runs) for `python bench/disagg_validate.py`, each run
read with the flags of the recipe that served it.

    python bench/to_inferencex_disagg.py RUNS.csv INFERENCEX > data/inferencex-h200/disagg_runs.csv

RUNS.csv: the 50 H200 rows of SemiAnalysis InferenceX's dashboard fixture
(vngcloud/InferenceX-app@7fe6d62, packages/app/cypress/fixtures/api/benchmarks.json, one row
per run; data/inferencex-h200/disagg_runs.md says what each column is). Only its rows with
`disagg` true are written.

INFERENCEX: a checkout of SemiAnalysisAI/InferenceX at RECIPES_COMMIT (the last commit
before its recipes were migrated off the `sa-bench` client; `git clone` the repository and
`git checkout` that commit). Its `.github/configs/nvidia-master.yaml` lists, per engine,
each search-space entry: the recipe, the concurrencies it ran, and each side's workers, TP,
EP and attention DP. A run's entry is the one whose engine, lengths, spec method, layout and
concurrency list match the row (exactly one must, else the converter stops and says why);
the recipe (`benchmarks/multi_node/srt-slurm-recipes/<recipe>`) must state the same worker
counts and sizes. The recipes were added to the repository in 2026-04, after these runs, and
name the runs' containers (TensorRT-LLM runtime 0.8.1.post1, SGLang v0.5.8.post1-cu130).

Per run, from the row: each side's TP, EP, attention DP (`*_dp_attention` true: DP = TP)
and worker count; the engine; the concurrency; the stated lengths as the client's uniform
ranges [0.8 L, L]; the measured means and medians, seconds converted to ms. From its recipe:
- TensorRT-LLM (`trtllm_config`, whose limits are per attention rank, so a worker's are
  that x its DP size): a side's `max_batch_size` (max_num_seqs) and `max_num_tokens`
  (the prefill step's token budget); `kv_cache_config.dtype`; an MTP run's
  `speculative_config.num_nextn_predict_layers` (draft tokens a step).
- SGLang (`sglang_config`, limits per worker): `max-running-requests` (max_num_seqs), the
  prefill step's budget min(`max-prefill-tokens`, `chunked-prefill-size`);
  `kv-cache-dtype` (unset: blank, the engine's default); an MTP run's drafts a step,
  `speculative-num-draft-tokens` - 1 (EAGLE with top-k 1 verifies the drafts and one more).
Stated for every row, not read from either: the KV link, InfiniBand NDR between nodes
(every worker is one 8-GPU node here). Nothing is fitted or typed per row.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from bstar.disagg_runs import COLUMNS  # noqa: E402
from bstar.errors import BstarError  # noqa: E402
from bstar.specs.precision import kv_dtype_for  # noqa: E402

SOURCE = "vngcloud/InferenceX-app@7fe6d62 packages/app/cypress/fixtures/api/benchmarks.json"
RECIPES_REPO = "SemiAnalysisAI/InferenceX"
RECIPES_COMMIT = "24d118f7adb0b9fc1910831f5ee30241a3914659"
MASTER = ".github/configs/nvidia-master.yaml"
RECIPES = "benchmarks/multi_node/srt-slurm-recipes"
RANGE_RATIO = 0.8  # --random-range-ratio of every run
PROMPTS_PER_USER = 10  # --num-prompts = 10 x CONC
ENGINES = {"dynamo-sglang": "sglang", "dynamo-trt": "trt-llm"}
MODELS = {"dsr1": "deepseek-r1-0528"}


class RecipeError(ValueError):
    """A run with no recipe, two, or a recipe that disagrees with the row."""


def _truth(v: Any) -> bool:
    return str(v).strip().lower() in ("true", "1", "yes")


def _layout(row: dict[str, str], name: str) -> dict[str, Any]:
    tp = int(row[f"{name}_tp"])
    return {"workers": int(row[f"{name}_num_workers"]), "tp": tp,
            "ep": int(row[f"{name}_ep"]),
            "dp": tp if _truth(row[f"{name}_dp_attention"]) else 1}


def _entry_layout(e: dict[str, Any]) -> dict[str, Any]:
    return {"workers": int(e["num-worker"]), "tp": int(e["tp"]), "ep": int(e["ep"]),
            "dp": int(e["tp"]) if _truth(e["dp-attn"]) else 1}


def _config_key(row: dict[str, str]) -> str:
    return f"{row['model']}-{row['precision']}-{row['hardware']}-{row['framework']}"


def _load(path: Path) -> Any:
    import yaml

    return yaml.safe_load(path.read_text(encoding="utf-8"))


def concurrencies(recipe: dict[str, Any], entry: dict[str, Any]) -> list[int]:
    """The users the recipe's client ran (`benchmark.concurrencies`, "AxBxC"), else the
    search-space entry's `conc-list` (the TensorRT-LLM entries name a recipe by a label,
    c1 for a client run at 9 users: the recipe's own list is what ran)."""
    stated = (recipe.get("benchmark") or {}).get("concurrencies")
    if stated is None:
        return [int(c) for c in entry.get("conc-list", [])]
    return [int(c) for c in str(stated).split("x")]


def find_recipe(master: dict[str, Any], row: dict[str, str], sides: dict[str, Any],
                checkout: Path) -> tuple[str, dict[str, Any]]:
    """The recipe (its path relative to RECIPES, and its contents) of the search-space entry
    that served the row, whose layout is `sides` (`_layout`)."""
    key = _config_key(row)
    if key not in master:
        raise RecipeError(f"{key}: not in {MASTER}")
    isl, osl, conc = int(row["isl"]), int(row["osl"]), int(row["conc"])
    hits = []
    for slc in master[key].get("seq-len-configs", []):
        if (int(slc["isl"]), int(slc["osl"])) != (isl, osl):
            continue
        for e in slc.get("search-space", []):
            if (str(e.get("spec-decoding") or "none") != row["spec_method"]
                    or any(_entry_layout(e[n]) != sides[n] for n in sides)):
                continue
            recipe = _load(checkout / RECIPES / e["recipe"])
            if conc in concurrencies(recipe, e):
                hits.append((e["recipe"], recipe))
    if len(hits) != 1:
        raise RecipeError(f"{key} isl {isl} osl {osl} {row['spec_method']} c{conc} "
                          f"{sides}: {len(hits)} recipes match "
                          f"({', '.join(h[0] for h in hits) or 'none'})")
    return hits[0]


def _check_resources(recipe: dict[str, Any], sides: dict[str, dict[str, Any]],
                     where: str) -> None:
    res = recipe["resources"]
    for n in ("prefill", "decode"):
        if int(res[f"{n}_workers"]) != sides[n]["workers"]:
            raise RecipeError(f"{where}: {n}_workers {res[f'{n}_workers']} in the recipe, "
                              f"{sides[n]['workers']} in the row")


def _check_layout(got: tuple[int, int, int], side: dict[str, Any], where: str) -> None:
    want = (side["tp"], side["ep"], side["dp"])
    if got != want:
        raise RecipeError(f"{where} TP/EP/DP {got} in the recipe, {want} in the row")


def _kv_dtype(names: list[str], where: str) -> str:
    """The sides' one KV cache dtype in bstar's names (`kv_dtype_for`; auto: blank, the
    engine's default)."""
    try:
        got = {kv_dtype_for(n, default="", where=where) for n in names}
    except BstarError as e:
        raise RecipeError(str(e)) from None
    if len(got) != 1:
        raise RecipeError(f"{where}: the two sides' KV cache dtypes differ ({names})")
    return got.pop()


def trt_flags(recipe: dict[str, Any], sides: dict[str, dict[str, Any]],
              where: str) -> dict[str, Any]:
    """Each side's limits (per attention rank x DP), the KV dtype and the MTP drafts."""
    cfg = recipe["backend"]["trtllm_config"]
    out: dict[str, Any] = {}
    for n in ("prefill", "decode"):
        c, s = cfg[n], sides[n]
        dp = int(c["tensor_parallel_size"]) if c.get("enable_attention_dp") else 1
        got = (int(c["tensor_parallel_size"]), int(c.get("moe_expert_parallel_size", 1)), dp)
        _check_layout(got, s, f"{where}: {n}")
        out[f"{n}_max_num_seqs"] = int(c["max_batch_size"]) * dp
        if n == "prefill":
            out["prefill_max_num_batched_tokens"] = int(c["max_num_tokens"]) * dp
    out["kv_cache_dtype"] = _kv_dtype(
        [str(cfg[n].get("kv_cache_config", {}).get("dtype", "auto")) for n in cfg], where)
    spec = cfg["decode"].get("speculative_config")
    if spec:
        out["num_speculative_tokens"] = int(spec["num_nextn_predict_layers"])
    return out


def sglang_flags(recipe: dict[str, Any], sides: dict[str, dict[str, Any]],
                 where: str) -> dict[str, Any]:
    """Each side's limits per worker, the KV dtype and the MTP drafts."""
    cfg = recipe["backend"]["sglang_config"]
    out: dict[str, Any] = {}
    for n in ("prefill", "decode"):
        c, s = cfg[n], sides[n]
        dp = int(c.get("dp-size", 1)) if _truth(c.get("enable-dp-attention", False)) else 1
        got = (int(c["tp-size"]), int(c.get("ep-size", 1)), dp)
        _check_layout(got, s, f"{where}: {n}")
        out[f"{n}_max_num_seqs"] = int(c["max-running-requests"])
        if n == "prefill":
            out["prefill_max_num_batched_tokens"] = min(
                int(c["max-prefill-tokens"]), int(c.get("chunked-prefill-size",
                                                         c["max-prefill-tokens"])))
    out["kv_cache_dtype"] = _kv_dtype(
        [str(cfg[n].get("kv-cache-dtype", "auto")) for n in cfg], where)
    draft = cfg["decode"].get("speculative-num-draft-tokens")
    if draft is not None:
        out["num_speculative_tokens"] = int(draft) - 1
    return out


def recipe_flags(row: dict[str, str], sides: dict[str, Any], checkout: Path,
                 master: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The recipe that served the row (of layout `sides`) and the flags read from it
    (module docstring)."""
    rel, recipe = find_recipe(master, row, sides, checkout)
    _check_resources(recipe, sides, rel)
    read = trt_flags if ENGINES[row["framework"]] == "trt-llm" else sglang_flags
    flags = read(recipe, sides, rel)
    if (row["spec_method"] == "mtp") != ("num_speculative_tokens" in flags):
        raise RecipeError(f"{rel}: spec method {row['spec_method']} but the recipe "
                          f"{'has no' if row['spec_method'] == 'mtp' else 'has a'} drafter")
    return rel, flags


def convert(rows: list[dict[str, str]], checkout: Path) -> list[dict[str, Any]]:
    master = _load(checkout / MASTER)
    out = []
    for r in rows:
        if not _truth(r["disagg"]):
            continue
        engine = ENGINES[r["framework"]]
        isl, osl, conc = int(r["isl"]), int(r["osl"]), int(r["conc"])
        sides = {n: _layout(r, n) for n in ("prefill", "decode")}
        rel, flags = recipe_flags(r, sides, checkout, master)
        name = (f"{r['framework']}-{r['spec_method']}-{sides['prefill']['workers']}p"
                f"{sides['decode']['workers']}d-isl{isl}-osl{osl}-c{conc}")
        row: dict[str, Any] = {
            "run": name, "model": MODELS[r["model"]], "gpu": r["hardware"], "engine": engine,
            "engine_version": r["image"], "dtype": "", "spec_method": r["spec_method"],
            "kv_link": "ib-ndr", "concurrency": conc,
            "num_prompts": PROMPTS_PER_USER * conc,
            "prompt_len_min": int(isl * RANGE_RATIO), "prompt_len_max": isl,
            "output_len_min": int(osl * RANGE_RATIO), "output_len_max": osl,
            "ttft_mean_ms": _ms(r["m_mean_ttft"]), "ttft_median_ms": _ms(r["m_median_ttft"]),
            "tpot_mean_ms": _ms(r["m_mean_tpot"]), "tpot_median_ms": _ms(r["m_median_tpot"]),
            "e2e_mean_ms": _ms(r["m_mean_e2el"]),
            "output_tok_s_per_gpu": round(float(r["m_output_tput_per_gpu"]), 4),
            "date": r["date"],
            "source": f"{SOURCE} {r['run_url']}; recipe {RECIPES_REPO}@"
                      f"{RECIPES_COMMIT[:9]} {RECIPES}/{rel}"}
        for n, s in sides.items():
            row.update({f"{n}_{k}": v for k, v in s.items()})
        row.update(flags)
        out.append(row)
    return out


def _ms(seconds: str) -> float:
    return round(float(seconds) * 1e3, 4)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] in ("-h", "--help"):
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[0], newline="", encoding="utf-8") as f:
        try:
            rows = convert(list(csv.DictReader(f)), Path(argv[1]))
        except (RecipeError, OSError, KeyError) as e:
            print(f"to_inferencex_disagg: {e}", file=sys.stderr)
            return 1
    w = csv.DictWriter(sys.stdout, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
