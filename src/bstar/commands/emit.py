"""The tail every command shares: `--plot FILE` (a picture, its path on stderr), then
`--json` (one JSON document on stdout, the contract in docs/contracts.md) or the terminal
renderer (bstar.report.text). Standard library only at top level."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def emit(args: argparse.Namespace, data: Callable[[], Any], text: Callable[[], None],
         plot: Callable[[str], Path] | None = None) -> int:
    """Draw `plot(args.plot)` when --plot is given, then print `data()` as JSON with --json
    or call `text()`; 0 (the exit status of a command that got this far)."""
    if plot is not None and getattr(args, "plot", None):
        # stderr: --json keeps stdout to the one JSON document.
        print(f"plot written to {plot(args.plot)}", file=sys.stderr)
    if getattr(args, "json", False):
        print(json.dumps(data(), indent=2))
        return 0
    text()
    return 0
