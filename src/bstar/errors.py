"""Errors a user can cause. The CLI prints them on one line and exits 2."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class BstarError(ValueError):
    """A user error: bad input, unknown name, impossible setting. Never a bug."""


def closest(name: str, candidates: Iterable[str], n: int = 3) -> str:
    """'; did you mean: a, b?' or '' -- for one-line unknown-name messages."""
    pool = sorted(set(candidates))
    matches = difflib.get_close_matches(name.lower(), pool, n=n, cutoff=0.4)
    if not matches:
        matches = [c for c in pool if name.lower() in c][:n]
    return f"; did you mean: {', '.join(matches)}?" if matches else ""
