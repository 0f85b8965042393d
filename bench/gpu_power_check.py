"""Real-GPU check of the power model (docs/energy.md): NVML's board power of GPU 0 while it
idles, while it streams HBM (a large copy: memory-bound, as decode is) and while it runs a
bf16 matmul (compute-bound, as prefill is), each for --seconds; written as JSON beside
what bstar's power model says for the catalog GPU (--gpu).

    python bench/gpu_power_check.py --gpu h200 --seconds 20 -o power_check.json

Needs nvidia-ml-py (module pynvml) and an NVIDIA GPU; torch for the loads (without it only
the idle phase runs). Nothing here is asserted: it prints and writes what it measured, to
be set against the model's guesses (idle = 10% of TDP, memory_fraction 0.6).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

SAMPLE_S = 0.1  # NVML's power reading refreshes about this often on recent boards


def sample(nvml: Any, handle: Any, seconds: float) -> dict[str, float]:
    """Mean and max board power (W) and mean SM / memory utilization (%) over `seconds`."""
    watts: list[float] = []
    sm: list[float] = []
    mem: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        watts.append(nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0)  # milliwatts
        u = nvml.nvmlDeviceGetUtilizationRates(handle)
        sm.append(float(u.gpu))
        mem.append(float(u.memory))
        time.sleep(SAMPLE_S)
    return {"power_mean_w": sum(watts) / len(watts), "power_max_w": max(watts),
            "sm_util_mean_pct": sum(sm) / len(sm), "mem_util_mean_pct": sum(mem) / len(mem),
            "samples": len(watts)}


def under_load(nvml: Any, handle: Any, seconds: float, work: Any) -> dict[str, float]:
    """`sample` while `work()` runs in a loop on another thread; adds the work's rate."""
    import torch

    stop = threading.Event()
    count = [0]

    def loop() -> None:
        while not stop.is_set():
            work()
            torch.cuda.synchronize()
            count[0] += 1

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    time.sleep(2.0)  # warm-up: clocks and power settle
    n0, t0 = count[0], time.monotonic()
    got = sample(nvml, handle, seconds)
    rate = (count[0] - n0) / (time.monotonic() - t0)
    stop.set()
    t.join()
    return got | {"iterations_per_s": rate}


def model_says(gpu_id: str) -> dict[str, Any] | None:
    """bstar's power model for the catalog GPU, or None when bstar does not import."""
    try:
        from bstar.energy import power_model
        from bstar.specs.gpu import get_gpu
    except ImportError:
        return None
    g = get_gpu(gpu_id)
    pm = power_model(g)
    return None if pm is None else pm.to_dict() | {
        "hbm_bandwidth_bytes_s": g.hbm_bandwidth_bytes_s, "bf16_flops": g.bf16_flops}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", default="h200", help="catalog id to compare with (bstar gpus)")
    ap.add_argument("--seconds", type=float, default=20.0, help="per phase (default 20)")
    ap.add_argument("-o", "--output", type=Path, default=Path("power_check.json"))
    args = ap.parse_args()
    try:
        import pynvml as nvml
    except ImportError:
        print("needs nvidia-ml-py (pip install nvidia-ml-py)", file=sys.stderr)
        return 2
    nvml.nvmlInit()
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(0)
        name = nvml.nvmlDeviceGetName(handle)
        limit_w = nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0
        out: dict[str, Any] = {"device": name if isinstance(name, str) else name.decode(),
                               "enforced_power_limit_w": limit_w,
                               "model": model_says(args.gpu), "phases": {}}
        out["phases"]["idle"] = sample(nvml, handle, args.seconds)
        try:
            import torch
        except ImportError:
            torch = None  # type: ignore[assignment]
            out["note"] = "torch not installed: only the idle phase ran"
        if torch is not None and torch.cuda.is_available():
            n_bytes = 2 * 2**30  # 2 GiB each way: far past any L2
            src = torch.empty(n_bytes // 2, dtype=torch.bfloat16, device="cuda")
            dst = torch.empty_like(src)
            copy = under_load(nvml, handle, args.seconds, lambda: dst.copy_(src))
            copy["bytes_per_s"] = 2 * n_bytes * copy["iterations_per_s"]  # read + write
            out["phases"]["hbm_copy"] = copy
            del src, dst
            n = 8192
            a = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
            b = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
            mm = under_load(nvml, handle, args.seconds, lambda: a @ b)
            mm["flops_per_s"] = 2 * n**3 * mm["iterations_per_s"]
            out["phases"]["bf16_matmul"] = mm
        m = out["model"]
        if m is not None:
            ph = out["phases"]
            out["compare"] = {"idle_w_measured": ph["idle"]["power_mean_w"],
                              "idle_w_model": m["idle_w"]}
            if "hbm_copy" in ph:
                u_m = ph["hbm_copy"]["bytes_per_s"] / m["hbm_bandwidth_bytes_s"]
                out["compare"] |= {
                    "hbm_copy_w_measured": ph["hbm_copy"]["power_mean_w"],
                    "hbm_copy_w_model": m["idle_w"] + (m["tdp_w"] - m["idle_w"])
                    * min(1.0, m["memory_fraction"] * u_m) ** m["exponent"],
                    "hbm_copy_bandwidth_fraction": u_m,
                    # what memory_fraction the measurement implies (linear curve)
                    "memory_fraction_implied": (ph["hbm_copy"]["power_mean_w"] - m["idle_w"])
                    / (m["tdp_w"] - m["idle_w"]) / u_m}
                out["compare"] |= {
                    "matmul_w_measured": ph["bf16_matmul"]["power_mean_w"],
                    "matmul_flops_fraction": ph["bf16_matmul"]["flops_per_s"]
                    / m["bf16_flops"], "tdp_w": m["tdp_w"]}
    finally:
        nvml.nvmlShutdown()
    args.output.write_text(json.dumps(out, indent=2))
    print(json.dumps(out.get("compare", out["phases"]), indent=2))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
