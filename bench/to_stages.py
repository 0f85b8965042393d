"""Write inference-perf load stages as a stages table for `bstar validate`.

    python bench/to_stages.py DIR [DIR ...] > data/vllm-h100/stages.csv

Each DIR is one experiment folder of the public repository inference-sim/training (commit
ed5c1d2, folder default_args/): `exp-config.yaml` (the vLLM server's flags), `profile.yaml`
(inference-perf's load and workload) and `results/stage_N_lifecycle_metrics.json` (one per
load stage). One row per stage; data/vllm-h100/README.md says what each column is.

Derived, not copied: `tpot_mean_ms` = (E2E mean - TTFT mean) / (output_len - 1) with the
configured output length (the server generates all of them: ignore_eos). inference-perf's own
TPOT and ITL figures are about half the true time per token (it receives about two stream
chunks per token), so they are left out, and `tpot_p90_ms` stays empty. Times in the source
are in seconds; here in ms, rounded to 0.1 us. Lengths are the source's prompt percentiles
(tokens, as inference-perf's tokenizer counts them).
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from bstar.specs.presets import get_model  # noqa: E402
from bstar.validate_stages import COLUMNS  # noqa: E402

SOURCE = "inference-sim/training@ed5c1d2 default_args/{experiment}"
ARRIVALS = {"constant": "constant", "poisson": "poisson"}  # inference-perf load.type


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 4)


def stage_rows(folder: Path) -> list[dict[str, Any]]:
    server = yaml.safe_load((folder / "exp-config.yaml").read_text())
    profile = yaml.safe_load((folder / "profile.yaml").read_text())
    load = profile["load"]
    data = profile["data"]["shared_prefix"]
    output_len = int(data["output_len"])
    model = get_model(server["model"]).name  # a bundled preset, by its Hugging Face repo
    rows = []
    for i, st in enumerate(load["stages"]):
        m = json.loads((folder / "results" / f"stage_{i}_lifecycle_metrics.json").read_text())
        ok, lat = m["successes"], m["successes"]["latency"]
        ttft, e2e = lat["time_to_first_token"], lat["request_latency"]
        prompt = ok["prompt_len"]
        failed = (m.get("failures") or {}).get("count") or 0
        rows.append({
            "stage": f"{folder.name.split('-', 2)[2]}-{i}",
            "model": model, "gpu": "h100-sxm", "num_gpus": server["tensor_parallelism"],
            "engine": "vllm", "engine_version": "V1 (early 2026)", "dtype": "fp16",
            "max_num_seqs": server["max_num_seqs"],
            "max_num_batched_tokens": server["max_num_batched_tokens"],
            "max_model_len": server["max_model_len"],
            "arrival": ARRIVALS[load["type"]], "rate_req_s": st["rate"], "concurrency": "",
            "duration_s": st["duration"],
            "prompt_len_min": int(prompt["min"]), "prompt_len_p10": round(prompt["p10"], 4),
            "prompt_len_p25": round(prompt["p25"], 4), "prompt_len_p50": round(prompt["median"], 4),
            "prompt_len_p75": round(prompt["p75"], 4), "prompt_len_p90": round(prompt["p90"], 4),
            "prompt_len_p99": round(prompt["p99"], 4), "prompt_len_max": int(prompt["max"]),
            "shared_prefix_len": data["system_prompt_len"],
            # inference-perf's shared_prefix generator makes groups x users prompts once and
            # sends them in turn: every later request repeats one of them exactly.
            "distinct_prompts": int(data["num_unique_system_prompts"])
            * int(data["num_users_per_system_prompt"]),
            "output_len": output_len,
            "ignore_eos": str(bool(profile["server"].get("ignore_eos"))).lower(),
            "requests_sent": m["load_summary"]["count"], "requests_ok": ok["count"],
            "requests_failed": failed,
            "ttft_mean_ms": _ms(ttft["mean"]), "ttft_p50_ms": _ms(ttft["median"]),
            "ttft_p90_ms": _ms(ttft["p90"]),
            "e2e_mean_ms": _ms(e2e["mean"]), "e2e_p50_ms": _ms(e2e["median"]),
            "e2e_p90_ms": _ms(e2e["p90"]),
            "tpot_mean_ms": round((e2e["mean"] - ttft["mean"]) * 1e3 / (output_len - 1), 4),
            "tpot_p90_ms": "",
            "output_tok_s": round(ok["throughput"]["output_tokens_per_sec"], 3),
            "source": SOURCE.format(experiment=folder.name),
        })
    return rows


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    rows = [r for d in sorted(Path(a) for a in argv) for r in stage_rows(d)]
    rows.sort(key=lambda r: (r["model"], r["stage"]))
    w = csv.DictWriter(sys.stdout, fieldnames=list(COLUMNS), lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
