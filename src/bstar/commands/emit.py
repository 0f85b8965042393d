"""The tail every command shares: `--plot FILE` (a picture, its path on stderr), then
`--json` (one JSON document on stdout, the contract in docs/contracts.md) or the command's
terminal renderer (one module of bstar.report.text). Standard library only at top level."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def finite(obj: Any) -> Any:
    """`obj` with every non-finite float (NaN, +-inf) as null: JSON has no such numbers."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite(v) for v in obj]
    return obj


def dumps(obj: Any) -> str:
    """The one JSON document of `--json`: strict JSON (a NaN or an infinity becomes null,
    never the non-standard `NaN`/`Infinity`), credentials masked (bstar.redact)."""
    from bstar.redact import redact_json

    try:
        text = json.dumps(obj, indent=2, allow_nan=False)
    except ValueError:  # a NaN or an infinity somewhere: null instead
        text = json.dumps(finite(obj), indent=2, allow_nan=False)
    return redact_json(text)


def emit(args: argparse.Namespace, data: Callable[[], Any], text: Callable[[], None],
         plot: Callable[[str], Path] | None = None) -> int:
    """Draw `plot(args.plot)` when --plot is given, then print `data()` as JSON with --json
    or call `text()`; 0 (the exit status of a command that got this far)."""
    if plot is not None and getattr(args, "plot", None):
        # stderr: --json keeps stdout to the one JSON document.
        print(f"plot written to {plot(args.plot)}", file=sys.stderr)
    if getattr(args, "json", False):
        print(dumps(data()))
        return 0
    text()
    return 0
