"""llama.cpp decode curves of several tiny random-weight shapes on this machine's CPU, so the
CPU x llama.cpp group of `bstar validate data/cpu/curves.csv` has models to leave out.

    python bench/cpu_models.py OUTDIR      # ~4 min on two cores; writes OUTDIR/*.json/.toml

One CPU probe at llama.cpp's one thread (as `bstar demo` takes it), then per shape: build the
model (cached), start llama.cpp's server on 127.0.0.1 (one thread, as the demo on two cores),
`bstar sweep`
concurrency 1, 2, 4, 8, 16 with 64-token prompts and 32-token outputs, 16 requests per level.
Files: `llamacpp-probe-TAG.toml`, and per shape `llamacpp-SHAPE-config.json` and
`llamacpp-SHAPE-sweep-TAG.json` (the sweep's --json). `python bench/to_curves.py cpu` reads
them next to the demo's run.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

# (label, tiny model parameters): the demo's shape, a narrower one, a deeper one.
SHAPES = (("h1024-l8", {}),
          ("h512-l8", {"hidden_size": 512, "intermediate_size": 1408, "num_heads": 8,
                       "num_kv_heads": 4}),
          ("h1024-l16", {"num_layers": 16}))
LEVELS = [1, 2, 4, 8, 16]
INPUT_LEN, OUTPUT_LEN, REQUESTS = 64, 32, 16
DEPLOYMENT = {"weight_dtype": "fp32", "kv_dtype": "fp16", "engine": "llama.cpp"}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    from bstar.loadgen.sweep import SweepConfig, run_sweep
    from bstar.probe import probe_cpu_toml
    from bstar.report.views import sweep_deployment
    from bstar.servers import LlamaCppServer
    from bstar.tinymodel import default_tiny_dir

    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    tag = time.strftime("%Y%m%dT%H%M", time.gmtime())
    probe = out / f"llamacpp-probe-{tag}.toml"
    probe.write_text(probe_cpu_toml(1, copy_bytes=128 << 20, gemm_n=1024, repeats=3),
                     encoding="utf-8")
    for label, params in SHAPES:
        tiny = default_tiny_dir(**params)
        assert tiny.gguf_path is not None
        cfg_path = out / f"llamacpp-{label}-config.json"
        cfg_path.write_bytes((tiny.hf_dir / "config.json").read_bytes())
        t0 = time.time()
        with LlamaCppServer(tiny.gguf_path, n_parallel=max(LEVELS),
                            ctx_per_slot=INPUT_LEN + OUTPUT_LEN + 64, threads=1,
                            timeout_s=120, log_path=out / f"llamacpp-{label}.log") as server:
            cfg = SweepConfig(url=server.url, served_model="tiny", concurrency=LEVELS,
                              input_len=INPUT_LEN, output_len=OUTPUT_LEN,
                              num_requests=REQUESTS, level_time_limit_s=120.0,
                              request_timeout_s=120.0, model=str(cfg_path), gpu=str(probe),
                              deployment={**DEPLOYMENT, "model": str(cfg_path),
                                          "gpu": str(probe)})
            result = run_sweep(cfg, db=out / "runs.db",
                               deployment=sweep_deployment(cfg.to_options()))
        d = result.to_dict()
        (out / f"llamacpp-{label}-sweep-{tag}.json").write_text(json.dumps(d, indent=2) + "\n")
        print(f"{label}: {time.time() - t0:.0f} s, ITL p50 "
              + ", ".join(f"{lv['concurrency']}: {lv['itl_ms']['p50']:.1f} ms"
                          for lv in d["levels"] if lv.get("itl_ms", {}).get("p50")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
