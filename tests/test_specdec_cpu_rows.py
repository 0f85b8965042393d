"""The CPU verify step's pricing on stored data (docs/cost-model.md, "Speculative decoding
on the CPU: the verify GEMM"): vLLM's own GEMM timed at 1-256 rows is fitted best by the
additive roof, and the step profile built from it scores the recorded n-gram run within
the issue's 15% at every batch. Offline, exact arithmetic on files in data/cpu/."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def _bench(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_engine_gemm_rows_fit_the_additive_roof() -> None:
    g = _bench("cpu_gemm_rows")
    run = json.loads((REPO / "data/cpu/gemm-rows-20261202T0840.json").read_text())
    fits = {f["roof_sharpness"]: f for f in g.fit(run)}
    assert min(fits.values(), key=lambda f: f["rms_rel_error"])["roof_sharpness"] == 1.0
    assert fits[1.0]["rms_rel_error"] < 0.5 * fits[2.0]["rms_rel_error"]
    probe = (REPO / "data/cpu/specdec-probe-onednn-20261202T0840.toml").read_text()
    assert f"bf16_flops = {fits[1.0]['gemm_flops']}" in probe  # the profile's rate is R


def test_recorded_ngram_run_within_15_percent() -> None:
    h = _bench("specdec_vllm_cpu")
    m = json.loads((REPO / "data/cpu/specdec-vllm-20261202T0741.json").read_text())
    rows = h.compare(m)
    assert [r["batch"] for r in rows] == [1, 4, 8]
    for r in rows:
        assert abs(r["predicted_speedup"] / r["measured_speedup"] - 1.0) <= 0.15, r
