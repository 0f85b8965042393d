"""Measure a live OpenAI-compatible server: client, workload, metrics, scrape, store, sweep.

Uses aiohttp (a base dependency). The entry point is `run_sweep` in
`bstar.loadgen.sweep`; submodules import lazily so `import bstar.loadgen` stays light.
"""

from __future__ import annotations

__all__ = ["SweepConfig", "SweepResult", "load_result", "run_sweep"]


def __getattr__(name: str) -> object:
    if name in __all__:
        from bstar.loadgen import sweep

        return getattr(sweep, name)
    raise AttributeError(f"module 'bstar.loadgen' has no attribute {name!r}")
