"""Reading a config.json's keys: integers in range, positive counts, and the words of the
refusal a key bstar does not model gets (`--assume-unmodeled` proceeds)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from bstar.errors import BstarError

# Bounds that no real model reaches (vocabularies are ~10^5-10^6, layers ~10^2): a larger
# value is a broken config, and accepting it would build absurd per-layer tuples.
MAX_DIM = 1 << 24
MAX_LAYERS = 10_000
ASSUME_ENV = "BSTAR_ASSUME_UNMODELED"
ASSUME_HINT = f"; --assume-unmodeled (or {ASSUME_ENV}=1) proceeds"


def _req(cfg: Mapping[str, Any], where: str, *keys: str) -> Any:
    for k in keys:
        if k in cfg and cfg[k] is not None:
            return cfg[k]
    raise BstarError(f"{where}: config is missing {' or '.join(repr(k) for k in keys)}")


def integer(cfg: Mapping[str, Any], where: str, *keys: str, default: int | None = None) -> int:
    """The first of `keys` the config gives, a whole number in 0..MAX_DIM; `default` when
    none is given (None: a missing key is an error)."""
    try:
        v = _req(cfg, where, *keys)
    except BstarError:
        if default is None:
            raise
        return default
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) \
            or v != int(v):
        raise BstarError(f"{where}: {keys[0]!r} must be an integer, got {v!r}")
    if not 0 <= v <= MAX_DIM:
        raise BstarError(f"{where}: {keys[0]!r} = {v!r} is out of range (0..{MAX_DIM:,})")
    return int(v)


def positive(cfg: Mapping[str, Any], where: str, *keys: str) -> int:
    v = integer(cfg, where, *keys)
    if v <= 0:
        raise BstarError(f"{where}: {keys[0]!r} must be positive, got {v}")
    return v

