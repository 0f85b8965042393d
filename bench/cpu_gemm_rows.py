"""How a CPU GEMM's time grows with its rows at small row counts: the engine's own GEMM.

Speculative decoding's verify step multiplies the rows of every weight GEMM by K + 1 (B x
(K + 1) query tokens over one weight read, docs/cost-model.md "Speculative decoding"). On
the CPU the step's price at 4-32 rows rests on two things the probe does not measure: the
GEMM library's rate at those rows (`bstar probe` times numpy's GEMM at n = 2048, while vLLM's
CPU build runs oneDNN's `onednn_mm` on prepacked weights), and how the weight stream and the
FMAs overlap on one core (the roof's shape, `roof_sharpness`).

This times vLLM's CPU linear exactly as vLLM dispatches it (`create_onednn_mm(W.t(), 32)`
then `onednn_mm`; torch's F.linear where the build lacks oneDNN) over the tiny model's 8
layers of weights (data/cpu/tiny-config.json: 377 MB fp32, far past the caches, so the
weights stream from memory each pass) at one thread, for rows M = 1..256, the fastest of
5 passes each; then fits t(M) = roof(W, M x F / R; k) for k in 1, 1.5, 2, 3, inf (W the
weight stream, F the FLOPs of one row, R the GEMM rate) and prints each k's fit.

Run it in vLLM's venv (it imports vllm._custom_ops), on one core, with nothing else heavy:
    flock /tmp/bstar-heavy.lock taskset -c 0 $BSTAR_VLLM_PYTHON bench/cpu_gemm_rows.py [OUT.json]
Score a stored run again (no torch needed): python bench/cpu_gemm_rows.py --fit FILE.json
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

ROWS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256)
SHARPNESS = (1.0, 1.5, 2.0, 3.0, math.inf)
CONFIG = Path(__file__).resolve().parents[1] / "data" / "cpu" / "tiny-config.json"


def layer_shapes(cfg: dict[str, Any]) -> list[tuple[int, int]]:
    """(out, in) of every weight GEMM of the decoder layers (q, k, v, o, gate, up, down)."""
    h, inter = int(cfg["hidden_size"]), int(cfg["intermediate_size"])
    hd = int(cfg.get("head_dim") or h // int(cfg["num_attention_heads"]))
    q, kv = int(cfg["num_attention_heads"]) * hd, int(cfg["num_key_value_heads"]) * hd
    one = [(q, h), (kv, h), (kv, h), (h, q), (inter, h), (inter, h), (h, inter)]
    return one * int(cfg["num_hidden_layers"])


def measure(rows: tuple[int, ...] = ROWS) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    try:
        import vllm._custom_ops as ops

        def make(w: Any) -> Any:
            h = ops.create_onednn_mm(w.t(), 32)
            return lambda x: ops.onednn_mm(h, x, None)
        library = "vllm onednn_mm"
    except (ImportError, AttributeError, RuntimeError):
        def make(w: Any) -> Any:
            return lambda x: torch.nn.functional.linear(x, w)
        library = "torch F.linear"
    shapes = layer_shapes(json.loads(CONFIG.read_text()))
    g = torch.Generator().manual_seed(0)
    fns = [(k, make(torch.randn(n, k, generator=g))) for n, k in shapes]
    out = []
    for m in rows:
        xs = {k: torch.randn(m, k, generator=g) for k in {k for k, _ in fns}}
        best = math.inf
        for _ in range(5):
            t0 = time.perf_counter()
            for k, f in fns:
                f(xs[k])
            best = min(best, time.perf_counter() - t0)
        out.append({"rows": m, "time_s": best})
    return {"library": library, "threads": 1, "torch": torch.__version__,
            "weight_bytes": sum(4 * n * k for n, k in shapes),
            "flops_per_row": sum(2 * n * k for n, k in shapes), "points": out}


def roof(m: float, c: float, k: float) -> float:
    return max(m, c) if math.isinf(k) else (m ** k + c ** k) ** (1.0 / k)


def fit(run: dict[str, Any]) -> list[dict[str, Any]]:
    """Per roof shape k: the weight-stream time W and GEMM rate R that minimise the squared
    relative error over the points (a grid over W, then R, refined twice)."""
    pts = [(p["rows"], p["time_s"]) for p in run["points"]]
    f_row = float(run["flops_per_row"])
    t1 = min(t for m, t in pts if m == min(m for m, _ in pts))
    res = []
    for k in SHARPNESS:
        best = (math.inf, 0.0, 0.0)
        w_lo, w_hi, r_lo, r_hi = 0.3 * t1, 1.0 * t1, 2e10, 1e12
        for _ in range(3):
            for i in range(61):
                w = w_lo + (w_hi - w_lo) * i / 60
                for j in range(61):
                    r = r_lo * (r_hi / r_lo) ** (j / 60)
                    e = sum((roof(w, m * f_row / r, k) / t - 1.0) ** 2 for m, t in pts)
                    if e < best[0]:
                        best = (e, w, r)
            _, w0, r0 = best
            w_lo, w_hi = 0.9 * w0, 1.1 * w0
            r_lo, r_hi = 0.8 * r0, 1.25 * r0
        e, w, r = best
        errs = [roof(w, m * f_row / r, k) / t - 1.0 for m, t in pts]
        res.append({"roof_sharpness": k, "weight_s": w, "gemm_flops": r,
                    "rms_rel_error": math.sqrt(e / len(pts)),
                    "max_abs_rel_error": max(abs(x) for x in errs)})
    return res


def report(run: dict[str, Any]) -> None:
    f_row = run["flops_per_row"]
    print(f"{run['library']} at {run['threads']} thread, {run['weight_bytes'] / 1e6:.0f} MB "
          "of weights:")
    for p in run["points"]:
        t = p["time_s"]
        print(f"  rows {p['rows']:>4}: {t * 1e3:7.2f} ms, weights at "
              f"{run['weight_bytes'] / t / 1e9:5.2f} GB/s, "
              f"{p['rows'] * f_row / t / 1e9:6.1f} GFLOP/s")
    for r in fit(run):
        print(f"  roof k = {r['roof_sharpness']:g}: W = {r['weight_s'] * 1e3:.2f} ms, R = "
              f"{r['gemm_flops'] / 1e9:.1f} GFLOP/s, rms error {r['rms_rel_error']:.1%}, "
              f"max {r['max_abs_rel_error']:.1%}")


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--fit":
        report(json.loads(Path(sys.argv[2]).read_text()))
        return
    run = measure()
    run["created"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with open("/proc/loadavg") as f:
        run["loadavg"] = f.read().split()[:3]
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(json.dumps(run, indent=1) + "\n")
    report(run)


if __name__ == "__main__":
    main()
