"""The terminal renderers over bstar's results, one module per command or family: `plan`,
`compare`, `catalog` (models, gpus), `fit`, `simulate`, `search`, `sweep` (sweep, runs and
its live progress), `validate`, `calibrate`, `kv`, `probe` and `demo`; `_common` holds the
consoles and tables they share. No computation here; the commands call these through
`commands/emit.py`.

The names below are importable from this package, and each loads only its own module when
first asked for (PEP 562): `bstar plan` imports the plan renderer, not rich or the others.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# name -> the module under bstar.report.text that defines it
_RENDERERS = {
    "print_plan": "plan",
    "print_disagg_plan": "disaggregate", "format_disagg_plan": "disaggregate",
    "print_disagg_simulation": "disaggregate",
    "print_compare": "compare",
    "print_models": "catalog", "print_gpus": "catalog",
    "print_fit": "fit",
    "print_simulation": "simulate",
    "print_search": "search",
    "print_result": "sweep", "levels_table": "sweep", "Progress": "sweep",
    "print_runs": "sweep", "print_runs_compare": "sweep",
    "print_curves_validation": "validate", "print_stages_validation": "validate",
    "format_stages_validation": "validate", "print_rows_validation": "validate",
    "print_runs_validation": "validate", "format_runs_validation": "validate",
    "print_calibration": "calibrate",
    "print_kv_check": "kv", "format_kv_check": "kv",
    "print_probe": "probe", "print_demo": "demo",
    "console": "_common", "wide_console": "_common",
}

__all__ = [
    "Progress",
    "console",
    "format_disagg_plan",
    "format_kv_check",
    "format_runs_validation",
    "format_stages_validation",
    "levels_table",
    "print_calibration",
    "print_compare",
    "print_curves_validation",
    "print_demo",
    "print_disagg_plan",
    "print_disagg_simulation",
    "print_fit",
    "print_gpus",
    "print_kv_check",
    "print_models",
    "print_plan",
    "print_probe",
    "print_result",
    "print_rows_validation",
    "print_runs",
    "print_runs_compare",
    "print_runs_validation",
    "print_search",
    "print_simulation",
    "print_stages_validation",
    "wide_console",
]

if TYPE_CHECKING:
    from bstar.report.text._common import console, wide_console
    from bstar.report.text.calibrate import print_calibration
    from bstar.report.text.catalog import print_gpus, print_models
    from bstar.report.text.compare import print_compare
    from bstar.report.text.demo import print_demo
    from bstar.report.text.disaggregate import (
        format_disagg_plan,
        print_disagg_plan,
        print_disagg_simulation,
    )
    from bstar.report.text.fit import print_fit
    from bstar.report.text.kv import format_kv_check, print_kv_check
    from bstar.report.text.plan import print_plan
    from bstar.report.text.probe import print_probe
    from bstar.report.text.search import print_search
    from bstar.report.text.simulate import print_simulation
    from bstar.report.text.sweep import (
        Progress,
        levels_table,
        print_result,
        print_runs,
        print_runs_compare,
    )
    from bstar.report.text.validate import (
        format_runs_validation,
        format_stages_validation,
        print_curves_validation,
        print_rows_validation,
        print_runs_validation,
        print_stages_validation,
    )


def __getattr__(name: str) -> Any:
    module = _RENDERERS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
