"""bstar: how many sequences should your LLM server batch at once?

The library API (a notebook imports this; the CLI is a thin layer over it). Heavy parts
(numpy-based cost model, fitting, HTTP, plotting) load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# name -> module that defines it; resolved lazily so `import bstar` stays light.
# `bstar.recommend` is the submodule (recommend.py: every max_num_seqs decided); its
# function is `bstar.recommend.recommend`, the same as `Recommendation.from_cost_model`.
_EXPORTS = {
    "BstarError": "bstar.errors",
    "ModelSpec": "bstar.specs.model", "from_hf_config": "bstar.specs.model",
    "GpuSpec": "bstar.specs.gpu", "get_gpu": "bstar.specs.gpu", "gpu_catalog": "bstar.specs.gpu",
    "get_model": "bstar.specs.presets", "model_index": "bstar.specs.presets",
    "Precision": "bstar.specs.precision", "get_precision": "bstar.specs.precision",
    "Deployment": "bstar.deployment", "Efficiency": "bstar.deployment", "IDEAL": "bstar.deployment",
    "decode_step": "bstar.roofline", "curve": "bstar.roofline", "b_star": "bstar.roofline",
    "b_mem": "bstar.roofline", "compute_crossover": "bstar.roofline",
    "Recommendation": "bstar.recommend",
    "Plan": "bstar.plan", "make_plan": "bstar.plan",
    "FitResult": "bstar.fit", "Points": "bstar.fit", "fit_points": "bstar.fit",
    "load_points": "bstar.fit", "make_points": "bstar.fit",
    "Knee": "bstar.knee", "all_knees": "bstar.knee",
}
__all__ = [
    "IDEAL",
    "BstarError",
    "Deployment",
    "Efficiency",
    "FitResult",
    "GpuSpec",
    "Knee",
    "ModelSpec",
    "Plan",
    "Points",
    "Precision",
    "Recommendation",
    "__version__",
    "all_knees",
    "b_mem",
    "b_star",
    "compute_crossover",
    "curve",
    "decode_step",
    "fit_points",
    "from_hf_config",
    "get_gpu",
    "get_model",
    "get_precision",
    "gpu_catalog",
    "load_points",
    "make_plan",
    "make_points",
    "model_index",
]

if TYPE_CHECKING:  # pragma: no cover
    from bstar.deployment import IDEAL, Deployment, Efficiency
    from bstar.errors import BstarError
    from bstar.fit import FitResult, Points, fit_points, load_points, make_points
    from bstar.knee import Knee, all_knees
    from bstar.plan import Plan, make_plan
    from bstar.recommend import Recommendation
    from bstar.roofline import b_mem, b_star, compute_crossover, curve, decode_step
    from bstar.specs.gpu import GpuSpec, get_gpu, gpu_catalog
    from bstar.specs.model import ModelSpec, from_hf_config
    from bstar.specs.precision import Precision, get_precision
    from bstar.specs.presets import get_model, model_index


def __getattr__(name: str) -> Any:
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'bstar' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(mod), name)
