"""Write the repo's own measurements as curves tables for `bstar validate`.

    python bench/to_curves.py h200   > data/h200/curves.csv
    python bench/to_curves.py h200-heldout > data/h200/heldout-curves.csv
    python bench/to_curves.py cpu    > data/cpu/curves.csv

h200: the decode steps of data/h200/steps.jsonl and llama-3-8b-decode.jsonl (bench/gpu_steps.py;
one row per (model, context, batch); the 8-layer cut of Llama-3-8B, a harness device with no
served counterpart, is left out); h200-heldout: data/h200/heldout.jsonl, models measured after
the torch-graph profile was fitted, to be predicted, not fitted. cpu: the closed-loop levels
of data/cpu/vllm-decode-sweep-*.json
and data/cpu/llamacpp-sweep-*.json (`bstar sweep` against vLLM and against llama.cpp's server
on this machine's CPU), each with its run's probe as the device and the tiny model's
config.json. Numbers are copied, not rounded (repr of the float).
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = ("model", "gpu", "num_gpus", "engine", "engine_version", "dtype", "kv_dtype",
           "input_len", "output_len", "context_tokens", "batch", "batch_kind", "step_ms",
           "itl_ms", "tpot_ms", "throughput_tok_s", "ttft_ms", "source", "note")


def h200(files: tuple[tuple[str, str], ...] = (
        ("steps.jsonl", "bench/gpu_steps.py (norm fused)"),
        ("llama-3-8b-decode.jsonl", "earlier harness (norm fused)"))) -> list[dict[str, object]]:
    rows = []
    for name, version in files:
        for line in (ROOT / "data" / "h200" / name).read_text().splitlines():
            r = json.loads(line)
            if r["kind"] != "decode" or "@8l" in r["model"]:
                continue
            model, _, tag = r["model"].partition("@")
            rows.append({"model": model, "gpu": "h200", "num_gpus": 1, "engine": "torch-graph",
                         "engine_version": version, "dtype": tag or "bf16", "kv_dtype": "bf16",
                         "context_tokens": r["context"], "batch": r["batch"],
                         "batch_kind": "step", "step_ms": repr(r["step_ms"]),
                         "source": f"data/h200/{name}",
                         "note": "median of 20 CUDA-graph replays, random weights"})
    return rows


# Closed-loop sweeps in data/cpu/: (file pattern, engine, probe file, model config); {tag} is
# the run's tag and {shape} the middle of the file name (bench/cpu_models.py's shapes).
CPU_SWEEPS = (("vllm-decode-sweep-*.json", "vllm", "probe-{tag}.toml", "tiny-config.json"),
              ("llamacpp-sweep-*.json", "llama.cpp", "llamacpp-probe-{tag}.toml",
               "tiny-config.json"),
              ("llamacpp-*-sweep-*.json", "llama.cpp", "llamacpp-probe-{tag}.toml",
               "llamacpp-{shape}-config.json"))


def cpu() -> list[dict[str, object]]:
    rows = []
    for pattern, engine, probe, config in CPU_SWEEPS:
        for f in sorted((ROOT / "data" / "cpu").glob(pattern)):
            tag = f.stem.rsplit("-", 1)[1]
            shape = f.stem.removeprefix("llamacpp-").rsplit("-sweep-", 1)[0]
            d = json.loads(f.read_text())
            o = d["options"]
            dep = o.get("deployment") or {}
            for lv in d["levels"]:
                if lv.get("status") != "completed":
                    continue
                rows.append({"model": config.format(shape=shape), "gpu": probe.format(tag=tag),
                             "num_gpus": 1, "engine": engine, "engine_version":
                             f"{d.get('server_version') or ''} (cpu, run {tag})".strip(),
                             "dtype": dep.get("weight_dtype") or "fp32",
                             "kv_dtype": dep.get("kv_dtype") or "fp32",
                             "input_len": o["input_len"], "output_len": o["output_len"],
                             "batch": lv["concurrency"], "batch_kind": "concurrency",
                             "itl_ms": repr(lv["itl_ms"]["p50"]),
                             "tpot_ms": repr(lv["tpot_ms"]["p50"]),
                             "throughput_tok_s": repr(lv["throughput_tok_s"]),
                             "ttft_ms": repr(lv["ttft_ms"]["p50"]),
                             "source": f"data/cpu/{f.name}",
                             "note": f"bstar sweep, {lv['requests']} requests, p50s"})
    return rows


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in ("h200", "h200-heldout", "cpu"):
        print(__doc__, file=sys.stderr)
        return 2
    rows = (h200() if argv[0] == "h200" else cpu() if argv[0] == "cpu"
            else h200((("heldout.jsonl", "bench/gpu_steps.py --models (held out)"),)))
    print(f"# Written by `python bench/to_curves.py {argv[0]}` from the files in the source "
          "column; see data/README.md.")
    w = csv.DictWriter(sys.stdout, COLUMNS, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
